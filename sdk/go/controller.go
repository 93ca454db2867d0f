package backpressure

import (
	"fmt"
	"math"
	"time"
)

// Nanos is a monotonic timestamp in nanoseconds since an epoch chosen by the caller (the
// process start for a worker, zero for a simulation), or a span of nanoseconds. Arithmetic on
// it saturates, as in the Rust worker.
type Nanos uint64

// NanosFromSecs is s seconds (saturating).
func NanosFromSecs(s uint64) Nanos { return Nanos(satMul(s, 1_000_000_000)) }

// NanosFromMillis is ms milliseconds (saturating).
func NanosFromMillis(ms uint64) Nanos { return Nanos(satMul(ms, 1_000_000)) }

// NanosFromDuration converts a duration (negative ones are 0).
func NanosFromDuration(d time.Duration) Nanos {
	if d < 0 {
		return 0
	}
	return Nanos(d)
}

// Add is n + d, saturating at the largest value.
func (n Nanos) Add(d Nanos) Nanos {
	s := n + d
	if s < n {
		return Nanos(math.MaxUint64)
	}
	return s
}

// Sub is n - earlier, or 0 if earlier is later.
func (n Nanos) Sub(earlier Nanos) Nanos {
	if earlier > n {
		return 0
	}
	return n - earlier
}

// Seconds is n in seconds as a float.
func (n Nanos) Seconds() float64 { return float64(n) / 1e9 }

// Duration is n as a time.Duration (saturating).
func (n Nanos) Duration() time.Duration {
	if n > math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(n)
}

func satMul(a, b uint64) uint64 {
	if a != 0 && b > math.MaxUint64/a {
		return math.MaxUint64
	}
	return a * b
}

// Outcome is the outcome of processing one message.
type Outcome int

const (
	// Success: processed successfully.
	Success Outcome = iota
	// DependencyFailure: failed because of a dependency or overload (timeouts, 429/503,
	// throttling, connection errors). The only outcome that drives backoff up.
	DependencyFailure
	// MessageFailure: failed because of the message itself (validation, poison message, a
	// 4xx). Never drives backoff: the dependency answered.
	MessageFailure
)

// Outcomes lists every outcome, in the order of the wire contract's classes.
var Outcomes = [3]Outcome{Success, DependencyFailure, MessageFailure}

