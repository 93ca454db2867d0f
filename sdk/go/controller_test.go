package backpressure

// Ports of the Rust worker's controller unit tests (crates/worker/src/controller/tests).

import (
	"math"
	"testing"
)

func steadySettings() Settings {
	s := DefaultSettings()
	s.InitialPermits = 0
	return s
}

func spSettings(maxPermits uint32, setPoint float64, reaction uint32) Settings {
	s := steadySettings()
	s.Algorithm = AlgorithmSetPoint
	s.SetPoint = setPoint
	s.Reaction = reaction
	s.MaxPermits = maxPermits
	return s
}

func plain(maxPermits uint32, setPoint float64, reaction uint32) *SetPoint {
	s := spSettings(maxPermits, setPoint, reaction)
	s.Credit = 0
	return NewSetPoint(s, 1)
}

const t0 = Nanos(100_000_000_000)

func secs(s uint64) Nanos { return t0.Add(NanosFromSecs(s)) }

func backOffFully(t *testing.T, c Controller, now Nanos) {
	t.Helper()
	for range 10_000 {
		if c.Mode() == ModeProbing {
			return
		}
		c.Record(now, DependencyFailure)
	}
	t.Fatalf("never backed off fully")
}

func nextProbeTime(t *testing.T, c Controller, from Nanos) Nanos {
	t.Helper()
	now := from
	for range 10_000 {
		if c.Permits(now, 0) == 1 {
			return now
		}
		next, ok := c.NextChange(now)
		if !ok {
			next = now.Add(NanosFromMillis(10))
		}
		now = max(next, now+1)
	}
	t.Fatalf("no probe granted after %d", from)
	return 0
}

