//! Traces of an HPA's syncs, replayed against the port.
//!
//! A trace is JSON (`crates/sim/traces/*.json`): the HPA's configuration and, per sync, what
//! the controller read and the replicas it left on the scale. A recorded trace comes from a
//! real kube-controller-manager (the lab); a hand-written one (`upstream-testcase-*.json`)
//! from the upstream test cases its `source` names.
//!
//! ```json
//! {
//!   "source": "hand-written from horizontal_test.go TestScaleUpCMExternal",
//!   "description": "…",
//!   "hpa": {
//!     "minReplicas": 2, "maxReplicas": 6,
//!     "target": {"type": "Value", "milliValue": 6666},
//!     "behavior": null,
//!     "tolerance": 0.1,
//!     "downscaleStabilizationSeconds": 300
//!   },
//!   "initialRecommendations": null,
//!   "steps": [
//!     {"t": 0, "specReplicas": 3, "statusReplicas": 3, "readyPods": 3, "metric": 8600,
//!      "desired": 4}
//!   ]
//! }
//! ```
//!
//! - `hpa.target`: `Value` or `AverageValue` in milli-units; `hpa.behavior`: the object's
//!   `spec.behavior` as written (`null`: unset); `tolerance` and
//!   `downscaleStabilizationSeconds`: the controller's flags.
//! - `initialRecommendations`: the controller's stored recommendations before the first step
//!   (`[{"t": -60, "replicas": 5}]`, times in the steps' clock); `null` or absent: none, a
//!   controller that has not seen the HPA yet.
//! - `steps[].t`: seconds; `metric`: the external metric's value in milli-units as the
//!   metrics API served it, `null` when the fetch failed; `desired`: `scale.spec.replicas`
//!   after the sync (the current replicas when the HPA did not scale); `note`: optional, free
//!   text; `proposed`: optional, the replica calculator's result the controller logged,
//!   checked as well.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{
    Behavior, ControllerFlags, HpaController, HpaError, HpaSpec, MetricTarget, SyncInput,
    SyncOutput,
};

/// The HPA and controller configuration of a trace.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TraceHpa {
    /// `spec.minReplicas`.
    pub min_replicas: i32,
    /// `spec.maxReplicas`.
    pub max_replicas: i32,
    /// The metric's target.
    pub target: MetricTarget,
    /// `spec.behavior`; `null`: unset.
    pub behavior: Option<Behavior>,
    /// `--horizontal-pod-autoscaler-tolerance`.
    pub tolerance: f64,
    /// `--horizontal-pod-autoscaler-downscale-stabilization`, seconds.
    pub downscale_stabilization_seconds: f64,
}

impl TraceHpa {
    /// The spec the port runs.
    pub fn spec(&self) -> HpaSpec {
        HpaSpec::new(self.min_replicas, self.max_replicas, self.target)
            .with_behavior(self.behavior.clone())
            .with_flags(ControllerFlags {
                tolerance: self.tolerance,
                downscale_stabilization_seconds: self.downscale_stabilization_seconds,
            })
    }
}

/// A stored recommendation.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TraceRecommendation {
    /// When, seconds.
    pub t: f64,
    /// The recommendation.
    pub replicas: i32,
}

/// One sync.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Step {
    /// Seconds.
    pub t: f64,
    /// `scale.spec.replicas`.
    pub spec_replicas: i32,
    /// `scale.status.replicas`.
    pub status_replicas: i32,
    /// Pods `Running` with `Ready=True`.
    pub ready_pods: i32,
    /// The metric's value (milli-units); `null`: the fetch failed.
    pub metric: Option<i64>,
    /// `scale.spec.replicas` after the sync.
    pub desired: i32,
    /// The replica calculator's proposal the controller logged ("Proposing desired replicas",
    /// `metricDesiredReplicas`), when the trace has it: checked too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposed: Option<i32>,
    /// Where the expectation comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Step {
    /// The port's input.
    pub fn input(&self) -> SyncInput {
        SyncInput {
            now: self.t,
            spec_replicas: self.spec_replicas,
            status_replicas: self.status_replicas,
            ready_pods: self.ready_pods,
            metric: self.metric,
        }
    }
}

