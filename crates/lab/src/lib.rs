//! backpressure-lab: the whole system on one machine with real parts.

pub mod cluster;
pub mod dependency;
pub mod hpa;
pub mod kubelet;
pub mod operator;
pub mod plot;
pub mod producer;
pub mod prom;
pub mod queue;
pub mod record;
pub mod run;
pub mod scenario;
pub mod serve;
pub mod worker;
