package backpressure

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sync"
	"time"
)

// StaleError: a payload older than the running generation (HTTP 409).
type StaleError struct{ Running, Given int64 }

func (e *StaleError) Error() string {
	return fmt.Sprintf("generation %d is older than the running generation %d", e.Given, e.Running)
}

// Limits are the worker's own bounds on a configuration, checked on every update (push or
// file) on top of the wire contract's ranges (the Rust worker's config::Limits).
type Limits struct {
	// MaxPermits is the largest maxPermits (default 1024).
	MaxPermits uint32
	// MaxReaction is the largest reaction (default 100000).
	MaxReaction uint32
	// MinProbeMs is the smallest probeInitialMs/probeMaxMs (default 100 ms).
	MinProbeMs uint64
	// MaxProbeMs is the largest probeInitialMs/probeMaxMs (default 1 h).
	MaxProbeMs uint64
	// MaxGenerationLeadMs is how far generation may be ahead of this worker's clock
	// (default 5 minutes).
	MaxGenerationLeadMs int64
	// MaxWindowMs is the largest ratioWindowMs and brakeReleaseMs (default 1 h).
	MaxWindowMs uint64
	// MaxRedeliveryMs is the largest redelivery.maxMs and baseMs (default 12 h).
	MaxRedeliveryMs uint64
}

// DefaultLimits are the Rust worker's default limits.
func DefaultLimits() Limits {
	return Limits{
		MaxPermits:          1024,
		MaxReaction:         100_000,
		MinProbeMs:          100,
		MaxProbeMs:          3_600_000,
		MaxGenerationLeadMs: MaxGenerationLeadMs,
		MaxWindowMs:         3_600_000,
		MaxRedeliveryMs:     43_200_000,
	}
}

// Check checks cfg at nowUnix (seconds); the error (a *FieldError) names the field.
func (l Limits) Check(cfg *WorkerConfig, nowUnix int64) error {
	field := func(name, format string, args ...any) error {
		return &FieldError{name, fmt.Sprintf(format, args...)}
	}
	if cfg.MaxPermits > l.MaxPermits {
		return field("maxPermits", "%d exceeds this worker's limit of %d", cfg.MaxPermits, l.MaxPermits)
	}
	if cfg.Reaction > l.MaxReaction {
		return field("reaction", "%d exceeds this worker's limit of %d", cfg.Reaction, l.MaxReaction)
	}
	for _, p := range []struct {
		name string
		ms   uint64
	}{{"probeInitialMs", cfg.ProbeInitialMs}, {"probeMaxMs", cfg.ProbeMaxMs}} {
		if p.ms < l.MinProbeMs || p.ms > l.MaxProbeMs {
			return field(p.name, "%d ms is outside this worker's range of %d to %d ms", p.ms, l.MinProbeMs, l.MaxProbeMs)
		}
	}
	if p := cfg.InitialPermits; p != nil && *p > l.MaxPermits {
		return field("initialPermits", "%d exceeds this worker's limit of %d", *p, l.MaxPermits)
	}
	for _, w := range []struct {
		name string
		ms   *uint64
	}{{"ratioWindowMs", cfg.RatioWindowMs}, {"brakeReleaseMs", cfg.BrakeReleaseMs}} {
		if w.ms != nil && *w.ms > l.MaxWindowMs {
			return field(w.name, "%d ms exceeds this worker's limit of %d ms", *w.ms, l.MaxWindowMs)
		}
	}
	if r := cfg.Redelivery; r != nil && max(r.MaxMs, r.BaseMs) > l.MaxRedeliveryMs {
		return field("redelivery.maxMs", "%d ms exceeds this worker's limit of %d ms", max(r.MaxMs, r.BaseMs), l.MaxRedeliveryMs)
	}
	return checkGenerationLead(cfg.Generation, nowUnix, l.MaxGenerationLeadMs)
}

func satMulI64(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	c := a * b
	if c/b != a || (a == -1 && b == -1<<63) || (b == -1 && a == -1<<63) {
		if (a < 0) != (b < 0) {
			return -1 << 63
		}
		return 1<<63 - 1
	}
	return c
}

func satAddI64(a, b int64) int64 {
	c := a + b
	if (b > 0 && c < a) || (b < 0 && c > a) {
		if b > 0 {
			return 1<<63 - 1
		}
		return -1 << 63
	}
	return c
}

