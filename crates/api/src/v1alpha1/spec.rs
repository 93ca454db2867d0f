//! `WorkerBackpressure` and its spec.

use kube_derive::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{QueueSpec, WorkerBackpressureStatus};
use crate::duration::Duration;

/// Backpressure-aware autoscaling for one queue worker workload.
///
/// The operator pushes the worker controller configuration (`spec.worker`) to the workload's
/// pods, reads fleet backoff and queue metrics from Prometheus, and scales the target through its
/// `/scale` subresource: it scales out for a genuine backlog, holds while the fleet's backoff
/// shows the dependency is failing, and ramps up in stages after recovery.
// Repeated `printcolumn(type_ = ...)` keys are separate columns, not duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "backpressure.dev",
    version = "v1alpha1",
    kind = "WorkerBackpressure",
    plural = "workerbackpressures",
    singular = "workerbackpressure",
    shortname = "wbp",
    category = "backpressure",
    namespaced,
    status = "WorkerBackpressureStatus",
    printcolumn(
        name = "Target",
        type_ = "string",
        json_path = ".spec.targetRef.name",
        description = "The scaled workload"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the last reconcile decided with metrics (the Ready condition)"
    ),
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".spec.mode",
        priority = 1,
        description = "Active, DryRun or Guard"
    ),
    printcolumn(
        name = "Regime",
        type_ = "string",
        json_path = ".status.regime",
        description = "What the operator last decided the fleet is in"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".status.replicas.current",
        description = "Current replicas of the target"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        json_path = ".status.replicas.desired",
        description = "Replicas the operator wants"
    ),
    printcolumn(
        name = "Recommended",
        type_ = "integer",
        json_path = ".status.replicas.recommended",
        priority = 1,
        description = "Replicas a backlog-only autoscaler would pick"
    ),
    printcolumn(
        name = "Backoff",
        type_ = "number",
        json_path = ".status.fleet.backoff",
        description = "Fleet backoff factor in [0,1]"
    ),
    printcolumn(
        name = "Queue Age",
        type_ = "number",
        json_path = ".status.fleet.queueAge",
        description = "Age in seconds of the oldest message not yet delivered once"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.mode) || self.mode != 'Guard' || has(self.guard)").message("spec.guard is required when spec.mode is Guard").field_path(".guard").reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new("!has(self.producers) || has(self.producers.targetRef) || (has(self.producers.mode) && self.producers.mode == 'Off')").message("spec.producers.targetRef is required unless spec.producers.mode is Off").field_path(".producers.targetRef").reason(Reason::FieldValueRequired))]
pub struct WorkerBackpressureSpec {
    /// The workload to scale: anything that serves the `/scale` subresource (Deployment,
    /// StatefulSet, or a custom resource), in the same namespace.
    pub target_ref: TargetRef,

    /// `Active` (default) scales the target; `DryRun` decides and reports everything, including
    /// what it would have done, and never writes to the target; `Guard` leaves scaling to an
    /// existing HPA or KEDA ScaledObject (`spec.guard`) and clamps it wherever `Active` would
    /// not scale: no scale-out while held, while a hold is pending or while the failure rate is
    /// above the set point, no scale-in while held or pending (unless `hold.allowScaleIn`), the
    /// stage's ceiling during a ramp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,

    /// Stop deciding and acting for this object. Status says `Suspended`; the target and its
    /// pods are left as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,

    /// The autoscaler to guard in `Guard` mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<GuardRef>,

    /// The worker controller configuration pushed to every pod of the target (the wire
    /// contract in `backpressure_api::wire`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerSpec>,

    /// Where fleet backoff and queue metrics come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsSpec>,

    /// The queue the workers consume, when it is read from its system's standard exporter
    /// (Redis Streams, RabbitMQ, SQS, Kafka, Pub/Sub) instead of the worker library's own
    /// `backpressure_queue_*` series: the operator then builds the queue queries
    /// (docs/queues.md). Absent: `Custom`, the worker library's series.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueSpec>,

    /// How replicas are chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<ScalingSpec>,

    /// Producer backpressure: pause or throttle the workload that feeds the queue while the
    /// backlog is above a high watermark, so that holding the workers during an outage does
    /// not grow the queue without bound. Absent: producers are not touched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producers: Option<ProducersSpec>,
}

/// A reference to the scaled workload in the object's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// API version of the target, for example `apps/v1`.
    #[schemars(length(min = 1, max = 253))]
    pub api_version: String,
    /// Kind of the target, for example `Deployment`.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    /// Name of the target.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// What the operator may do to the target.
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
pub enum Mode {
    /// Scale the target through its `/scale` subresource.
    #[default]
    Active,
    /// Decide and report, never write to the target.
    DryRun,
    /// Clamp an existing HPA or KEDA ScaledObject instead of scaling directly.
    Guard,
}

