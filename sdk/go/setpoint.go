package backpressure

import "math"

const (
	// startupRoundTrips: a healthy startup ramp takes about this many round trips.
	startupRoundTrips = 16.0
	// peakDecayPerPermit: the remembered peak of permits decays one permit per this many ns.
	peakDecayPerPermit = 3e9
	// experimentTau: time constant (ns) of the experiment counts.
	experimentTau = 600e9
	// minExperiments: experiments needed before their failure fraction is trusted at all.
	minExperiments = 30.0
	// zConfidence of the test "failures at minimal concurrency exceed the set point".
	zConfidence = 2.0
	// floorWindow: outcomes in the moving average of the failure fraction.
	floorWindow = 1000.0
	// adopt: a floor is adopted only above this multiple of the set point.
	adopt = 1.5
)

// SetPoint is the set-point integrator with probing, slow start, a startup ramp and
// failure-floor learning (the default controller). See the Rust worker's
// controller::SetPoint and docs/algorithms.md for the reasoning; this is a faithful port.
//
// State: an integrator x in [-credit, 1]; the backoff factor is max(0, x). A dependency
// failure moves x up by 1/N, a success down by s/((1-s)N), a message failure not at all.
// Permits are floor(maxPermits·(1 − backoff)); at 0 the controller probes one message at a
// time on a doubling, jittered interval, and a successful probe slow-starts from 2 permits.
type SetPoint struct {
	settings    Settings
	x, up, down float64
	mode        Mode
	probe       probeSchedule
	probeArmed  bool
	ssthresh    uint32
	peak        float64
	peakAt      optNanos
	brake       *Brake
	window      float64
	expN        float64
	expFail     float64
	expAt       optNanos
	fAvg        float64
	floor       float64
}

// NewSetPoint is a controller at zero backoff, starting up; seed seeds the probe jitter.
func NewSetPoint(settings Settings, seed uint64) *SetPoint {
	settings = settings.Sanitized()
	c := &SetPoint{
		// Start with the full credit: a fresh worker is assumed healthy.
		x:        -settings.Credit,
		mode:     ModeNormal,
		probe:    newProbeSchedule(settings.ProbeInitial, settings.ProbeMax, seed),
		ssthresh: 2,
		peak:     float64(settings.MaxPermits),
		settings: settings,
	}
	c.setSteps()
	if initial := c.settings.InitialPermits; initial > 0 && initial < c.settings.MaxPermits {
		c.mode = ModeStarting
		c.window = float64(initial)
	}
	return c
}

// StartupWindow is the startup window's permits (maxPermits once started).
func (c *SetPoint) StartupWindow() uint32 {
	if c.mode == ModeStarting {
		return min(max(toU32(math.Floor(c.window)), 1), c.settings.MaxPermits)
	}
	return c.settings.MaxPermits
}

func (c *SetPoint) controlledLimit() uint32 { return min(c.ownLimit(), c.StartupWindow()) }

func (c *SetPoint) recordStarting(now Nanos, outcome Outcome) {
	s := c.EffectiveSetPoint()
	gain := float64(c.settings.MaxPermits) / startupRoundTrips / c.window
	switch outcome {
	case Success:
		c.window += gain
	case DependencyFailure:
		c.window = fmax(c.window-float64(float64(gain*(1.0-s))/s), 1.0)
	default:
		return
	}
	c.integrate(outcome)
	if c.ownLimit() == 0 {
		c.enterProbing(now)
	} else {
		c.finishStartingIfDone(now)
	}
}

func (c *SetPoint) finishStartingIfDone(now Nanos) {
	if c.mode == ModeStarting && c.window >= float64(c.ownLimit()) {
		c.mode = ModeNormal
		c.trackPeak(now, c.ownLimit())
	}
}

// SetBackoff sets the backoff factor directly (carrying state over from another controller).
func (c *SetPoint) SetBackoff(now Nanos, backoff float64) {
	c.x = clamp01(backoff)
	c.mode = ModeNormal
	c.settle(now)
}

// Integrator is the integrator state, which may be negative (credit).
func (c *SetPoint) Integrator() float64 { return c.x }

// Ssthresh is the slow-start threshold set when full backoff was last entered.
func (c *SetPoint) Ssthresh() uint32 { return c.ssthresh }

// ProbeInterval is the current probe interval (before jitter).
func (c *SetPoint) ProbeInterval() Nanos { return c.probe.interval }

// EffectiveSetPoint is the set point the integrator runs with: f0 + s·(1 − f0).
func (c *SetPoint) EffectiveSetPoint() float64 {
	s := c.settings.SetPoint
	return c.floor + float64(s*(1.0-c.floor))
}

