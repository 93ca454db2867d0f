package backpressure

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The wire contract (crates/api/src/wire.rs), version WireVersion.
const (
	// WireVersion is carried in every payload.
	WireVersion = "backpressure.dev/worker-config/v1"
	// TokenAudiencePrefix prefixes the audience of a push token: PushAudience(ns, workload).
	TokenAudiencePrefix = "backpressure.dev"
	// MaxGenerationLeadMs is how far a pushed generation may be ahead of the worker's clock.
	MaxGenerationLeadMs = 5 * 60 * 1000
	// ConfigPath is the HTTP path of the configuration endpoint on the admin port.
	ConfigPath = "/v1/config"
	// AdminPortName is the name of the container port the operator pushes to.
	AdminPortName = "bp-admin"
	// DefaultAdminPort is the admin port when the pod declares none named AdminPortName.
	DefaultAdminPort = 9464
	// ConfigFileName is the configuration's file name inside the operator's ConfigMap.
	ConfigFileName = "worker-config.json"
	// MaxPayloadBytes is the largest payload a worker must accept (413 beyond).
	MaxPayloadBytes = 64 * 1024
)

// Metric names and labels of the wire contract.
const (
	LabelWorkload  = "workload"
	LabelNamespace = "namespace"
	LabelClass     = "class"
	LabelHash      = "hash"
	LabelAlgorithm = "algorithm"

	MetricBackoff       = "backpressure_backoff_factor"
	MetricFailureFloor  = "backpressure_failure_floor"
	MetricPermits       = "backpressure_permits"
	MetricInFlight      = "backpressure_in_flight"
	MetricOutcomesTotal = "backpressure_outcomes_total"
	MetricProbesTotal   = "backpressure_probes_total"
	MetricConfigInfo    = "backpressure_config_info"

	ClassSuccess           = "success"
	ClassDependencyFailure = "dependency_failure"
	ClassMessageFailure    = "message_failure"
)

// PushAudience is the token audience of the workers of workload in namespace:
// backpressure.dev/<namespace>/<workload>.
func PushAudience(namespace, workload string) string {
	return TokenAudiencePrefix + "/" + namespace + "/" + workload
}

// WorkerConfig is the configuration document pushed to every worker. Optional fields are nil
// when absent (and left out of its JSON and of its hash).
type WorkerConfig struct {
	Version        string
	Generation     int64
	Hash           string
	Algorithm      Algorithm
	SetPoint       float64
	Reaction       uint32
	MaxPermits     uint32
	ProbeInitialMs uint64
	ProbeMaxMs     uint64
	InitialPermits *uint32
	RatioWindowMs  *uint64
	BrakeReleaseMs *uint64
	FloorMax       *float64
	Redelivery     *RedeliveryConfig
	Brake          *BrakeConfig
}

// RedeliveryConfig is the redelivery backoff of a failed message.
type RedeliveryConfig struct {
	BaseMs uint64
	MaxMs  uint64
}

// BrakeConfig is the brake as the worker sees it.
type BrakeConfig struct {
	MinBackoff    float64
	ExpiresAtUnix *int64
}

// ConfigAck is the worker's answer to a push and to GET /v1/config.
type ConfigAck struct {
	Hash       string `json:"hash"`
	Generation int64  `json:"generation"`
}

// DefaultWorkerConfig is the built-in defaults of the API as a payload, with its hash.
func DefaultWorkerConfig() WorkerConfig {
	c := WorkerConfig{
		Version:        WireVersion,
		Algorithm:      AlgorithmSetPoint,
		SetPoint:       DefaultSetPoint,
		Reaction:       DefaultReaction(DefaultMaxPermits),
		MaxPermits:     DefaultMaxPermits,
		ProbeInitialMs: DefaultProbeInitialMs,
		ProbeMaxMs:     DefaultProbeMaxMs,
	}
	c.Hash = c.ComputeHash()
	return c
}

