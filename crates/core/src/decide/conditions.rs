//! `status.conditions`: the conditions of a decision ([`Decider::conditions`]), the one a caller
//! owns ([`set_condition`]), and the builder behind both, with Kubernetes semantics:
//! `lastTransitionTime` changes only when a condition's status changes, so an unchanged world
//! writes identical conditions.

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{Regime, WorkerBackpressureStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::decider::{Decider, Outcome};
use super::time::{human, truncate};

/// Condition status values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }

    pub(super) fn from_bool(b: bool) -> Self {
        if b { Status::True } else { Status::False }
    }
}

/// Collects conditions in the order of [`cond::ALL`] (plus `Stalled` last when set).
pub(super) struct Builder<'a> {
    prev: &'a [Condition],
    now: Timestamp,
    generation: Option<i64>,
    out: Vec<Condition>,
}

impl<'a> Builder<'a> {
    pub(super) fn new(prev: &'a [Condition], now: Timestamp, generation: Option<i64>) -> Self {
        Builder {
            prev,
            now,
            generation,
            out: Vec::new(),
        }
    }

    /// Sets a condition, keeping the previous transition time when the status is unchanged.
    pub(super) fn set(&mut self, type_: &str, status: Status, reason: &str, message: String) {
        let status = status.as_str();
        let last_transition_time = find(self.prev, type_)
            .filter(|c| c.status == status)
            .map_or(Time(self.now), |c| c.last_transition_time.clone());
        self.out.push(Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: self.generation,
            last_transition_time,
        });
    }

    /// Copies the previous condition of this type unchanged, if there is one.
    pub(super) fn keep(&mut self, type_: &str) -> bool {
        match find(self.prev, type_) {
            Some(c) => {
                self.out.push(c.clone());
                true
            }
            None => false,
        }
    }

    pub(super) fn build(mut self) -> Vec<Condition> {
        self.out.sort_by_key(|c| rank(&c.type_));
        self.out
    }
}

/// Position of a condition type in the written order ([`cond::ALL`], others last).
pub(super) fn rank(type_: &str) -> usize {
    cond::ALL
        .iter()
        .position(|a| *a == type_)
        .unwrap_or(cond::ALL.len())
}

/// The condition of `type_` in `conditions`.
pub(super) fn find<'c>(conditions: &'c [Condition], type_: &str) -> Option<&'c Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is `True`.
pub(super) fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

/// Sets one condition the caller owns (Guard mode's `GuardApplied`) in `status`, with Kubernetes
/// semantics: `lastTransitionTime` is kept from `previous` while the condition's status is
/// unchanged, so an unchanged world writes an identical status.
pub fn set_condition(
    status: &mut WorkerBackpressureStatus,
    previous: Option<&WorkerBackpressureStatus>,
    type_: &str,
    value: bool,
    reason: &str,
    message: String,
    now: Timestamp,
) {
    let value = if value { "True" } else { "False" };
    let last_transition_time = previous
        .and_then(|p| p.conditions.as_deref())
        .and_then(|c| find(c, type_))
        .filter(|c| c.status == value)
        .map_or(Time(truncate(now)), |c| c.last_transition_time.clone());
    let new = Condition {
        type_: type_.to_owned(),
        status: value.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: status.observed_generation,
        last_transition_time,
    };
    let list = status.conditions.get_or_insert_with(Vec::new);
    list.retain(|c| c.type_ != type_);
    list.push(new);
    list.sort_by_key(|c| rank(&c.type_));
}

