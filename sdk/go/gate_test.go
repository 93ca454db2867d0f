package backpressure

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func plainSettings() Settings {
	s := steadySettings()
	s.Credit = 0
	return s
}

// fakeClock is a controllable gate clock for the tests that are about time (the brake's lift).
type fakeClock struct{ t atomic.Uint64 }

func (c *fakeClock) now() Nanos              { return Nanos(c.t.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.t.Add(uint64(d)) }

func backOffGate(t *testing.T, g *Gate) {
	t.Helper()
	for range 40 {
		p := g.TryAcquire(1)
		if p == nil {
			t.Fatal("no permit while backing off")
		}
		m := p.Start()
		p.Release()
		m.Finish(DependencyFailure)
		if g.Snapshot().Mode == ModeProbing {
			return
		}
	}
	t.Fatal("did not back off")
}

func TestGrantsFollowTheControllerAndUnusedPermitsReturn(t *testing.T) {
	g := NewGate(Build(plainSettings(), 1))
	p, err := g.Acquire(context.Background(), 100)
	if err != nil || p.Granted() != 16 {
		t.Fatal(err, p.Granted())
	}
	if g.TryAcquire(1) != nil {
		t.Fatal("all reserved")
	}
	a, b := p.Start(), p.Start()
	p.Release()
	if s := g.Snapshot(); s.InFlight != 2 || s.Reserved != 0 {
		t.Fatalf("%+v", s)
	}
	if q := g.TryAcquire(100); q == nil || q.Granted() != 14 {
		t.Fatal("14 more")
	} else {
		q.Release()
	}
	a.Finish(Success)
	b.Finish(DependencyFailure)
	b.Finish(DependencyFailure) // only the first counts
	if s := g.Snapshot(); s.InFlight != 0 || s.Limit != 15 {
		t.Fatalf("%+v", s)
	}
}

func TestProbePermitUsedByAnEmptyPollIsReturned(t *testing.T) {
	for _, alg := range []Algorithm{AlgorithmSetPoint, AlgorithmRatioThrottle} {
		s := plainSettings()
		s.Algorithm = alg
		s.ProbeInitial, s.ProbeMax = NanosFromMillis(20), NanosFromMillis(40)
		g := NewGate(Build(s, 7))
		backOffGate(t, g)
		if g.TryAcquire(1) != nil {
			t.Fatal("a probe before its interval")
		}
		for range 5 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			p, err := g.Acquire(ctx, 10)
			cancel()
			if err != nil || !p.IsProbe() || p.Granted() != 1 {
				t.Fatalf("%s: %v", alg, err)
			}
			p.Release() // the poll came back empty
			if s := g.Snapshot(); s.Reserved != 0 || s.InFlight != 0 {
				t.Fatalf("%+v", s)
			}
		}
		p, err := g.Acquire(context.Background(), 10)
		if err != nil {
			t.Fatal(err)
		}
		m := p.Start()
		p.Release()
		m.Finish(Success)
		if g.Snapshot().Limit < 1 {
			t.Fatalf("%s: still backed off", alg)
		}
	}
}

func TestAcquireWaitsForAFinishedMessageAndHonoursTheContext(t *testing.T) {
	s := plainSettings()
	s.MaxPermits = 1
	g := NewGate(Build(s, 1))
	p, _ := g.Acquire(context.Background(), 1)
	m := p.Start()
	p.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := g.Acquire(ctx, 1); err == nil {
		t.Fatal("granted over the limit")
	}
	got := make(chan uint32)
	go func() {
		q, err := g.Acquire(context.Background(), 1)
		if err != nil {
			got <- 0
			return
		}
		got <- q.Granted()
		q.Release()
	}()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	m.Finish(Success)
	select {
	case n := <-got:
		if n != 1 {
			t.Fatal(n)
		}
		if time.Since(start) > 500*time.Millisecond {
			t.Fatal("not woken by the finished message")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("never granted")
	}
}

func TestMessagesBeyondTheGrantAreStillProcessed(t *testing.T) {
	s := plainSettings()
	s.MaxPermits = 2
	g := NewGate(Build(s, 1))
	p, _ := g.Acquire(context.Background(), 2)
	ms := []*InFlight{p.Start(), p.Start(), p.Start()}
	p.Release()
	if g.Snapshot().InFlight != 3 {
		t.Fatal(g.Snapshot())
	}
	for _, m := range ms {
		m.Finish(Success)
	}
	if s := g.Snapshot(); s.InFlight != 0 || s.Reserved != 0 {
		t.Fatal(s)
	}
	p.Start().Abandon() // a handler that could not tell: freed, not recorded
	if g.Snapshot().InFlight != 0 {
		t.Fatal("abandoned message still in flight")
	}
}

func TestConcurrentWorkersKeepTheCountsStraight(t *testing.T) {
	m := NewMetrics("w")
	g := NewGate(Build(plainSettings(), 1), WithMetrics(m))
	var wg sync.WaitGroup
	var started atomic.Int64
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				p, err := g.Acquire(context.Background(), 3)
				if err != nil {
					t.Error(err)
					return
				}
				n := int(p.Granted())
				if (w+i)%2 == 0 && n > 1 {
					n-- // a short poll
				}
				var inner sync.WaitGroup
				for range n {
					f := p.Start()
					started.Add(1)
					inner.Add(1)
					go func() { defer inner.Done(); f.Finish(Success) }()
				}
				p.Release()
				inner.Wait()
			}
		}()
	}
	wg.Wait()
	s := g.Snapshot()
	if s.InFlight != 0 || s.Reserved != 0 || s.Limit != 16 {
		t.Fatalf("%+v", s)
	}
	if got := m.OutcomeCount(Success); got != uint64(started.Load()) {
		t.Fatalf("%d outcomes for %d messages", got, started.Load())
	}
}

