//! The effective configuration of one `WorkerBackpressure`: its own spec merged with the
//! `BackpressurePolicy` objects that select its namespace and the built-in defaults.
//!
//! Precedence, for every field independently:
//!
//! 1. the object's own value (`spec.*`);
//! 2. each matching policy's `spec.defaults.*`, by descending `spec.priority` (default 0), ties
//!    broken by policy name (ascending);
//! 3. the built-in default in [`backpressure_api::defaults`].
//!
//! Then every matching policy's `spec.limits` applies, whatever the source of the value (limits
//! always win): `maxSetPoint`, `maxReplicas` and `maxScaleUpPods` lower a value (the most
//! restrictive limit of all policies binds), `requiredRampStages` replaces the stages (the
//! first policy in precedence order that requires stages wins; other policies that require
//! different stages are named in the override as a conflict: admission checks every policy),
//! and `allowedModes` (the
//! intersection of all policies' lists) replaces a mode that is not allowed by `DryRun`, else
//! `Active`, else `Guard`. Each such change is recorded in [`Effective::overrides`] as field
//! path → description, for `status.overrides`.
//!
//! Any matching policy with `dryRun: true` puts the object in DryRun. The emergency brake is the
//! largest `minBackoff` of the matching policies whose brake has not expired at `now`.
//!
//! Errors are never panics: an unparsable duration, a value out of range, `minReplicas >
//! maxReplicas` or `release.backoffBelow >= hold.backoffAbove` after merging, or invalid ramp
//! stages are returned together as a list of [`FieldError`]s, each naming the field and where
//! the value came from.

mod selector;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use backpressure_api::defaults as d;
use backpressure_api::duration::Duration as ApiDuration;
use backpressure_api::v1alpha1::{
    Algorithm, BackpressurePolicy, BackpressurePolicySpec, Brake, FallbackPolicy, GuardRef,
    MetricsSpec, Mode, QueryOverrides, ScalingSpec, SecretRef, TargetRef, WorkerBackpressureSpec,
    WorkerSpec,
};
use backpressure_api::wire::{BrakeConfig, WIRE_VERSION, WorkerConfig};
use k8s_openapi::jiff::Timestamp;

pub use selector::{SelectorError, namespace_selector_matches};

/// A matching policy as `resolve` needs it: its name and spec.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyInput<'a> {
    /// `metadata.name` of the policy.
    pub name: &'a str,
    /// The policy's spec.
    pub spec: &'a BackpressurePolicySpec,
}

impl<'a> PolicyInput<'a> {
    /// Borrows a stored policy (an unnamed policy gets the empty name).
    pub fn from_policy(policy: &'a BackpressurePolicy) -> Self {
        PolicyInput {
            name: policy.metadata.name.as_deref().unwrap_or_default(),
            spec: &policy.spec,
        }
    }

    fn priority(&self) -> i32 {
        self.spec.priority.unwrap_or(0)
    }
}

/// Sorts policies into precedence order: descending priority, then ascending name.
pub fn sort_by_precedence(policies: &mut [PolicyInput<'_>]) {
    policies.sort_by(|a, b| {
        b.priority()
            .cmp(&a.priority())
            .then_with(|| a.name.cmp(b.name))
    });
}

/// The policies whose namespace selector selects a namespace with `namespace_labels`, in
/// precedence order. A policy with an invalid selector selects nothing (the policy's own
/// reconcile reports the selector error).
pub fn policies_for_namespace<'a>(
    policies: impl IntoIterator<Item = &'a BackpressurePolicy>,
    namespace_labels: &BTreeMap<String, String>,
) -> Vec<PolicyInput<'a>> {
    let mut out: Vec<PolicyInput<'a>> = policies
        .into_iter()
        .filter(|p| {
            namespace_selector_matches(p.spec.namespace_selector.as_ref(), namespace_labels)
                .unwrap_or(false)
        })
        .map(PolicyInput::from_policy)
        .collect();
    sort_by_precedence(&mut out);
    out
}

/// Whether a policy's brake is in force at `now` (it lifts itself at `expiresAt`).
pub fn brake_active(brake: &Brake, now: Timestamp) -> bool {
    brake.expires_at.as_ref().is_none_or(|t| now < t.0)
}

/// One invalid field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Where the value came from: `spec.scaling.hold.for`, or
    /// `BackpressurePolicy NAME: spec.defaults.scaling.hold.for`, or a policy limit.
    pub field: String,
    /// What is wrong, with the offending value.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// The object's configuration cannot be resolved; every problem found is listed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {}", join(.errors))]
pub struct ResolveError {
    /// The invalid fields, in the order the resolver checked them.
    pub errors: Vec<FieldError>,
}

fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The fully resolved configuration: every field present, durations parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Effective {
    /// The scaled workload.
    pub target_ref: TargetRef,
    /// The mode after `allowedModes` limits.
    pub mode: Mode,
    /// The autoscaler guarded in `Guard` mode.
    pub guard: Option<GuardRef>,
    /// `spec.suspend`.
    pub suspend: bool,
    /// Decide and report, never write to the target: `mode: DryRun` or a policy's `dryRun`.
    pub dry_run: bool,
    /// What put the object in DryRun (`spec.mode` or `policy NAME`), if anything did.
    pub dry_run_by: Option<String>,
    /// Worker controller configuration pushed to the pods.
    pub worker: EffectiveWorker,
    /// Metrics sources.
    pub metrics: EffectiveMetrics,
    /// Scaling behavior.
    pub scaling: EffectiveScaling,
    /// The emergency brake in force at the time of resolution.
    pub brake: Option<EffectiveBrake>,
    /// Matching policies by name, in precedence order.
    pub policies: Vec<String>,
    /// Values a policy limit changed: field path → description.
    pub overrides: BTreeMap<String, String>,
    /// A manual hold in force until this time (`kubectl wbp hold`, the
    /// `backpressure.dev/hold-until` annotation): no scale-out, whatever the metrics say. Set by
    /// the caller from the object's annotations; [`resolve`] leaves it empty.
    pub manual_hold_until: Option<Timestamp>,
}

/// Resolved `spec.worker`.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveWorker {
    /// Controller algorithm.
    pub algorithm: Algorithm,
    /// Set point in (0, 1).
    pub set_point: f64,
    /// Reaction size N (>= 1).
    pub reaction: u32,
    /// Maximum permits (>= 1).
    pub max_permits: u32,
    /// First probe interval (> 0).
    pub probe_initial: Duration,
    /// Largest probe interval (>= probe_initial).
    pub probe_max: Duration,
}

/// Resolved `spec.metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveMetrics {
    /// Prometheus base URL; `None` means the operator's `--prometheus-url`.
    pub address: Option<String>,
    /// Query timeout.
    pub timeout: Duration,
    /// Credentials for Prometheus.
    pub secret_ref: Option<SecretRef>,
    /// Value of the `workload` label (defaults to the target's name).
    pub workload: String,
    /// PromQL overrides, merged field by field.
    pub queries: QueryOverrides,
    /// `rate()` window of the default queries.
    pub rate_window: Duration,
    /// Samples older than this are unknown.
    pub stale_after: Duration,
}

/// Resolved `spec.scaling`.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveScaling {
    /// Fewest replicas (>= 0).
    pub min_replicas: i32,
    /// Most replicas (>= max(1, min_replicas)).
    pub max_replicas: i32,
    /// Queue age the backlog sizing aims at (> 0).
    pub target_queue_age: Duration,
    /// When to hold scale-out.
    pub hold: EffectiveHold,
    /// When a hold ends.
    pub release: EffectiveRelease,
    /// Scale-out step limit.
    pub scale_up: EffectiveScaleUp,
    /// Scale-in step limit and stabilization.
    pub scale_down: EffectiveScaleDown,
    /// The staged ramp after release.
    pub ramp_up: EffectiveRampUp,
    /// What to do while metrics are unavailable.
    pub on_metrics_unavailable: Fallback,
}

/// Resolved `spec.scaling.hold`.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveHold {
    /// Fleet backoff above which scale-out is held, in (0, 1].
    pub backoff_above: f64,
    /// How long backoff must stay above it.
    pub for_: Duration,
    /// Allow scale-in while held.
    pub allow_scale_in: bool,
}

/// Resolved `spec.scaling.release`.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveRelease {
    /// Fleet backoff below which a hold may end, in [0, hold.backoff_above).
    pub backoff_below: f64,
    /// How long backoff must stay below it.
    pub for_: Duration,
}

/// Resolved `spec.scaling.scaleUp`.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveScaleUp {
    /// Pods that may be added per period (>= 1).
    pub max_pods: i32,
    /// Percent of current replicas that may be added per period (>= 1).
    pub max_percent: i32,
    /// The period (> 0).
    pub period: Duration,
}

/// Resolved `spec.scaling.scaleDown`.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveScaleDown {
    /// Percent of current replicas that may be removed per period, in [1, 100].
    pub max_percent: i32,
    /// The period (> 0).
    pub period: Duration,
    /// Scale in only to the highest recommendation of this window.
    pub stabilization: Duration,
}

/// Resolved `spec.scaling.rampUp`.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveRampUp {
    /// Percent of the way to the target per stage: strictly increasing, in [1, 100], ending
    /// at 100.
    pub stages: Vec<i32>,
    /// Time at each stage.
    pub dwell: Duration,
    /// Fleet backoff above which a ramp is aborted, in (0, 1].
    pub abort_above: f64,
}