// learn updates the experiment counts, the moving average and the floor with one outcome
// recorded in mode (before the outcome changes the mode).
func (c *SetPoint) learn(now Nanos, mode Mode, outcome Outcome) {
	var failed float64
	switch outcome {
	case Success:
		failed = 0
	case DependencyFailure:
		failed = 1
	default:
		return
	}
	c.fAvg += (failed - c.fAvg) / floorWindow
	if c.expAt.ok {
		decay := math.Exp(-float64(now.Sub(c.expAt.t)) / experimentTau)
		c.expN *= decay
		c.expFail *= decay
	}
	c.expAt = some(now)
	startingLow := mode == ModeStarting && c.window <= fmax(float64(c.settings.MaxPermits)/4.0, 2.0)
	if mode == ModeProbing || mode == ModeSlowStart || startingLow {
		c.expN += 1.0
		c.expFail += failed
	}
	s := c.settings.SetPoint
	mx := c.settings.FloorMax
	fExp := 0.0
	if c.expN > 0 {
		fExp = c.expFail / c.expN
	}
	significant := c.expN >= minExperiments &&
		fExp-float64(zConfidence*math.Sqrt(float64(fExp*(1.0-fExp))/c.expN)) > s &&
		fExp <= mx
	candidate := fmin(fmin(fExp, c.fAvg), mx)
	floor := 0.0
	if (c.floor > 0 && candidate > s) || (significant && candidate > float64(adopt*s)) {
		floor = candidate
	}
	if floor != c.floor {
		c.floor = floor
		c.setSteps()
	}
}

func (c *SetPoint) setSteps() {
	s := c.EffectiveSetPoint()
	n := float64(c.settings.Reaction)
	c.up = 1.0 / n
	c.down = s / float64((1.0-s)*n)
}

func (c *SetPoint) ownLimit() uint32 { return limitFor(c.settings.MaxPermits, c.x) }

func (c *SetPoint) integrate(outcome Outcome) {
	switch outcome {
	case Success:
		c.x = snap(fmax(c.x-c.down, -c.settings.Credit))
	case DependencyFailure:
		c.x = snap(fmin(c.x+c.up, 1.0))
	}
}

// settle enters or leaves full backoff according to the integrator.
func (c *SetPoint) settle(now Nanos) {
	limit := c.ownLimit()
	if limit == 0 {
		if c.mode != ModeProbing {
			c.enterProbing(now)
		}
	} else if c.mode == ModeProbing {
		c.mode = ModeNormal
		c.probeArmed = false
	}
	if c.mode == ModeNormal {
		c.trackPeak(now, limit)
	}
}

func (c *SetPoint) enterProbing(now Nanos) {
	c.trackPeak(now, 0)
	half := toU32(math.Floor(c.peak / 2.0))
	c.ssthresh = min(max(half, 2), max(c.settings.MaxPermits, 2))
	c.mode = ModeProbing
	c.probeArmed = false
	c.x = 1.0
	c.probe.start(now)
}

func (c *SetPoint) trackPeak(now Nanos, limit uint32) {
	elapsed := 0.0
	if c.peakAt.ok {
		elapsed = float64(now.Sub(c.peakAt.t))
	}
	decayed := c.peak - elapsed/peakDecayPerPermit
	c.peak = fmax(decayed, float64(limit))
	c.peakAt = some(now)
}

func (c *SetPoint) probeSucceeded(now Nanos) {
	p := float64(c.settings.MaxPermits)
	c.x = fmax(fmin(c.x, 1.0-2.0/p), 0.0)
	c.probe.reset(now)
	c.mode = ModeSlowStart
	c.leaveSlowStartIfDone(now)
}

func (c *SetPoint) probeFailed(now Nanos) {
	c.x = 1.0
	c.probe.failed(now)
}

func (c *SetPoint) leaveSlowStartIfDone(now Nanos) {
	if c.ownLimit() >= min(c.ssthresh, c.settings.MaxPermits) {
		c.mode = ModeNormal
		c.trackPeak(now, c.ownLimit())
	}
}

// Algorithm implements Controller.
func (c *SetPoint) Algorithm() Algorithm { return AlgorithmSetPoint }

// Settings implements Controller.
func (c *SetPoint) Settings() Settings { return c.settings }

// Record implements Controller.
func (c *SetPoint) Record(now Nanos, outcome Outcome) {
	if c.settings.FloorMax > 0 {
		c.learn(now, c.mode, outcome)
	}
	switch {
	case c.mode == ModeProbing && c.probeArmed:
		c.probeArmed = false
		switch outcome {
		case Success:
			c.probeSucceeded(now)
		case DependencyFailure:
			c.probeFailed(now)
		case MessageFailure:
			// The dependency was not exercised: another probe may go out now.
			c.probe.allowNow(now)
		}
	case c.mode == ModeStarting:
		c.recordStarting(now, outcome)
	case c.mode == ModeSlowStart:
		switch outcome {
		case Success:
			p := float64(c.settings.MaxPermits)
			c.x = fmax(c.x-1.0/p, 0.0)
			c.leaveSlowStartIfDone(now)
		case DependencyFailure:
			c.mode = ModeNormal
			c.integrate(outcome)
			c.settle(now)
		}
	default:
		// Normal, or a late outcome of a message taken before full backoff.
		c.integrate(outcome)
		c.settle(now)
	}
}

