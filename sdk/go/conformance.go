package backpressure

// The conformance executor: one golden-vector case (conformance/vectors/controller.json,
// format in conformance/README.md) run on a fresh controller, with the readings after every
// step (the Rust worker's conformance module). The admin server answers POST
// ConformanceHookPath with it when started for a conformance run (Admin.WithConformanceHook);
// the golden-vector tests of this package run every case of the file through it too, so the
// step semantics exist once. The controller that serves messages is never touched: each run
// builds its own from the case's config and seed, and the case's times are the only clock.

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Conformance hook limits.
const (
	// ConformanceHookPath is the hook's path on the admin port.
	ConformanceHookPath = "/v1/conformance/controller"
	// MaxConformanceSteps is the most steps one case may have.
	MaxConformanceSteps = 1_000_000
	// MaxConformanceCaseBytes is the largest request body the hook reads (a case of the
	// committed vectors is far smaller).
	MaxConformanceCaseBytes = 16 * 1024 * 1024
)

// StepOp is the call a step makes (`op` in the file).
type StepOp string

// The calls.
const (
	// OpRecord is Record(t, Outcome).
	OpRecord StepOp = "record"
	// OpPermits is Permits(t, InFlight).
	OpPermits StepOp = "permits"
	// OpReleaseUnused is ReleaseUnused(t, Unused).
	OpReleaseUnused StepOp = "releaseUnused"
	// OpConfigure is a new payload (Config, at Unix time UnixS): its brake succeeds the old
	// one, then its settings apply.
	OpConfigure StepOp = "configure"
)

// ConformanceStep is one call at controller time T. Only the fields of its Op are set.
type ConformanceStep struct {
	T        Nanos
	Op       StepOp
	Outcome  Outcome       // OpRecord
	InFlight uint32        // OpPermits
	Unused   uint32        // OpReleaseUnused
	Config   *WorkerConfig // OpConfigure
	UnixS    int64         // OpConfigure
}

// ConformanceCase is one case of the controller vectors: the fields the executor needs
// (name, description and each step's expect are ignored, so a case of the file is read as
// it is).
type ConformanceCase struct {
	// Seed of the controller's generator.
	Seed uint64
	// BrakeOffsetNs is this worker's brake-lift offset, used for every configure step.
	BrakeOffsetNs uint64
	// Config is the payload the controller is built from.
	Config WorkerConfig
	// Steps are the calls, in non-decreasing T.
	Steps []ConformanceStep
}

// Observation is the readings after one step (the fields of a step's expect).
type Observation struct {
	// Permits is what Permits returned (only after a permits step).
	Permits *uint32 `json:"permits,omitempty"`
	// Backoff is Backoff(t).
	Backoff float64 `json:"backoff"`
	// Mode is Mode() by its wire name.
	Mode string `json:"mode"`
	// Limit is Limit(t).
	Limit uint32 `json:"limit"`
	// FailureFloor is FailureFloor().
	FailureFloor float64 `json:"failureFloor"`
	// FloorEstimate is FloorEstimate(), nil (null) when unknown.
	FloorEstimate *float64 `json:"floorEstimate"`
}

// Observations is the hook's answer: one Observation per step.
type Observations struct {
	Observations []Observation `json:"observations"`
}

// CaseError is why a case cannot run: not a case (malformed JSON, unknown op, missing or
// mistyped fields), a payload that does not validate, steps going back in time, too many
// steps. The hook answers 400 with it.
type CaseError struct {
	// Step is the index of the step at fault, -1 for the case as a whole.
	Step int
	// Reason says what is wrong.
	Reason string
	// Err is the underlying error (a ConfigError for an invalid payload), if any.
	Err error
}

func (e *CaseError) Error() string { return e.Reason }

// Unwrap is the underlying error.
func (e *CaseError) Unwrap() error { return e.Err }

