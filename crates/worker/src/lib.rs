//! backpressure-worker