func starting(maxPermits, initial uint32) *SetPoint {
	s := spSettings(maxPermits, 0.05, 20)
	s.InitialPermits = initial
	return NewSetPoint(s, 1)
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestStartupRampsOnePermitPerRoundTripWithoutBackoff(t *testing.T) {
	c := starting(16, 2)
	if c.Mode() != ModeStarting || c.Permits(t0, 0) != 2 || c.Limit(t0) != 2 || c.Backoff(t0) != 0 {
		t.Fatalf("fresh: %v %d", c.Mode(), c.Limit(t0))
	}
	if c.Permits(t0, 2) != 0 {
		t.Fatal("in-flight messages count against the window")
	}
	successes, last := 0, uint32(2)
	for c.Mode() == ModeStarting {
		c.Record(t0, Success)
		successes++
		limit := c.Limit(t0)
		if limit != last && limit != last+1 {
			t.Fatalf("%d -> %d", last, limit)
		}
		if c.Backoff(t0) != 0 {
			t.Fatal("backoff while starting")
		}
		last = limit
	}
	if successes < 120 || successes > 135 {
		t.Fatalf("%d successes", successes)
	}
	if c.Mode() != ModeNormal || c.Limit(t0) != 16 {
		t.Fatalf("%v %d", c.Mode(), c.Limit(t0))
	}
	for range 20 {
		c.Record(t0, DependencyFailure)
	}
	if c.Limit(t0) != 16 {
		t.Fatalf("credit lost: %d", c.Limit(t0))
	}
	c.Record(t0, DependencyFailure)
	if c.Limit(t0) != 15 {
		t.Fatalf("%d", c.Limit(t0))
	}
}

func TestStartupRampIsScaledToMaxPermits(t *testing.T) {
	c := starting(160, 20)
	for range 20 {
		c.Record(t0, Success)
	}
	if l := c.Limit(t0); l < 27 || l > 29 {
		t.Fatalf("%d", l)
	}
}

func TestStartupWindowShrinksAboveTheSetPointAndNeverBelowOne(t *testing.T) {
	c := starting(16, 2)
	for c.Limit(t0) < 10 {
		c.Record(t0, Success)
	}
	w := c.window
	c.Record(t0, DependencyFailure)
	if !near(c.window, w-19.0/w) || c.Mode() != ModeStarting {
		t.Fatalf("%v vs %v", c.window, w-19.0/w)
	}
	c.Record(t0, MessageFailure)
	if !near(c.window, w-19.0/w) {
		t.Fatal("message failure moved the window")
	}
	for range 50 {
		for range 9 {
			c.Record(t0, Success)
		}
		c.Record(t0, DependencyFailure)
		if c.Mode() != ModeStarting {
			t.Fatalf("mode %v", c.Mode())
		}
	}
	if c.Limit(t0) > 2 {
		t.Fatalf("%d", c.Limit(t0))
	}
	for range 40 {
		c.Record(t0, DependencyFailure)
		if c.Mode() == ModeStarting && c.StartupWindow() != 1 {
			t.Fatalf("window %d", c.StartupWindow())
		}
	}
}

func TestAnOutageDuringStartupEndsItInProbing(t *testing.T) {
	c := starting(16, 2)
	for i := range 38 {
		c.Record(t0, DependencyFailure)
		want := ModeStarting
		if i >= 37 {
			want = ModeNormal
		}
		if c.Mode() != want || c.Limit(t0) != 1 {
			t.Fatalf("after %d failures: %v %d", i+1, c.Mode(), c.Limit(t0))
		}
	}
	c.Record(t0, DependencyFailure)
	if c.Mode() != ModeProbing || c.Backoff(t0) != 1 || c.Limit(t0) != 0 {
		t.Fatalf("%v %v %d", c.Mode(), c.Backoff(t0), c.Limit(t0))
	}
}

func TestStartupEndsWhenTheIntegratorLimitsMoreThanTheWindow(t *testing.T) {
	c := starting(16, 2)
	for range 6 {
		c.Record(t0, Success)
	}
	for range 36 {
		c.Record(t0, DependencyFailure)
	}
	own := limitFor(16, c.Integrator())
	if own >= 16 || own <= 1 {
		t.Fatalf("own limit %d", own)
	}
	for c.Mode() == ModeStarting {
		c.Record(t0, Success)
	}
	if c.Limit(t0) != limitFor(16, c.Integrator()) || !(c.Backoff(t0) > 0) {
		t.Fatalf("%d %v", c.Limit(t0), c.Backoff(t0))
	}
}

func TestStartupIsOnByDefaultAndEndsOnCarryOverOrASmallerMax(t *testing.T) {
	if NewSetPoint(DefaultSettings(), 1).Mode() != ModeStarting {
		t.Fatal("default does not start up")
	}
	if NewSetPoint(steadySettings(), 1).Mode() != ModeNormal {
		t.Fatal("steady starts up")
	}
	if starting(16, 16).Mode() != ModeNormal || starting(16, 0).Mode() != ModeNormal {
		t.Fatal("initial 0 or max starts up")
	}
	c := starting(16, 2)
	c.StartFrom(t0, 0.25)
	if c.Mode() != ModeNormal || c.Limit(t0) != 12 {
		t.Fatalf("%v %d", c.Mode(), c.Limit(t0))
	}
	c = starting(16, 2)
	for range 3 {
		c.Record(t0, Success)
	}
	s := spSettings(3, 0.05, 20)
	s.InitialPermits = 2
	c.Reconfigure(t0, s)
	if c.Mode() != ModeNormal || c.Limit(t0) != 3 {
		t.Fatalf("%v %d", c.Mode(), c.Limit(t0))
	}
}

func TestIntegratorSteps(t *testing.T) {
	c := plain(16, 0.05, 20)
	c.Record(t0, DependencyFailure)
	if math.Abs(c.Backoff(t0)-1.0/20.0) > 1e-12 {
		t.Fatal(c.Backoff(t0))
	}
	c.Record(t0, Success)
	if math.Abs(c.Backoff(t0)-(1.0/20.0-0.05/(0.95*20.0))) > 1e-12 {
		t.Fatal(c.Backoff(t0))
	}
	c = plain(16, 0.05, 20)
	c.Record(t0, DependencyFailure)
	for range 19 {
		c.Record(t0, Success)
	}
	if c.Backoff(t0) >= 1e-9 {
		t.Fatal(c.Backoff(t0))
	}
	c = plain(16, 0.05, 20)
	c.Record(t0, DependencyFailure)
	if c.Permits(t0, 0) != 15 || c.Permits(t0, 10) != 5 || c.Permits(t0, 20) != 0 {
		t.Fatal("permits")
	}
}

func TestMessageFailuresNeverDriveBackoff(t *testing.T) {
	for _, alg := range []Algorithm{AlgorithmSetPoint, AlgorithmRatioThrottle} {
		s := steadySettings()
		s.Algorithm = alg
		c := Build(s, 3)
		for i := range uint64(10_000) {
			c.Record(t0.Add(NanosFromMillis(i)), MessageFailure)
		}
		end := t0.Add(NanosFromSecs(10))
		if c.Backoff(end) != 0 || c.Permits(end, 0) != 16 {
			t.Fatalf("%s: %v %d", alg, c.Backoff(end), c.Permits(end, 0))
		}
	}
}

func TestCreditAbsorbsOneReactionOfFailuresThenBacksOff(t *testing.T) {
	c := NewSetPoint(spSettings(16, 0.05, 20), 1)
	if c.Integrator() != -1 {
		t.Fatal(c.Integrator())
	}
	for range 20 {
		c.Record(t0, DependencyFailure)
	}
	if c.Backoff(t0) != 0 || c.Permits(t0, 0) != 16 {
		t.Fatal("credit")
	}
	c.Record(t0, DependencyFailure)
	if !(c.Backoff(t0) > 0) || c.Permits(t0, 0) != 15 {
		t.Fatal("after credit")
	}
	for range 19 {
		c.Record(t0, DependencyFailure)
	}
	if c.Mode() != ModeProbing || c.Backoff(t0) != 1 {
		t.Fatal("not probing")
	}
}

func TestProbingGrantsOneMessageOnADoublingJitteredInterval(t *testing.T) {
	c := plain(16, 0.05, 20)
	backOffFully(t, c, t0)
	if c.Permits(t0, 0) != 0 {
		t.Fatal("the first probe waits an interval")
	}
	due, _ := c.NextChange(t0)
	wait := due - t0
	if wait < NanosFromSecs(1) || wait >= NanosFromSecs(2) {
		t.Fatalf("wait %d", wait)
	}
	if c.Permits(due, 1) != 0 || c.Permits(due, 0) != 1 {
		t.Fatal("probe grant")
	}
	now := due
	type iw struct{ interval, wait Nanos }
	var got []iw
	for range 8 {
		c.Record(now, DependencyFailure)
		next, _ := c.NextChange(now)
		got = append(got, iw{c.ProbeInterval(), next - now})
		now = next
		if c.Permits(now, 0) != 1 {
			t.Fatal("no probe when due")
		}
	}
	want := []uint64{4, 8, 16, 32, 60, 60, 60, 60}
	for k, g := range got {
		if g.interval != NanosFromSecs(want[k]) || g.wait < g.interval/2 || g.wait >= g.interval {
			t.Fatalf("%d: %+v", k, g)
		}
	}
	jittered := false
	for k := 5; k < len(got); k++ {
		jittered = jittered || got[k].wait != got[k-1].wait
	}
	if !jittered {
		t.Fatal("not jittered")
	}
}

func TestSuccessfulProbeSlowStartsToHalfThePeak(t *testing.T) {
	c := plain(16, 0.05, 20)
	backOffFully(t, c, t0)
	if c.Ssthresh() != 8 {
		t.Fatal(c.Ssthresh())
	}
	now := nextProbeTime(t, c, t0)
	c.Record(now, Success)
	if c.Mode() != ModeSlowStart || c.Limit(now) != 2 || c.ProbeInterval() != NanosFromSecs(2) {
		t.Fatal("slow start")
	}
	limits := []uint32{c.Limit(now)}
	for c.Mode() == ModeSlowStart {
		c.Record(now, Success)
		limits = append(limits, c.Limit(now))
	}
	for k, l := range limits {
		if l != uint32(k+2) {
			t.Fatalf("%v", limits)
		}
	}
	if len(limits) != 7 {
		t.Fatalf("%v", limits)
	}
}

func TestSlowStartEndsAtTheFirstDependencyFailure(t *testing.T) {
	c := plain(16, 0.05, 20)
	backOffFully(t, c, t0)
	now := nextProbeTime(t, c, t0)
	c.Record(now, Success)
	c.Record(now, Success)
	if c.Limit(now) != 3 {
		t.Fatal(c.Limit(now))
	}
	c.Record(now, DependencyFailure)
	if c.Mode() != ModeNormal || c.Limit(now) != 2 {
		t.Fatal(c.Mode(), c.Limit(now))
	}
}

func TestThePeakDecays(t *testing.T) {
	c := plain(16, 0.05, 20)
	c.Record(t0, Success)
	c.SetBackoff(t0, 0.75)
	if c.Limit(t0) != 4 {
		t.Fatal(c.Limit(t0))
	}
	backOffFully(t, c, t0.Add(NanosFromSecs(60)))
	if c.Ssthresh() != 2 {
		t.Fatal(c.Ssthresh())
	}
	c = plain(16, 0.05, 20)
	c.Record(t0, Success)
	c.SetBackoff(t0, 0.75)
	backOffFully(t, c, t0.Add(NanosFromSecs(1)))
	if c.Ssthresh() != 7 {
		t.Fatal(c.Ssthresh())
	}
}

func TestLateOutcomesInProbingAreNotProbeResults(t *testing.T) {
	c := plain(16, 0.05, 20)
	backOffFully(t, c, t0)
	interval := c.ProbeInterval()
	for range 10 {
		c.Record(t0, DependencyFailure)
	}
	if c.ProbeInterval() != interval {
		t.Fatal("interval grew")
	}
	c.Record(t0, Success)
	if c.Mode() != ModeProbing {
		t.Fatal("a late success is not a probe result")
	}
}

func TestMessageFailureProbeAllowsAnotherProbeAtOnce(t *testing.T) {
	c := plain(16, 0.05, 20)
	backOffFully(t, c, t0)
	now := nextProbeTime(t, c, t0)
	c.Record(now, MessageFailure)
	if c.Mode() != ModeProbing || c.Permits(now, 0) != 1 {
		t.Fatal("no probe at once")
	}
}

func TestHealthCheckReplacesMessageProbes(t *testing.T) {
	s := spSettings(16, 0.05, 20)
	s.HealthCheckProbes = true
	s.Credit = 0
	c := NewSetPoint(s, 9)
	backOffFully(t, c, t0)
	now, checks := t0, 0
	for range 1000 {
		if c.Permits(now, 0) != 0 {
			t.Fatal("message probe")
		}
		if c.HealthCheckDue(now) {
			checks++
			if c.HealthCheckDue(now) {
				t.Fatal("two checks at once")
			}
			c.RecordHealthCheck(now, checks >= 3)
			if c.Mode() != ModeProbing {
				break
			}
		}
		now, _ = c.NextChange(now)
	}
	if checks != 3 || c.Mode() != ModeSlowStart || c.Permits(now, 0) != 2 {
		t.Fatal(checks, c.Mode())
	}
}

func TestBrakeIsAMinimumBackoffUntilItExpires(t *testing.T) {
	c := Build(steadySettings(), 1)
	until := t0.Add(NanosFromSecs(30))
	c.SetBrake(&Brake{MinBackoff: 0.5, Until: until, HasUntil: true})
	if c.Backoff(t0) != 0.5 || c.Permits(t0, 0) != 8 {
		t.Fatal("brake")
	}
	if n, ok := c.NextChange(t0); !ok || n != until {
		t.Fatal("next change")
	}
	if c.Backoff(until) != 0 || c.Permits(until, 0) != 16 {
		t.Fatal("expired")
	}
	p := plain(16, 0.05, 20)
	backOffFully(t, p, t0)
	p.SetBrake(&Brake{MinBackoff: 1})
	if p.Permits(t0.Add(NanosFromSecs(3600)), 0) != 0 {
		t.Fatal("a full brake stops probes")
	}
	fs, os := steadySettings(), steadySettings()
	fs.Algorithm, os.Algorithm = AlgorithmFixed, AlgorithmOff
	fixed, off := Build(fs, 1), Build(os, 1)
	for _, c := range []Controller{fixed, off} {
		c.SetBrake(&Brake{MinBackoff: 0.75})
		for range 100 {
			c.Record(t0, DependencyFailure)
		}
	}
	if fixed.Permits(t0, 0) != 4 || fixed.Backoff(t0) != 0.75 || off.Permits(t0, 0) != 16 || off.Backoff(t0) != 0 {
		t.Fatal("fixed/off")
	}
}

func lifting(t *testing.T, minBackoff float64, until *Nanos, offset uint64) Brake {
	t.Helper()
	b := Brake{MinBackoff: minBackoff}
	if until != nil {
		b.Until, b.HasUntil = *until, true
	}
	out, ok := SucceedBrake(nil, &b, t0, NanosFromSecs(60), NanosFromSecs(offset))
	if !ok {
		t.Fatal("no brake")
	}
	return out
}

func ptr[T any](v T) *T { return &v }

func TestAnExpiringBrakeLiftsGentlyAfterThisPodsOffset(t *testing.T) {
	brake := lifting(t, 1, ptr(secs(10)), 20)
	c := Build(steadySettings(), 1)
	c.SetBrake(&brake)
	at := func(s uint64) uint32 { return c.Permits(secs(s), 0) }
	if at(0) != 0 || at(10) != 0 || at(29) != 0 {
		t.Fatal("held")
	}
	if n, _ := c.NextChange(secs(29)); n != secs(30) {
		t.Fatal("next change at the fall's start")
	}
	if at(45) != 4 || !near(c.Backoff(secs(45)), 0.75) {
		t.Fatal("a quarter of the way")
	}
	if n, _ := c.NextChange(secs(45)); n != secs(45).Add(NanosFromMillis(3750)) {
		t.Fatal("woken per permit")
	}
	if at(60) != 8 || at(90) != 16 || c.Backoff(secs(90)) != 0 {
		t.Fatal("fall")
	}
	if _, ok := c.NextChange(secs(90)); ok {
		t.Fatal("lifted")
	}
	other := Build(steadySettings(), 1)
	ob := lifting(t, 1, ptr(secs(10)), 5)
	other.SetBrake(&ob)
	if other.Permits(secs(30), 0) != 4 || c.Permits(secs(30), 0) != 0 {
		t.Fatal("offsets")
	}
}

func active(b Brake, now Nanos) float64 {
	v, ok := b.Active(now)
	if !ok {
		return -1
	}
	return v
}

func TestARemovedOrLoweredBrakeFallsToTheNewLevel(t *testing.T) {
	release, offset := NanosFromSecs(60), NanosFromSecs(6)
	full := lifting(t, 1, nil, 6)
	half := Brake{MinBackoff: 0.5}
	lowered, _ := SucceedBrake(&full, &half, t0, release, offset)
	if active(lowered, secs(5)) != 1 || !near(active(lowered, secs(21)), 0.75) || active(lowered, secs(40)) != 0.5 {
		t.Fatal("lowered")
	}
	again, _ := SucceedBrake(&lowered, &half, secs(21), release, offset)
	if !near(active(again, secs(21)), 0.75) || !near(active(again, secs(27)), 0.65) {
		t.Fatal("again")
	}
	removed, _ := SucceedBrake(&again, nil, secs(40), release, offset)
	if active(removed, secs(46)) != 0.5 || !near(active(removed, secs(61)), 0.25) || active(removed, secs(76)) != -1 {
		t.Fatal("removed")
	}
	if _, ok := SucceedBrake(&removed, nil, secs(80), release, offset); ok {
		t.Fatal("leftover")
	}
	expired := lifting(t, 0.5, ptr(secs(1)), 0)
	if _, ok := SucceedBrake(&expired, nil, secs(100), release, offset); ok {
		t.Fatal("expired leftover")
	}
	mid, _ := SucceedBrake(&expired, nil, secs(16), release, offset)
	if !near(active(mid, secs(16)), 0.25) {
		t.Fatal("mid")
	}
	step, ok := SucceedBrake(&full, nil, t0, 0, 0)
	if ok && active(step, t0) != -1 {
		t.Fatal("release 0")
	}
}

func TestBrakeFromWireConvertsUnixExpiry(t *testing.T) {
	now := NanosFromSecs(50)
	b := BrakeFromWire(&BrakeConfig{MinBackoff: 0.3, ExpiresAtUnix: ptr(int64(1_000_010))}, now, 1_000_000)
	if !b.HasUntil || b.Until != NanosFromSecs(60) || active(b, NanosFromSecs(59)) != 0.3 || active(b, NanosFromSecs(60)) != -1 {
		t.Fatal("from wire")
	}
	e := BrakeFromWire(&BrakeConfig{MinBackoff: 0.3, ExpiresAtUnix: ptr(int64(999_000))}, now, 1_000_000)
	if active(e, now) != -1 {
		t.Fatal("expired")
	}
}

func TestReconfigureKeepsStateAndAlgorithmChangeCarriesBackoff(t *testing.T) {
	s := steadySettings()
	s.Credit = 0
	c := Build(s, 1)
	for range 10 {
		c.Record(t0, DependencyFailure)
	}
	b := c.Backoff(t0)
	if !near(b, 0.5) {
		t.Fatal(b)
	}
	s32 := steadySettings()
	s32.MaxPermits = 32
	ApplySettings(&c, t0, s32, 1, nil)
	if c.Backoff(t0) != b || c.Permits(t0, 0) != 16 {
		t.Fatal("reconfigure")
	}
	fs := steadySettings()
	fs.Algorithm = AlgorithmFixed
	ApplySettings(&c, t0, fs, 1, nil)
	if c.Algorithm() != AlgorithmFixed || c.Backoff(t0) != 0 {
		t.Fatal("fixed")
	}
	c2 := Build(fs, 1)
	brake := &Brake{MinBackoff: 0.25}
	c2.SetBrake(brake)
	ApplySettings(&c2, t0, steadySettings(), 1, brake)
	if c2.Algorithm() != AlgorithmSetPoint || c2.Backoff(t0) != 0.25 {
		t.Fatal("carried from Fixed under brake")
	}
}

func TestSameSeedSameProbeSchedule(t *testing.T) {
	schedule := func(seed uint64) []Nanos {
		s := steadySettings()
		s.Credit = 0
		c := NewSetPoint(s, seed)
		backOffFully(t, c, t0)
		now := t0
		var out []Nanos
		for range 6 {
			now = nextProbeTime(t, c, now)
			out = append(out, now)
			c.Record(now, DependencyFailure)
		}
		return out
	}
	a, b, d := schedule(42), schedule(42), schedule(43)
	same := func(x, y []Nanos) bool {
		for k := range x {
			if x[k] != y[k] {
				return false
			}
		}
		return true
	}
	if !same(a, b) || same(a, d) {
		t.Fatal("seeding")
	}
}

func TestFromConfigUsesTheWireKnobs(t *testing.T) {
	cfg := DefaultWorkerConfig()
	cfg.Algorithm = AlgorithmRatioThrottle
	cfg.MaxPermits = 7
	cfg.ProbeInitialMs = 500
	cfg.ProbeMaxMs = 4000
	c := FromConfig(&cfg, 1)
	s := c.Settings()
	if c.Algorithm() != AlgorithmRatioThrottle || s.MaxPermits != 7 || s.ProbeInitial != NanosFromMillis(500) || s.ProbeMax != NanosFromSecs(4) || c.Limit(t0) != 7 {
		t.Fatal("from config")
	}
}

func TestRatioThrottleBacksOffProbesAndForgetsAfterTheWindow(t *testing.T) {
	c := NewRatioThrottle(steadySettings(), 5)
	now := t0
	for range 200 {
		c.Record(now, DependencyFailure)
		now = now.Add(NanosFromMillis(5))
	}
	if c.Mode() != ModeProbing || c.Limit(now) != 0 {
		t.Fatal("not probing")
	}
	end := now.Add(NanosFromSecs(60))
	for now < end {
		k := c.Permits(now, 0)
		for range k {
			c.Record(now, Success)
		}
		next, ok := c.NextChange(now)
		if !ok {
			next = now.Add(NanosFromMillis(100))
		}
		now = min(next, now.Add(NanosFromMillis(100)))
	}
	if c.Mode() != ModeNormal || c.Limit(now) != 16 {
		t.Fatal(c.Mode(), c.Limit(now))
	}
}

// drive runs one SetPoint for secs seconds of 100 ms ticks: messages take 1 s and each fails
// with probability fail(limit at its start, t). Returns the failure fraction and mean permits
// over the last tail seconds.
func drive(secs, tail uint64, fail func(limit uint32, t uint64) float64) (*SetPoint, float64, float64) {
	c := NewSetPoint(spSettings(16, 0.05, 20), 7)
	rng := NewSplitMix64(11)
	type msg struct {
		done uint64
		ok   bool
	}
	var inFlight []msg
	var att, fails, permitSum, samples uint64
	for tick := range secs * 10 {
		now := NanosFromMillis(tick * 100)
		for i := 0; i < len(inFlight); {
			if inFlight[i].done <= tick {
				m := inFlight[i]
				inFlight[i] = inFlight[len(inFlight)-1]
				inFlight = inFlight[:len(inFlight)-1]
				o := Success
				if !m.ok {
					o = DependencyFailure
				}
				c.Record(now, o)
				if tick >= (secs-tail)*10 {
					att++
					if !m.ok {
						fails++
					}
				}
			} else {
				i++
			}
		}
		limit := c.Limit(now)
		k := c.Permits(now, uint32(len(inFlight)))
		for range k {
			ok := rng.NextF64() >= fail(max(limit, 1), tick/10)
			inFlight = append(inFlight, msg{tick + 10, ok})
		}
		if tick >= (secs-tail)*10 {
			permitSum += uint64(c.Limit(now))
			samples++
		}
	}
	return c, float64(fails) / float64(max(att, 1)), float64(permitSum) / float64(max(samples, 1))
}

func TestLoadIndependentFailuresLearnAFloorAndStopThrottling(t *testing.T) {
	c, f, permits := drive(1800, 600, func(uint32, uint64) float64 { return 0.15 })
	if fl := c.FailureFloor(); fl < 0.12 || fl > 0.18 {
		t.Fatalf("floor %v", fl)
	}
	if permits < 14 || f < 0.12 || f > 0.18 {
		t.Fatalf("permits %v failures %v", permits, f)
	}
}

func TestOverloadLearnsNoFloorAndKeepsTheSetPoint(t *testing.T) {
	c, f, _ := drive(1800, 900, func(limit uint32, _ uint64) float64 {
		return math.Max(1-6.0/float64(limit), 0) + 0.005
	})
	if c.FailureFloor() != 0 || f > 0.06 {
		t.Fatalf("floor %v failures %v", c.FailureFloor(), f)
	}
}

func TestOutagesAndFlappingLearnNoFloor(t *testing.T) {
	c, _, permits := drive(1800, 600, func(_ uint32, t uint64) float64 {
		if t >= 60 {
			return 1
		}
		return 0
	})
	if c.FailureFloor() != 0 || permits >= 1 {
		t.Fatalf("outage: floor %v permits %v", c.FailureFloor(), permits)
	}
	c, _, _ = drive(3600, 600, func(_ uint32, t uint64) float64 {
		if (t/60)%2 == 1 {
			return 1
		}
		return 0.005
	})
	if c.FailureFloor() != 0 {
		t.Fatalf("flapping: floor %v", c.FailureFloor())
	}
}

func TestFloorEndsWhenTheDependencyHeals(t *testing.T) {
	c, f, permits := drive(3600, 300, func(_ uint32, t uint64) float64 {
		if t < 1800 {
			return 0.15
		}
		return 0.005
	})
	if c.FailureFloor() != 0 || f >= 0.02 || permits < 15 {
		t.Fatalf("%v %v %v", c.FailureFloor(), f, permits)
	}
}

func TestFloorEstimateIsUnknownUntilTested(t *testing.T) {
	if _, ok := NewSetPoint(spSettings(16, 0.05, 20), 7).FloorEstimate(); ok {
		t.Fatal("fresh knows")
	}
	c, _, _ := drive(600, 60, func(uint32, uint64) float64 { return 0.005 })
	if _, ok := c.FloorEstimate(); ok {
		t.Fatal("healthy knows")
	}
	c, _, _ = drive(1800, 600, func(uint32, uint64) float64 { return 0.15 })
	if f0, ok := c.FloorEstimate(); !ok || f0 < 0.12 || f0 > 0.18 {
		t.Fatalf("floor %v %v", f0, ok)
	}
	c, _, _ = drive(900, 60, func(limit uint32, _ uint64) float64 {
		if limit > 1 {
			return 0.9
		}
		return 0
	})
	if f0, ok := c.FloorEstimate(); !ok || f0 != 0 {
		t.Fatalf("conclusively none: %v %v", f0, ok)
	}
}

func TestSplitMix64IsBitExact(t *testing.T) {
	// Reference outputs of SplitMix64 seeded with 0 (Vigna's splitmix64.c).
	r := NewSplitMix64(0)
	want := []uint64{0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, 0x06c45d188009454f}
	for _, w := range want {
		if got := r.NextU64(); got != w {
			t.Fatalf("%#x != %#x", got, w)
		}
	}
	f := NewSplitMix64(7).NextF64()
	if f < 0 || f >= 1 {
		t.Fatal(f)
	}
}