/// The autoscaler guarded in `Guard` mode.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct GuardRef {
    /// `HorizontalPodAutoscaler` (autoscaling/v2) or `ScaledObject` (keda.sh/v1alpha1).
    pub kind: GuardKind,
    /// Name of the autoscaler in the object's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Kinds of autoscaler that `Guard` mode can clamp.
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
pub enum GuardKind {
    /// An autoscaling/v2 HorizontalPodAutoscaler.
    #[default]
    HorizontalPodAutoscaler,
    /// A KEDA ScaledObject.
    ScaledObject,
}

/// The in-pod backpressure controller's configuration.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct WorkerSpec {
    /// Controller algorithm: `SetPoint` (default), `RatioThrottle`, `Fixed` or `Off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<Algorithm>,

    /// Failure rate treated as background noise, in [0.0001, 1). Backoff grows only while the
    /// dependency failure rate is above it. Defaults to 0.05. Expected dead letters are about
    /// messages × setPoint^R for R delivery attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0001 && self < 1.0").message("setPoint must be at least 0.0001 and less than 1"))]
    pub set_point: Option<f64>,

    /// Reaction size N: the number of dependency failures (net of successes) that take the
    /// backoff factor from 0 to 1. Defaults to max(20, maxPermits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub reaction: Option<u32>,

    /// Messages a pod may process at once with no backoff. Defaults to 16; at most 1024, the
    /// largest value the worker library accepts by default (`config::Limits`), so that a valid
    /// object never produces a config its workers refuse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_permits: Option<u32>,

    /// How a fully backed-off worker probes the dependency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeSpec>,

    /// Permits of a freshly started pod, which ramps up to maxPermits over about 16 round trips
    /// (slower while failures exceed the set point), so that pods started together (a
    /// scale-out, a rollout) do not all open maxPermits calls at once. 0 starts at maxPermits.
    /// Defaults to 2, what docs/sim/report.md measures; at most 1024.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1024))]
    pub initial_permits: Option<u32>,

    /// Sliding window of the RatioThrottle algorithm. Defaults to 30s; between 1s and 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('1h')").message("ratioWindow must be between 1s and 1h"))]
    pub ratio_window: Option<Duration>,

    /// How long a full brake takes to lift when it expires or is lowered or removed: each pod
    /// waits a random offset of up to half of it, then its permits return linearly, so the
    /// fleet does not come back in one second. 0s lifts in one step. Defaults to 60s; at
    /// most 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('0s') && duration(self) <= duration('1h')").message("brakeRelease must be between 0s and 1h"))]
    pub brake_release: Option<Duration>,

    /// SetPoint only: the highest dependency-failure rate the worker may learn as not caused by
    /// its own load (a failure floor it does not throttle for); above it failures are treated as
    /// an outage. 0 turns the floor off. Defaults to 0.25; at most 0.9.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0 && self <= 0.9").message("floorMax must be between 0 and 0.9"))]
    pub floor_max: Option<f64>,

    /// How soon a failed message is delivered again (the worker nacks it with a delay growing
    /// with its receive count, instead of waiting out the queue's visibility timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redelivery: Option<RedeliverySpec>,

    /// `Disabled` for metrics-only workers: workers that export the backpressure metrics but
    /// take no config pushes (no admin endpoint, or a worker in another language without the
    /// config receiver). The operator reads their metrics, scales and holds as for any fleet,
    /// pushes nothing and mints no push token, and `ConfigInSync` says `NotManaged`; the
    /// worker ConfigMap is still written for pods that read it from a file. Defaults to
    /// `Enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<ConfigPush>,
}

/// Whether the operator pushes the worker config to the pods (`spec.worker.push`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConfigPush {
    /// Push the config to every ready pod's admin endpoint (the default).
    #[default]
    Enabled,
    /// Push nothing: the workers are metrics-only.
    Disabled,
}

/// The redelivery backoff: a message whose k-th delivery failed is visible again
/// `base · 2^(k-1)` later, at most `max`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.base) || !has(self.max) || duration(self.base) <= duration(self.max)").message("redelivery.base must not exceed redelivery.max").field_path(".base"))]
pub struct RedeliverySpec {
    /// The delay after a failed first delivery; 0s turns the backoff off (the visibility
    /// timeout decides). Defaults to 1m; at most 12h (SQS's largest visibility timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('0s') && duration(self) <= duration('12h')").message("redelivery.base must be between 0s and 12h"))]
    pub base: Option<Duration>,
    /// The longest delay. Defaults to 8m; at most 12h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('0s') && duration(self) <= duration('12h')").message("redelivery.max must be between 0s and 12h"))]
    pub max: Option<Duration>,
}

