//! backpressure-worker (crate docs are completed below).

pub mod controller;
pub mod metrics;
pub mod permits;
