//! backpressure-sim
