//! `backpressure-sim`: a deterministic discrete-event model of queue workers with backpressure
//! and autoscalers, and the scenario benchmark that compares policies on the same seeds.
//!
//! The model (see [`engine`] for the time-step choice and its error):
//!
//! - a **producer** with Poisson arrivals at a rate that changes in steps and surges; with
//!   producer control (issue 17) a gate the operator sets and a backlog of what it holds
//!   ([`producer`]);
//! - a **queue** with at-least-once delivery, redelivery after a visibility timeout, a DLQ
//!   after `maxReceives` failed deliveries, first-attempt age and depth, optionally a capacity
//!   past which the broker rejects publishes ([`queue`]);
//! - **worker pods** that start after a startup delay, each with its own controller from
//!   `backpressure-worker` (the real `SetPoint` and `Off` controllers, driven with simulated
//!   time) and its permits;
//! - a **dependency** with a capacity shared by the fleet, overload failures, injected outages
//!   (hard, partial, intermittent), capacity that returns gradually, noise and latency
//!   ([`dependency`]);
//! - **autoscalers** behind one trait: static, KEDA on the queue age or on the broker's lag
//!   (KEDA's metric source and the Kubernetes HPA controller's algorithm, ported), and ours
//!   ([`autoscaler`]).
//!
//! Nothing reads a clock and every random draw comes from a stream seeded by the scenario
//! ([`rng`]): the same scenario file gives the same numbers.

pub mod autoscaler;
pub mod dependency;
pub mod engine;
pub mod metrics;
pub mod plot;
pub mod policy;
pub mod producer;
pub mod queue;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod stats;
pub mod sweep;

pub use engine::{RunOutput, Sample, SimError, Simulation};
pub use policy::{POLICIES, Policy};
pub use scenario::Scenario;