/// Worker controller algorithms (see `backpressure-worker`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Set-point integrator with probing and slow start (default).
    #[default]
    SetPoint,
    /// Google SRE client-side throttling with K = 1/(1 - setPoint).
    RatioThrottle,
    /// A fixed number of permits, no backoff.
    Fixed,
    /// No throttling: maxPermits always.
    Off,
}

/// Probing while fully backed off.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.initialInterval) || !has(self.maxInterval) || duration(self.initialInterval) <= duration(self.maxInterval)").message("probe.initialInterval must not exceed probe.maxInterval").field_path(".initialInterval"))]
pub struct ProbeSpec {
    /// First interval between probes once fully backed off. Defaults to 2s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_interval: Option<Duration>,
    /// The probe interval doubles up to this. Defaults to 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_interval: Option<Duration>,
}

/// Metrics sources.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct MetricsSpec {
    /// The Prometheus that scrapes the workers and the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusSpec>,

    /// Value of the `workload` label that the workers and the queue exporter put on their
    /// series. Defaults to `spec.targetRef.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub workload: Option<String>,

    /// PromQL overrides, one per metric kind. Each query must return one series per workload
    /// labelled `namespace` and `workload`: the operator runs each distinct query once per
    /// interval and picks this object's series by those labels. A query written here reads this
    /// namespace only: every selector in it gets `namespace="<this namespace>"` (replacing any
    /// `namespace` matcher written), unless a BackpressurePolicy selecting this namespace sets
    /// `metricsAccess.allowCrossNamespaceQueries`. A query that does not parse, or reads no
    /// series at all (`vector(1)`), makes the metrics unavailable, with the field named in the
    /// MetricsAvailable condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queries: Option<QueryOverrides>,

    /// Window of the `rate()` in the default queries. Defaults to 1m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_window: Option<Duration>,

    /// A sample older than this is unknown, never zero. Defaults to 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_after: Option<Duration>,
}

/// Connection to Prometheus.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct PrometheusSpec {
    /// Base URL of the Prometheus HTTP API, for example `http://prometheus.monitoring:9090`.
    /// Defaults to the operator's `--prometheus-url`. Another address is queried only if its
    /// scheme, host and port are allowed: by the operator's `--allowed-prometheus-address` or by
    /// a BackpressurePolicy's `metricsAccess.prometheusAddresses` that selects this namespace;
    /// otherwise the MetricsAvailable condition names this field and nothing is fetched.
    /// Credentials in the URL are never shown in status or events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("self.startsWith('http://') || self.startsWith('https://')").message("address must be an http:// or https:// URL"))]
    pub address: Option<String>,
    /// Timeout of each query. Defaults to 5s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// A Secret in the object's namespace holding a bearer token (key `token`) or basic-auth
    /// credentials (keys `username` and `password`). The operator sends it only to an address
    /// the Secret itself lists in its annotation `backpressure.dev/prometheus-addresses`
    /// (comma- or space-separated URLs, matched on scheme, host and port), or to one the
    /// platform trusts with credentials (`--allowed-prometheus-address`, `--prometheus-url`, or
    /// a policy's `metricsAccess.prometheusAddresses` entry with `credentials: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretRef>,
}

/// The annotation by which a Secret consents to being sent to Prometheus addresses: a comma-
/// or space-separated list of URLs, matched on scheme, host and port. Whoever may annotate the
/// Secret (its owner, not whoever may create a WorkerBackpressure) decides where it may go.
pub const PROMETHEUS_ADDRESSES_ANNOTATION: &str = "backpressure.dev/prometheus-addresses";

/// A reference to a Secret in the same namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// PromQL overrides per metric kind.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct QueryOverrides {
    /// Fleet backoff factor in [0,1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
    /// Dependency failures per attempt, in [0,1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_rate: Option<String>,
    /// Age in seconds of the oldest message not yet delivered once (waiting for its first
    /// delivery attempt; redeliveries do not count), 0 when none waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_age: Option<String>,
    /// Messages waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<String>,
    /// Messages arriving per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arrival_rate: Option<String>,
    /// Messages completed per second by the whole fleet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_rate: Option<String>,
}

