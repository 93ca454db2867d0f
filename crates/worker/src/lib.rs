//! backpressure-worker (crate docs are completed below).

pub mod controller;
