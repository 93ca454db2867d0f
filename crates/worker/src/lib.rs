//! backpressure-worker (crate docs are completed below).

pub mod config;
pub mod controller;
pub mod metrics;
pub mod permits;
pub mod worker_loop;
