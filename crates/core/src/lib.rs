//! backpressure-core: the pure decision core of backpressure-operator.
//!
//! - [`resolve`]: the precedence of a `WorkerBackpressure` spec, the matching
//!   `BackpressurePolicy` objects and the built-in defaults, into one [`resolve::Effective`];
//! - [`decide`]: from the effective configuration, the previous status and one observation,
//!   the regime, the replicas, the status, the events;
//! - [`producers`]: producer control, the watermark loop that pauses or throttles the queue's
//!   producers, independent of the worker hold;
//! - [`guard`]: the clamp Guard mode puts on the guarded autoscaler after a decision;
//! - [`selector`]: label selectors, structured (`namespaceSelector`) or in the string form of
//!   `/scale` `status.selector`, with one evaluator;
//! - [`freshness`]: the sample timestamps every query returns beside its values, so that
//!   `staleAfter` applies to all of them;
//! - [`presets`]: the queue queries of `spec.queue`, on each queue system's standard exporter;
//! - [`tenancy`]: what a tenant may reach through `spec.metrics` (its queries scoped to its
//!   namespace, the Prometheus addresses it may name, credentials redacted from URLs).
//!
//! Nothing here performs I/O, reads a clock or draws a random number: the operator and the
//! simulator (`backpressure-sim`) call the same functions, and this crate depends on neither a
//! Kubernetes client nor an async runtime (`cargo tree -p backpressure-core` shows it).

pub mod decide;
pub mod freshness;
pub mod guard;
pub mod presets;
pub mod producers;
pub mod resolve;
pub mod selector;
pub mod tenancy;