/// A trace.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Trace {
    /// Where it comes from: a recording (cluster, versions, date) or the upstream test cases.
    pub source: String,
    /// What it exercises.
    #[serde(default)]
    pub description: String,
    /// The configuration.
    pub hpa: TraceHpa,
    /// Stored recommendations before the first step; `None`: a fresh controller.
    #[serde(default)]
    pub initial_recommendations: Option<Vec<TraceRecommendation>>,
    /// The syncs.
    pub steps: Vec<Step>,
}

/// The first step where the port disagrees with the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// Index of the step.
    pub step: usize,
    /// The step (inputs and the expected `desired`).
    pub input: Step,
    /// What the trace says the HPA wrote.
    pub expected: i32,
    /// What the port decided.
    pub got: SyncOutput,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.input;
        write!(
            f,
            "step {} (t={}s, specReplicas={}, statusReplicas={}, readyPods={}, metric={}): \
             expected desired={}, got {} (metric proposal {:?}, reason {:?}, limited {:?}, \
             stabilization {:?}, error {:?})",
            self.step,
            s.t,
            s.spec_replicas,
            s.status_replicas,
            s.ready_pods,
            s.metric
                .map_or_else(|| "null".to_owned(), |m| format!("{m}m")),
            self.expected,
            self.got.desired,
            self.got.metric_desired,
            self.got.reason,
            self.got.limited,
            self.got.stabilization,
            self.got.error,
        )
    }
}

/// Why a trace did not replay.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The configuration is invalid.
    #[error(transparent)]
    Spec(#[from] HpaError),
    /// A step disagrees.
    #[error("{0}")]
    Mismatch(Box<Mismatch>),
    /// A step's replica calculation disagrees with the proposal the controller logged.
    #[error(
        "step {step} (t={t}s, specReplicas={spec}, readyPods={ready}, metric={metric:?}m): \
         the controller proposed {expected}, the port {got:?}"
    )]
    Proposal {
        /// Index of the step.
        step: usize,
        /// Its time.
        t: f64,
        /// Its `specReplicas`.
        spec: i32,
        /// Its `readyPods`.
        ready: i32,
        /// Its metric.
        metric: Option<i64>,
        /// The logged proposal.
        expected: i32,
        /// The port's `metric_desired`.
        got: Option<i32>,
    },
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file is not a trace.
    #[error("parsing {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The error.
        source: serde_json::Error,
    },
}

/// Runs the port through the trace's steps and reports the first disagreement.
pub fn replay(trace: &Trace) -> Result<(), ReplayError> {
    let mut hpa = HpaController::new(trace.hpa.spec())?;
    if let Some(recs) = &trace.initial_recommendations {
        let recs: Vec<(f64, i32)> = recs.iter().map(|r| (r.t, r.replicas)).collect();
        hpa.set_recommendations(&recs);
    }
    for (i, step) in trace.steps.iter().enumerate() {
        let got = hpa.reconcile(&step.input());
        if let Some(expected) = step.proposed
            && got.metric_desired != Some(expected)
        {
            return Err(ReplayError::Proposal {
                step: i,
                t: step.t,
                spec: step.spec_replicas,
                ready: step.ready_pods,
                metric: step.metric,
                expected,
                got: got.metric_desired,
            });
        }
        if got.desired != step.desired {
            return Err(ReplayError::Mismatch(Box::new(Mismatch {
                step: i,
                input: step.clone(),
                expected: step.desired,
                got,
            })));
        }
    }
    Ok(())
}

/// Reads a trace file.
pub fn load(path: &Path) -> Result<Trace, ReplayError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReplayError::Io {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| ReplayError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// The `*.json` files of a directory, sorted.
pub fn files(dir: &Path) -> Result<Vec<PathBuf>, ReplayError> {
    let io = |source| ReplayError::Io {
        path: dir.to_owned(),
        source,
    };
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    Ok(paths)
}
