//! Test fixtures for `decide`: an effective configuration built from the real resolver, fleet
//! metrics, and a small closed-loop [`World`] that feeds each decision's status and replicas
//! back into the next observation (as the operator and the simulator do).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use backpressure_api::v1alpha1::{
    ConfigStatus, TargetRef, WorkerBackpressure, WorkerBackpressureSpec, WorkerBackpressureStatus,
};
use k8s_openapi::jiff::Timestamp;

use super::{Decision, FleetMetrics, Observation, decide};
use crate::resolve::{Effective, EffectiveScaling, resolve};

/// The epoch of every test: 2027-01-15T08:00:00Z.
pub const T0: i64 = 1_800_000_000;

/// `T0 + secs`.
pub fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(T0 + secs).unwrap()
}

/// A spec that sets only its target: the Deployment `name`.
pub fn spec_for(name: &str) -> WorkerBackpressureSpec {
    WorkerBackpressureSpec {
        target_ref: TargetRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: name.into(),
        },
        ..Default::default()
    }
}

/// The object `ns/name` with [`spec_for`]`(name)` and no status.
pub fn wbp(ns: &str, name: &str) -> WorkerBackpressure {
    let mut w = WorkerBackpressure::new(name, spec_for(name));
    w.metadata.namespace = Some(ns.into());
    w
}

/// The built-in defaults (resolved from an empty spec) with `tweak` applied to scaling;
/// `maxReplicas` is 50 unless the tweak says otherwise.
pub fn effective(tweak: impl FnOnce(&mut EffectiveScaling)) -> Effective {
    let mut eff = resolve(&spec_for("export-worker"), &[], at(0)).unwrap();
    eff.scaling.max_replicas = 50;
    tweak(&mut eff.scaling);
    eff
}

/// Fleet metrics with only the backoff set.
pub fn fleet(backoff: f64) -> FleetMetrics {
    FleetMetrics {
        backoff: Some(backoff),
        failure_rate: Some(backoff / 4.0),
        ..FleetMetrics::default()
    }
}

/// What the queue looks like. Completion follows the ready pods (`per_pod × ready`, at most
/// what arrives when the queue is empty).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Queue {
    /// Served exactly at the target age: arrivals = per-pod throughput × ready pods.
    Steady,
    /// A worked example: age 412 s, depth 12000, 300/s arriving, 22.5/s per pod (→ 14).
    Backlog,
    /// Empty: age 0, depth 0, 10/s arriving and completing.
    Idle,
    /// No queue metric known.
    Unknown,
}

/// A closed loop around [`decide`].
#[derive(Debug, Clone)]
pub struct World {
    /// The configuration.
    pub eff: Effective,
    /// The status as stored (fed back each step).
    pub status: Option<WorkerBackpressureStatus>,
    /// Seconds since [`T0`].
    pub t: i64,
    /// Replicas of the target (follows `scale_to`).
    pub current: i32,
    /// Ready pods (follow the replicas immediately unless pinned).
    pub ready: i32,
    /// Fleet backoff; `None` is unknown.
    pub backoff: Option<f64>,
    /// The queue.
    pub queue: Queue,
    /// A metrics query error.
    pub error: Option<String>,
    /// Pods in sync.
    pub config: Option<ConfigStatus>,
    /// Round-trip the status through JSON between steps, as the API server does.
    pub via_json: bool,
    /// The dependency failure rate, if set; otherwise a quarter of the backoff.
    pub failure_rate: Option<f64>,
    /// The fleet's failure floor (`None`: not exported).
    pub failure_floor: Option<f64>,
    /// The partitions the queue's exporter counts (`None`: not exported).
    pub partitions: Option<f64>,
    /// The fleet completion rate, if set; otherwise the queue's.
    pub completion_rate: Option<f64>,
}

impl World {
    /// A world with `replicas` ready replicas, backoff 0, a steady queue.
    pub fn new(eff: Effective, replicas: i32) -> Self {
        World {
            eff,
            status: None,
            t: 0,
            current: replicas,
            ready: replicas,
            backoff: Some(0.0),
            queue: Queue::Steady,
            error: None,
            config: None,
            via_json: true,
            failure_rate: None,
            failure_floor: None,
            partitions: None,
            completion_rate: None,
        }
    }

    /// Sets the backoff.
    pub fn backoff(&mut self, b: f64) -> &mut Self {
        self.backoff = Some(b);
        self
    }

    /// Sets the queue.
    pub fn queue(&mut self, q: Queue) -> &mut Self {
        self.queue = q;
        self
    }

    /// The metrics of this instant.
    pub fn metrics(&self) -> FleetMetrics {
        let r = f64::from(self.ready);
        let (age, depth, arrival, completion) = match self.queue {
            Queue::Steady => (Some(60.0), Some(1200.0 * r), Some(20.0 * r), Some(20.0 * r)),
            Queue::Backlog => (Some(412.0), Some(12000.0), Some(300.0), Some(22.5 * r)),
            Queue::Idle => (Some(0.0), Some(0.0), Some(10.0), Some(10.0)),
            Queue::Unknown => (None, None, None, None),
        };
        FleetMetrics {
            backoff: self.backoff,
            failure_rate: self.failure_rate.or(self.backoff.map(|b| b / 4.0)),
            queue_age: age,
            queue_depth: depth,
            arrival_rate: arrival,
            completion_rate: self.completion_rate.or(completion),
            failure_floor: self.failure_floor,
            partitions: self.partitions,
        }
    }

    /// The observation of this instant.
    pub fn observation(&self) -> Observation {
        Observation {
            now: at(self.t),
            generation: Some(1),
            current_replicas: self.current,
            ready_pods: self.ready,
            fleet: self.metrics(),
            metrics_error: self.error.clone(),
            config: self.config.clone(),
        }
    }

    /// Decides without advancing time or applying anything.
    pub fn peek(&self) -> Decision {
        decide(&self.eff, self.status.as_ref(), &self.observation())
    }

    /// Advances `dt` seconds, decides, stores the status and applies the scale.
    pub fn step(&mut self, dt: i64) -> Decision {
        self.t += dt;
        let d = self.peek();
        self.status = Some(if self.via_json {
            let json = serde_json::to_string(&d.status).unwrap();
            serde_json::from_str(&json).unwrap()
        } else {
            d.status.clone()
        });
        if let Some(n) = d.scale_to() {
            self.current = n;
            self.ready = n;
        }
        d
    }

    /// The same world after an operator restart: only the stored status survives.
    pub fn restarted(&self) -> World {
        World {
            status: self
                .status
                .as_ref()
                .map(|s| serde_json::from_value(serde_json::to_value(s).unwrap()).unwrap()),
            ..self.clone()
        }
    }
}
