//! `WorkerBackpressure` status: regime, replicas, ramp, fleet, config, decision.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_derive::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::GuardKind;

/// What the operator observed and decided, and why.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct WorkerBackpressureStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The regime the fleet is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regime: Option<Regime>,

    /// Replica counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<ReplicaStatus>,

    /// The staged ramp in progress, if any. The operator resumes it from here after a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp: Option<RampStatus>,

    /// Hysteresis and stabilization state the decision carries from one reconcile to the next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracking: Option<TrackingStatus>,

    /// The fleet snapshot the last decision used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetStatus>,

    /// Worker configuration rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigStatus>,

    /// The last scaling decision (hold, scale out, scale in, ramp stage...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision: Option<DecisionRecord>,

    /// Policies applied to this object, by name, in precedence order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<String>>,

    /// Values a policy limit overrode: field path to a description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<BTreeMap<String, String>>,

    /// Set while the object is in DryRun, naming what put it there: `spec.mode`, the
    /// `kubectl wbp dry-run` annotation, or a BackpressurePolicy. Decisions are then computed
    /// and reported but never applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run_by: Option<String>,

    /// Guard mode: the autoscaler the operator clamps and how it is clamped right now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<GuardStatus>,

    /// Producer control (`spec.producers`): the state the producers are in, why, and how many
    /// producer pods run it. Independent of the worker hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producers: Option<ProducerStatus>,

    /// Ready, DependencyHealthy, ScaleOutHeld, Ramping, MetricsAvailable, ConfigInSync,
    /// PolicyLimited, GuardApplied in Guard mode, and ProducersThrottled with `spec.producers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
}

/// Producer control: the state, its reason and its rollout to the producer pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct ProducerStatus {
    /// `Open`, `Throttled`, `Paused` or `Resuming`.
    pub state: ProducerState,
    /// When the producers entered this state (a `Resuming` step restarts it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// Messages per second the whole producer workload may send (`Throttled`, `Resuming`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// `Resuming`: the rate allowed in the step before this one (0 after a pause). The arrival
    /// rate's window can still reach into that step, so whether the producers send less than
    /// they may is judged against the lower of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_rate: Option<f64>,
    /// Since when every signal has been below its low watermark without interruption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below_resume_since: Option<Time>,
    /// The watermarks in force, for example `queueDepth 800/200, queueAge 10m/2m` (pause
    /// above / resume below).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermarks: Option<String>,
    /// Why, in words and numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Content hash of the producer state document the pods should run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// Generation of the producer state document (grows whenever its hash changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Ready producer pods that acknowledged the current document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_in_sync: Option<i32>,
    /// Ready producer pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_total: Option<i32>,
}

/// The states of producer control.
#[derive(
    JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
)]
pub enum ProducerState {
    /// Producers send freely.
    #[default]
    Open,
    /// Producers send at most `rate` (a share of the fleet's completion rate).
    Throttled,
    /// Producers send nothing.
    Paused,
    /// On the way back to `Open`: producers send at most `rate`, which rises while the queue
    /// stays below the low watermark.
    Resuming,
}

impl ProducerState {
    /// All states, in declaration order (metrics export every label value).
    pub const ALL: [ProducerState; 4] = [
        ProducerState::Open,
        ProducerState::Throttled,
        ProducerState::Paused,
        ProducerState::Resuming,
    ];

    /// The name as written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            ProducerState::Open => "Open",
            ProducerState::Throttled => "Throttled",
            ProducerState::Paused => "Paused",
            ProducerState::Resuming => "Resuming",
        }
    }
}

/// The guarded autoscaler and its clamp.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct GuardStatus {
    /// `HorizontalPodAutoscaler` or `ScaledObject`.
    pub kind: GuardKind,
    /// Name of the autoscaler in the object's namespace.
    pub name: String,
    /// What is clamped now.
    pub clamp: GuardClamp,
    /// The replica ceiling during a ramp (the HPA's `maxReplicas`, the ScaledObject's
    /// `maxReplicaCount`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_replicas: Option<i32>,
}