func TestMetricsFollowTheGate(t *testing.T) {
	m := NewMetrics("w")
	g := NewGate(Build(plainSettings(), 1), WithMetrics(m))
	p, _ := g.Acquire(context.Background(), 4)
	f := p.Start()
	p.Release()
	if text := m.Encode(); !strings.Contains(text, `backpressure_in_flight{workload="w"} 1`) {
		t.Fatal(text)
	}
	f.Finish(DependencyFailure)
	text := m.Encode()
	if m.OutcomeCount(DependencyFailure) != 1 ||
		!strings.Contains(text, `backpressure_permits{workload="w"} 15`) ||
		!strings.Contains(text, `backpressure_backoff_factor{workload="w"} 0.05`) {
		t.Fatal(text)
	}
	s := plainSettings()
	s.ProbeInitial, s.ProbeMax = NanosFromMillis(10), NanosFromMillis(20)
	g.Apply(s, nil, unixNow())
	backOffGate(t, g)
	p, err := g.Acquire(context.Background(), 1)
	if err != nil || !p.IsProbe() {
		t.Fatal("no probe")
	}
	p.Start().Finish(Success)
	p.Release()
	if m.ProbeCount() != 1 {
		t.Fatal(m.ProbeCount())
	}
}

type check struct {
	healthyAfter uint32
	calls        atomic.Uint32
	running      atomic.Bool
}

func (c *check) Check(context.Context) bool {
	if c.running.Swap(true) {
		panic("two checks at once")
	}
	time.Sleep(time.Millisecond)
	c.running.Store(false)
	return c.calls.Add(1) >= c.healthyAfter
}

