package backpressure

// probeSchedule times probes while fully backed off: intervals start at initial, double after
// each failed probe up to max, and each wait is the interval times a jitter factor drawn from
// U[0.5, 1) so that a fleet of workers does not probe in lockstep.
type probeSchedule struct {
	initial, max, interval, nextAt Nanos
	rng                            SplitMix64
}

func newProbeSchedule(initial, max Nanos, seed uint64) probeSchedule {
	return probeSchedule{initial: initial, max: max, interval: initial, rng: SplitMix64{seed}}
}

// start: entering full backoff, the first probe after a jittered initial interval.
func (p *probeSchedule) start(now Nanos) {
	p.interval = p.initial
	p.schedule(now)
}

func (p *probeSchedule) due(now Nanos) bool { return now >= p.nextAt }

// failed: a probe failed; double the interval (up to the maximum) and wait.
func (p *probeSchedule) failed(now Nanos) {
	p.interval = Nanos(min(satMul(uint64(p.interval), 2), uint64(p.max)))
	p.schedule(now)
}

// hold waits one current interval again without growing it (a health check was started).
func (p *probeSchedule) hold(now Nanos) { p.schedule(now) }

// reset: a probe succeeded; allow the next one now and reset the interval.
func (p *probeSchedule) reset(now Nanos) {
	p.interval = p.initial
	p.nextAt = now
}

// allowNow allows the next probe now, keeping the interval.
func (p *probeSchedule) allowNow(now Nanos) { p.nextAt = now }

// setBounds sets new bounds at runtime; the current interval is clamped into them.
func (p *probeSchedule) setBounds(initial, max Nanos) {
	p.initial = initial
	p.max = max
	p.interval = clampU64(p.interval, initial, max)
}

func clampU64[T ~uint64](x, lo, hi T) T {
	// Rust's Ord::clamp (lo <= hi holds: sanitized settings).
	if x < lo {
		return lo
	}
	if x > hi {
		return hi
	}
	return x
}

func (p *probeSchedule) schedule(now Nanos) {
	jitter := 0.5 + float64(0.5*p.rng.NextF64())
	wait := toU64(float64(float64(p.interval) * jitter))
	p.nextAt = now.Add(Nanos(max(wait, 1)))
}
