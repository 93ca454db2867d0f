package backpressure

const (
	// ratioBins is the number of bins of the sliding window.
	ratioBins = 30
	// ratioPadding pads the denominator (the SRE book's +1).
	ratioPadding = 1.0
)

type ratioBin struct {
	epoch             uint64
	requests, accepts float64
}

// RatioThrottle is client-side throttling from the Google SRE book ("Handling Overload"):
// backoff = max(0, (requests − K·accepts) / (requests + 1)) over a sliding window, with
// K = 1/(1 − s). Each attempt is counted with weight 1/(1 − backoff) (at most maxPermits).
// When permits reach 0 it probes like SetPoint; a successful probe clears the window and
// slow-starts from 2 permits. A faithful port of the Rust worker's controller::RatioThrottle.
type RatioThrottle struct {
	settings          Settings
	k                 float64
	binWidth          uint64
	bins              [ratioBins]ratioBin
	requests, accepts float64
	currentEpoch      uint64
	backoff           float64
	mode              Mode
	slowStartLimit    uint32
	probe             probeSchedule
	probeArmed        bool
	brake             *Brake
}

// NewRatioThrottle is a controller with an empty window; seed seeds the probe jitter.
func NewRatioThrottle(settings Settings, seed uint64) *RatioThrottle {
	settings = settings.Sanitized()
	c := &RatioThrottle{
		k:        1,
		binWidth: 1,
		mode:     ModeNormal,
		probe:    newProbeSchedule(settings.ProbeInitial, settings.ProbeMax, seed),
		settings: settings,
	}
	c.setParams()
	return c
}

func (c *RatioThrottle) setParams() {
	c.k = 1.0 / (1.0 - c.settings.SetPoint)
	c.binWidth = max(uint64(c.settings.RatioWindow)/ratioBins, 1)
}

