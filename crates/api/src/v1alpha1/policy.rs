//! `BackpressurePolicy`: fleet-wide defaults, limits and the brake.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube_derive::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{
    MetricsSpec, Mode, ProducersSpec, QueueDefaults, QueueSystem, ScalingSpec, WorkerSpec,
};

/// Fleet-wide defaults and guardrails for the WorkerBackpressure objects in the namespaces it
/// selects. Precedence: the object's own value, then policies by descending priority (ties by
/// name), then built-in defaults; limits always win.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[kube(
    crates(kube_core = "::kube_core"),
    group = "backpressure.dev",
    version = "v1alpha1",
    kind = "BackpressurePolicy",
    plural = "backpressurepolicies",
    singular = "backpressurepolicy",
    shortname = "bpp",
    category = "backpressure",
    status = "BackpressurePolicyStatus",
    printcolumn(name = "Priority", type_ = "integer", json_path = ".spec.priority"),
    printcolumn(
        name = "Matched",
        type_ = "integer",
        json_path = ".status.matchedObjects",
        description = "WorkerBackpressure objects this policy applies to"
    ),
    printcolumn(name = "DryRun", type_ = "boolean", json_path = ".spec.dryRun"),
    printcolumn(
        name = "Brake",
        type_ = "number",
        json_path = ".spec.brake.minBackoff",
        description = "Emergency minimum backoff"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BackpressurePolicySpec {
    /// Namespaces whose WorkerBackpressure objects this policy applies to. Empty selects all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// Higher priority policies are consulted first for defaults. Defaults to 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -1000, max = 1000))]
    pub priority: Option<i32>,

    /// Values for fields a WorkerBackpressure leaves unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<PolicyDefaults>,

    /// Bounds every matched object must respect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<PolicyLimits>,

    /// Fleet-wide DryRun: matched objects decide and report but never write to their targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,

    /// Emergency brake: a minimum backoff pushed to every matched worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brake: Option<Brake>,

    /// What the matched objects may reach through `spec.metrics`, beyond their own namespace's
    /// series on the operator's allowed Prometheus addresses. Grants of all matching policies
    /// add up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_access: Option<MetricsAccess>,
}

/// Grants to the matched namespaces' objects (platform decisions; a WorkerBackpressure cannot
/// make them).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct MetricsAccess {
    /// Run the matched objects' own `spec.metrics.queries` as written, without restricting
    /// every selector to the object's namespace: they may then read any namespace's series.
    /// Defaults to false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_cross_namespace_queries: Option<bool>,

    /// Prometheus addresses the matched objects may name in `spec.metrics.prometheus.address`,
    /// matched on scheme, host and port (path and credentials do not count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["address".into()]))]
    pub prometheus_addresses: Option<Vec<AllowedPrometheus>>,
}

/// One Prometheus the matched objects may query.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct AllowedPrometheus {
    /// Base URL, for example `https://thanos.monitoring:9090`.
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(validation = Rule::new("self.startsWith('http://') || self.startsWith('https://')").message("address must be an http:// or https:// URL"))]
    pub address: String,
    /// Send the Secret an object names in `spec.metrics.prometheus.secretRef` to this address
    /// even when the Secret does not list it in its `backpressure.dev/prometheus-addresses`
    /// annotation. Only for a Prometheus the platform runs: any Secret with a `token` or
    /// `username`/`password` key in a matched namespace can then be sent there. Defaults to
    /// false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<bool>,
}

/// Defaults a policy supplies.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.producers) || !has(self.producers.targetRef)").message("a policy cannot name producers: producers.targetRef belongs to each WorkerBackpressure").field_path(".producers.targetRef"))]
pub struct PolicyDefaults {
    /// Default mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Default worker configuration fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerSpec>,
    /// Default metrics fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<MetricsSpec>,
    /// Default scaling fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<ScalingSpec>,
    /// Default producer-control fields (mode, watermarks, dwells) for objects that name their
    /// producers in `spec.producers.targetRef`; a policy never names producers itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producers: Option<ProducersSpec>,
    /// Default `spec.queue` fields: the exporter's scrape labels and `staleAfter`; a policy
    /// never names a queue itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueDefaults>,
}

/// Limits a policy enforces.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct PolicyLimits {
    /// Largest allowed `spec.worker.setPoint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0.0001 && self < 1.0").message("maxSetPoint must be at least 0.0001 and less than 1"))]
    pub max_set_point: Option<f64>,
    /// Largest allowed `spec.scaling.maxReplicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_replicas: Option<i32>,
    /// Largest allowed `spec.scaling.scaleUp.maxPods`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_scale_up_pods: Option<i32>,
    /// Ramp stages every matched object must use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 10), inner(range(min = 1, max = 100)))]
    #[x_kube(merge_strategy = ListMerge::Set, validation = Rule::new("self.isSorted() && self[self.size() - 1] == 100").message("requiredRampStages must be strictly increasing and end at 100"))]
    pub required_ramp_stages: Option<Vec<i32>>,
    /// Modes matched objects may use. Empty allows all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 3))]
    pub allowed_modes: Option<Vec<Mode>>,
    /// Queue systems (`spec.queue.system`, `Custom` without `spec.queue`) matched objects may
    /// read, for example those whose exporters the platform runs. An object reading another is
    /// invalid (`InvalidSpec` names the policy). Empty allows all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 6))]
    pub allowed_queue_systems: Option<Vec<QueueSystem>>,
}

/// The emergency brake.
///
/// `expiresAt` is required at admission (a CEL rule): a brake throttles every matched worker,
/// and one that is forgotten must lift itself. CEL has no clock, so how far ahead `expiresAt`
/// lies cannot be bounded at admission; BackpressurePolicy is cluster-scoped and written by
/// platform admins only, and the policy's status says whether and until when the brake is in
/// force. A brake stored without `expiresAt` (under an older CRD) stays in force until the
/// policy changes; any write to the policy must then add one.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.expiresAt)").message("brake.expiresAt is required: an emergency brake must lift itself").field_path(".expiresAt").reason(Reason::FieldValueRequired))]
pub struct Brake {
    /// Minimum backoff every matched worker applies, in [0,1]; 1 stops taking messages
    /// altogether, probes included, until the brake lifts. When the brake expires, or is
    /// lowered or removed, each worker's level falls gently (by 1 per minute by default, after
    /// a random per-pod delay), not in one step.
    #[x_kube(validation = Rule::new("self >= 0.0 && self <= 1.0").message("minBackoff must be between 0 and 1"))]
    pub min_backoff: f64,
    /// The brake lifts itself at this time, so a forgotten brake does not stay on. Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// Why the brake is on (shown in events and status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reason: Option<String>,
}

/// What a policy currently applies to.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[x_kube(crates(kube_core = "::kube_core"))]
#[serde(rename_all = "camelCase")]
pub struct BackpressurePolicyStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// WorkerBackpressure objects this policy matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_objects: Option<i32>,
    /// Whether the brake is in force (false once expired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brake_active: Option<bool>,
    /// Ready and other conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Option<Vec<Condition>>,
}