/// How a guarded autoscaler is clamped.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GuardClamp {
    /// Nothing: the autoscaler runs with its original settings.
    #[default]
    None,
    /// Scale-out disabled (failure rate above the set point, manual hold, or held / hold
    /// pending with `hold.allowScaleIn`): HPA `behavior.scaleUp.selectPolicy: Disabled`, KEDA
    /// annotation `autoscaling.keda.sh/paused-scale-out: "true"`.
    ScaleOutDisabled,
    /// Scale-out and scale-in disabled (held, or hold pending, without `hold.allowScaleIn`):
    /// HPA `behavior.scaleUp.selectPolicy` and `behavior.scaleDown.selectPolicy: Disabled`,
    /// KEDA annotations `autoscaling.keda.sh/paused-scale-out` and
    /// `autoscaling.keda.sh/paused-scale-in: "true"`.
    ScalingDisabled,
    /// During a ramp: the autoscaler may scale out up to `maxReplicas` only.
    MaxReplicas,
}

/// The regimes of the fleet.
#[derive(
    JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
)]
pub enum Regime {
    /// The queue is served within its target age.
    #[default]
    Healthy,
    /// The producer outpaces a healthy fleet: scale out.
    Backlogged,
    /// Backoff shows the dependency is failing: scale-out held.
    DependencyFailing,
    /// The dependency recovered: staged ramp in progress.
    Recovering,
    /// Metrics missing, stale or NaN: the fallback applies.
    MetricsUnavailable,
    /// `spec.suspend` is true.
    Suspended,
}

impl Regime {
    /// All regimes, in declaration order (metrics export every label value).
    pub const ALL: [Regime; 6] = [
        Regime::Healthy,
        Regime::Backlogged,
        Regime::DependencyFailing,
        Regime::Recovering,
        Regime::MetricsUnavailable,
        Regime::Suspended,
    ];

    /// The name as written in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Regime::Healthy => "Healthy",
            Regime::Backlogged => "Backlogged",
            Regime::DependencyFailing => "DependencyFailing",
            Regime::Recovering => "Recovering",
            Regime::MetricsUnavailable => "MetricsUnavailable",
            Regime::Suspended => "Suspended",
        }
    }
}

/// Replica counts.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    /// Replicas of the target at the last observation.
    pub current: i32,
    /// Replicas the operator wants.
    pub desired: i32,
    /// What a backlog-only autoscaler would pick (no hold, no ramp).
    pub recommended: i32,
}

/// A staged ramp.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct RampStatus {
    /// The stage reached, 1-based.
    pub stage: i32,
    /// Number of stages.
    pub of: i32,
    /// Replicas when the ramp started.
    pub from: i32,
    /// Replicas the ramp is heading to.
    pub to: i32,
    /// When the current stage started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_started_at: Option<Time>,
    /// When the next stage may start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_stage_at: Option<Time>,
    /// How many ramps were aborted back to hold since the last full recovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborts: Option<i32>,
}

/// State carried between reconciles for hysteresis and stabilization.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct TrackingStatus {
    /// Since when fleet backoff has been above `hold.backoffAbove` without interruption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub above_hold_since: Option<Time>,
    /// Since when fleet backoff has been below `release.backoffBelow` without interruption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below_release_since: Option<Time>,
    /// When the target was last scaled out by the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_up: Option<Time>,
    /// When the target was last scaled in by the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_down: Option<Time>,
    /// Recommendation change points inside the scale-down stabilization window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recommendations: Option<Vec<RecommendationPoint>>,
    /// When the ready pods last rose, while the completion rate's window (`metrics.rateWindow`)
    /// still reaches back before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_rose_at: Option<Time>,
    /// The pods the completion rate stood for just before that rise (fractional when an
    /// earlier rise was still inside the window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_before_rise: Option<f64>,
    /// The fleet's highest recent dependency call rate: the reference of its load test for a
    /// failure floor (see `fleetFloor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_peak: Option<LoadPeak>,
    /// Since when the fleet's failures have stayed where they were while its calls were at most
    /// `0.8·(1 − setPoint)` of `loadPeak`, and the failure rate when that began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_evidence: Option<FloorEvidence>,
    /// The failure floor the fleet's load test found: the share of calls that kept failing
    /// while the fleet's calls fell (`setPoint/2` < floor <= `worker.floorMax`). It counts like
    /// the workers' own floor until the failure rate falls to the set point or to half the
    /// floor, whichever is lower, or rises above `worker.floorMax`, and meanwhile the workers
    /// are pushed the set point `floor + setPoint·(1 − floor)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_floor: Option<f64>,
}

