//! What a tenant may reach through `spec.metrics`: its queries scoped to its own namespace
//! ([`query`]) and the Prometheus addresses it may name, matched on their origin, with
//! credentials never shown ([`address`]). Pure functions; the operator applies them before any
//! query leaves.

pub mod address;
pub mod query;