/// How replicas are chosen.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.minReplicas) ? self.minReplicas : 1) <= (has(self.maxReplicas) ? self.maxReplicas : 10)").message("minReplicas must not exceed maxReplicas (defaults: 1 and 10)").field_path(".minReplicas"))]
#[x_kube(validation = Rule::new("(has(self.release) && has(self.release.backoffBelow) ? self.release.backoffBelow : 0.05) < (has(self.hold) && has(self.hold.backoffAbove) ? self.hold.backoffAbove : 0.2)").message("release.backoffBelow must be below hold.backoffAbove (defaults: 0.05 and 0.2)").field_path(".release.backoffBelow"))]
pub struct ScalingSpec {
    /// Fewest replicas, never undercut, also not on missing metrics. Defaults to 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100000))]
    pub min_replicas: Option<i32>,

    /// Most replicas. Defaults to 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_replicas: Option<i32>,

    /// Queue age the workload is willing to serve (the age of the oldest message not yet
    /// delivered once; redeliveries do not count); the backlog
    /// sizing aims to keep the queue age at or below it. Defaults to 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_queue_age: Option<Duration>,

    /// When to stop scale-out because the dependency is failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<HoldSpec>,

    /// When a hold ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<ReleaseSpec>,

    /// Scale-out step limits (HPA-style).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up: Option<ScaleUpSpec>,

    /// Scale-in step limits and stabilization (HPA-style).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down: Option<ScaleDownSpec>,

    /// The staged ramp after a hold is released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp_up: Option<RampUpSpec>,

    /// What to do while metrics are missing, stale or NaN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_metrics_unavailable: Option<MetricsFallback>,
}

/// Hold: no scale-out while the fleet is backed off.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct HoldSpec {
    /// Fleet backoff above which scale-out is held. Where the workers report a failure floor
    /// (failures that do not respond to load), the fleet failure rate must also be above their
    /// effective set point. Defaults to 0.2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0.0 && self <= 1.0").message("backoffAbove must be greater than 0 and at most 1"))]
    pub backoff_above: Option<f64>,
    /// How long backoff must stay above the threshold before the hold starts. Defaults to 30s.
    #[serde(rename = "for", default, skip_serializing_if = "Option::is_none")]
    pub for_: Option<Duration>,
    /// Allow scale-in while held (the backlog is not served anyway). Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_scale_in: Option<bool>,
}

/// Release: the end of a hold.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct ReleaseSpec {
    /// Fleet backoff below which a hold may end. A hold also ends with the backoff at or below
    /// `hold.backoffAbove` and the fleet failure rate at or below the workers' effective set
    /// point, where no backlog waits for the withheld pods or the workers report a failure
    /// floor. Must be below `hold.backoffAbove`. Defaults to 0.05.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0 && self < 1.0").message("backoffBelow must be at least 0 and less than 1"))]
    pub backoff_below: Option<f64>,
    /// How long the evidence for a release must last. Defaults to 60s.
    #[serde(rename = "for", default, skip_serializing_if = "Option::is_none")]
    pub for_: Option<Duration>,
}

/// Scale-out limits per period: the larger of `maxPods` and `maxPercent` of current replicas.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct ScaleUpSpec {
    /// Pods that may be added per period. Defaults to 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_pods: Option<i32>,
    /// Percent of current replicas that may be added per period. Defaults to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_percent: Option<i32>,
    /// The period. Defaults to 15s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Duration>,
}

/// Scale-in limits and stabilization.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct ScaleDownSpec {
    /// Percent of current replicas that may be removed per period. Defaults to 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub max_percent: Option<i32>,
    /// The period. Defaults to 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Duration>,
    /// Scale in only to the highest recommendation of this window. Defaults to 300s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stabilization: Option<Duration>,
}

/// The staged ramp after recovery.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct RampUpSpec {
    /// Percent of the way from the held replicas to the backlog-sized target at each stage:
    /// strictly increasing, ending at 100. Defaults to [25, 50, 75, 100].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 10), inner(range(min = 1, max = 100)))]
    #[x_kube(
        merge_strategy = ListMerge::Set,
        validation = Rule::new("self.isSorted()").message("stages must be strictly increasing"),
        validation = Rule::new("self.size() > 0 && self[self.size() - 1] == 100").message("stages must end at 100"),
    )]
    pub stages: Option<Vec<i32>>,
    /// Time at each stage before the next. Defaults to 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dwell: Option<Duration>,
    /// Fleet backoff above which the ramp is aborted back to hold. Defaults to 0.2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0.0 && self <= 1.0").message("abortAbove must be greater than 0 and at most 1"))]
    pub abort_above: Option<f64>,
}