/// The fleet's highest recent dependency call rate.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct LoadPeak {
    /// Dependency calls per second (completions over the share of calls that succeed).
    pub calls: f64,
    /// Since when the fleet has run below 80 % of it (absent while it runs near it). It is
    /// forgotten 10 minutes after that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub below_since: Option<Time>,
}

/// The fleet's load test in progress.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct FloorEvidence {
    /// When the evidence began.
    pub since: Time,
    /// The failure rate then.
    pub failure_rate: f64,
}

/// A recommendation that held from `since` until the next point.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct RecommendationPoint {
    /// When this recommendation was first made.
    pub since: Time,
    /// The recommended replicas.
    pub replicas: i32,
}

/// A fleet snapshot. Absent values were unknown (missing, NaN or stale), never zero.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct FleetStatus {
    /// Mean backoff factor of the fleet, in [0,1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<f64>,
    /// Dependency failures per attempt, in [0,1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_rate: Option<f64>,
    /// Age in seconds of the oldest message not yet delivered once (redeliveries do not count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_age: Option<f64>,
    /// Messages waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<f64>,
    /// Messages arriving per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival_rate: Option<f64>,
    /// Messages completed per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_rate: Option<f64>,
    /// Ready pods of the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_pods: Option<i32>,
    /// When the metrics were read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampled_at: Option<Time>,
}

/// Worker configuration rollout.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct ConfigStatus {
    /// Content hash of the rendered worker configuration.
    pub hash: String,
    /// Generation of the rendered configuration: grows by one whenever the hash changes, so
    /// workers can refuse an older payload arriving late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Ready pods that report running this hash.
    pub pods_in_sync: i32,
    /// Ready pods of the target.
    pub pods_total: i32,
}

/// Scaling actions.
#[derive(
    JsonSchema,
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
)]
pub enum Action {
    /// Nothing to change.
    #[default]
    None,
    /// Replicas increased for a backlog.
    ScaleOut,
    /// Replicas decreased.
    ScaleIn,
    /// Scale-out withheld because the dependency is failing.
    HoldScaleOut,
    /// A ramp stage started.
    RampStage,
    /// A ramp was aborted because backoff rose again.
    AbortRamp,
    /// The metrics-unavailable fallback was applied.
    Fallback,
}

impl Action {
    /// All actions, in declaration order.
    pub const ALL: [Action; 7] = [
        Action::None,
        Action::ScaleOut,
        Action::ScaleIn,
        Action::HoldScaleOut,
        Action::RampStage,
        Action::AbortRamp,
        Action::Fallback,
    ];

    /// The name as written in status and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::None => "None",
            Action::ScaleOut => "ScaleOut",
            Action::ScaleIn => "ScaleIn",
            Action::HoldScaleOut => "HoldScaleOut",
            Action::RampStage => "RampStage",
            Action::AbortRamp => "AbortRamp",
            Action::Fallback => "Fallback",
        }
    }
}

/// One decision, with its reason in words and numbers.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct DecisionRecord {
    /// When it was made.
    pub time: Time,
    /// What was decided.
    pub action: Action,
    /// Replicas before.
    pub from: i32,
    /// Replicas after (or that would have been set in DryRun).
    pub to: i32,
    /// Why, for example "fleet backoff 0.31 > 0.20 for 45s".
    pub reason: String,
    /// True when the decision was not applied because of DryRun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
}
