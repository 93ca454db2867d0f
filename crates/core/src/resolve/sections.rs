//! The sections of [`resolve`](super::resolve), in the order it calls them: each picks its
//! fields through the [`Resolver`] and checks them, so that every invalid field is reported.

use std::collections::BTreeMap;
use std::time::Duration;

use backpressure_api::defaults as d;
use backpressure_api::v1alpha1::{
    Algorithm, ConfigPush, FallbackPolicy, Mode, QueryOverrides, WorkerBackpressureSpec,
};
use k8s_openapi::jiff::Timestamp;

use super::limits::check_stages;
use super::resolver::Resolver;
use super::{
    Effective, EffectiveBrake, EffectiveHold, EffectiveMetrics, EffectiveRampUp, EffectiveRelease,
    EffectiveScaleDown, EffectiveScaleUp, EffectiveScaling, EffectiveWorker, Fallback,
    MetricsAccess, PolicyAddress, PolicyInput, brake_active,
};

/// `spec.worker`: the controller configuration pushed to the pods.
pub(super) fn worker(r: &mut Resolver<'_>) -> EffectiveWorker {
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
    if !(set_point.value.is_finite()
        && set_point.value >= d::MIN_SET_POINT
        && set_point.value < 1.0)
    {
        r.error(
            &set_point.from,
            format!(
                "setPoint {} is not in [{}, 1)",
                set_point.value,
                d::MIN_SET_POINT
            ),
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
    let (initial_permits, ratio_window, brake_release, floor_max, redelivery) = worker_extras(r);
    let push = r.value("worker.push", |l| l.worker?.push, ConfigPush::Enabled);
    EffectiveWorker {
        algorithm: algorithm.value,
        set_point: set_point.value,
        reaction: reaction.value,
        max_permits: max_permits.value,
        probe_initial: probe_initial.value,
        probe_max: probe_max.value,
        initial_permits,
        ratio_window,
        brake_release,
        floor_max,
        redelivery,
        push: push.value == ConfigPush::Enabled,
    }
}

/// Largest `worker.ratioWindow` and `worker.brakeRelease` (as the CRD's CEL rules).
const MAX_WORKER_WINDOW: Duration = Duration::from_secs(3600);
/// Largest `worker.redelivery` delay: SQS's largest visibility timeout (as the CRD's CEL rules).
const MAX_REDELIVERY: Duration = Duration::from_secs(12 * 3600);

/// The optional worker settings: each `None` unless a layer sets it (then the worker library's
/// default applies, and the payload, without the field, keeps its hash). Bounds as the CRD's,
/// also checked here for policies and objects stored before the rules existed.
fn worker_extras(r: &mut Resolver<'_>) -> WorkerExtras {
    let initial_permits = r.value(
        "worker.initialPermits",
        |l| l.worker?.initial_permits,
        d::INITIAL_PERMITS,
    );
    if initial_permits.value > MAX_INITIAL_PERMITS {
        r.error(
            &initial_permits.from,
            format!(
                "initialPermits {} exceeds {MAX_INITIAL_PERMITS}",
                initial_permits.value
            ),
        );
    }
    let ratio_window = r.duration(
        "worker.ratioWindow",
        |l| l.worker?.ratio_window.as_ref(),
        d::RATIO_WINDOW,
    );
    if ratio_window.value < Duration::from_secs(1) || ratio_window.value > MAX_WORKER_WINDOW {
        r.error(
            &ratio_window.from,
            format!(
                "ratioWindow {:?} is not between 1s and 1h",
                ratio_window.value
            ),
        );
    }
    let brake_release = r.duration(
        "worker.brakeRelease",
        |l| l.worker?.brake_release.as_ref(),
        d::BRAKE_RELEASE,
    );
    if brake_release.value > MAX_WORKER_WINDOW {
        r.error(
            &brake_release.from,
            format!("brakeRelease {:?} exceeds 1h", brake_release.value),
        );
    }
    let floor_max = r.value("worker.floorMax", |l| l.worker?.floor_max, d::FLOOR_MAX);
    if !(floor_max.value.is_finite() && (0.0..=d::MAX_FLOOR_MAX).contains(&floor_max.value)) {
        r.error(
            &floor_max.from,
            format!(
                "floorMax {} is not between 0 and {}",
                floor_max.value,
                d::MAX_FLOOR_MAX
            ),
        );
    }
    let base = r.duration(
        "worker.redelivery.base",
        |l| l.worker?.redelivery.as_ref()?.base.as_ref(),
        d::REDELIVERY_BASE,
    );
    let max = r.duration(
        "worker.redelivery.max",
        |l| l.worker?.redelivery.as_ref()?.max.as_ref(),
        d::REDELIVERY_MAX,
    );
    for p in [&base, &max] {
        if p.value > MAX_REDELIVERY {
            r.error(
                &p.from,
                format!("redelivery delay {:?} exceeds 12h", p.value),
            );
        }
    }
    if base.value > max.value {
        r.error(
            &base.from,
            format!(
                "redelivery.base {:?} exceeds redelivery.max {:?} (from {})",
                base.value, max.value, max.from
            ),
        );
    }
    let redelivery = match (base.clone().set(), max.clone().set()) {
        (None, None) => None,
        _ => Some((base.value, max.value)),
    };
    (
        initial_permits.set(),
        ratio_window.set(),
        brake_release.set(),
        floor_max.set(),
        redelivery,
    )
}

/// `initialPermits`, `ratioWindow`, `brakeRelease`, `floorMax`, `redelivery` of [`EffectiveWorker`].
type WorkerExtras = (
    Option<u32>,
    Option<Duration>,
    Option<Duration>,
    Option<f64>,
    Option<(Duration, Duration)>,
);

/// Largest `worker.initialPermits` (as the CRD's bound, the worker's default `maxPermits` limit).
const MAX_INITIAL_PERMITS: u32 = 1024;

/// `spec.metrics`: where and how the fleet metrics are queried (the `workload` label defaults
/// to the target's name).
pub(super) fn metrics(
    r: &mut Resolver<'_>,
    spec: &WorkerBackpressureSpec,
    policies: &[PolicyInput<'_>],
) -> EffectiveMetrics {
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
    let mut query_sources = BTreeMap::new();
    let mut pick = |kind: &'static str, get: fn(&QueryOverrides) -> Option<&String>| {
        let (text, source) = r.query(&format!("metrics.queries.{kind}"), get)?;
        query_sources.insert(kind, source);
        Some(text)
    };
    let queries = QueryOverrides {
        backoff: pick("backoff", |q| q.backoff.as_ref()),
        failure_rate: pick("failureRate", |q| q.failure_rate.as_ref()),
        queue_age: pick("queueAge", |q| q.queue_age.as_ref()),
        queue_depth: pick("queueDepth", |q| q.queue_depth.as_ref()),
        arrival_rate: pick("arrivalRate", |q| q.arrival_rate.as_ref()),
        completion_rate: pick("completionRate", |q| q.completion_rate.as_ref()),
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
    let queue = super::queue::resolve(r, spec, stale_after.value);
    EffectiveMetrics {
        queue,
        address_from_policy: address.is_from_policy(),
        secret_ref_from_policy: secret_ref.is_from_policy(),
        address: Some(address.value).filter(|a| !a.is_empty()),
        timeout: timeout.value,
        secret_ref: secret_ref.value,
        workload: workload.value,
        queries,
        query_sources,
        access: access(policies),
        rate_window: rate_window.value,
        stale_after: stale_after.value,
    }
}

/// What the matching `policies` (in precedence order) grant through `metricsAccess`: the
/// grants add up; the first policy that allows cross-namespace queries is named.
fn access(policies: &[PolicyInput<'_>]) -> MetricsAccess {
    let mut out = MetricsAccess::default();
    for p in policies {
        let Some(a) = &p.spec.metrics_access else {
            continue;
        };
        if a.allow_cross_namespace_queries == Some(true) && out.cross_namespace_by.is_none() {
            out.cross_namespace_by = Some(p.name.to_owned());
        }
        for entry in a.prometheus_addresses.iter().flatten() {
            out.prometheus_addresses.push(PolicyAddress {
                address: entry.address.clone(),
                credentials: entry.credentials == Some(true),
                policy: p.name.to_owned(),
            });
        }
    }
    out
}

/// `spec.scaling`: bounds, hold, release, step limits, ramp and the metrics fallback, with the
/// checks across fields (`minReplicas <= maxReplicas`, `release.backoffBelow <
/// hold.backoffAbove`, `rampUp.abortAbove > release.backoffBelow`).
pub(super) fn scaling(r: &mut Resolver<'_>) -> EffectiveScaling {
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
    let on_metrics_unavailable = on_metrics_unavailable(r);
    EffectiveScaling {
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
    }
}

/// `spec.scaling.onMetricsUnavailable`: `Static` and `IfHigher` need `replicas` >= 1.
fn on_metrics_unavailable(r: &mut Resolver<'_>) -> Fallback {
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

    match (fallback_policy.value, fallback_replicas.value) {
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
    }
}

/// What the mode requires once the policies' limits applied (`mode_from` names where the
/// configured mode came from): Guard needs `spec.guard`; DryRun comes from the mode or from
/// the first policy with `dryRun: true`, and [`Effective::dry_run_by`] says which.
pub(super) fn mode(
    r: &mut Resolver<'_>,
    eff: &mut Effective,
    mode_from: &str,
    policies: &[PolicyInput<'_>],
) {
    if eff.mode == Mode::Guard && eff.guard.is_none() {
        r.error("spec.guard", "required when the mode is Guard".into());
    }
    if eff.mode == Mode::DryRun {
        eff.dry_run = true;
        eff.dry_run_by = Some(if eff.overrides.contains_key("spec.mode") {
            "a policy's allowedModes".to_owned()
        } else {
            mode_from.to_owned()
        });
    } else if let Some(p) = policies.iter().find(|p| p.spec.dry_run == Some(true)) {
        eff.dry_run = true;
        eff.dry_run_by = Some(format!("policy {}", p.name));
    }
}

/// The emergency brake: the largest `minBackoff` of the policies whose brake is in force at
/// `now`; an out-of-range `minBackoff` is an error.
pub(super) fn brake(
    r: &mut Resolver<'_>,
    eff: &mut Effective,
    policies: &[PolicyInput<'_>],
    now: Timestamp,
) {
    for p in policies {
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
}