/// Resolved `spec.scaling.onMetricsUnavailable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Keep the current replicas.
    Hold,
    /// Set this many replicas.
    Static(i32),
    /// Raise to this many replicas if below, never lower.
    IfHigher(i32),
}

/// The emergency brake in force.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveBrake {
    /// Minimum backoff in [0, 1].
    pub min_backoff: f64,
    /// When it lifts itself.
    pub expires_at: Option<Timestamp>,
    /// Why it is on.
    pub reason: Option<String>,
    /// The policy it comes from.
    pub policy: String,
}

impl fmt::Display for EffectiveBrake {
    /// `emergency brake 0.50 from policy P until T: reason`, for conditions and events.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "emergency brake {:.2} from policy {}",
            self.min_backoff, self.policy
        )?;
        if let Some(t) = self.expires_at {
            write!(f, " until {t}")?;
        }
        match self.reason.as_deref().map(str::trim) {
            Some(r) if !r.is_empty() => write!(f, ": {r}"),
            _ => Ok(()),
        }
    }
}

/// Where a layer's values come from.
#[derive(Debug, Clone, Copy)]
enum Source<'a> {
    Object,
    Policy(&'a str),
}

impl Source<'_> {
    fn field(self, path: &str) -> String {
        match self {
            Source::Object => format!("spec.{path}"),
            Source::Policy(name) => format!("BackpressurePolicy {name}: spec.defaults.{path}"),
        }
    }
}

/// One layer of the precedence: the object's spec or one policy's defaults.
#[derive(Debug, Clone, Copy)]
struct Layer<'a> {
    source: Source<'a>,
    mode: Option<Mode>,
    worker: Option<&'a WorkerSpec>,
    metrics: Option<&'a MetricsSpec>,
    scaling: Option<&'a ScalingSpec>,
}

/// A resolved value and where it came from (for error messages).
#[derive(Debug, Clone)]
struct Picked<T> {
    value: T,
    from: String,
}

struct Resolver<'a> {
    layers: Vec<Layer<'a>>,
    errors: Vec<FieldError>,
}

