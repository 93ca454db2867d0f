//! operator

pub mod resolve;
pub mod decide;
