//! `backpressure.dev/v1alpha1`: the `WorkerBackpressure` and `BackpressurePolicy` resources.
//!
//! Every spec field is optional on purpose. The effective value of a field is, in order: the
//! object's own value, then the matching `BackpressurePolicy` objects by priority, then the
//! built-in default named in the field's documentation ([`crate::defaults`]). Limits in a
//! policy always win. Leaving defaults out of the stored object is what lets a platform team
//! change a default for the whole fleet without touching every object.

mod policy;
mod queue;
mod spec;
mod status;

pub use policy::*;
pub use queue::*;
pub use spec::*;
pub use status::*;

/// API group of every resource in this crate.
pub const GROUP: &str = "backpressure.dev";
/// API version of this module's resources.
pub const VERSION: &str = "v1alpha1";