impl Decider<'_> {
    /// The conditions of a decision, from its outcome and the previous conditions.
    pub(super) fn conditions(&self, out: &Outcome, prev: &[Condition]) -> Vec<Condition> {
        let eff = self.eff;
        let s = &eff.scaling;
        let mut b = Builder::new(prev, self.now, self.obs.generation);
        let regime = out.regime.as_str();
        let dry = if eff.dry_run { " (dry run)" } else { "" };

        if out.regime == Regime::Suspended {
            b.set(
                cond::READY,
                Status::True,
                "Suspended",
                "spec.suspend is true: nothing is decided or changed".into(),
            );
            for t in cond::ALL.iter().skip(1) {
                b.keep(t);
            }
            return b.build();
        }

        // An emergency brake throttles the workers whatever the regime: say so where people look.
        let brake = eff
            .brake
            .as_ref()
            .map(|b| format!("; {b}"))
            .unwrap_or_default();
        match &out.metrics {
            Ok(_) => b.set(
                cond::READY,
                Status::True,
                "Reconciled",
                format!(
                    "regime {regime}: desired {} replicas{dry}{brake}",
                    out.desired
                ),
            ),
            Err(why) => b.set(
                cond::READY,
                Status::False,
                "MetricsUnavailable",
                format!("{why}; desired {} replicas{dry}{brake}", out.desired),
            ),
        }

        match self.backoff.or(self.fleet.backoff) {
            Some(v) if v <= s.hold.backoff_above => b.set(
                cond::DEPENDENCY_HEALTHY,
                Status::True,
                "BackoffBelowHold",
                format!(
                    "fleet backoff {v:.2} ≤ hold threshold {:.2}",
                    s.hold.backoff_above
                ),
            ),
            Some(v) => b.set(
                cond::DEPENDENCY_HEALTHY,
                Status::False,
                "BackoffAboveHold",
                format!(
                    "fleet backoff {v:.2} > hold threshold {:.2}",
                    s.hold.backoff_above
                ),
            ),
            None => b.set(
                cond::DEPENDENCY_HEALTHY,
                Status::Unknown,
                "BackoffUnknown",
                "fleet backoff is unknown".into(),
            ),
        }

        if out.held {
            let mut msg = match self.backoff {
                Some(v) => format!(
                    "fleet backoff {v:.2} (hold above {:.2}, release below {:.2} for {}); \
                     holding at {} replicas, a backlog-only autoscaler would pick {}",
                    s.hold.backoff_above,
                    s.release.backoff_below,
                    human(s.release.for_),
                    out.desired,
                    out.recommended
                ),
                None => format!(
                    "hold kept while metrics are unavailable; {} replicas",
                    out.desired
                ),
            };
            if s.hold.allow_scale_in {
                msg.push_str("; scale-in allowed");
            }
            b.set(cond::SCALE_OUT_HELD, Status::True, "DependencyFailing", msg);
        } else if let Some(until) = self.eff.manual_hold_until.filter(|u| *u > self.now) {
            b.set(
                cond::SCALE_OUT_HELD,
                Status::True,
                "ManualHold",
                format!(
                    "scale-out held by hand until {} (kubectl wbp release lifts it)",
                    truncate(until)
                ),
            );
        } else if let Some(since) = &self.tracking.above_hold_since
            && out.regime != Regime::MetricsUnavailable
        {
            b.set(
                cond::SCALE_OUT_HELD,
                Status::False,
                "HoldPending",
                format!(
                    "fleet backoff above {:.2} since {}; scale-out is deferred and held after {}",
                    s.hold.backoff_above,
                    since.0,
                    human(s.hold.for_)
                ),
            );
        } else {
            b.set(
                cond::SCALE_OUT_HELD,
                Status::False,
                "NotHeld",
                "scale-out is not held".into(),
            );
        }

        match (&out.ramp, out.held) {
            (Some(r), false) => b.set(
                cond::RAMPING,
                Status::from_bool(true),
                if out.regime == Regime::MetricsUnavailable {
                    "RampPaused"
                } else {
                    "Ramping"
                },
                format!(
                    "stage {}/{}: {} → {} replicas{}",
                    r.stage,
                    r.of,
                    r.from,
                    r.to,
                    r.next_stage_at
                        .as_ref()
                        .map(|t| format!(", next stage not before {}", t.0))
                        .unwrap_or_default()
                ),
            ),
            (Some(r), true) => b.set(
                cond::RAMPING,
                Status::False,
                "Aborted",
                format!(
                    "ramp aborted at stage {}/{}; {} abort(s) since the last full recovery",
                    r.stage,
                    r.of,
                    r.aborts.unwrap_or(0)
                ),
            ),
            (None, _) => b.set(
                cond::RAMPING,
                Status::False,
                "NotRamping",
                "no ramp in progress".into(),
            ),
        }

        match &out.metrics {
            Ok(None) => b.set(
                cond::METRICS_AVAILABLE,
                Status::True,
                "MetricsAvailable",
                "fleet backoff and queue metrics are known".into(),
            ),
            Ok(Some(partial)) => b.set(
                cond::METRICS_AVAILABLE,
                Status::True,
                "PartialMetrics",
                format!("enough metrics to decide; a query failed: {partial}"),
            ),
            Err(why) => b.set(
                cond::METRICS_AVAILABLE,
                Status::False,
                if self.obs.metrics_error.is_some() {
                    "QueryFailed"
                } else {
                    "MetricsMissing"
                },
                why.clone(),
            ),
        }

        if eff.overrides.is_empty() {
            b.set(
                cond::POLICY_LIMITED,
                Status::False,
                "WithinLimits",
                "no BackpressurePolicy limit overrides a value".into(),
            );
        } else {
            b.set(
                cond::POLICY_LIMITED,
                Status::True,
                "LimitsApplied",
                eff.overrides
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            );
        }

        match &self.obs.config {
            // Metrics-only workers take no config: nothing to be in sync with, and nothing
            // to alert on.
            Some(_) if !eff.worker.push => b.set(
                cond::CONFIG_IN_SYNC,
                Status::Unknown,
                "NotManaged",
                "spec.worker.push is Disabled: the workers take no config pushes; the operator \
                 reads their metrics only"
                    .into(),
            ),
            // Nothing is pushed in DryRun: the pods keep whatever they run, which is not a
            // fault to alert on (ConfigOutOfSync counts `False` only).
            Some(cfg) if eff.dry_run => b.set(
                cond::CONFIG_IN_SYNC,
                Status::Unknown,
                "NotPushed",
                format!(
                    "DryRun: the operator pushes no config; {} of {} ready pods run config {}",
                    cfg.pods_in_sync, cfg.pods_total, cfg.hash
                ),
            ),
            Some(cfg) if cfg.pods_in_sync >= cfg.pods_total => b.set(
                cond::CONFIG_IN_SYNC,
                Status::True,
                "InSync",
                format!(
                    "{} of {} ready pods run config {}",
                    cfg.pods_in_sync, cfg.pods_total, cfg.hash
                ),
            ),
            Some(cfg) => b.set(
                cond::CONFIG_IN_SYNC,
                Status::False,
                "OutOfSync",
                format!(
                    "{} of {} ready pods run config {}",
                    cfg.pods_in_sync, cfg.pods_total, cfg.hash
                ),
            ),
            None => {
                if !b.keep(cond::CONFIG_IN_SYNC) {
                    b.set(
                        cond::CONFIG_IN_SYNC,
                        Status::Unknown,
                        "NotObserved",
                        "the pods' configuration has not been observed yet".into(),
                    );
                }
            }
        }
        b.build()
    }
}