// ---- errors ----

// ConfigError is why a document was refused. Use errors.As to tell the kinds apart.
type ConfigError interface {
	error
	configError()
}

// MalformedError: not JSON, or not the shape of the document.
type MalformedError struct{ Reason string }

// VersionError: a version this receiver does not speak.
type VersionError struct{ Version string }

// FieldError: a field out of range; Field is the JSON field name (e.g. "brake.minBackoff").
type FieldError struct{ Field, Reason string }

// HashError: the hash does not match the content.
type HashError struct{ Given, Computed string }

// TooLargeError: larger than MaxPayloadBytes.
type TooLargeError struct{ Size int }

func (e *MalformedError) Error() string { return "malformed document: " + e.Reason }
func (e *VersionError) Error() string {
	return fmt.Sprintf("unsupported version %q: expected %q (worker config)", e.Version, WireVersion)
}
func (e *FieldError) Error() string {
	return fmt.Sprintf("invalid worker config field %s: %s", e.Field, e.Reason)
}
func (e *HashError) Error() string {
	return fmt.Sprintf("hash mismatch: payload says %q, content hashes to %q", e.Given, e.Computed)
}
func (e *TooLargeError) Error() string {
	return fmt.Sprintf("document of %d bytes exceeds the limit of %d bytes", e.Size, MaxPayloadBytes)
}

func (*MalformedError) configError() {}
func (*VersionError) configError()   {}
func (*FieldError) configError()     {}
func (*HashError) configError()      {}
func (*TooLargeError) configError()  {}

// ---- parsing ----

// ParseWorkerConfig parses and validates a payload as the Rust worker does
// (WorkerConfig::parse): size, JSON shape (unknown, duplicate and missing fields and wrong
// types are malformed; field names are case-sensitive), version, ranges, and the hash when
// one is given (an empty hash means "not given").
func ParseWorkerConfig(data []byte) (WorkerConfig, error) {
	if len(data) > MaxPayloadBytes {
		return WorkerConfig{}, &TooLargeError{len(data)}
	}
	cfg, err := decodeWorkerConfig(data)
	if err != nil {
		return WorkerConfig{}, err
	}
	if err := cfg.Validate(); err != nil {
		return WorkerConfig{}, err
	}
	return cfg, nil
}

// UnmarshalJSON decodes strictly (as ParseWorkerConfig, without validating).
func (c *WorkerConfig) UnmarshalJSON(data []byte) error {
	cfg, err := decodeWorkerConfig(data)
	if err != nil {
		return err
	}
	*c = cfg
	return nil
}

func malformed(format string, args ...any) error {
	return &MalformedError{fmt.Sprintf(format, args...)}
}

// object reads a JSON object's members strictly: names are case-sensitive, duplicates and
// names not in known are refused. Values are kept raw.
func object(data []byte, known []string) (map[string]json.RawMessage, error) {
	return readObject(data, known, false)
}

// objectIgnoring reads a JSON object's members in known (case-sensitive, duplicates refused)
// and skips the others, as serde does for a struct without deny_unknown_fields.
func objectIgnoring(data []byte, known []string) (map[string]json.RawMessage, error) {
	return readObject(data, known, true)
}

func readObject(data []byte, known []string, ignoreUnknown bool) (map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, jsonError(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, malformed("invalid type: expected a JSON object")
	}
	members := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, jsonError(err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, malformed("expected a member name")
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, jsonError(err)
		}
		isKnown := false
		for _, k := range known {
			if k == name {
				isKnown = true
				break
			}
		}
		if !isKnown {
			if ignoreUnknown {
				continue
			}
			return nil, malformed("unknown field `%s`, expected one of %s", name, quoteAll(known))
		}
		if _, dup := members[name]; dup {
			return nil, malformed("duplicate field `%s`", name)
		}
		members[name] = raw
	}
	if _, err := dec.Token(); err != nil {
		return nil, jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, malformed("trailing characters")
	}
	return members, nil
}

