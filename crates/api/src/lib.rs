//! API types of backpressure-operator (`backpressure.dev/v1alpha1`) and the wire contract
//! between the operator and the workers.
//!
//! - [`v1alpha1`]: the `WorkerBackpressure` (namespaced, short name `wbp`) and
//!   `BackpressurePolicy` (cluster-scoped) custom resources;
//! - [`wire`]: the worker configuration payload, the admin endpoint and the metric names;
//! - [`defaults`]: the built-in defaults, the last step of the precedence;
//! - [`crd`]: the generated CustomResourceDefinitions as YAML.

pub mod conditions;
pub mod crd;
pub mod defaults;
pub mod duration;
pub mod v1alpha1;
pub mod wire;

pub use duration::Duration;
pub use v1alpha1::{BackpressurePolicy, WorkerBackpressure};

/// Field manager of every server-side apply and `/scale` update the operator makes (status,
/// ConfigMaps, autoscaler clamps, replicas). Part of the API: GitOps tools are configured to
/// ignore the fields this manager owns, so it never changes.
pub const FIELD_MANAGER: &str = "backpressure-operator";