func TestHealthCheckReplacesMessageProbesInTheGate(t *testing.T) {
	hc := &check{healthyAfter: 3}
	s := plainSettings()
	s.HealthCheckProbes = true
	s.ProbeInitial, s.ProbeMax = NanosFromMillis(10), NanosFromMillis(40)
	g := NewGate(Build(s, 1), WithHealthCheck(hc))
	backOffGate(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := g.Acquire(ctx, 10)
	if err != nil || p.IsProbe() || p.Granted() != 2 || hc.calls.Load() != 3 {
		t.Fatal(err, p, hc.calls.Load())
	}
}

func TestApplyChangesSettingsAndBrakeAtRuntime(t *testing.T) {
	clock := &fakeClock{}
	g := NewGate(Build(steadySettings(), 1), WithBrakeJitter(0.5), withClock(clock.now))
	cfg := DefaultWorkerConfig()
	cfg.MaxPermits = 4
	settings := SettingsFromConfig(&cfg)
	if settings.BrakeRelease != NanosFromSecs(60) {
		t.Fatal(settings.BrakeRelease)
	}
	granted := func() uint32 {
		p := g.TryAcquire(100)
		if p == nil {
			return 0
		}
		defer p.Release()
		return p.Granted()
	}
	g.Apply(settings, &BrakeConfig{MinBackoff: 0.5, ExpiresAtUnix: ptr(int64(1030))}, 1000)
	if granted() != 2 {
		t.Fatal("braked")
	}
	// Expired at 30 s: held for this pod's 15 s offset, then falls 1 per minute.
	clock.advance(31 * time.Second)
	if granted() != 2 {
		t.Fatal("31 s")
	}
	clock.advance(29 * time.Second)
	if granted() != 3 {
		t.Fatal("60 s")
	}
	clock.advance(15 * time.Second)
	if granted() != 4 {
		t.Fatal("75 s")
	}
	full := &BrakeConfig{MinBackoff: 1}
	g.Apply(settings, full, 1000)
	if granted() != 0 {
		t.Fatal("a full brake stops everything")
	}
	g.Apply(settings, nil, 1000)
	if granted() != 0 {
		t.Fatal("removed: still held for the offset")
	}
	clock.advance(30 * time.Second)
	g.Apply(settings, nil, 1000) // the same configuration again does not restart the lift
	if granted() != 1 {
		t.Fatal("0.75")
	}
	clock.advance(30 * time.Second)
	if granted() != 3 {
		t.Fatal("0.25")
	}
	clock.advance(15 * time.Second)
	if granted() != 4 {
		t.Fatal("lifted")
	}
	instant := settings
	instant.BrakeRelease = 0
	g.Apply(instant, full, 1000)
	if granted() != 0 {
		t.Fatal("full")
	}
	g.Apply(instant, nil, 1000)
	if granted() != 4 {
		t.Fatal("release 0 lifts in one step")
	}
	off := settings
	off.Algorithm = AlgorithmOff
	g.Apply(off, nil, 1000)
	if g.Settings().Algorithm != AlgorithmOff {
		t.Fatal("algorithm")
	}
}

func TestAWaitingWorkerWakesUpAsTheBrakeLifts(t *testing.T) {
	// Real time, scaled down: a full brake expiring after 1 s that lifts over 1.6 s (16
	// permits): the first permit after about 1.1 s, one permit, not sixteen.
	g := NewGate(Build(steadySettings(), 1), WithBrakeJitter(0))
	s := steadySettings()
	s.BrakeRelease = NanosFromMillis(1600)
	now := unixNow()
	g.Apply(s, &BrakeConfig{MinBackoff: 1, ExpiresAtUnix: ptr(now + 1)}, now)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := g.Acquire(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(start)
	if waited < 1050*time.Millisecond || waited > 2*time.Second || p.Granted() != 1 {
		t.Fatal(waited, p.Granted())
	}
}

// floorGauge is the backpressure_failure_floor sample of m's exposition.
func floorGauge(t *testing.T, m *Metrics) string {
	t.Helper()
	prefix := MetricFailureFloor + `{workload="w"} `
	for _, line := range strings.Split(m.Encode(), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return v
		}
	}
	t.Fatalf("no %s sample", MetricFailureFloor)
	return ""
}

// The failure-floor gauge is NaN until the controller has tested for a floor, from the
// gate's creation on (0 would read as "tested, no floor" and pull the fleet's mean floor
// down), and follows the controller through reconfigurations (the Rust Gate::publish).
func TestFailureFloorGaugeIsNaNUntilTested(t *testing.T) {
	m := NewMetrics("w")
	g := NewGate(Build(plainSettings(), 1), WithMetrics(m))
	if got := floorGauge(t, m); got != "NaN" {
		t.Fatalf("fresh gate: failure floor %s, want NaN", got)
	}
	if s := g.Snapshot(); s.FailureFloorKnown {
		t.Fatalf("fresh gate knows a floor: %+v", s)
	}
	p, _ := g.Acquire(context.Background(), 1)
	p.Start().Finish(Success)
	p.Release()
	if got := floorGauge(t, m); got != "NaN" {
		t.Fatalf("after one outcome: failure floor %s, want NaN", got)
	}

	// A controller that learned a floor (load-independent failures of 15%) exports it as
	// soon as a gate publishes, before any outcome through the gate.
	learned, _, _ := drive(1800, 600, func(uint32, uint64) float64 { return 0.15 })
	floor, known := learned.FloorEstimate()
	if !known || floor < 0.12 || floor > 0.18 {
		t.Fatalf("drive learned no floor: %v %v", floor, known)
	}
	m = NewMetrics("w")
	clock := &fakeClock{}
	clock.advance(1801 * time.Second) // after the drive's last tick
	g = NewGate(learned, WithMetrics(m), withClock(clock.now))
	if s := g.Snapshot(); !s.FailureFloorKnown || s.FailureFloor != floor {
		t.Fatalf("snapshot %+v, learned %v", s, floor)
	}
	if got, want := floorGauge(t, m), strconv.FormatFloat(floor, 'g', -1, 64); got != want {
		t.Fatalf("learned floor exported as %s, want %s", got, want)
	}
	// Another algorithm: a new controller that has tested nothing.
	fixed := plainSettings()
	fixed.Algorithm = AlgorithmFixed
	g.Apply(fixed, nil, unixNow())
	if got := floorGauge(t, m); got != "NaN" {
		t.Fatalf("after switching to Fixed: failure floor %s, want NaN", got)
	}
}
