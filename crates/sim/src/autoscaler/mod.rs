//! Autoscalers behind one interface: none (static replicas), the KEDA comparators (KEDA's
//! metric source and the Kubernetes HPA controller's algorithm, ported: [`hpa`]), and ours.
//!
//! An autoscaler sees what the operator or KEDA would see: metrics from the last Prometheus
//! scrape (gauges at scrape time, rates over a window), the broker's own counts where KEDA
//! reads the broker directly, and the target's replica counts. It returns the replicas it
//! wants; the engine applies them to the fleet.
//!
//! "Ours" is the operator's real `decide` ([`ours`]).

pub mod hpa;
pub mod ours;

pub use hpa::Hpa;
pub use ours::{EPOCH_UNIX_SECONDS, Ours, spec_for, to_timestamp};

use backpressure_api::v1alpha1::{Action, ProducerState, Regime};

/// What an autoscaler can observe at a decision.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observation {
    /// Simulated seconds since the start of the run.
    pub now: f64,
    /// The target's `spec.replicas`.
    pub replicas: u32,
    /// Ready pods (`Running` with `Ready=True`).
    pub ready_pods: u32,
    /// Pods created and not terminating, ready or not (a Deployment's `status.replicas`).
    pub status_replicas: u32,
    /// Mean backoff factor of the ready pods at the last scrape.
    pub backoff: Option<f64>,
    /// Dependency failures per attempt over the rate window.
    pub failure_rate: Option<f64>,
    /// Queue age (the oldest message not yet delivered once) at the last scrape, seconds.
    pub queue_age: Option<f64>,
    /// Messages waiting at the last scrape.
    pub queue_depth: Option<f64>,
    /// Arrivals per second over the rate window.
    pub arrival_rate: Option<f64>,
    /// Completions per second over the rate window.
    pub completion_rate: Option<f64>,
    /// Mean failure floor of the ready pods at the last scrape (`backpressure_failure_floor`).
    pub failure_floor: Option<f64>,
    /// When the scrape was taken (seconds).
    pub sampled_at: f64,
    /// Messages never delivered, read from the broker at the decision (a Redis Streams
    /// consumer group's `lag`, `XINFO GROUPS`); `None`: the read failed or is not available.
    pub undelivered: Option<u64>,
    /// The metrics query failed (Prometheus unreachable or answering an error), as opposed to
    /// answering without a series (`queue_age: None`).
    pub scrape_failed: bool,
}

/// What an autoscaler decided.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Replicas wanted.
    pub desired: u32,
    /// The regime, for autoscalers that classify one.
    pub regime: Option<Regime>,
    /// The action, for autoscalers that report one.
    pub action: Option<Action>,
    /// What a backlog-only autoscaler would pick, if reported.
    pub recommended: Option<u32>,
    /// Why, in words.
    pub reason: String,
    /// When to decide again, in seconds (the operator's requeue); `None` for the fixed sync
    /// period.
    pub requeue_after: Option<f64>,
    /// The producer state, for an autoscaler that controls the producers.
    pub producers: Option<ProducerGate>,
    /// The set point the workers are to run (ours: the config push,
    /// `decide::worker_set_point`); `None`: the scenario's.
    pub worker_set_point: Option<f64>,
}

/// The producer state decided with the replicas (ours with `spec.producers`).
#[derive(Clone, Debug, PartialEq)]
pub struct ProducerGate {
    /// Open, Paused, Throttled or Resuming.
    pub state: ProducerState,
    /// Messages per second the whole producer workload may send (Throttled, Resuming).
    pub rate: Option<f64>,
    /// The event's message when the state or the rate changed.
    pub event: Option<String>,
}

impl Decision {
    /// Keep the current replicas.
    pub fn keep(replicas: u32) -> Self {
        Decision {
            desired: replicas,
            regime: None,
            action: None,
            recommended: None,
            reason: String::new(),
            requeue_after: None,
            producers: None,
            worker_set_point: None,
        }
    }
}

/// An autoscaler. Deterministic: no clock, no randomness of its own.
pub trait Autoscaler: std::fmt::Debug + Send {
    /// A short name for the report.
    fn name(&self) -> &'static str;

    /// Decides the replicas from an observation.
    fn decide(&mut self, obs: &Observation) -> Decision;
}

/// No autoscaling: replicas stay where they are.
#[derive(Clone, Debug, Default)]
pub struct Static;

impl Autoscaler for Static {
    fn name(&self) -> &'static str {
        "static"
    }

    fn decide(&mut self, obs: &Observation) -> Decision {
        Decision::keep(obs.replicas)
    }
}