impl<'a> Resolver<'a> {
    /// The first layer that has the field, else the built-in default.
    fn value<T>(&self, path: &str, get: impl Fn(&Layer<'a>) -> Option<T>, default: T) -> Picked<T> {
        for layer in &self.layers {
            if let Some(value) = get(layer) {
                return Picked {
                    value,
                    from: layer.source.field(path),
                };
            }
        }
        Picked {
            value: default,
            from: format!("built-in default of spec.{path}"),
        }
    }

    /// Like [`Resolver::value`] for durations; an unparsable duration is an error (and the
    /// default stands in so that resolution can go on and report every problem).
    fn duration(
        &mut self,
        path: &str,
        get: impl Fn(&Layer<'a>) -> Option<&'a ApiDuration>,
        default: Duration,
    ) -> Picked<Duration> {
        for layer in &self.layers {
            if let Some(text) = get(layer) {
                let from = layer.source.field(path);
                return match text.get() {
                    Ok(value) => Picked { value, from },
                    Err(e) => {
                        self.errors.push(FieldError {
                            field: from.clone(),
                            message: e.to_string(),
                        });
                        Picked {
                            value: default,
                            from,
                        }
                    }
                };
            }
        }
        Picked {
            value: default,
            from: format!("built-in default of spec.{path}"),
        }
    }

    /// A PromQL override: the first layer with a non-blank query, else none (the default
    /// query of the wire contract).
    fn query(&self, path: &str, get: fn(&QueryOverrides) -> Option<&String>) -> Option<String> {
        let picked = self.value(
            path,
            |l| {
                get(l.metrics?.queries.as_ref()?)
                    .filter(|q| !q.trim().is_empty())
                    .cloned()
            },
            String::new(),
        );
        Some(picked.value).filter(|q| !q.is_empty())
    }

    fn error(&mut self, field: &str, message: String) {
        self.errors.push(FieldError {
            field: field.to_owned(),
            message,
        });
    }
}

/// Resolves the effective configuration of an object with `spec` in a namespace matched by
/// `policies` (any order; they are sorted into precedence order here), at `now` (only the
/// brake's expiry depends on it).
pub fn resolve(
    spec: &WorkerBackpressureSpec,
    policies: &[PolicyInput<'_>],
    now: Timestamp,
) -> Result<Effective, ResolveError> {
    let mut policies = policies.to_vec();
    sort_by_precedence(&mut policies);

    let mut layers = vec![Layer {
        source: Source::Object,
        mode: spec.mode,
        worker: spec.worker.as_ref(),
        metrics: spec.metrics.as_ref(),
        scaling: spec.scaling.as_ref(),
    }];
    for p in &policies {
        if let Some(defaults) = &p.spec.defaults {
            layers.push(Layer {
                source: Source::Policy(p.name),
                mode: defaults.mode,
                worker: defaults.worker.as_ref(),
                metrics: defaults.metrics.as_ref(),
                scaling: defaults.scaling.as_ref(),
            });
        }
    }
    let mut r = Resolver {
        layers,
        errors: Vec::new(),
    };

    // --- worker -------------------------------------------------------------------------
    let algorithm = r.value(
        "worker.algorithm",
        |l| l.worker?.algorithm,
        Algorithm::default(),
    );
    let set_point = r.value("worker.setPoint", |l| l.worker?.set_point, d::SET_POINT);
    let max_permits = r.value(
        "worker.maxPermits",
        |l| l.worker?.max_permits,
        d::MAX_PERMITS,
    );
    let reaction = r.value(
        "worker.reaction",
        |l| l.worker?.reaction,
        d::reaction(max_permits.value),
    );
    let probe_initial = r.duration(
        "worker.probe.initialInterval",
        |l| l.worker?.probe.as_ref()?.initial_interval.as_ref(),
        d::PROBE_INITIAL,
    );
    let probe_max = r.duration(
        "worker.probe.maxInterval",
        |l| l.worker?.probe.as_ref()?.max_interval.as_ref(),
        d::PROBE_MAX,
    );
    if !(set_point.value.is_finite() && set_point.value > 0.0 && set_point.value < 1.0) {
        r.error(
            &set_point.from,
            format!("setPoint {} is not in (0, 1)", set_point.value),
        );
    }
    if reaction.value == 0 {
        r.error(&reaction.from, "reaction must be at least 1".into());
    }
    if max_permits.value == 0 {
        r.error(&max_permits.from, "maxPermits must be at least 1".into());
    }
    if probe_initial.value.is_zero() {
        r.error(
            &probe_initial.from,
            "initialInterval must be greater than 0".into(),
        );
    }
    if probe_initial.value > probe_max.value {
        r.error(
            &probe_initial.from,
            format!(
                "initialInterval {:?} exceeds maxInterval {:?} (from {})",
                probe_initial.value, probe_max.value, probe_max.from
            ),
        );
    }

    // --- metrics ------------------------------------------------------------------------
    let address = r.value(
        "metrics.prometheus.address",
        |l| l.metrics?.prometheus.as_ref()?.address.clone(),
        String::new(),
    );
    let timeout = r.duration(
        "metrics.prometheus.timeout",
        |l| l.metrics?.prometheus.as_ref()?.timeout.as_ref(),
        d::QUERY_TIMEOUT,
    );
    let secret_ref = r.value(
        "metrics.prometheus.secretRef",
        |l| Some(Some(l.metrics?.prometheus.as_ref()?.secret_ref.clone()?)),
        None,
    );
    let workload = r.value(
        "metrics.workload",
        |l| l.metrics?.workload.clone(),
        spec.target_ref.name.clone(),
    );
    let queries = QueryOverrides {
        backoff: r.query("metrics.queries.backoff", |q| q.backoff.as_ref()),
        failure_rate: r.query("metrics.queries.failureRate", |q| q.failure_rate.as_ref()),
        queue_age: r.query("metrics.queries.queueAge", |q| q.queue_age.as_ref()),
        queue_depth: r.query("metrics.queries.queueDepth", |q| q.queue_depth.as_ref()),
        arrival_rate: r.query("metrics.queries.arrivalRate", |q| q.arrival_rate.as_ref()),
        completion_rate: r.query("metrics.queries.completionRate", |q| {
            q.completion_rate.as_ref()
        }),
    };
    let rate_window = r.duration(
        "metrics.rateWindow",
        |l| l.metrics?.rate_window.as_ref(),
        d::RATE_WINDOW,
    );
    let stale_after = r.duration(
        "metrics.staleAfter",
        |l| l.metrics?.stale_after.as_ref(),
        d::STALE_AFTER,
    );
    for p in [&timeout, &rate_window, &stale_after] {
        if p.value.is_zero() {
            r.error(&p.from, "must be greater than 0".into());
        }
    }

    // --- scaling ------------------------------------------------------------------------
    let min_replicas = r.value(
        "scaling.minReplicas",
        |l| l.scaling?.min_replicas,
        d::MIN_REPLICAS,
    );
    let max_replicas = r.value(
        "scaling.maxReplicas",
        |l| l.scaling?.max_replicas,
        d::MAX_REPLICAS,
    );
    let target_queue_age = r.duration(
        "scaling.targetQueueAge",
        |l| l.scaling?.target_queue_age.as_ref(),
        d::TARGET_QUEUE_AGE,
    );
    let hold_above = r.value(
        "scaling.hold.backoffAbove",
        |l| l.scaling?.hold.as_ref()?.backoff_above,
        d::HOLD_BACKOFF_ABOVE,
    );
    let hold_for = r.duration(
        "scaling.hold.for",
        |l| l.scaling?.hold.as_ref()?.for_.as_ref(),
        d::HOLD_FOR,
    );
    let allow_scale_in = r.value(
        "scaling.hold.allowScaleIn",
        |l| l.scaling?.hold.as_ref()?.allow_scale_in,
        false,
    );
    let release_below = r.value(
        "scaling.release.backoffBelow",
        |l| l.scaling?.release.as_ref()?.backoff_below,
        d::RELEASE_BACKOFF_BELOW,
    );
    let release_for = r.duration(
        "scaling.release.for",
        |l| l.scaling?.release.as_ref()?.for_.as_ref(),
        d::RELEASE_FOR,
    );
    let up_pods = r.value(
        "scaling.scaleUp.maxPods",
        |l| l.scaling?.scale_up.as_ref()?.max_pods,
        d::SCALE_UP_MAX_PODS,
    );
    let up_percent = r.value(
        "scaling.scaleUp.maxPercent",
        |l| l.scaling?.scale_up.as_ref()?.max_percent,
        d::SCALE_UP_MAX_PERCENT,
    );
    let up_period = r.duration(
        "scaling.scaleUp.period",
        |l| l.scaling?.scale_up.as_ref()?.period.as_ref(),
        d::SCALE_UP_PERIOD,
    );
    let down_percent = r.value(
        "scaling.scaleDown.maxPercent",
        |l| l.scaling?.scale_down.as_ref()?.max_percent,
        d::SCALE_DOWN_MAX_PERCENT,
    );
    let down_period = r.duration(
        "scaling.scaleDown.period",
        |l| l.scaling?.scale_down.as_ref()?.period.as_ref(),
        d::SCALE_DOWN_PERIOD,
    );
    let stabilization = r.duration(
        "scaling.scaleDown.stabilization",
        |l| l.scaling?.scale_down.as_ref()?.stabilization.as_ref(),
        d::SCALE_DOWN_STABILIZATION,
    );
    let stages = r.value(
        "scaling.rampUp.stages",
        |l| l.scaling?.ramp_up.as_ref()?.stages.clone(),
        d::RAMP_STAGES.to_vec(),
    );
    let dwell = r.duration(
        "scaling.rampUp.dwell",
        |l| l.scaling?.ramp_up.as_ref()?.dwell.as_ref(),
        d::RAMP_DWELL,
    );
    let abort_above = r.value(
        "scaling.rampUp.abortAbove",
        |l| l.scaling?.ramp_up.as_ref()?.abort_above,
        d::RAMP_ABORT_ABOVE,
    );
    let fallback_policy = r.value(
        "scaling.onMetricsUnavailable.policy",
        |l| l.scaling?.on_metrics_unavailable.as_ref()?.policy,
        FallbackPolicy::Hold,
    );
    let fallback_replicas = r.value(
        "scaling.onMetricsUnavailable.replicas",
        |l| Some(l.scaling?.on_metrics_unavailable.as_ref()?.replicas),
        None,
    );

    if min_replicas.value < 0 {
        r.error(
            &min_replicas.from,
            format!("minReplicas {} is negative", min_replicas.value),
        );
    }
    if max_replicas.value < 1 {
        r.error(
            &max_replicas.from,
            format!("maxReplicas {} must be at least 1", max_replicas.value),
        );
    }
    if min_replicas.value > max_replicas.value {
        r.error(
            &min_replicas.from,
            format!(
                "minReplicas {} exceeds maxReplicas {} (from {})",
                min_replicas.value, max_replicas.value, max_replicas.from
            ),
        );
    }
    if target_queue_age.value.is_zero() {
        r.error(&target_queue_age.from, "must be greater than 0".into());
    }
    if !(hold_above.value.is_finite() && hold_above.value > 0.0 && hold_above.value <= 1.0) {
        r.error(
            &hold_above.from,
            format!("backoffAbove {} is not in (0, 1]", hold_above.value),
        );
    }
    if !(release_below.value.is_finite() && release_below.value >= 0.0 && release_below.value < 1.0)
    {
        r.error(
            &release_below.from,
            format!("backoffBelow {} is not in [0, 1)", release_below.value),
        );
    }
    if release_below.value >= hold_above.value {
        r.error(
            &release_below.from,
            format!(
                "release.backoffBelow {} must be below hold.backoffAbove {} (from {})",
                release_below.value, hold_above.value, hold_above.from
            ),
        );
    }
    if !(abort_above.value.is_finite() && abort_above.value > 0.0 && abort_above.value <= 1.0) {
        r.error(
            &abort_above.from,
            format!("abortAbove {} is not in (0, 1]", abort_above.value),
        );
    }
    if abort_above.value <= release_below.value {
        r.error(
            &abort_above.from,
            format!(
                "rampUp.abortAbove {} must be above release.backoffBelow {} (from {}), or a \
                 ramp would abort at a backoff that releases the hold",
                abort_above.value, release_below.value, release_below.from
            ),
        );
    }
    if up_pods.value < 1 {
        r.error(
            &up_pods.from,
            format!("maxPods {} must be at least 1", up_pods.value),
        );
    }
    if up_percent.value < 1 {
        r.error(
            &up_percent.from,
            format!("maxPercent {} must be at least 1", up_percent.value),
        );
    }
    if !(1..=100).contains(&down_percent.value) {
        r.error(
            &down_percent.from,
            format!("maxPercent {} is not in [1, 100]", down_percent.value),
        );
    }
    for p in [&up_period, &down_period, &dwell] {
        if p.value.is_zero() {
            r.error(&p.from, "must be greater than 0".into());
        }
    }
    if let Err(message) = check_stages(&stages.value) {
        r.error(&stages.from, message);
    }
    let on_metrics_unavailable = match (fallback_policy.value, fallback_replicas.value) {
        (FallbackPolicy::Hold, _) => Fallback::Hold,
        (FallbackPolicy::Static, Some(n)) if n >= 1 => Fallback::Static(n),
        (FallbackPolicy::IfHigher, Some(n)) if n >= 1 => Fallback::IfHigher(n),
        (policy, replicas) => {
            r.error(
                &fallback_replicas.from,
                format!(
                    "replicas is required and must be at least 1 for the {policy:?} policy \
                     (from {}), got {replicas:?}",
                    fallback_policy.from
                ),
            );
            Fallback::Hold
        }
    };

    // --- mode -----------------------------------------------------------------------------
    let mode = r.value("mode", |l| l.mode, Mode::Active);
    let guard = spec.guard.clone();

    let mut eff = Effective {
        manual_hold_until: None,
        target_ref: spec.target_ref.clone(),
        mode: mode.value,
        guard,
        suspend: spec.suspend.unwrap_or(false),
        dry_run: false,
        dry_run_by: None,
        worker: EffectiveWorker {
            algorithm: algorithm.value,
            set_point: set_point.value,
            reaction: reaction.value,
            max_permits: max_permits.value,
            probe_initial: probe_initial.value,
            probe_max: probe_max.value,
        },
        metrics: EffectiveMetrics {
            address: Some(address.value).filter(|a| !a.is_empty()),
            timeout: timeout.value,
            secret_ref: secret_ref.value,
            workload: workload.value,
            queries,
            rate_window: rate_window.value,
            stale_after: stale_after.value,
        },
        scaling: EffectiveScaling {
            min_replicas: min_replicas.value,
            max_replicas: max_replicas.value,
            target_queue_age: target_queue_age.value,
            hold: EffectiveHold {
                backoff_above: hold_above.value,
                for_: hold_for.value,
                allow_scale_in: allow_scale_in.value,
            },
            release: EffectiveRelease {
                backoff_below: release_below.value,
                for_: release_for.value,
            },
            scale_up: EffectiveScaleUp {
                max_pods: up_pods.value,
                max_percent: up_percent.value,
                period: up_period.value,
            },
            scale_down: EffectiveScaleDown {
                max_percent: down_percent.value,
                period: down_period.value,
                stabilization: stabilization.value,
            },
            ramp_up: EffectiveRampUp {
                stages: stages.value,
                dwell: dwell.value,
                abort_above: abort_above.value,
            },
            on_metrics_unavailable,
        },
        brake: None,
        policies: policies.iter().map(|p| p.name.to_owned()).collect(),
        overrides: BTreeMap::new(),
    };

    apply_limits(&mut r, &mut eff, &policies);

    if eff.mode == Mode::Guard && eff.guard.is_none() {
        r.error("spec.guard", "required when the mode is Guard".into());
    }
    if eff.mode == Mode::DryRun {
        eff.dry_run = true;
        eff.dry_run_by = Some(if eff.overrides.contains_key("spec.mode") {
            "a policy's allowedModes".to_owned()
        } else {
            mode.from.clone()
        });
    } else if let Some(p) = policies.iter().find(|p| p.spec.dry_run == Some(true)) {
        eff.dry_run = true;
        eff.dry_run_by = Some(format!("policy {}", p.name));
    }

    // --- brake ----------------------------------------------------------------------------
    for p in &policies {
        let Some(brake) = &p.spec.brake else { continue };
        if !(brake.min_backoff.is_finite() && (0.0..=1.0).contains(&brake.min_backoff)) {
            r.error(
                &format!("BackpressurePolicy {}: spec.brake.minBackoff", p.name),
                format!("{} is not in [0, 1]", brake.min_backoff),
            );
            continue;
        }
        if !brake_active(brake, now) {
            continue;
        }
        // Largest minimum backoff wins; ties keep the earlier policy in precedence order.
        if eff
            .brake
            .as_ref()
            .is_none_or(|b| brake.min_backoff > b.min_backoff)
        {
            eff.brake = Some(EffectiveBrake {
                min_backoff: brake.min_backoff,
                expires_at: brake.expires_at.as_ref().map(|t| t.0),
                reason: brake.reason.clone(),
                policy: p.name.to_owned(),
            });
        }
    }

    if r.errors.is_empty() {
        Ok(eff)
    } else {
        Err(ResolveError { errors: r.errors })
    }
}

/// Checks ramp stages: 1 to 10 stages, each in [1, 100], strictly increasing, ending at 100.
pub fn check_stages(stages: &[i32]) -> Result<(), String> {
    if stages.is_empty() || stages.len() > 10 {
        return Err(format!("{stages:?}: must have 1 to 10 stages"));
    }
    if stages.iter().any(|s| !(1..=100).contains(s)) {
        return Err(format!("{stages:?}: every stage must be in [1, 100]"));
    }
    if stages.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("{stages:?}: stages must be strictly increasing"));
    }
    if stages.last() != Some(&100) {
        return Err(format!("{stages:?}: the last stage must be 100"));
    }
    Ok(())
}

/// The most restrictive numeric limit over `policies` (first in precedence order on ties).
fn tightest<T: PartialOrd + Copy>(
    policies: &[PolicyInput<'_>],
    get: impl Fn(&PolicyInput<'_>) -> Option<T>,
) -> Option<(T, String)> {
    let mut best: Option<(T, String)> = None;
    for p in policies {
        if let Some(v) = get(p)
            && best.as_ref().is_none_or(|(b, _)| v < *b)
        {
            best = Some((v, p.name.to_owned()));
        }
    }
    best
}

fn apply_limits(r: &mut Resolver<'_>, eff: &mut Effective, policies: &[PolicyInput<'_>]) {
    let limits = |p: &PolicyInput<'_>| p.spec.limits.clone().unwrap_or_default();

    if let Some((limit, by)) = tightest(policies, |p| limits(p).max_set_point) {
        if !(limit.is_finite() && limit > 0.0 && limit < 1.0) {
            r.error(
                &format!("BackpressurePolicy {by}: spec.limits.maxSetPoint"),
                format!("{limit} is not in (0, 1)"),
            );
        } else if eff.worker.set_point > limit {
            eff.overrides.insert(
                "spec.worker.setPoint".into(),
                format!("{} lowered to {limit} by policy {by}", eff.worker.set_point),
            );
            eff.worker.set_point = limit;
        }
    }

    if let Some((limit, by)) = tightest(policies, |p| limits(p).max_replicas) {
        if limit < 1 {
            r.error(
                &format!("BackpressurePolicy {by}: spec.limits.maxReplicas"),
                format!("{limit} must be at least 1"),
            );
        } else if eff.scaling.max_replicas > limit {
            eff.overrides.insert(
                "spec.scaling.maxReplicas".into(),
                format!(
                    "{} lowered to {limit} by policy {by}",
                    eff.scaling.max_replicas
                ),
            );
            eff.scaling.max_replicas = limit;
            if eff.scaling.min_replicas > limit {
                eff.overrides.insert(
                    "spec.scaling.minReplicas".into(),
                    format!(
                        "{} lowered to {limit} by policy {by} (maxReplicas limit)",
                        eff.scaling.min_replicas
                    ),
                );
                eff.scaling.min_replicas = limit;
            }
        }
    }

    if let Some((limit, by)) = tightest(policies, |p| limits(p).max_scale_up_pods) {
        if limit < 1 {
            r.error(
                &format!("BackpressurePolicy {by}: spec.limits.maxScaleUpPods"),
                format!("{limit} must be at least 1"),
            );
        } else if eff.scaling.scale_up.max_pods > limit {
            eff.overrides.insert(
                "spec.scaling.scaleUp.maxPods".into(),
                format!(
                    "{} lowered to {limit} by policy {by}",
                    eff.scaling.scale_up.max_pods
                ),
            );
            eff.scaling.scale_up.max_pods = limit;
        }
    }

    if let Some(p) = policies
        .iter()
        .find(|p| limits(p).required_ramp_stages.is_some())
    {
        let required = limits(p).required_ramp_stages.unwrap_or_default();
        if let Err(message) = check_stages(&required) {
            r.error(
                &format!(
                    "BackpressurePolicy {}: spec.limits.requiredRampStages",
                    p.name
                ),
                message,
            );
        } else {
            // Policies further down that require other stages lose here, but admission checks
            // every policy: an object that sets its stages cannot satisfy them all. Say so.
            let clash: Vec<String> = policies
                .iter()
                .filter_map(|q| {
                    limits(q)
                        .required_ramp_stages
                        .filter(|other| *other != required)
                        .map(|other| format!("policy {} requires {other:?}", q.name))
                })
                .collect();
            let mut note = String::new();
            if eff.scaling.ramp_up.stages != required {
                note = format!(
                    "{:?} replaced by {required:?} required by policy {}",
                    eff.scaling.ramp_up.stages, p.name
                );
                eff.scaling.ramp_up.stages = required.clone();
            }
            if !clash.is_empty() {
                if note.is_empty() {
                    note = format!("{required:?} required by policy {}", p.name);
                }
                note.push_str(&format!(
                    "; conflicting limits: {} (the first policy in precedence wins here, and \
                     admission rejects an object that sets stages until the policies agree)",
                    clash.join(", ")
                ));
            }
            if !note.is_empty() {
                eff.overrides
                    .insert("spec.scaling.rampUp.stages".into(), note);
            }
        }
    }

    // allowedModes: the intersection of every non-empty list.
    let mut allowed: Option<Vec<Mode>> = None;
    let mut restricting: Vec<&str> = Vec::new();
    for p in policies {
        let Some(list) = limits(p).allowed_modes.filter(|l| !l.is_empty()) else {
            continue;
        };
        restricting.push(p.name);
        allowed = Some(match allowed {
            None => list,
            Some(prev) => prev.into_iter().filter(|m| list.contains(m)).collect(),
        });
    }
    if let Some(allowed) = allowed
        && !allowed.contains(&eff.mode)
    {
        let by = restricting.join(", ");
        let replacement = [Mode::DryRun, Mode::Active, Mode::Guard]
            .into_iter()
            .find(|m| allowed.contains(m) && (*m != Mode::Guard || eff.guard.is_some()));
        match replacement {
            Some(m) => {
                eff.overrides.insert(
                    "spec.mode".into(),
                    format!(
                        "{:?} is not allowed by policy {by} (allowed: {allowed:?}); using {m:?}",
                        eff.mode
                    ),
                );
                eff.mode = m;
            }
            None => r.error(
                "spec.mode",
                format!(
                    "{:?} is not allowed by policy {by} and no allowed mode applies \
                     (allowed: {allowed:?})",
                    eff.mode
                ),
            ),
        }
    }
}

/// The generation of the worker configuration whose content hash is `hash`, given the previous
/// one (hash and generation, from status) at `now`.
///
/// The same content keeps its generation. New content gets the larger of the previous
/// generation + 1 and the Unix time in milliseconds, so generations keep growing across a recreated
/// object or a lost status: workers refuse a generation older than the one they run, and a
/// counter that restarted at 1 would be refused by every pod until it restarted.
pub fn next_config_generation(previous: Option<(&str, i64)>, hash: &str, now: Timestamp) -> i64 {
    match previous {
        Some((h, generation)) if h == hash => generation,
        Some((_, generation)) => generation.saturating_add(1).max(now.as_millisecond()),
        None => now.as_millisecond().max(1),
    }
}

/// Renders the worker configuration payload (wire contract) with its hash.
///
/// `generation` must grow whenever the payload changes ([`next_config_generation`]); workers
/// refuse a generation older than the one they run.
pub fn render_worker_config(effective: &Effective, generation: i64) -> WorkerConfig {
    let w = &effective.worker;
    WorkerConfig {
        version: WIRE_VERSION.to_owned(),
        generation,
        hash: String::new(),
        algorithm: w.algorithm,
        set_point: w.set_point,
        reaction: w.reaction,
        max_permits: w.max_permits,
        probe_initial_ms: millis(w.probe_initial).max(1),
        probe_max_ms: millis(w.probe_max).max(millis(w.probe_initial).max(1)),
        brake: effective.brake.as_ref().map(|b| BrakeConfig {
            min_backoff: b.min_backoff,
            expires_at_unix: b.expires_at.map(Timestamp::as_second),
        }),
    }
    .with_hash()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
