//! backpressure-lab
