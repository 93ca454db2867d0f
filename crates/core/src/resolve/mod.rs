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
//! path → description, for `status.overrides`. `allowedQueueSystems` cannot replace a queue (the
//! queue is where the workers read): an object whose `spec.queue.system` (`Custom` without one)
//! a policy does not list is an error naming the policy.
//!
//! Any matching policy with `dryRun: true` puts the object in DryRun. The emergency brake is the
//! largest `minBackoff` of the matching policies whose brake has not expired at `now`.
//!
//! Errors are never panics: an unparsable duration, a value out of range, `minReplicas >
//! maxReplicas` or `release.backoffBelow >= hold.backoffAbove` after merging, or invalid ramp
//! stages are returned together as a list of [`FieldError`]s, each naming the field and where
//! the value came from.
//!
//! # Layout
//!
//! This file holds the types and [`resolve`], which calls one function per section in
//! `sections.rs` (worker, metrics with `queue.rs` for `spec.queue`, scaling, mode, brake), each
//! picking its fields through the precedence layers of `resolver.rs`; `limits.rs` applies the
//! policies' limits (and [`check_stages`]); `worker_config.rs` renders the wire payload ([`render_worker_config`]).

mod limits;
mod producers;
mod queue;
mod resolver;
mod sections;
#[cfg(test)]
mod tests;
mod worker_config;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use backpressure_api::v1alpha1::{
    Algorithm, BackpressurePolicy, BackpressurePolicySpec, Brake, GuardRef, KafkaExporter, Mode,
    ProducerMode, QueryOverrides, QueueSystem, SecretRef, SqsExporter, TargetRef,
    WorkerBackpressureSpec,
};
use k8s_openapi::jiff::Timestamp;

pub use crate::selector::{SelectorError, namespace_selector_matches};
pub use limits::check_stages;
use resolver::Resolver;
pub use worker_config::{next_config_generation, render_worker_config};

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
    /// Producer control (`spec.producers`); `None` when the object names no producers.
    pub producers: Option<EffectiveProducers>,
    /// Matching policies by name, in precedence order.
    pub policies: Vec<String>,
    /// Values a policy limit changed: field path → description.
    pub overrides: BTreeMap<String, String>,
    /// A manual hold in force until this time (`kubectl wbp hold`, the
    /// `backpressure.dev/hold-until` annotation): no scale-out, whatever the metrics say. Set by
    /// the caller from the object's annotations; [`resolve`] leaves it empty.
    pub manual_hold_until: Option<Timestamp>,
}

/// Resolved `spec.producers` (see [`crate::producers`] for the state machine).
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveProducers {
    /// The producer workload; `None` only with `mode: Off`.
    pub target_ref: Option<TargetRef>,
    /// `Pause`, `Throttle` or `Off`.
    pub mode: ProducerMode,
    /// Queue-depth watermarks: (pause above, resume below), in messages.
    pub depth: Option<(f64, f64)>,
    /// Queue-age watermarks: (pause above, resume below).
    pub age: Option<(Duration, Duration)>,
    /// Shortest time restricted before resuming.
    pub pause_dwell: Duration,
    /// Time at each step of the way back to open.
    pub resume_dwell: Duration,
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
    /// Startup ramp's first permits; `None`: not set anywhere, the worker library's default
    /// (the payload leaves the field out, so the hash of such a payload does not change).
    pub initial_permits: Option<u32>,
    /// RatioThrottle window; `None`: the library default.
    pub ratio_window: Option<Duration>,
    /// Brake lift time; `None`: the library default.
    pub brake_release: Option<Duration>,
    /// Highest learnable failure floor; `None`: the library default.
    pub floor_max: Option<f64>,
    /// Redelivery backoff `(base, max)` (base 0: off); `None`: the library default.
    pub redelivery: Option<(Duration, Duration)>,
    /// Whether the config is pushed to the pods (`false`: metrics-only workers).
    pub push: bool,
}

/// Resolved `spec.metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveMetrics {
    /// Prometheus base URL; `None` means the operator's `--prometheus-url`.
    pub address: Option<String>,
    /// `address` comes from a policy's defaults (platform input), not from the object.
    pub address_from_policy: bool,
    /// Query timeout.
    pub timeout: Duration,
    /// Credentials for Prometheus.
    pub secret_ref: Option<SecretRef>,
    /// `secret_ref` comes from a policy's defaults (platform input), not from the object.
    pub secret_ref_from_policy: bool,
    /// Value of the `workload` label (defaults to the target's name).
    pub workload: String,
    /// PromQL overrides, merged field by field, as written (see
    /// [`crate::tenancy::scoped_queries`] for what is run).
    pub queries: QueryOverrides,
    /// Where each override in `queries` came from, by its field name in `spec.metrics.queries`
    /// (`queueAge`).
    pub query_sources: BTreeMap<&'static str, QuerySource>,
    /// What the matching policies grant through `metricsAccess`.
    pub access: MetricsAccess,
    /// `rate()` window of the default queries.
    pub rate_window: Duration,
    /// Samples older than this are unknown.
    pub stale_after: Duration,
    /// `spec.queue`: where the queue metrics come from.
    pub queue: EffectiveQueue,
}

