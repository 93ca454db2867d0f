//! operator

pub mod resolve;