/// Fallback while metrics are unavailable.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.policy) || self.policy == 'Hold' || has(self.replicas)").message("replicas is required for the Static and IfHigher policies").field_path(".replicas").reason(Reason::FieldValueRequired))]
pub struct MetricsFallback {
    /// `Hold` (default) keeps the current replicas; `Static` sets `replicas`; `IfHigher` scales
    /// up to `replicas` if below, never down. Never scales to zero on missing data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<FallbackPolicy>,
    /// Replicas for `Static` and `IfHigher`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub replicas: Option<i32>,
}

/// Fallback policies.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FallbackPolicy {
    /// Keep the current replicas.
    #[default]
    Hold,
    /// Set a fixed replica count.
    Static,
    /// Raise to a replica count, never lower.
    IfHigher,
}

/// Producer backpressure (`spec.producers`): a watermark loop with hysteresis on the queue.
///
/// ```text
///            signal > pauseAbove                    signal < resumeBelow for pauseDwell
///   Open ─────────────────────────► Paused / Throttled ─────────────────────────► Resuming
///    ▲                                   ▲                                          │
///    │ the allowed rate no longer binds  │ signal > pauseAbove                     │
///    └───────────────────────────────────┴──────────────────────────────────────────┘
/// ```
///
/// A signal is above its high watermark when it exceeds `pauseAbove`, below its low watermark
/// when it is under `resumeBelow`; with both signals set, either one above pauses and both must
/// be below to resume. `Throttle` lets the producers send what the workers complete (a share of
/// the fleet's completion rate, so the backlog drains), `Pause` stops them. `Resuming` lets them
/// send at the fleet's completion rate first and raises the allowed rate each `resumeDwell`
/// while the queue stays below the low watermark, so recovery does not refill the queue faster
/// than the workers drain it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct ProducersSpec {
    /// The producer workload in this namespace (for example a Deployment); its pods receive
    /// the producer state through the same authenticated push as the worker config, with a
    /// token whose audience names this workload. Required unless `mode` is `Off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<TargetRef>,

    /// `Pause` (default) stops the producers above the high watermark, `Throttle` limits them to
    /// a rate the operator computes from the fleet's completion rate, `Off` never restricts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ProducerMode>,

    /// Watermarks on the queue depth (messages waiting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<DepthWatermarks>,

    /// Watermarks on the queue age (the age of the oldest message not yet delivered once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_age: Option<AgeWatermarks>,

    /// Shortest time producers stay paused or throttled before resuming, however fast the
    /// queue falls. Defaults to 60s; at most 24h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('0s') && duration(self) <= duration('24h')").message("pauseDwell must be between 0s and 24h"))]
    pub pause_dwell: Option<Duration>,

    /// Time at each step of the way back to `Open`: the allowed rate doubles at most once per
    /// dwell, and only while the queue stays below the low watermark. Should be at least the
    /// `rate()` window of the metrics, so each step is judged on arrivals at its own rate.
    /// Defaults to 60s; between 1s and 24h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('24h')").message("resumeDwell must be between 1s and 24h"))]
    pub resume_dwell: Option<Duration>,
}

/// What producer control does above the high watermark.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ProducerMode {
    /// Stop accepting until the queue is below the low watermark.
    #[default]
    Pause,
    /// Accept at a share of the fleet's measured completion rate, so the backlog drains.
    Throttle,
    /// Never restrict the producers.
    Off,
}

/// Queue-depth watermarks, in messages.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.resumeBelow < self.pauseAbove").message("resumeBelow must be below pauseAbove").field_path(".resumeBelow"))]
pub struct DepthWatermarks {
    /// High watermark: producers are restricted while more messages than this wait.
    #[schemars(range(min = 1, max = 1_000_000_000_000i64))]
    pub pause_above: i64,
    /// Low watermark: producers resume once fewer messages than this wait.
    #[schemars(range(min = 0, max = 1_000_000_000_000i64))]
    pub resume_below: i64,
}

/// Queue-age watermarks.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("duration(self.resumeBelow) < duration(self.pauseAbove)").message("resumeBelow must be below pauseAbove").field_path(".resumeBelow"))]
pub struct AgeWatermarks {
    /// High watermark: producers are restricted while the oldest message not yet delivered
    /// once is older than this. At most 24h.
    #[x_kube(validation = Rule::new("duration(self) > duration('0s') && duration(self) <= duration('24h')").message("pauseAbove must be greater than 0s and at most 24h"))]
    pub pause_above: Duration,
    /// Low watermark: producers resume once it is younger than this.
    #[x_kube(validation = Rule::new("duration(self) >= duration('0s') && duration(self) <= duration('24h')").message("resumeBelow must be between 0s and 24h"))]
    pub resume_below: Duration,
}
