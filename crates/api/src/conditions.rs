//! Condition types and reasons written to `status.conditions`.
//!
//! `Ready` is the summary condition that kstatus, Flux and Argo CD read: True when the last
//! reconcile succeeded for the current generation, False with a reason otherwise. The other
//! conditions are specific and always present once the object has been reconciled.

/// Summary: the object is reconciled for its current generation.
pub const READY: &str = "Ready";
/// The fleet's backoff is below the hold threshold.
pub const DEPENDENCY_HEALTHY: &str = "DependencyHealthy";
/// Scale-out is held because the dependency is failing.
pub const SCALE_OUT_HELD: &str = "ScaleOutHeld";
/// A staged ramp is in progress.
pub const RAMPING: &str = "Ramping";
/// The fleet metrics were read and are fresh.
pub const METRICS_AVAILABLE: &str = "MetricsAvailable";
/// Every ready pod runs the current worker configuration.
pub const CONFIG_IN_SYNC: &str = "ConfigInSync";
/// A `BackpressurePolicy` limit overrode a value of the object (the values are listed in the
/// message and in `status.overrides`).
pub const POLICY_LIMITED: &str = "PolicyLimited";
/// Guard mode only: the guarded HPA or ScaledObject carries the clamp the decision asks for
/// (or its original settings when nothing is clamped).
pub const GUARD_APPLIED: &str = "GuardApplied";
/// With `spec.producers` only: the producers are paused, throttled or resuming (True), or
/// open (False); the reason is the state.
pub const PRODUCERS_THROTTLED: &str = "ProducersThrottled";
/// kstatus: the object is still being worked on.
pub const RECONCILING: &str = "Reconciling";
/// kstatus: the object cannot make progress without a change.
pub const STALLED: &str = "Stalled";

/// Every condition type the operator manages on a WorkerBackpressure, in the order written.
/// `GuardApplied` is present in Guard mode only, `ProducersThrottled` with `spec.producers`.
pub const ALL: [&str; 9] = [
    READY,
    DEPENDENCY_HEALTHY,
    SCALE_OUT_HELD,
    RAMPING,
    METRICS_AVAILABLE,
    CONFIG_IN_SYNC,
    POLICY_LIMITED,
    GUARD_APPLIED,
    PRODUCERS_THROTTLED,
];
