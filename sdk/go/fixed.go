package backpressure

// Fixed is always maxPermits, except under the operator's brake. Backoff is 0 (or the brake).
type Fixed struct {
	settings Settings
	brake    *Brake
}

// NewFixed is a fixed controller.
func NewFixed(settings Settings) *Fixed { return &Fixed{settings: settings.Sanitized()} }

// Algorithm implements Controller.
func (c *Fixed) Algorithm() Algorithm { return AlgorithmFixed }

// Settings implements Controller.
func (c *Fixed) Settings() Settings { return c.settings }

// Record implements Controller (outcomes change nothing).
func (c *Fixed) Record(Nanos, Outcome) {}

// Permits implements Controller.
func (c *Fixed) Permits(now Nanos, inFlight uint32) uint32 {
	return satSubU32(c.Limit(now), inFlight)
}

// ReleaseUnused implements Controller.
func (c *Fixed) ReleaseUnused(Nanos, uint32) {}

// Limit implements Controller.
func (c *Fixed) Limit(now Nanos) uint32 { return brakeCap(c.brake, c.settings.MaxPermits, now) }

// Backoff implements Controller.
func (c *Fixed) Backoff(now Nanos) float64 {
	if c.brake != nil {
		if level, ok := c.brake.Active(now); ok {
			return level
		}
	}
	return 0
}

// Mode implements Controller.
func (c *Fixed) Mode() Mode { return ModeNormal }

// FailureFloor implements Controller.
func (c *Fixed) FailureFloor() float64 { return 0 }

// FloorEstimate implements Controller.
func (c *Fixed) FloorEstimate() (float64, bool) { return 0, false }

// Reconfigure implements Controller.
func (c *Fixed) Reconfigure(_ Nanos, settings Settings) { c.settings = settings.Sanitized() }

// SetBrake implements Controller.
func (c *Fixed) SetBrake(brake *Brake) { c.brake = copyBrake(brake) }

// NextChange implements Controller.
func (c *Fixed) NextChange(now Nanos) (Nanos, bool) {
	if c.brake == nil {
		return 0, false
	}
	return c.brake.NextChange(now, c.settings.MaxPermits)
}

// HealthCheckDue implements Controller.
func (c *Fixed) HealthCheckDue(Nanos) bool { return false }

// StartFrom implements Controller.
func (c *Fixed) StartFrom(Nanos, float64) {}

// RecordHealthCheck implements Controller.
func (c *Fixed) RecordHealthCheck(Nanos, bool) {}

// Off is backpressure switched off: always maxPermits, backoff always 0, the brake ignored.
type Off struct {
	settings Settings
}

// NewOff is a pass-through controller.
func NewOff(settings Settings) *Off { return &Off{settings: settings.Sanitized()} }

// Algorithm implements Controller.
func (c *Off) Algorithm() Algorithm { return AlgorithmOff }

// Settings implements Controller.
func (c *Off) Settings() Settings { return c.settings }

// Record implements Controller.
func (c *Off) Record(Nanos, Outcome) {}

// Permits implements Controller.
func (c *Off) Permits(_ Nanos, inFlight uint32) uint32 {
	return satSubU32(c.settings.MaxPermits, inFlight)
}

// ReleaseUnused implements Controller.
func (c *Off) ReleaseUnused(Nanos, uint32) {}

// Limit implements Controller.
func (c *Off) Limit(Nanos) uint32 { return c.settings.MaxPermits }

// Backoff implements Controller.
func (c *Off) Backoff(Nanos) float64 { return 0 }

// Mode implements Controller.
func (c *Off) Mode() Mode { return ModeNormal }

// FailureFloor implements Controller.
func (c *Off) FailureFloor() float64 { return 0 }

// FloorEstimate implements Controller.
func (c *Off) FloorEstimate() (float64, bool) { return 0, false }

// Reconfigure implements Controller.
func (c *Off) Reconfigure(_ Nanos, settings Settings) { c.settings = settings.Sanitized() }

// SetBrake implements Controller (ignored).
func (c *Off) SetBrake(*Brake) {}

// NextChange implements Controller.
func (c *Off) NextChange(Nanos) (Nanos, bool) { return 0, false }

// HealthCheckDue implements Controller.
func (c *Off) HealthCheckDue(Nanos) bool { return false }

// StartFrom implements Controller.
func (c *Off) StartFrom(Nanos, float64) {}

// RecordHealthCheck implements Controller.
func (c *Off) RecordHealthCheck(Nanos, bool) {}