func malformedCase(step int, err error) error {
	reason := err.Error()
	if m, ok := err.(*MalformedError); ok {
		reason = m.Reason
	}
	if step >= 0 {
		reason = fmt.Sprintf("steps[%d]: %s", step, reason)
	}
	return &CaseError{Step: step, Reason: "malformed case: " + reason, Err: err}
}

var (
	caseFields = []string{"seed", "brakeOffsetNs", "config", "steps"}
	stepFields = []string{"t", "op", "outcome", "inFlight", "unused", "config", "unixS"}
)

// ParseConformanceCase reads a case from a request body (or a case of controller.json):
// an object with seed, brakeOffsetNs, config and steps (other members are ignored); each step
// an object with t, op and the fields of its op. Payloads are decoded strictly as pushes are,
// but validated only when the case runs.
func ParseConformanceCase(data []byte) (ConformanceCase, error) {
	var c ConformanceCase
	if !utf8.Valid(data) {
		return c, malformedCase(-1, errors.New("invalid UTF-8"))
	}
	m, err := objectIgnoring(data, caseFields)
	if err != nil {
		return c, malformedCase(-1, err)
	}
	for _, name := range caseFields {
		if _, ok := m[name]; !ok {
			return c, malformedCase(-1, fmt.Errorf("missing field `%s`", name))
		}
	}
	if c.Seed, err = parseU64("seed", m["seed"]); err != nil {
		return c, malformedCase(-1, err)
	}
	if c.BrakeOffsetNs, err = parseU64("brakeOffsetNs", m["brakeOffsetNs"]); err != nil {
		return c, malformedCase(-1, err)
	}
	if c.Config, err = decodeWorkerConfig(m["config"]); err != nil {
		return c, malformedCase(-1, fmt.Errorf("config: %w", err))
	}
	var steps []json.RawMessage
	if isNull(m["steps"]) || json.Unmarshal(m["steps"], &steps) != nil {
		return c, malformedCase(-1, errors.New("invalid type: `steps` must be an array"))
	}
	c.Steps = make([]ConformanceStep, len(steps))
	for i, raw := range steps {
		if c.Steps[i], err = parseStep(raw); err != nil {
			return c, malformedCase(i, err)
		}
	}
	return c, nil
}

func parseStep(raw json.RawMessage) (ConformanceStep, error) {
	var s ConformanceStep
	m, err := objectIgnoring(raw, stepFields)
	if err != nil {
		return s, err
	}
	field := func(name string) (json.RawMessage, error) {
		v, ok := m[name]
		if !ok {
			return nil, malformed("missing field `%s`", name)
		}
		return v, nil
	}
	v, err := field("t")
	if err != nil {
		return s, err
	}
	t, err := parseU64("t", v)
	if err != nil {
		return s, err
	}
	s.T = Nanos(t)
	if v, err = field("op"); err != nil {
		return s, err
	}
	op, err := parseString("op", v)
	if err != nil {
		return s, err
	}
	s.Op = StepOp(op)
	switch s.Op {
	case OpRecord:
		if v, err = field("outcome"); err != nil {
			return s, err
		}
		class, err := parseString("outcome", v)
		if err != nil {
			return s, err
		}
		if s.Outcome, err = ParseOutcome(class); err != nil {
			return s, malformed("unknown outcome `%s`, expected one of `success`, `dependency_failure`, `message_failure`", class)
		}
	case OpPermits:
		if v, err = field("inFlight"); err != nil {
			return s, err
		}
		if s.InFlight, err = parseU32("inFlight", v); err != nil {
			return s, err
		}
	case OpReleaseUnused:
		if v, err = field("unused"); err != nil {
			return s, err
		}
		if s.Unused, err = parseU32("unused", v); err != nil {
			return s, err
		}
	case OpConfigure:
		if v, err = field("config"); err != nil {
			return s, err
		}
		cfg, err := decodeWorkerConfig(v)
		if err != nil {
			return s, fmt.Errorf("config: %w", err)
		}
		s.Config = &cfg
		if v, err = field("unixS"); err != nil {
			return s, err
		}
		if s.UnixS, err = parseI64("unixS", v); err != nil {
			return s, err
		}
	default:
		return s, malformed("unknown op `%s`, expected one of `record`, `permits`, `releaseUnused`, `configure`", op)
	}
	return s, nil
}