// checkGenerationLead refuses a generation more than maxLeadMs ahead of nowUnix (seconds).
func checkGenerationLead(generation, nowUnix, maxLeadMs int64) error {
	horizon := satAddI64(satMulI64(nowUnix, 1000), maxLeadMs)
	if generation > horizon {
		return &FieldError{"generation", fmt.Sprintf(
			"%d is more than %d s ahead of this worker's clock (%d ms); generations are Unix milliseconds",
			generation, maxLeadMs/1000, satMulI64(nowUnix, 1000))}
	}
	return nil
}

// Origin says where the running configuration came from.
type Origin int

const (
	// OriginInitial: the built-in or programmatic initial configuration.
	OriginInitial Origin = iota
	// OriginFile: the mounted file.
	OriginFile
	// OriginPush: a push to the admin port.
	OriginPush
)

func (o Origin) String() string {
	switch o {
	case OriginFile:
		return "file"
	case OriginPush:
		return "push"
	}
	return "initial"
}

// ConfigState is the running configuration and where it is applied (the Rust worker's
// config::ConfigState): it validates a payload, checks it against the worker's Limits,
// refuses one older than the running generation (a same hash and generation is a no-op),
// applies the controller settings and brake to the Gate and updates the config-info metric,
// all under one lock so that file and push apply in order. A refused payload leaves the
// running configuration unchanged. Safe for concurrent use.
type ConfigState struct {
	mu      sync.Mutex
	running WorkerConfig
	origin  Origin
	gate    *Gate
	metrics *Metrics
	// base: library-side settings (credit, health-check probes) kept across pushes, and the
	// application's choice for the optional fields a payload leaves out.
	base   Settings
	limits Limits
	logger *slog.Logger
}

func unixNow() int64 { return time.Now().Unix() }

// NewConfigState starts from initial (validated; an invalid one is replaced by the default),
// applying it to gate. The library-side knobs of gate's current settings are kept across
// updates. metrics may be nil.
func NewConfigState(gate *Gate, initial WorkerConfig, metrics *Metrics) *ConfigState {
	if err := initial.Validate(); err != nil {
		gate.logger.Warn("invalid initial worker config; using the defaults", "error", err)
		initial = DefaultWorkerConfig()
	}
	if initial.Hash == "" {
		initial = initial.WithHash()
	}
	s := &ConfigState{
		running: initial,
		origin:  OriginInitial,
		gate:    gate,
		metrics: metrics,
		base:    gate.Settings(),
		limits:  DefaultLimits(),
		logger:  gate.logger,
	}
	s.install(&initial, unixNow())
	return s
}

// SetLimits checks every later update against limits instead of DefaultLimits (the initial
// configuration is the application's own and is not checked).
func (s *ConfigState) SetLimits(limits Limits) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits = limits
}

// Limits are the limits updates are checked against.
func (s *ConfigState) Limits() Limits {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limits
}

// Running is the running configuration.
func (s *ConfigState) Running() WorkerConfig {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running
}

// Ack is the running hash and generation.
func (s *ConfigState) Ack() ConfigAck {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ConfigAck{Hash: s.running.Hash, Generation: s.running.Generation}
}

// Origin is where the running configuration came from.
func (s *ConfigState) Origin() Origin {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.origin
}

// Gate is the gate the configuration is applied to.
func (s *ConfigState) Gate() *Gate { return s.gate }

// ApplyBytes parses, validates and applies a payload.
func (s *ConfigState) ApplyBytes(data []byte, origin Origin) (ConfigAck, error) {
	cfg, err := ParseWorkerConfig(data)
	if err != nil {
		return ConfigAck{}, err
	}
	return s.Apply(cfg, origin)
}

// Apply validates and applies a configuration.
func (s *ConfigState) Apply(cfg WorkerConfig, origin Origin) (ConfigAck, error) {
	return s.ApplyAt(cfg, origin, unixNow())
}

