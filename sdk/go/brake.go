package backpressure

import "math"

// Fall is a brake level falling linearly: from From, starting at Start.
type Fall struct {
	From  float64
	Start Nanos
}

// Brake is the operator's emergency brake in controller time: a minimum backoff, optionally
// until a moment, and how it lifts.
//
// A brake that ends (its expiry passes, or a push lowers or removes it) does not return the
// worker to full permits in one step: its level falls linearly to the new one, by 1 per
// Release, and each pod starts its fall after its own random Offset in [0, Release/2). Permits
// follow the level (floor(maxPermits·(1 − level))); the controller's own backoff still applies
// on top. Release 0 lifts in one step. A full brake (MinBackoff 1) stops everything, probes
// included.
type Brake struct {
	// MinBackoff is the minimum backoff in [0, 1].
	MinBackoff float64
	// Until: the brake lifts itself at this time, if HasUntil.
	Until    Nanos
	HasUntil bool
	// Release is how long a full brake takes to lift; 0 lifts at once.
	Release Nanos
	// Offset is this pod's delay before its level starts to fall.
	Offset Nanos
	// Lift is an earlier, higher level still falling, if HasLift.
	Lift    Fall
	HasLift bool
}

// BrakeFromWire converts the wire brake (whose expiry is Unix seconds) to controller time,
// given the current time in both clocks. An expiry already in the past gives an inactive
// brake. It lifts at once (see SucceedBrake for a gentle lift).
func BrakeFromWire(b *BrakeConfig, now Nanos, nowUnix int64) Brake {
	out := Brake{MinBackoff: clamp01(b.MinBackoff)}
	if b.ExpiresAtUnix != nil {
		ahead := satSubI64(*b.ExpiresAtUnix, nowUnix)
		out.HasUntil = true
		if ahead <= 0 {
			out.Until = now
		} else {
			out.Until = now.Add(NanosFromSecs(uint64(ahead)))
		}
	}
	return out
}

func satSubI64(a, b int64) int64 {
	d := a - b
	// Overflow when the operands' signs differ and the result's sign differs from a's.
	if (a >= 0) != (b >= 0) && (d >= 0) != (a >= 0) {
		if a >= 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	}
	return d
}

// SucceedBrake is the brake that follows old (nil: none) when next is pushed (nil: removed)
// at now, lifting gently over release with this pod's offset: if the new level is below the
// old one, the old level falls to it from now + offset; a fall already under way goes on.
// ok is false when nothing is left to apply.
func SucceedBrake(old *Brake, next *Brake, now, release, offset Nanos) (Brake, bool) {
	var b Brake
	if next != nil {
		b = *next
	}
	b.Release = release
	b.Offset = offset
	b.HasLift = false
	b.Lift = Fall{}
	newLevel, ok := b.steady(now)
	if !ok {
		newLevel = 0
	}
	if old != nil {
		oldLevel, ok := old.Active(now)
		if !ok {
			oldLevel = 0
		}
		if oldLevel > newLevel {
			oldSteady, ok := old.steady(now)
			if !ok {
				oldSteady = 0
			}
			if oldSteady > newLevel {
				// The old brake itself was in force and now drops.
				b.Lift, b.HasLift = Fall{oldLevel, now.Add(offset)}, true
			} else {
				// A fall under way (an earlier drop, or the old expiry): it goes on. Rust's
				// max_by keeps the last of equal maxima.
				var cands []Fall
				if old.HasLift {
					cands = append(cands, old.Lift)
				}
				if f, ok := old.expiryFall(); ok {
					cands = append(cands, f)
				}
				for i, f := range cands {
					if i == 0 || totalCmp(old.fall(f, now), old.fall(b.Lift, now)) >= 0 {
						b.Lift, b.HasLift = f, true
					}
				}
			}
		}
	}
	empty := b.MinBackoff <= 0 && !b.HasUntil && !b.HasLift
	return b, !empty
}

// steady is the level of the brake itself (without any fall): MinBackoff until it expires.
func (b *Brake) steady(now Nanos) (float64, bool) {
	if b.HasUntil && now >= b.Until {
		return 0, false
	}
	return clamp01(b.MinBackoff), true
}

// expiryFall is the expired brake's own fall.
func (b *Brake) expiryFall() (Fall, bool) {
	if !b.HasUntil {
		return Fall{}, false
	}
	return Fall{clamp01(b.MinBackoff), b.Until.Add(b.Offset)}, true
}

// fall is the level of a fall at now.
func (b *Brake) fall(f Fall, now Nanos) float64 {
	if now < f.Start {
		return f.From
	}
	if b.Release == 0 {
		return 0
	}
	return f.From - now.Sub(f.Start).Seconds()/b.Release.Seconds()
}

// Active is the minimum backoff in force at now, if any: the brake's level, or the level of a
// brake still lifting.
func (b *Brake) Active(now Nanos) (float64, bool) {
	level, have := 0.0, false
	add := func(x float64) {
		if have {
			level = fmax(level, x)
		} else {
			level, have = x, true
		}
	}
	if s, ok := b.steady(now); ok {
		add(s)
	}
	if b.HasUntil && now >= b.Until {
		if f, ok := b.expiryFall(); ok {
			add(b.fall(f, now))
		}
	}
	if b.HasLift {
		add(b.fall(b.Lift, now))
	}
	if !have || !(level > 0) {
		return 0, false
	}
	return clamp01(level), true
}

// NextChange is the next time after now at which the permits cap may rise without a new
// outcome: the expiry, the start of a fall, or (while falling) when the level has fallen by
// one permit of maxPermits.
func (b *Brake) NextChange(now Nanos, maxPermits uint32) (Nanos, bool) {
	n := b.nextChange(now, maxPermits)
	return n.t, n.ok
}

func (b *Brake) nextChange(now Nanos, maxPermits uint32) optNanos {
	var next optNanos
	if b.HasUntil && b.Until > now {
		next = some(b.Until)
	}
	var falls []Fall
	if b.HasLift {
		falls = append(falls, b.Lift)
	}
	if f, ok := b.expiryFall(); ok {
		falls = append(falls, f)
	}
	for _, f := range falls {
		if f.Start > now {
			next = earliest(next, some(f.Start))
		} else if b.fall(f, now) > 0 && b.Release > 0 {
			step := uint64(b.Release) / uint64(max(maxPermits, 1))
			next = earliest(next, some(now.Add(Nanos(max(step, 1_000_000)))))
		}
	}
	return next
}

// totalCmp is Rust's f64::total_cmp.
func totalCmp(a, b float64) int {
	ka, kb := int64(math.Float64bits(a)), int64(math.Float64bits(b))
	ka ^= int64(uint64(ka>>63) >> 1)
	kb ^= int64(uint64(kb>>63) >> 1)
	switch {
	case ka < kb:
		return -1
	case ka > kb:
		return 1
	}
	return 0
}
