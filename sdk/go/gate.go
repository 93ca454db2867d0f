package backpressure

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// maxWait bounds one wait in Acquire, so that a missed wake-up can never stall a worker long.
const maxWait = time.Second

// HealthCheck is a cheap check that replaces message probes while fully backed off (see
// Settings.HealthCheckProbes).
type HealthCheck interface {
	// Check says whether the dependency looks healthy.
	Check(ctx context.Context) bool
}

// Snapshot is a point-in-time view of a Gate.
type Snapshot struct {
	// Backoff is the backoff factor in [0, 1].
	Backoff float64
	// Limit is the allowed concurrency now.
	Limit uint32
	// InFlight counts messages being processed.
	InFlight uint32
	// Reserved counts permits handed out for polls that have not returned yet.
	Reserved uint32
	// Mode is the controller's mode.
	Mode Mode
	// FailureFloor is the failure floor the controller learned, valid when FailureFloorKnown
	// (false until it has tested for one; see Controller.FloorEstimate).
	FailureFloor      float64
	FailureFloorKnown bool
}

// Gate shares one Controller between a poll loop and the goroutines processing messages, on
// the process's monotonic clock (the Rust worker's permits::Gate). Safe for concurrent use.
//
//	permit, err := gate.Acquire(ctx, 10) // waits until at least one message may start
//	msgs := poll(permit.Granted())
//	for _, m := range msgs {
//		inflight := permit.Start()
//		go func() { inflight.Finish(handle(m)) }()
//	}
//	permit.Release() // permits the poll did not use go back
type Gate struct {
	mu          sync.Mutex
	controller  Controller
	inFlight    uint32
	reserved    uint32
	waiting     uint32
	seed        uint64
	brake       *Brake
	brakeJitter float64
	changed     chan struct{}
	origin      time.Time
	now         func() Nanos
	metrics     *Metrics
	healthCheck HealthCheck
	logger      *slog.Logger
}

// GateOption configures a Gate.
type GateOption func(*Gate)

// WithMetrics makes the gate update these metrics.
func WithMetrics(m *Metrics) GateOption { return func(g *Gate) { g.metrics = m } }

// WithHealthCheck runs this check instead of message probes when the controller asks for one.
func WithHealthCheck(h HealthCheck) GateOption { return func(g *Gate) { g.healthCheck = h } }

// WithSeed seeds controllers created when the algorithm changes at runtime.
func WithSeed(seed uint64) GateOption { return func(g *Gate) { g.seed = seed } }

// WithBrakeJitter sets this pod's share of the brake's lift offset, in [0, 1) (the offset is
// this times brakeRelease/2). By default it is random per process.
func WithBrakeJitter(share float64) GateOption {
	return func(g *Gate) {
		if !isFinite(share) {
			share = 0
		}
		g.brakeJitter = clampF(share, 0, 1)
	}
}

// WithLogger logs through l (default slog.Default()).
func WithLogger(l *slog.Logger) GateOption { return func(g *Gate) { g.logger = l } }

// withClock replaces the monotonic clock (tests).
func withClock(now func() Nanos) GateOption { return func(g *Gate) { g.now = now } }

// NewGate creates a gate around controller, whose epoch is now.
func NewGate(controller Controller, opts ...GateOption) *Gate {
	g := &Gate{
		controller:  controller,
		brakeJitter: rand.Float64(),
		changed:     make(chan struct{}),
		origin:      time.Now(),
		logger:      slog.Default(),
	}
	g.now = func() Nanos { return NanosFromDuration(time.Since(g.origin)) }
	for _, o := range opts {
		o(g)
	}
	g.publish()
	return g
}

// Now is the gate's clock: nanoseconds since it was created (monotonic).
func (g *Gate) Now() Nanos { return g.now() }

// Snapshot is the current state.
func (g *Gate) Snapshot() Snapshot {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.snapshotLocked(now)
}

func (g *Gate) snapshotLocked(now Nanos) Snapshot {
	floor, known := g.controller.FloorEstimate()
	return Snapshot{
		Backoff:           g.controller.Backoff(now),
		Limit:             g.controller.Limit(now),
		InFlight:          g.inFlight,
		Reserved:          g.reserved,
		Mode:              g.controller.Mode(),
		FailureFloor:      floor,
		FailureFloorKnown: known,
	}
}

// Settings are the controller's settings in force.
func (g *Gate) Settings() Settings {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.controller.Settings()
}

// TryAcquire grants up to max permits without waiting, if the controller allows any now
// (nil otherwise).
func (g *Gate) TryAcquire(max uint32) *PollPermit {
	now := g.now()
	g.mu.Lock()
	p := g.grantLocked(now, max)
	g.mu.Unlock()
	if p != nil {
		g.publish()
	}
	return p
}

func (g *Gate) grantLocked(now Nanos, max uint32) *PollPermit {
	if max == 0 {
		return nil
	}
	allowed := min(g.controller.Permits(now, g.inFlight+g.reserved), max)
	if allowed == 0 {
		return nil
	}
	g.reserved += allowed
	return &PollPermit{gate: g, remaining: allowed, granted: allowed, probe: g.controller.Mode() == ModeProbing}
}