// ApplyAt is Apply with the current Unix time given (for the brake's expiry and the
// generation's lead). Errors: a ConfigError (400, or 413 for *TooLargeError) or *StaleError
// (409).
func (s *ConfigState) ApplyAt(cfg WorkerConfig, origin Origin, nowUnix int64) (ConfigAck, error) {
	if err := cfg.Validate(); err != nil {
		return ConfigAck{}, err
	}
	if err := s.Limits().Check(&cfg, nowUnix); err != nil {
		return ConfigAck{}, err
	}
	if cfg.Hash == "" {
		cfg = cfg.WithHash()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	current := s.running.Generation
	if cfg.Generation < current {
		return ConfigAck{}, &StaleError{Running: current, Given: cfg.Generation}
	}
	ack := ConfigAck{Hash: cfg.Hash, Generation: cfg.Generation}
	if cfg.Hash == s.running.Hash && cfg.Generation == current {
		return ack, nil
	}
	s.install(&cfg, nowUnix)
	s.logger.Info("worker config applied", "hash", ack.Hash, "generation", ack.Generation,
		"from", origin.String(), "previous", s.running.Hash)
	s.running = cfg
	s.origin = origin
	return ack, nil
}

func (s *ConfigState) install(cfg *WorkerConfig, nowUnix int64) {
	b := s.base
	settings := SettingsFromConfig(cfg)
	// A field the payload carries wins; one it leaves out keeps the application's setting.
	settings.Credit = b.Credit
	settings.HealthCheckProbes = b.HealthCheckProbes
	if cfg.RatioWindowMs == nil {
		settings.RatioWindow = b.RatioWindow
	}
	if cfg.BrakeReleaseMs == nil {
		settings.BrakeRelease = b.BrakeRelease
	}
	if cfg.InitialPermits == nil {
		settings.InitialPermits = b.InitialPermits
	}
	if cfg.FloorMax == nil {
		settings.FloorMax = b.FloorMax
	}
	if cfg.Redelivery == nil {
		settings.RedeliveryBase, settings.RedeliveryMax, settings.HasRedelivery = b.RedeliveryBase, b.RedeliveryMax, b.HasRedelivery
	}
	s.gate.Apply(settings, cfg.Brake, nowUnix)
	if s.metrics != nil {
		s.metrics.SetConfig(cfg.Hash, cfg.Algorithm)
	}
}

// DefaultFilePoll is the default interval between checks of the mounted file.
const DefaultFilePoll = time.Second

// FileWatcher watches a mounted worker-config.json and applies it when its content changes.
// It polls the file's content through its path (following symlinks), which handles both a
// file rewritten in place and kubelet's ConfigMap update (an atomically re-pointed ..data
// symlink). A missing file is waited for; an invalid file is reported once per content and the
// running configuration stays.
type FileWatcher struct {
	state      *ConfigState
	path       string
	lastDigest *[32]byte
}

// NewFileWatcher watches path, applying to state.
func NewFileWatcher(state *ConfigState, path string) *FileWatcher {
	return &FileWatcher{state: state, path: path}
}

// FileCheck is what one check of the file found.
type FileCheck struct {
	// Changed: new content was found (then Ack or Err says what became of it).
	Changed bool
	// Ack of the applied (or already running) content.
	Ack ConfigAck
	// Err: the content was refused, or (with Changed false) the file could not be read.
	Err error
}

// Check reads the file once and applies it if its content changed.
func (w *FileWatcher) Check() FileCheck {
	data, err := os.ReadFile(w.path)
	if errors.Is(err, fs.ErrNotExist) {
		return FileCheck{}
	}
	if err != nil {
		return FileCheck{Err: err}
	}
	digest := sha256.Sum256(data)
	if w.lastDigest != nil && *w.lastDigest == digest {
		return FileCheck{}
	}
	w.lastDigest = &digest
	ack, err := w.state.ApplyBytes(data, OriginFile)
	if err != nil {
		w.state.logger.Warn("worker config file refused; keeping the running one", "path", w.path, "error", err)
		return FileCheck{Changed: true, Err: err}
	}
	return FileCheck{Changed: true, Ack: ack}
}

// Run checks the file every interval until ctx ends.
func (w *FileWatcher) Run(ctx context.Context, interval time.Duration) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	unreadableReported := false
	for {
		r := w.Check()
		switch {
		case r.Err != nil && !r.Changed:
			if !unreadableReported {
				unreadableReported = true
				w.state.logger.Warn("cannot read the worker config file", "path", w.path, "error", r.Err)
			}
		default:
			unreadableReported = false
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