// jsonError is a decoding error as a MalformedError; a document that ends early says so
// (encoding/json reports a bare EOF).
func jsonError(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return malformed("EOF while parsing a value")
	}
	return malformed("%v", err)
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = "`" + n + "`"
	}
	return strings.Join(q, ", ")
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// integer literal: -?(0|[1-9][0-9]*), no fraction or exponent (serde_json reads those as
// floats, which integer fields refuse; "-0" too).
func intLiteral(field string, raw json.RawMessage) (string, error) {
	s := string(bytes.TrimSpace(raw))
	if s == "" || s == "null" || s[0] == '"' || s[0] == '{' || s[0] == '[' || s == "true" || s == "false" {
		return "", malformed("invalid type: %s, expected an integer at `%s`", describe(s), field)
	}
	if strings.ContainsAny(s, ".eE") || s == "-0" {
		return "", malformed("invalid type: floating point `%s`, expected an integer at `%s`", s, field)
	}
	return s, nil
}

func describe(s string) string {
	switch {
	case s == "null":
		return "null"
	case s == "true" || s == "false":
		return "boolean `" + s + "`"
	case strings.HasPrefix(s, `"`):
		return "string " + s
	case strings.HasPrefix(s, "{"):
		return "map"
	case strings.HasPrefix(s, "["):
		return "sequence"
	}
	return "`" + s + "`"
}

func parseU32(field string, raw json.RawMessage) (uint32, error) {
	s, err := intLiteral(field, raw)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, malformed("invalid value: integer `%s`, expected u32 at `%s`", s, field)
	}
	return uint32(v), nil
}

func parseU64(field string, raw json.RawMessage) (uint64, error) {
	s, err := intLiteral(field, raw)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, malformed("invalid value: integer `%s`, expected u64 at `%s`", s, field)
	}
	return v, nil
}

func parseI64(field string, raw json.RawMessage) (int64, error) {
	s, err := intLiteral(field, raw)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, malformed("invalid value: integer `%s`, expected i64 at `%s`", s, field)
	}
	return v, nil
}

