//! backpressure-envtest
