//! backpressure-lab: the whole system on one machine with real parts.

pub mod queue;
pub mod scenario;