func parseF64(field string, raw json.RawMessage) (float64, error) {
	s := string(bytes.TrimSpace(raw))
	if s == "" || strings.ContainsAny(s[:1], `"{[tfn`) {
		return 0, malformed("invalid type: %s, expected f64 at `%s`", describe(s), field)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil && !(errors.Is(err, strconv.ErrRange) && !math.IsInf(v, 0)) {
		return 0, malformed("number out of range at `%s`", field)
	}
	return v, nil
}

func parseString(field string, raw json.RawMessage) (string, error) {
	var s string
	if isNull(raw) || bytes.TrimSpace(raw)[0] != '"' {
		return "", malformed("invalid type: %s, expected a string at `%s`", describe(string(bytes.TrimSpace(raw))), field)
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", malformed("%v", err)
	}
	return s, nil
}

var workerConfigFields = []string{
	"version", "generation", "hash", "algorithm", "setPoint", "reaction", "maxPermits",
	"probeInitialMs", "probeMaxMs", "initialPermits", "ratioWindowMs", "brakeReleaseMs",
	"floorMax", "redelivery", "brake",
}

func decodeWorkerConfig(data []byte) (WorkerConfig, error) {
	var c WorkerConfig
	if !utf8.Valid(data) {
		return c, malformed("invalid UTF-8")
	}
	m, err := object(data, workerConfigFields)
	if err != nil {
		return c, err
	}
	required := func(name string) (json.RawMessage, error) {
		raw, ok := m[name]
		if !ok {
			return nil, malformed("missing field `%s`", name)
		}
		return raw, nil
	}
	optional := func(name string) (json.RawMessage, bool) {
		raw, ok := m[name]
		if !ok || isNull(raw) {
			return nil, false
		}
		return raw, true
	}
	// Fields in declaration order, so the first error is the one serde reports.
	raw, err := required("version")
	if err != nil {
		return c, err
	}
	if c.Version, err = parseString("version", raw); err != nil {
		return c, err
	}
	if raw, err = required("generation"); err != nil {
		return c, err
	}
	if c.Generation, err = parseI64("generation", raw); err != nil {
		return c, err
	}
	if raw, ok := m["hash"]; ok {
		if c.Hash, err = parseString("hash", raw); err != nil {
			return c, err
		}
	}
	if raw, err = required("algorithm"); err != nil {
		return c, err
	}
	alg, err := parseString("algorithm", raw)
	if err != nil {
		return c, err
	}
	c.Algorithm = Algorithm(alg)
	if !c.Algorithm.valid() {
		return c, malformed("unknown variant `%s`, expected one of `SetPoint`, `RatioThrottle`, `Fixed`, `Off`", alg)
	}
	if raw, err = required("setPoint"); err != nil {
		return c, err
	}
	if c.SetPoint, err = parseF64("setPoint", raw); err != nil {
		return c, err
	}
	if raw, err = required("reaction"); err != nil {
		return c, err
	}
	if c.Reaction, err = parseU32("reaction", raw); err != nil {
		return c, err
	}
	if raw, err = required("maxPermits"); err != nil {
		return c, err
	}
	if c.MaxPermits, err = parseU32("maxPermits", raw); err != nil {
		return c, err
	}
	if raw, err = required("probeInitialMs"); err != nil {
		return c, err
	}
	if c.ProbeInitialMs, err = parseU64("probeInitialMs", raw); err != nil {
		return c, err
	}
	if raw, err = required("probeMaxMs"); err != nil {
		return c, err
	}
	if c.ProbeMaxMs, err = parseU64("probeMaxMs", raw); err != nil {
		return c, err
	}
	if raw, ok := optional("initialPermits"); ok {
		v, err := parseU32("initialPermits", raw)
		if err != nil {
			return c, err
		}
		c.InitialPermits = &v
	}
	if raw, ok := optional("ratioWindowMs"); ok {
		v, err := parseU64("ratioWindowMs", raw)
		if err != nil {
			return c, err
		}
		c.RatioWindowMs = &v
	}
	if raw, ok := optional("brakeReleaseMs"); ok {
		v, err := parseU64("brakeReleaseMs", raw)
		if err != nil {
			return c, err
		}
		c.BrakeReleaseMs = &v
	}
	if raw, ok := optional("floorMax"); ok {
		v, err := parseF64("floorMax", raw)
		if err != nil {
			return c, err
		}
		c.FloorMax = &v
	}
	if raw, ok := optional("redelivery"); ok {
		r, err := object(raw, []string{"baseMs", "maxMs"})
		if err != nil {
			return c, err
		}
		var rd RedeliveryConfig
		for _, f := range []struct {
			name string
			dst  *uint64
		}{{"baseMs", &rd.BaseMs}, {"maxMs", &rd.MaxMs}} {
			v, ok := r[f.name]
			if !ok {
				return c, malformed("missing field `%s`", f.name)
			}
			if *f.dst, err = parseU64("redelivery."+f.name, v); err != nil {
				return c, err
			}
		}
		c.Redelivery = &rd
	}
	if raw, ok := optional("brake"); ok {
		b, err := object(raw, []string{"minBackoff", "expiresAtUnix"})
		if err != nil {
			return c, err
		}
		var bc BrakeConfig
		v, ok := b["minBackoff"]
		if !ok {
			return c, malformed("missing field `minBackoff`")
		}
		if bc.MinBackoff, err = parseF64("brake.minBackoff", v); err != nil {
			return c, err
		}
		if v, ok := b["expiresAtUnix"]; ok && !isNull(v) {
			t, err := parseI64("brake.expiresAtUnix", v)
			if err != nil {
				return c, err
			}
			bc.ExpiresAtUnix = &t
		}
		c.Brake = &bc
	}
	return c, nil
}

// Validate checks version, ranges and the hash (an empty hash is accepted and means "not
// given"), as WorkerConfig::validate does; the error names the JSON field.
func (c *WorkerConfig) Validate() error {
	if c.Version != WireVersion {
		return &VersionError{c.Version}
	}
	field := func(name, format string, args ...any) error {
		return &FieldError{name, fmt.Sprintf(format, args...)}
	}
	if !(isFinite(c.SetPoint) && c.SetPoint > 0 && c.SetPoint < 1) {
		return field("setPoint", "%s is not in (0, 1)", rustFloat(c.SetPoint))
	}
	if c.Reaction == 0 {
		return field("reaction", "must be at least 1")
	}
	if c.MaxPermits == 0 {
		return field("maxPermits", "must be at least 1")
	}
	if c.ProbeInitialMs == 0 {
		return field("probeInitialMs", "must be at least 1")
	}
	if c.ProbeMaxMs < c.ProbeInitialMs {
		return field("probeMaxMs", "%d is below probeInitialMs %d", c.ProbeMaxMs, c.ProbeInitialMs)
	}
	if c.Generation < 0 {
		return field("generation", "must not be negative")
	}
	if c.RatioWindowMs != nil && *c.RatioWindowMs == 0 {
		return field("ratioWindowMs", "must be at least 1")
	}
	if f := c.FloorMax; f != nil && !(isFinite(*f) && *f >= 0 && *f <= MaxFloorMax) {
		return field("floorMax", "%s is not in [0, %s]", rustFloat(*f), rustFloat(MaxFloorMax))
	}
	if r := c.Redelivery; r != nil && r.MaxMs < r.BaseMs {
		return field("redelivery.maxMs", "%d is below redelivery.baseMs %d", r.MaxMs, r.BaseMs)
	}
	if b := c.Brake; b != nil && !(isFinite(b.MinBackoff) && b.MinBackoff >= 0 && b.MinBackoff <= 1) {
		return field("brake.minBackoff", "%s is not in [0, 1]", rustFloat(b.MinBackoff))
	}
	if c.Hash == "" {
		return nil
	}
	if computed := c.ComputeHash(); computed != c.Hash {
		return &HashError{c.Hash, computed}
	}
	return nil
}

// rustFloat formats like Rust's Display for f64 (no exponent, NaN, inf).
func rustFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// ActiveBrake is the effective brake at nowUnix (ok false once expired or without one).
func (c *WorkerConfig) ActiveBrake(nowUnix int64) (float64, bool) {
	if c.Brake == nil {
		return 0, false
	}
	if c.Brake.ExpiresAtUnix != nil && nowUnix >= *c.Brake.ExpiresAtUnix {
		return 0, false
	}
	return c.Brake.MinBackoff, true
}

// ---- serialization and the content hash ----

// member is one JSON object member with its value already encoded.
type member struct {
	name  string
	value string
}

// members lists the payload's members in serde's order. With jcs, numbers (integers
// included) are IEEE doubles written as RFC 8785 says and nested members are sorted;
// without, integers are exact and floats as encoding/json writes them.
func (c *WorkerConfig) members(jcs bool) ([]member, error) {
	var firstErr error
	f := func(x float64) string {
		var s string
		var err error
		if jcs {
			s, err = JCSNumber(x)
		} else if !isFinite(x) {
			err = fmt.Errorf("%v is not a JSON number", x)
		} else {
			var b []byte
			b, err = json.Marshal(x)
			s = string(b)
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
		return s
	}
	u := func(v uint64) string {
		if jcs {
			return f(float64(v))
		}
		return strconv.FormatUint(v, 10)
	}
	i := func(v int64) string {
		if jcs {
			return f(float64(v))
		}
		return strconv.FormatInt(v, 10)
	}
	out := []member{
		{"version", jsonString(c.Version)},
		{"generation", i(c.Generation)},
		{"hash", jsonString(c.Hash)},
		{"algorithm", jsonString(string(c.Algorithm))},
		{"setPoint", f(c.SetPoint)},
		{"reaction", u(uint64(c.Reaction))},
		{"maxPermits", u(uint64(c.MaxPermits))},
		{"probeInitialMs", u(c.ProbeInitialMs)},
		{"probeMaxMs", u(c.ProbeMaxMs)},
	}
	if c.InitialPermits != nil {
		out = append(out, member{"initialPermits", u(uint64(*c.InitialPermits))})
	}
	if c.RatioWindowMs != nil {
		out = append(out, member{"ratioWindowMs", u(*c.RatioWindowMs)})
	}
	if c.BrakeReleaseMs != nil {
		out = append(out, member{"brakeReleaseMs", u(*c.BrakeReleaseMs)})
	}
	if c.FloorMax != nil {
		out = append(out, member{"floorMax", f(*c.FloorMax)})
	}
	if r := c.Redelivery; r != nil {
		rm := []member{{"baseMs", u(r.BaseMs)}, {"maxMs", u(r.MaxMs)}}
		out = append(out, member{"redelivery", "{" + joinMembers(rm) + "}"})
	}
	if b := c.Brake; b != nil {
		bm := []member{{"minBackoff", f(b.MinBackoff)}}
		if b.ExpiresAtUnix != nil {
			bm = append(bm, member{"expiresAtUnix", i(*b.ExpiresAtUnix)})
		}
		if jcs {
			sortMembers(bm)
		}
		out = append(out, member{"brake", "{" + joinMembers(bm) + "}"})
	}
	if jcs {
		sortMembers(out)
	}
	return out, firstErr
}

func joinMembers(ms []member) string {
	var b strings.Builder
	for k, m := range ms {
		if k > 0 {
			b.WriteByte(',')
		}
		b.WriteString(jsonString(m.name))
		b.WriteByte(':')
		b.WriteString(m.value)
	}
	return b.String()
}

// MarshalJSON writes the payload as the Rust worker does (serde's field order, optional
// fields left out when absent). NaN and infinities cannot be written.
func (c WorkerConfig) MarshalJSON() ([]byte, error) {
	ms, err := c.members(false)
	if err != nil {
		return nil, err
	}
	return []byte("{" + joinMembers(ms) + "}"), nil
}

// Canonical is the RFC 8785 (JCS) form of the payload: members sorted by UTF-16 code units,
// no whitespace, every number an IEEE double written as ECMAScript writes it.
func (c *WorkerConfig) Canonical() (string, error) {
	ms, err := c.members(true)
	if err != nil {
		return "", err
	}
	return "{" + joinMembers(ms) + "}", nil
}

// ComputeHash is the content hash: the first 12 lowercase hex digits of the SHA-256 of the
// JCS form of the payload with hash "" and generation 0. A payload that cannot be
// canonicalized (a NaN) hashes its Go representation instead, which never matches a real one.
func (c *WorkerConfig) ComputeHash() string {
	cp := *c
	cp.Hash = ""
	cp.Generation = 0
	s, err := cp.Canonical()
	if err != nil {
		s = fmt.Sprintf("%#v", cp)
	}
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:6])
}