/// Resolved `spec.queue`.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectiveQueue {
    /// The queue system (`Custom` without `spec.queue`).
    pub system: QueueSystem,
    /// What identifies the queue in its system; `None` for `Custom`.
    pub source: Option<QueueSource>,
    /// Only the exporter's series with this `job` label.
    pub job: Option<String>,
    /// Only the exporter's series with this `instance` label.
    pub instance: Option<String>,
    /// Queue samples older than this are unknown.
    pub stale_after: Duration,
}

impl EffectiveQueue {
    /// The queue of an object without `spec.queue`: the worker library's series, as fresh as
    /// `stale_after`.
    pub fn custom(stale_after: Duration) -> Self {
        EffectiveQueue {
            system: QueueSystem::Custom,
            source: None,
            job: None,
            instance: None,
            stale_after,
        }
    }

    /// The partition count the object states (`spec.queue.kafka.partitions`).
    pub fn partitions(&self) -> Option<i32> {
        match &self.source {
            Some(QueueSource::Kafka { partitions, .. }) => *partitions,
            _ => None,
        }
    }
}

/// A queue in its system, as the presets read it (names as the exporters label them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueSource {
    /// A Redis stream and consumer group.
    RedisStreams {
        /// The stream's key.
        stream: String,
        /// The consumer group.
        group: String,
        /// The database number.
        db: i32,
    },
    /// A RabbitMQ queue.
    RabbitMq {
        /// The queue's name.
        queue: String,
        /// Its virtual host.
        vhost: String,
    },
    /// An SQS queue.
    Sqs {
        /// The queue's name (CloudWatch's `QueueName`).
        queue: String,
        /// Which exporter reads CloudWatch.
        exporter: SqsExporter,
        /// The CloudWatch period of the sums.
        period: Duration,
    },
    /// A Kafka topic and consumer group.
    Kafka {
        /// The topic.
        topic: String,
        /// The consumer group.
        group: String,
        /// Which exporter reads the lag.
        exporter: KafkaExporter,
        /// kafka-lag-exporter's `cluster_name`.
        cluster: Option<String>,
        /// The topic's partitions, when the object states them.
        partitions: Option<i32>,
    },
    /// A Pub/Sub subscription.
    PubSub {
        /// The subscription's ID.
        subscription: String,
        /// Its project.
        project: Option<String>,
    },
}

/// Where a PromQL override came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuerySource {
    /// The field: `spec.metrics.queries.queueAge`, or `BackpressurePolicy NAME:
    /// spec.defaults.metrics.queries.queueAge`.
    pub field: String,
    /// Written in the object (tenant input), not in a policy (platform input).
    pub tenant: bool,
}

/// What the matching policies grant through `spec.metricsAccess`; the grants of all policies
/// add up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricsAccess {
    /// The first policy (in precedence order) that lets the object's own queries read other
    /// namespaces, if any.
    pub cross_namespace_by: Option<String>,
    /// Prometheus addresses the object may name, from every matching policy.
    pub prometheus_addresses: Vec<PolicyAddress>,
}

/// A Prometheus address a policy allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyAddress {
    /// The address as the policy writes it (matched on its origin).
    pub address: String,
    /// Credentials from `secretRef` may be sent there without the Secret's own consent.
    pub credentials: bool,
    /// The policy.
    pub policy: String,
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

/// Resolves the effective configuration of an object with `spec` in a namespace matched by
/// `policies` (any order; they are sorted into precedence order here), at `now` (only the
/// brake's expiry depends on it).
///
/// One section at a time, in this order (so errors are listed in it): `spec.worker`,
/// `spec.metrics`, `spec.scaling`, the mode, `spec.producers`, the policies' limits, what the mode then requires
/// (DryRun, Guard's `spec.guard`), the emergency brake.
pub fn resolve(
    spec: &WorkerBackpressureSpec,
    policies: &[PolicyInput<'_>],
    now: Timestamp,
) -> Result<Effective, ResolveError> {
    let mut policies = policies.to_vec();
    sort_by_precedence(&mut policies);
    let mut r = Resolver::new(spec, &policies);

    let worker = sections::worker(&mut r);
    let metrics = sections::metrics(&mut r, spec, &policies);
    let scaling = sections::scaling(&mut r);
    let mode = r.value("mode", |l| l.mode, Mode::Active);
    let mut eff = Effective {
        manual_hold_until: None,
        target_ref: spec.target_ref.clone(),
        mode: mode.value,
        guard: spec.guard.clone(),
        suspend: spec.suspend.unwrap_or(false),
        dry_run: false,
        dry_run_by: None,
        worker,
        metrics,
        scaling,
        brake: None,
        producers: producers::resolve(&mut r, spec),
        policies: policies.iter().map(|p| p.name.to_owned()).collect(),
        overrides: BTreeMap::new(),
    };
    limits::apply(&mut r, &mut eff, &policies);
    sections::mode(&mut r, &mut eff, &mode.from, &policies);
    sections::brake(&mut r, &mut eff, &policies, now);

    if r.errors.is_empty() {
        Ok(eff)
    } else {
        Err(ResolveError { errors: r.errors })
    }
}