// Acquire waits until the controller allows at least one message and grants up to max (0 is
// treated as 1). It returns ctx's error if ctx ends first.
func (g *Gate) Acquire(ctx context.Context, max uint32) (*PollPermit, error) {
	max = maxU32(max, 1)
	for {
		now := g.now()
		g.mu.Lock()
		if p := g.grantLocked(now, max); p != nil {
			g.mu.Unlock()
			g.publish()
			return p, nil
		}
		hc := g.healthCheck != nil && g.controller.HealthCheckDue(now)
		g.waiting++
		wake, hasWake := g.controller.NextChange(now)
		changed := g.changed
		g.mu.Unlock()

		var err error
		if hc {
			g.runHealthCheck(ctx)
			err = ctx.Err()
		} else {
			wait := maxWait
			if hasWake {
				wait = min(wake.Sub(now).Duration(), maxWait)
			}
			timer := time.NewTimer(wait)
			select {
			case <-changed:
			case <-timer.C:
			case <-ctx.Done():
				err = ctx.Err()
			}
			timer.Stop()
		}
		g.mu.Lock()
		g.waiting--
		g.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
}

func maxU32(a, b uint32) uint32 {
	if a > b {
		return a
	}
	return b
}

func (g *Gate) runHealthCheck(ctx context.Context) {
	if g.metrics != nil {
		g.metrics.RecordProbe()
	}
	healthy := g.healthCheck.Check(ctx)
	g.logger.Debug("backpressure health check", "healthy", healthy)
	now := g.now()
	g.mu.Lock()
	g.controller.RecordHealthCheck(now, healthy)
	g.mu.Unlock()
	g.publish()
}

// Apply applies new controller settings and brake at runtime (see ApplySettings); nowUnix
// converts the brake's expiry. A brake that is lowered or removed lifts gently over
// settings.BrakeRelease, as one that expires.
func (g *Gate) Apply(settings Settings, brake *BrakeConfig, nowUnix int64) {
	now := g.now()
	g.mu.Lock()
	// Offset in [0, release/2): pods lift at different moments.
	offset := Nanos(toU64(float64(float64(settings.BrakeRelease)*0.5) * g.brakeJitter))
	g.brake = reconfigure(&g.controller, g.brake, now, settings, brake, nowUnix, g.seed, offset)
	g.mu.Unlock()
	g.publish()
	g.wake()
}

// publish updates the gauges.
func (g *Gate) publish() {
	if g.metrics == nil {
		return
	}
	s := g.Snapshot()
	g.metrics.SetBackoff(s.Backoff)
	// NaN until tested: a fresh pod must not read as "no floor" (0) and pull the fleet's
	// mean floor down before it has learned anything.
	g.metrics.SetFailureFloor(s.FailureFloor, s.FailureFloorKnown)
	g.metrics.SetPermits(s.Limit)
	g.metrics.SetInFlight(s.InFlight)
}

// wake wakes every waiting Acquire.
func (g *Gate) wake() {
	g.mu.Lock()
	close(g.changed)
	g.changed = make(chan struct{})
	g.mu.Unlock()
}

func (g *Gate) release(unused uint32) {
	now := g.now()
	g.mu.Lock()
	g.reserved -= unused
	g.controller.ReleaseUnused(now, unused)
	waiting := g.waiting
	g.mu.Unlock()
	if waiting > 0 {
		g.wake()
	}
}

func (g *Gate) finish(outcome Outcome, recorded bool) {
	now := g.now()
	g.mu.Lock()
	g.inFlight--
	if recorded {
		g.controller.Record(now, outcome)
	}
	waiting := g.waiting
	backoff := g.controller.Backoff(now)
	floor, known := g.controller.FloorEstimate()
	limit := g.controller.Limit(now)
	inFlight := g.inFlight
	g.mu.Unlock()
	if m := g.metrics; m != nil {
		if recorded {
			m.RecordOutcome(outcome)
		}
		m.SetBackoff(backoff)
		m.SetFailureFloor(floor, known)
		m.SetPermits(limit)
		m.SetInFlight(inFlight)
	}
	if waiting > 0 {
		g.wake()
	}
}

// PollPermit is the right to poll for up to Granted messages. Call Release when the poll has
// returned (defer it): the permits no message came back for go back to the gate.
type PollPermit struct {
	gate      *Gate
	mu        sync.Mutex
	remaining uint32
	granted   uint32
	probe     bool
}

// Granted is how many messages to poll for.
func (p *PollPermit) Granted() uint32 { return p.granted }

// IsProbe says whether this is a probe (the controller is fully backed off).
func (p *PollPermit) IsProbe() bool { return p.probe }

// Start starts processing one received message. It always succeeds: a message beyond the
// grant (a source that returned more than asked) is processed too, over the limit.
func (p *PollPermit) Start() *InFlight {
	g := p.gate
	p.mu.Lock()
	g.mu.Lock()
	if p.remaining > 0 {
		p.remaining--
		g.reserved--
	} else {
		g.logger.Warn("source returned more messages than permitted; processing anyway")
	}
	g.inFlight++
	inFlight := g.inFlight
	g.mu.Unlock()
	p.mu.Unlock()
	if m := g.metrics; m != nil {
		if p.probe {
			m.RecordProbe()
		}
		m.SetInFlight(inFlight)
	}
	return &InFlight{gate: g}
}

// Release returns the permits no message was started for. Idempotent.
func (p *PollPermit) Release() {
	p.mu.Lock()
	unused := p.remaining
	p.remaining = 0
	p.mu.Unlock()
	if unused > 0 {
		p.gate.release(unused)
	}
}

// InFlight is a message being processed: finish it with its outcome.
type InFlight struct {
	gate *Gate
	once sync.Once
}

// Finish records the outcome and frees the slot. Only the first call counts.
func (f *InFlight) Finish(outcome Outcome) {
	f.once.Do(func() { f.gate.finish(outcome, true) })
}

// Abandon frees the slot without recording an outcome (the handler could not tell, e.g. it
// panicked). Only the first of Finish and Abandon counts.
func (f *InFlight) Abandon() {
	f.once.Do(func() {
		f.gate.logger.Warn("message finished without an outcome; not recorded")
		f.gate.finish(Success, false)
	})
}