// reconfigure applies a payload at now as a worker does (Gate.Apply and a configure step):
// the payload's brake, converted to controller time at (now, nowUnix), succeeds old, lifting
// over settings.BrakeRelease with offset; then the settings apply in place, or a new
// controller of seed replaces *c when the algorithm changes (ApplySettings). It returns the
// brake now in force (nil: none).
func reconfigure(c *Controller, old *Brake, now Nanos, settings Settings, brake *BrakeConfig, nowUnix int64, seed uint64, offset Nanos) *Brake {
	var next *Brake
	if brake != nil {
		b := BrakeFromWire(brake, now, nowUnix)
		next = &b
	}
	var applied *Brake
	if b, ok := SucceedBrake(old, next, now, settings.BrakeRelease, offset); ok {
		applied = &b
	}
	ApplySettings(c, now, settings, seed, applied)
	return applied
}

// Run runs the case on a fresh controller of this package and returns the readings after
// every step. It stops at the first step that cannot run (steps going back in time, an
// invalid payload).
func (c *ConformanceCase) Run() (Observations, error) {
	if n := len(c.Steps); n > MaxConformanceSteps {
		return Observations{}, &CaseError{Step: -1, Reason: fmt.Sprintf("%d steps exceed the limit of %d", n, MaxConformanceSteps)}
	}
	invalid := func(step int, at string, err error) error {
		return &CaseError{Step: step, Reason: fmt.Sprintf("invalid config in %s: %v", at, err), Err: err}
	}
	if err := c.Config.Validate(); err != nil {
		return Observations{}, invalid(-1, "config", err)
	}
	offset := Nanos(c.BrakeOffsetNs)
	ctl := FromConfig(&c.Config, c.Seed)
	var brake *Brake
	var last Nanos
	out := Observations{Observations: make([]Observation, 0, len(c.Steps))}
	for i, s := range c.Steps {
		if s.T < last {
			return Observations{}, &CaseError{Step: i, Reason: fmt.Sprintf("steps[%d]: t goes back in time", i)}
		}
		last = s.T
		now := s.T
		var permits *uint32
		switch s.Op {
		case OpRecord:
			ctl.Record(now, s.Outcome)
		case OpPermits:
			p := ctl.Permits(now, s.InFlight)
			permits = &p
		case OpReleaseUnused:
			ctl.ReleaseUnused(now, s.Unused)
		case OpConfigure:
			if s.Config == nil {
				return Observations{}, &CaseError{Step: i, Reason: fmt.Sprintf("steps[%d]: configure without a config", i)}
			}
			if err := s.Config.Validate(); err != nil {
				return Observations{}, invalid(i, fmt.Sprintf("steps[%d].config", i), err)
			}
			brake = reconfigure(&ctl, brake, now, SettingsFromConfig(s.Config), s.Config.Brake, s.UnixS, c.Seed, offset)
		default:
			return Observations{}, &CaseError{Step: i, Reason: fmt.Sprintf("steps[%d]: unknown op `%s`", i, s.Op)}
		}
		o := Observation{
			Permits:      permits,
			Backoff:      ctl.Backoff(now),
			Mode:         ctl.Mode().String(),
			Limit:        ctl.Limit(now),
			FailureFloor: ctl.FailureFloor(),
		}
		if f, known := ctl.FloorEstimate(); known {
			o.FloorEstimate = &f
		}
		out.Observations = append(out.Observations, o)
	}
	return out, nil
}

// RunConformanceCase parses a case (ParseConformanceCase) and runs it (Run).
func RunConformanceCase(data []byte) (Observations, error) {
	c, err := ParseConformanceCase(data)
	if err != nil {
		return Observations{}, err
	}
	return c.Run()
}