// Class is the `class` label value of the wire contract.
func (o Outcome) Class() string {
	switch o {
	case Success:
		return ClassSuccess
	case DependencyFailure:
		return ClassDependencyFailure
	case MessageFailure:
		return ClassMessageFailure
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

func (o Outcome) String() string { return o.Class() }

// ParseOutcome parses a class name (success, dependency_failure, message_failure).
func ParseOutcome(s string) (Outcome, error) {
	for _, o := range Outcomes {
		if o.Class() == s {
			return o, nil
		}
	}
	return 0, fmt.Errorf("unknown outcome %q", s)
}

// Mode is what a controller is doing.
type Mode int

const (
	// ModeNormal: permits follow the backoff factor.
	ModeNormal Mode = iota
	// ModeProbing: fully backed off; one probe at a time on a growing, jittered interval.
	ModeProbing
	// ModeSlowStart: a probe succeeded; permits grow by one per success up to the slow-start
	// threshold.
	ModeSlowStart
	// ModeStarting: a freshly built controller ramps its permits up from
	// Settings.InitialPermits instead of starting at maxPermits. Not a backoff.
	ModeStarting
)

// String is the stable lower-case name (normal, probing, slow_start, starting).
func (m Mode) String() string {
	switch m {
	case ModeNormal:
		return "normal"
	case ModeProbing:
		return "probing"
	case ModeSlowStart:
		return "slow_start"
	case ModeStarting:
		return "starting"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Algorithm names a controller, as in the CRD and the payload.
type Algorithm string

const (
	// AlgorithmSetPoint is the set-point integrator with probing and slow start (default).
	AlgorithmSetPoint Algorithm = "SetPoint"
	// AlgorithmRatioThrottle is Google SRE client-side throttling with K = 1/(1 - setPoint).
	AlgorithmRatioThrottle Algorithm = "RatioThrottle"
	// AlgorithmFixed is a fixed number of permits, honouring the brake.
	AlgorithmFixed Algorithm = "Fixed"
	// AlgorithmOff is no throttling: maxPermits always, the brake ignored.
	AlgorithmOff Algorithm = "Off"
)

func (a Algorithm) valid() bool {
	switch a {
	case AlgorithmSetPoint, AlgorithmRatioThrottle, AlgorithmFixed, AlgorithmOff:
		return true
	}
	return false
}

// Controller turns message outcomes into a backoff factor and permits. It is plain,
// synchronous, deterministic state and not safe for concurrent use: [Gate] serializes access.
//
// The calling protocol of a worker:
//  1. before each poll, Permits(now, inFlight) where inFlight counts messages being processed
//     and permits handed out for polls that have not returned yet;
//  2. after a poll, ReleaseUnused(now, k) for the k permits the poll did not use (an empty
//     poll is not a probe result);
//  3. after each processed message, Record(now, outcome).
type Controller interface {
	// Algorithm is the algorithm implemented.
	Algorithm() Algorithm
	// Settings are the settings in force.
	Settings() Settings
	// Record records the outcome of one processed message.
	Record(now Nanos, outcome Outcome)
	// Permits is how many more messages may be taken now, given inFlight messages being
	// processed or polled for.
	Permits(now Nanos, inFlight uint32) uint32
	// ReleaseUnused returns unused permits of the last grant that no message came back for.
	ReleaseUnused(now Nanos, unused uint32)
	// Limit is the total concurrency allowed now (the permits gauge); 0 when fully backed off.
	Limit(now Nanos) uint32
	// Backoff is the backoff factor in [0, 1] (including an active brake).
	Backoff(now Nanos) float64
	// Mode is the current mode.
	Mode() Mode
	// FailureFloor is the dependency-failure fraction this controller found not to respond to
	// its concurrency and does not throttle for; 0 for controllers that do not learn one.
	FailureFloor() float64
	// FloorEstimate is what the controller knows about its failure floor: ok is false while it
	// has not tested it (exported as NaN).
	FloorEstimate() (floor float64, ok bool)
	// Reconfigure applies new settings of the same algorithm, keeping the backoff state.
	Reconfigure(now Nanos, settings Settings)
	// SetBrake sets (a copy of *brake) or clears (nil) the operator's brake.
	SetBrake(brake *Brake)
	// NextChange is the earliest future time at which Permits may grant more without a new
	// outcome (a probe coming due, a brake expiring or lifting), if any.
	NextChange(now Nanos) (Nanos, bool)
	// HealthCheckDue says, with Settings.HealthCheckProbes, whether a health check should run
	// now instead of a message probe; true schedules the next one.
	HealthCheckDue(now Nanos) bool
	// StartFrom starts from a backoff carried over from a previous controller (when the
	// algorithm changes at runtime). Controllers that derive their backoff from a window
	// ignore it.
	StartFrom(now Nanos, backoff float64)
	// RecordHealthCheck reports the result of a health check started after HealthCheckDue.
	RecordHealthCheck(now Nanos, healthy bool)
}

// Settings are the knobs of every controller: the WorkerConfig fields plus library-side
// settings. See the Rust worker's controller::Settings for the full reasoning.
type Settings struct {
	// Algorithm chooses the controller.
	Algorithm Algorithm
	// SetPoint s in (0,1): the dependency-failure fraction treated as background noise.
	SetPoint float64
	// Reaction N: dependency failures that take the backoff from 0 to 1.
	Reaction uint32
	// MaxPermits is the maximum concurrency at zero backoff.
	MaxPermits uint32
	// ProbeInitial is the first probe interval once fully backed off.
	ProbeInitial Nanos
	// ProbeMax: the probe interval doubles after each failed probe up to this.
	ProbeMax Nanos
	// Credit (SetPoint only): headroom below zero backoff, in units of one reaction.
	Credit float64
	// HealthCheckProbes (SetPoint, RatioThrottle): replace message probes with a health check.
	HealthCheckProbes bool
	// RatioWindow (RatioThrottle only): length of the sliding window.
	RatioWindow Nanos
	// InitialPermits (SetPoint only): the permits of a freshly built controller, which ramps
	// up to MaxPermits (0, or at least MaxPermits, starts at MaxPermits).
	InitialPermits uint32
	// BrakeRelease is how long a full brake takes to lift; 0 lifts in one step.
	BrakeRelease Nanos
	// FloorMax (SetPoint only): the highest failure floor the controller may learn; 0 turns
	// the floor off.
	FloorMax float64
	// Redelivery is the redelivery backoff (base, max) of a worker loop; not used by the
	// controllers. HasRedelivery false: plain nacks.
	RedeliveryBase, RedeliveryMax Nanos
	HasRedelivery                 bool
}

// Library defaults (crates/api/src/defaults.rs and the worker's controller module).
const (
	DefaultSetPoint       = 0.05
	DefaultMaxPermits     = 16
	DefaultProbeInitialMs = 2000
	DefaultProbeMaxMs     = 60_000
	// DefaultInitialPermits is the startup ramp's first permits (what the simulator measured).
	DefaultInitialPermits = 2
	// DefaultCredit is Settings.Credit's default.
	DefaultCredit = 1.0
	// DefaultFloorMax is Settings.FloorMax's default.
	DefaultFloorMax = 0.25
	// MaxFloorMax is the largest failure floor accepted.
	MaxFloorMax = 0.9
	// DefaultBrakeRelease is Settings.BrakeRelease's default (60 s).
	DefaultBrakeRelease = Nanos(60_000_000_000)
	// DefaultRatioWindow is Settings.RatioWindow's default (30 s).
	DefaultRatioWindow = Nanos(30_000_000_000)
	// DefaultRedeliveryBase and DefaultRedeliveryMax: 1 min doubling up to 8 min.
	DefaultRedeliveryBase = Nanos(60_000_000_000)
	DefaultRedeliveryMax  = Nanos(480_000_000_000)
	minReaction           = 20
)

// DefaultReaction is the default reaction size for maxPermits: max(20, maxPermits).
func DefaultReaction(maxPermits uint32) uint32 {
	if maxPermits > minReaction {
		return maxPermits
	}
	return minReaction
}

// SettingsFromConfig is the settings of a (validated) wire configuration, with library
// defaults for the rest. Out-of-range values are clamped to the nearest valid one.
func SettingsFromConfig(cfg *WorkerConfig) Settings {
	ms := NanosFromMillis
	s := Settings{
		Algorithm:      cfg.Algorithm,
		SetPoint:       cfg.SetPoint,
		Reaction:       cfg.Reaction,
		MaxPermits:     cfg.MaxPermits,
		ProbeInitial:   ms(cfg.ProbeInitialMs),
		ProbeMax:       ms(cfg.ProbeMaxMs),
		Credit:         DefaultCredit,
		RatioWindow:    DefaultRatioWindow,
		InitialPermits: DefaultInitialPermits,
		BrakeRelease:   DefaultBrakeRelease,
		FloorMax:       DefaultFloorMax,
		RedeliveryBase: DefaultRedeliveryBase,
		RedeliveryMax:  DefaultRedeliveryMax,
		HasRedelivery:  true,
	}
	if cfg.RatioWindowMs != nil {
		s.RatioWindow = ms(*cfg.RatioWindowMs)
	}
	if cfg.InitialPermits != nil {
		s.InitialPermits = *cfg.InitialPermits
	}
	if cfg.BrakeReleaseMs != nil {
		s.BrakeRelease = ms(*cfg.BrakeReleaseMs)
	}
	if cfg.FloorMax != nil {
		s.FloorMax = *cfg.FloorMax
	}
	if r := cfg.Redelivery; r != nil {
		if r.BaseMs == 0 {
			s.HasRedelivery = false
			s.RedeliveryBase, s.RedeliveryMax = 0, 0
		} else {
			s.RedeliveryBase, s.RedeliveryMax = ms(r.BaseMs), ms(r.MaxMs)
		}
	}
	return s.Sanitized()
}

// DefaultSettings are the settings of the default WorkerConfig.
func DefaultSettings() Settings {
	cfg := DefaultWorkerConfig()
	return SettingsFromConfig(&cfg)
}

// Sanitized clamps every field into its valid range (so a controller never divides by zero).
func (s Settings) Sanitized() Settings {
	if !(isFinite(s.SetPoint) && s.SetPoint > 0 && s.SetPoint < 1) {
		if s.SetPoint >= 1 {
			s.SetPoint = 0.99
		} else {
			s.SetPoint = 0.0001
		}
	}
	s.SetPoint = clampF(s.SetPoint, 0.0001, 0.99)
	s.Reaction = max(s.Reaction, 1)
	s.MaxPermits = max(s.MaxPermits, 1)
	s.ProbeInitial = max(s.ProbeInitial, 1)
	s.ProbeMax = max(s.ProbeMax, s.ProbeInitial)
	if !(isFinite(s.Credit) && s.Credit >= 0) {
		s.Credit = 0
	}
	s.RatioWindow = max(s.RatioWindow, 1_000_000)
	if isFinite(s.FloorMax) {
		s.FloorMax = clampF(s.FloorMax, 0, MaxFloorMax)
	} else {
		s.FloorMax = 0
	}
	if !s.HasRedelivery || s.RedeliveryBase == 0 {
		s.HasRedelivery = false
		s.RedeliveryBase, s.RedeliveryMax = 0, 0
	} else {
		s.RedeliveryMax = max(s.RedeliveryMax, s.RedeliveryBase)
	}
	return s
}

// Build builds the controller named by settings.Algorithm; seed seeds the probe jitter.
func Build(settings Settings, seed uint64) Controller {
	settings = settings.Sanitized()
	switch settings.Algorithm {
	case AlgorithmRatioThrottle:
		return NewRatioThrottle(settings, seed)
	case AlgorithmFixed:
		return NewFixed(settings)
	case AlgorithmOff:
		return NewOff(settings)
	default:
		settings.Algorithm = AlgorithmSetPoint
		return NewSetPoint(settings, seed)
	}
}

// FromConfig builds the controller of a wire configuration (without its brake; see
// BrakeFromWire).
func FromConfig(cfg *WorkerConfig, seed uint64) Controller {
	return Build(SettingsFromConfig(cfg), seed)
}

// ApplySettings applies settings to *controller: it reconfigures in place when the algorithm
// is unchanged, otherwise replaces it with a new controller that starts from the old backoff
// (its own, without the brake) where the new algorithm can carry it. The brake is set on the
// result.
func ApplySettings(controller *Controller, now Nanos, settings Settings, seed uint64, brake *Brake) {
	settings = settings.Sanitized()
	c := *controller
	if c.Algorithm() == settings.Algorithm {
		c.Reconfigure(now, settings)
	} else {
		// The old controller's own backoff, without the brake (set again below).
		c.SetBrake(nil)
		previous := c.Backoff(now)
		next := Build(settings, seed)
		next.StartFrom(now, previous)
		*controller = next
	}
	(*controller).SetBrake(brake)
}

// ---- float helpers with Rust's semantics ----

func isFinite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// fmax is Rust's f64::max: NaN is ignored when the other operand is a number.
func fmax(a, b float64) float64 {
	if math.IsNaN(a) {
		return b
	}
	if math.IsNaN(b) {
		return a
	}
	if a > b {
		return a
	}
	if b > a {
		return b
	}
	// Equal (or ±0): Rust returns either; the sign of zero never matters here.
	return a
}

// fmin is Rust's f64::min.
func fmin(a, b float64) float64 {
	if math.IsNaN(a) {
		return b
	}
	if math.IsNaN(b) {
		return a
	}
	if a < b {
		return a
	}
	if b < a {
		return b
	}
	return a
}

// clampF is Rust's f64::clamp (NaN stays NaN).
func clampF(x, lo, hi float64) float64 {
	if x < lo {
		x = lo
	}
	if x > hi {
		x = hi
	}
	return x
}

// clamp01 clamps to [0, 1], mapping NaN to 1 (fail safe: a broken computation backs off).
func clamp01(x float64) float64 {
	if math.IsNaN(x) {
		return 1
	}
	return clampF(x, 0, 1)
}

// toU32 is Rust's saturating `as u32` of a float (NaN is 0).
func toU32(x float64) uint32 {
	if math.IsNaN(x) || x <= 0 {
		return 0
	}
	if x >= math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(x)
}

// toU64 is Rust's saturating `as u64` of a float (NaN is 0).
func toU64(x float64) uint64 {
	if math.IsNaN(x) || x <= 0 {
		return 0
	}
	if x >= 18446744073709551615.0 {
		return math.MaxUint64
	}
	return uint64(x)
}

func satSubU32(a, b uint32) uint32 {
	if b > a {
		return 0
	}
	return a - b
}

// limitFor is the permits for a backoff: floor(max * (1 - b)), with a small tolerance so that
// b = 1 - k/max gives exactly k.
func limitFor(maxPermits uint32, backoff float64) uint32 {
	raw := float64(float64(maxPermits)*(1.0-clamp01(backoff))) + 1e-9
	return min(toU32(math.Floor(raw)), maxPermits)
}

// brakeCap is the permits cap of an active brake (maxPermits without one).
func brakeCap(brake *Brake, maxPermits uint32, now Nanos) uint32 {
	if brake != nil {
		if level, ok := brake.Active(now); ok {
			return limitFor(maxPermits, level)
		}
	}
	return maxPermits
}

// optNanos is an optional time.
type optNanos struct {
	t  Nanos
	ok bool
}

func some(t Nanos) optNanos { return optNanos{t, true} }

func earliest(a, b optNanos) optNanos {
	switch {
	case a.ok && b.ok:
		return some(min(a.t, b.t))
	case a.ok:
		return a
	default:
		return b
	}
}

// SplitMix64 is a tiny, seedable generator (bit-exact with the Rust worker's): the probe
// jitter of every controller.
type SplitMix64 struct{ state uint64 }

// NewSplitMix64 seeds a generator.
func NewSplitMix64(seed uint64) *SplitMix64 { return &SplitMix64{seed} }

// NextU64 is the next 64-bit output.
func (r *SplitMix64) NextU64() uint64 {
	r.state += 0x9E3779B97F4A7C15
	z := r.state
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// NextF64 is uniform in [0, 1).
func (r *SplitMix64) NextF64() float64 {
	return float64(r.NextU64()>>11) / float64(uint64(1)<<53)
}