func saturatingSubU64(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// advance moves the window to now, dropping bins that fell out of it.
func (c *RatioThrottle) advance(now Nanos) {
	epoch := uint64(now) / c.binWidth
	if epoch == c.currentEpoch {
		return
	}
	c.currentEpoch = epoch
	oldest := saturatingSubU64(epoch, ratioBins-1)
	requests, accepts := 0.0, 0.0
	for i := range c.bins {
		if c.bins[i].epoch < oldest {
			c.bins[i] = ratioBin{}
		} else {
			requests += c.bins[i].requests
			accepts += c.bins[i].accepts
		}
	}
	c.requests = requests
	c.accepts = accepts
	c.recompute(now)
}

func (c *RatioThrottle) rawBackoff(requests, accepts float64) float64 {
	raw := (requests - float64(c.k*accepts)) / (requests + ratioPadding)
	return clamp01(fmax(raw, 0))
}

func (c *RatioThrottle) recompute(now Nanos) {
	c.backoff = c.rawBackoff(c.requests, c.accepts)
	if c.mode == ModeSlowStart {
		return
	}
	limit := limitFor(c.settings.MaxPermits, c.backoff)
	if limit == 0 {
		if c.mode != ModeProbing {
			c.mode = ModeProbing
			c.probeArmed = false
			c.probe.start(now)
		}
	} else if c.mode == ModeProbing {
		c.mode = ModeNormal
		c.probeArmed = false
	}
}

func (c *RatioThrottle) clearWindow() {
	c.bins = [ratioBins]ratioBin{}
	c.requests = 0
	c.accepts = 0
	c.backoff = 0
}

// backoffAt is the window's backoff at now without moving the window.
func (c *RatioThrottle) backoffAt(now Nanos) float64 {
	epoch := uint64(now) / c.binWidth
	if epoch == c.currentEpoch {
		return c.backoff
	}
	oldest := saturatingSubU64(epoch, ratioBins-1)
	requests, accepts := 0.0, 0.0
	for _, b := range c.bins {
		if b.epoch >= oldest {
			requests += b.requests
			accepts += b.accepts
		}
	}
	return c.rawBackoff(requests, accepts)
}

func (c *RatioThrottle) ownLimit() uint32 { return c.limitWith(c.backoff) }

func (c *RatioThrottle) limitWith(backoff float64) uint32 {
	window := limitFor(c.settings.MaxPermits, backoff)
	if c.mode == ModeSlowStart {
		return min(window, c.slowStartLimit)
	}
	return window
}

func (c *RatioThrottle) probeSucceeded(now Nanos) {
	c.clearWindow()
	c.probe.reset(now)
	c.mode = ModeSlowStart
	c.slowStartLimit = 2
	c.endSlowStartIfDone()
}

func (c *RatioThrottle) endSlowStartIfDone() {
	if c.slowStartLimit >= c.settings.MaxPermits {
		c.mode = ModeNormal
	}
}

func (c *RatioThrottle) add(now Nanos, outcome Outcome) {
	p := float64(c.settings.MaxPermits)
	weight := 1.0
	if c.mode != ModeSlowStart {
		weight = fmin(1.0/fmax(1.0-c.backoff, 1.0/p), p)
	}
	accepted := 1.0
	if outcome == DependencyFailure {
		accepted = 0
	}
	bin := &c.bins[c.currentEpoch%ratioBins]
	if bin.epoch != c.currentEpoch {
		*bin = ratioBin{epoch: c.currentEpoch}
	}
	bin.requests += weight
	bin.accepts += accepted
	c.requests += weight
	c.accepts += accepted
	c.recompute(now)
}

// Algorithm implements Controller.
func (c *RatioThrottle) Algorithm() Algorithm { return AlgorithmRatioThrottle }

// Settings implements Controller.
func (c *RatioThrottle) Settings() Settings { return c.settings }

// Record implements Controller.
func (c *RatioThrottle) Record(now Nanos, outcome Outcome) {
	c.advance(now)
	if c.mode == ModeProbing && c.probeArmed {
		c.probeArmed = false
		switch outcome {
		case Success:
			c.probeSucceeded(now)
			return
		case DependencyFailure:
			c.probe.failed(now)
		case MessageFailure:
			c.probe.allowNow(now)
		}
	}
	if c.mode == ModeSlowStart {
		switch outcome {
		case Success:
			c.slowStartLimit++
			c.endSlowStartIfDone()
		case DependencyFailure:
			c.mode = ModeNormal
		}
	}
	c.add(now, outcome)
}

// Permits implements Controller.
func (c *RatioThrottle) Permits(now Nanos, inFlight uint32) uint32 {
	c.advance(now)
	cap := brakeCap(c.brake, c.settings.MaxPermits, now)
	if c.mode == ModeProbing {
		if cap == 0 || inFlight > 0 || c.settings.HealthCheckProbes || !c.probe.due(now) {
			return 0
		}
		c.probeArmed = true
		return 1
	}
	return satSubU32(min(c.ownLimit(), cap), inFlight)
}

// ReleaseUnused implements Controller.
func (c *RatioThrottle) ReleaseUnused(_ Nanos, unused uint32) {
	if unused > 0 && c.mode == ModeProbing {
		c.probeArmed = false
	}
}

// Limit implements Controller.
func (c *RatioThrottle) Limit(now Nanos) uint32 {
	cap := brakeCap(c.brake, c.settings.MaxPermits, now)
	return min(c.limitWith(c.backoffAt(now)), cap)
}

// Backoff implements Controller.
func (c *RatioThrottle) Backoff(now Nanos) float64 {
	own := c.backoffAt(now)
	if c.brake != nil {
		if level, ok := c.brake.Active(now); ok {
			return fmax(own, level)
		}
	}
	return own
}

// Mode implements Controller.
func (c *RatioThrottle) Mode() Mode { return c.mode }

// FailureFloor implements Controller (RatioThrottle learns none).
func (c *RatioThrottle) FailureFloor() float64 { return 0 }

// FloorEstimate implements Controller (never known).
func (c *RatioThrottle) FloorEstimate() (float64, bool) { return 0, false }

// Reconfigure implements Controller.
func (c *RatioThrottle) Reconfigure(now Nanos, settings Settings) {
	settings = settings.Sanitized()
	widthChanged := settings.RatioWindow != c.settings.RatioWindow
	c.probe.setBounds(settings.ProbeInitial, settings.ProbeMax)
	c.settings = settings
	c.setParams()
	if widthChanged {
		c.clearWindow()
		c.currentEpoch = uint64(now) / c.binWidth
	}
	c.endSlowStartIfDone()
	c.recompute(now)
}

// SetBrake implements Controller.
func (c *RatioThrottle) SetBrake(brake *Brake) { c.brake = copyBrake(brake) }

// NextChange implements Controller.
func (c *RatioThrottle) NextChange(now Nanos) (Nanos, bool) {
	var probe, nextBin, brake optNanos
	if c.mode == ModeProbing && !c.probe.due(now) {
		probe = some(c.probe.nextAt)
	}
	// The window forgets: the start of the next bin may lower the backoff.
	if c.backoff > 0 {
		nextBin = some(Nanos(satMul(uint64(now)/c.binWidth+1, c.binWidth)))
	}
	if c.brake != nil {
		brake = c.brake.nextChange(now, c.settings.MaxPermits)
	}
	n := earliest(earliest(probe, nextBin), brake)
	return n.t, n.ok
}

// HealthCheckDue implements Controller.
func (c *RatioThrottle) HealthCheckDue(now Nanos) bool {
	c.advance(now)
	if c.settings.HealthCheckProbes && c.mode == ModeProbing && c.probe.due(now) {
		c.probe.hold(now)
		return true
	}
	return false
}

// StartFrom implements Controller (the window derives the backoff: ignored).
func (c *RatioThrottle) StartFrom(Nanos, float64) {}

// RecordHealthCheck implements Controller.
func (c *RatioThrottle) RecordHealthCheck(now Nanos, healthy bool) {
	if c.mode != ModeProbing {
		return
	}
	c.advance(now)
	if healthy {
		c.probeSucceeded(now)
	} else {
		c.add(now, DependencyFailure)
		c.probe.failed(now)
	}
}
