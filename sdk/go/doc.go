// Package backpressure is the Go SDK of backpressure-operator: worker-side backpressure for
// queue workers, speaking the operator's wire contract (backpressure.dev/worker-config/v1).
//
// It is a port of the Rust worker library (crates/worker), which is the reference:
//
//   - the controllers (SetPoint, RatioThrottle, Fixed, Off) turn message outcomes into a
//     backoff factor in [0, 1] and a number of permits. They are plain, deterministic state:
//     time is passed in as integer nanoseconds ([Nanos]) and the only randomness (probe
//     jitter) comes from a seeded SplitMix64 generator, so the same calls give the same
//     results as the Rust controllers (checked against the golden vectors in
//     conformance/vectors/);
//   - [Gate] shares one controller between a poll loop and the goroutines processing
//     messages, on the real monotonic clock;
//   - [ParseWorkerConfig] parses and validates a WorkerConfig payload exactly as the Rust
//     worker does, and [WorkerConfig.ComputeHash] is its content hash (SHA-256 over the
//     RFC 8785 canonical JSON);
//   - [ConfigState], [Admin] and [FileWatcher] receive the configuration at runtime: pushes to
//     the admin port authenticated with a Kubernetes TokenReview ([TokenReviewVerifier]), and
//     the mounted worker-config.json file;
//   - [Metrics] exports the backpressure_* metrics with the Prometheus Go client.
package backpressure