// WithHash returns the payload with its hash filled in.
func (c WorkerConfig) WithHash() WorkerConfig {
	c.Hash = c.ComputeHash()
	return c
}

func sortMembers(ms []member) {
	// Insertion sort by UTF-16 code units (few members).
	for a := 1; a < len(ms); a++ {
		for b := a; b > 0 && utf16Less(ms[b].name, ms[b-1].name); b-- {
			ms[b], ms[b-1] = ms[b-1], ms[b]
		}
	}
}

func utf16Less(a, b string) bool {
	ua, ub := utf16Units(a), utf16Units(b)
	for k := 0; k < len(ua) && k < len(ub); k++ {
		if ua[k] != ub[k] {
			return ua[k] < ub[k]
		}
	}
	return len(ua) < len(ub)
}

func utf16Units(s string) []uint16 {
	var out []uint16
	for _, r := range s {
		if r >= 0x10000 {
			r -= 0x10000
			out = append(out, uint16(0xD800+(r>>10)), uint16(0xDC00+(r&0x3FF)))
		} else {
			out = append(out, uint16(r))
		}
	}
	return out
}

// jsonString writes s with the minimal escapes of RFC 8785.
func jsonString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\f':
			b.WriteString(`\f`)
		case '\r':
			b.WriteString(`\r`)
		default:
			if r < 0x20 {
				fmt.Fprintf(&b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// JCSNumber writes a double as ECMAScript's Number.prototype.toString does (RFC 8785): the
// shortest digits that read back as the same double, plain for decimal exponents from -6 to
// 20, else in exponent notation with an explicit sign; both zeros are "0". NaN and the
// infinities are refused.
func JCSNumber(v float64) (string, error) {
	if !isFinite(v) {
		return "", fmt.Errorf("%v is not a JSON number", v)
	}
	if v == 0 {
		return "0", nil
	}
	sci := strconv.FormatFloat(math.Abs(v), 'e', -1, 64) // d[.ddd]e±XX
	mant, expS, _ := strings.Cut(sci, "e")
	exp, err := strconv.Atoi(expS)
	if err != nil {
		return "", fmt.Errorf("unexpected float format %q", sci)
	}
	digits := strings.Replace(mant, ".", "", 1)
	k := len(digits)
	n := exp + 1
	var b strings.Builder
	if v < 0 {
		b.WriteByte('-')
	}
	switch {
	case k <= n && n <= 21:
		b.WriteString(digits)
		b.WriteString(strings.Repeat("0", n-k))
	case 0 < n && n <= 21:
		b.WriteString(digits[:n])
		b.WriteByte('.')
		b.WriteString(digits[n:])
	case -6 < n && n <= 0:
		b.WriteString("0.")
		b.WriteString(strings.Repeat("0", -n))
		b.WriteString(digits)
	default:
		b.WriteString(digits[:1])
		if k > 1 {
			b.WriteByte('.')
			b.WriteString(digits[1:])
		}
		e := n - 1
		sign := byte('+')
		if e < 0 {
			sign = '-'
			e = -e
		}
		b.WriteByte('e')
		b.WriteByte(sign)
		b.WriteString(strconv.Itoa(e))
	}
	return b.String(), nil
}

// CanonicalJSON is the RFC 8785 (JCS) form of any JSON document (numbers read as IEEE
// doubles, as JavaScript's JSON.parse reads them).
func CanonicalJSON(data []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	if _, err := dec.Token(); err != io.EOF {
		return "", errors.New("trailing characters")
	}
	var b strings.Builder
	if err := writeCanonical(&b, v); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeCanonical(b *strings.Builder, v any) error {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case string:
		b.WriteString(jsonString(x))
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return err
		}
		s, err := JCSNumber(f)
		if err != nil {
			return err
		}
		b.WriteString(s)
	case []any:
		b.WriteByte('[')
		for k, item := range x {
			if k > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, item); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case map[string]any:
		names := make([]member, 0, len(x))
		for name := range x {
			names = append(names, member{name: name})
		}
		sortMembers(names)
		b.WriteByte('{')
		for k, m := range names {
			if k > 0 {
				b.WriteByte(',')
			}
			b.WriteString(jsonString(m.name))
			b.WriteByte(':')
			if err := writeCanonical(b, x[m.name]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	default:
		return fmt.Errorf("unexpected JSON value %T", v)
	}
	return nil
}