// Permits implements Controller.
func (c *SetPoint) Permits(now Nanos, inFlight uint32) uint32 {
	cap := brakeCap(c.brake, c.settings.MaxPermits, now)
	if c.mode == ModeProbing {
		if cap == 0 || inFlight > 0 || c.settings.HealthCheckProbes || !c.probe.due(now) {
			return 0
		}
		// Stateless grant: if the poll comes back empty the grant is simply available again;
		// probeArmed only tells the next outcome it is a probe.
		c.probeArmed = true
		return 1
	}
	return satSubU32(min(c.controlledLimit(), cap), inFlight)
}

// ReleaseUnused implements Controller.
func (c *SetPoint) ReleaseUnused(_ Nanos, unused uint32) {
	if unused > 0 && c.mode == ModeProbing {
		c.probeArmed = false
	}
}

// Limit implements Controller.
func (c *SetPoint) Limit(now Nanos) uint32 {
	return min(c.controlledLimit(), brakeCap(c.brake, c.settings.MaxPermits, now))
}

// Backoff implements Controller.
func (c *SetPoint) Backoff(now Nanos) float64 {
	own := clamp01(c.x)
	if c.brake != nil {
		if level, ok := c.brake.Active(now); ok {
			return fmax(own, level)
		}
	}
	return own
}

// Mode implements Controller.
func (c *SetPoint) Mode() Mode { return c.mode }

// FailureFloor implements Controller: the learned failure floor f0.
func (c *SetPoint) FailureFloor() float64 { return c.floor }

// FloorEstimate implements Controller.
func (c *SetPoint) FloorEstimate() (float64, bool) {
	if c.floor > 0 {
		return c.floor, true
	}
	if c.settings.FloorMax <= 0 || c.expN < minExperiments {
		return 0, false
	}
	// No floor, and the experiments say so conclusively: failures at minimal concurrency are
	// clearly under the adoption threshold, or above the highest floor (an outage).
	f := c.expFail / c.expN
	sigma := math.Sqrt(float64(f*(1.0-f)) / c.expN)
	under := f+float64(zConfidence*sigma) <= float64(adopt*c.settings.SetPoint)
	outage := f-float64(zConfidence*sigma) > c.settings.FloorMax
	if under || outage {
		return 0, true
	}
	return 0, false
}

// Reconfigure implements Controller.
func (c *SetPoint) Reconfigure(now Nanos, settings Settings) {
	settings = settings.Sanitized()
	c.probe.setBounds(settings.ProbeInitial, settings.ProbeMax)
	c.settings = settings
	c.x = fmax(c.x, -c.settings.Credit)
	c.floor = fmin(c.floor, c.settings.FloorMax)
	if c.floor <= c.settings.SetPoint {
		c.floor = 0
	}
	c.setSteps()
	c.peak = fmin(c.peak, float64(c.settings.MaxPermits))
	c.settle(now)
	c.finishStartingIfDone(now)
}

// SetBrake implements Controller.
func (c *SetPoint) SetBrake(brake *Brake) { c.brake = copyBrake(brake) }

// NextChange implements Controller.
func (c *SetPoint) NextChange(now Nanos) (Nanos, bool) {
	var probe, brake optNanos
	if c.mode == ModeProbing && !c.probe.due(now) {
		probe = some(c.probe.nextAt)
	}
	if c.brake != nil {
		brake = c.brake.nextChange(now, c.settings.MaxPermits)
	}
	n := earliest(probe, brake)
	return n.t, n.ok
}

// HealthCheckDue implements Controller.
func (c *SetPoint) HealthCheckDue(now Nanos) bool {
	if c.settings.HealthCheckProbes && c.mode == ModeProbing && c.probe.due(now) {
		// Schedule the next check now, so a lost result can never stall probing.
		c.probe.hold(now)
		return true
	}
	return false
}

// StartFrom implements Controller.
func (c *SetPoint) StartFrom(now Nanos, backoff float64) { c.SetBackoff(now, backoff) }

// RecordHealthCheck implements Controller.
func (c *SetPoint) RecordHealthCheck(now Nanos, healthy bool) {
	if c.mode != ModeProbing {
		return
	}
	if healthy {
		c.probeSucceeded(now)
	} else {
		c.probeFailed(now)
	}
}

// snap rounds values within 1e-12 of 0 to exactly 0, so that sums of steps that should cancel
// do cancel despite rounding.
func snap(x float64) float64 {
	if math.Abs(x) < 1e-12 {
		return 0
	}
	return x
}

func copyBrake(b *Brake) *Brake {
	if b == nil {
		return nil
	}
	c := *b
	return &c
}
