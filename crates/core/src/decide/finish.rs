//! Status assembly: the hard bounds, the step-limit clocks, `lastDecision`, the events, the
//! conditions and the requeue, from the [`Outcome`] of a regime. Everything written is rounded
//! or truncated so that an unchanged world writes an identical status (the module
//! documentation's "Status stability").

use std::fmt::Write as _;
use std::time::Duration;

use backpressure_api::v1alpha1::{
    Action, DecisionRecord, FleetStatus, Regime, ReplicaStatus, TrackingStatus,
    WorkerBackpressureStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::decider::{Decider, Outcome};
use super::time::until;
use super::{
    BASE_REQUEUE, Decision, DecisionEvent, EventType, FleetMetrics, MIN_REQUEUE, sizing,
    status_changed,
};

impl Decider<'_> {
    /// Assembles the decision from a branch's outcome: the hard bounds, the step-limit clocks,
    /// `lastDecision`, the events, the conditions, the status and the requeue.
    pub(super) fn finish(mut self, mut out: Outcome, fleet: &FleetMetrics) -> Decision {
        let eff = self.eff;
        let c = self.current;
        let now = self.now;
        let dry = eff.dry_run;
        let prev = self.prev;
        let prev_regime = prev.and_then(|p| p.regime);
        let suspended = out.regime == Regime::Suspended;

        // Hard bounds, applied after everything else (as the HPA does).
        if !suspended {
            let clamped = self.clamp(out.desired);
            if clamped != out.desired {
                let _ = write!(
                    out.reason,
                    "; {clamped} to respect minReplicas {} and maxReplicas {}",
                    eff.scaling.min_replicas, eff.scaling.max_replicas
                );
                out.desired = clamped;
            }
            if out.action == Action::None && out.desired != c {
                out.action = if out.desired > c {
                    Action::ScaleOut
                } else {
                    Action::ScaleIn
                };
                out.reason = format!(
                    "{c} → {} to respect minReplicas {} and maxReplicas {}; {}",
                    out.desired, eff.scaling.min_replicas, eff.scaling.max_replicas, out.reason
                );
            }
            if !dry {
                let s = &eff.scaling;
                if out.desired > c
                    && sizing::period_over(
                        self.tracking.last_scale_up.as_ref(),
                        s.scale_up.period,
                        now,
                    )
                {
                    self.tracking.last_scale_up = Some(Time(now));
                }
                if out.desired < c
                    && sizing::period_over(
                        self.tracking.last_scale_down.as_ref(),
                        s.scale_down.period,
                        now,
                    )
                {
                    self.tracking.last_scale_down = Some(Time(now));
                }
            }
        }

        // lastDecision and events.
        let regime_changed = prev_regime != Some(out.regime);
        let record = DecisionRecord {
            time: Time(now),
            action: out.action,
            from: c,
            to: out.desired,
            reason: out.reason.clone(),
            dry_run: dry.then_some(true),
        };
        let prev_record = prev.and_then(|p| p.last_decision.clone());
        let repeated = prev_record.as_ref().is_some_and(|p| {
            p.action == record.action
                && p.from == record.from
                && p.to == record.to
                && p.dry_run == record.dry_run
        });
        // Suspension is not a decision: the last one stays on record.
        let new_record =
            ((out.action != Action::None && !repeated) || regime_changed) && !suspended;
        let last_decision = if new_record {
            Some(record)
        } else {
            prev_record
        };

        let mut events = Vec::new();
        if regime_changed {
            let from = prev_regime.map_or("none", Regime::as_str);
            events.push(DecisionEvent {
                type_: match out.regime {
                    Regime::DependencyFailing | Regime::MetricsUnavailable => EventType::Warning,
                    _ => EventType::Normal,
                },
                reason: out.regime.as_str(),
                action: "Classify",
                message: format!("regime {from} → {}: {}", out.regime.as_str(), out.reason),
            });
        }
        events.append(&mut out.events);
        if out.action != Action::None && !repeated {
            let (type_, reason) = match out.action {
                Action::ScaleOut => (EventType::Normal, "ScaledOut"),
                Action::ScaleIn => (EventType::Normal, "ScaledIn"),
                Action::HoldScaleOut => (EventType::Warning, "ScaleOutHeld"),
                Action::RampStage => (EventType::Normal, "RampStage"),
                Action::AbortRamp => (EventType::Warning, "RampAborted"),
                Action::Fallback => (EventType::Warning, "MetricsFallback"),
                Action::None => (EventType::Normal, "None"),
            };
            let message = if dry {
                format!(
                    "DryRun ({}): would set {} → {} replicas: {}",
                    eff.dry_run_by.as_deref().unwrap_or("dry run"),
                    c,
                    out.desired,
                    out.reason
                )
            } else {
                out.reason.clone()
            };
            events.push(DecisionEvent {
                type_,
                reason,
                action: out.action.as_str(),
                message,
            });
        }
        let overrides = (!eff.overrides.is_empty()).then(|| eff.overrides.clone());
        if overrides.is_some() && prev.and_then(|p| p.overrides.as_ref()) != overrides.as_ref() {
            events.push(DecisionEvent {
                type_: EventType::Warning,
                reason: "PolicyOverride",
                action: "Clamp",
                message: eff
                    .overrides
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            });
        }
        for e in &mut events {
            e.message = cap_message(std::mem::take(&mut e.message));
        }

        // Conditions.
        let prev_conditions = prev.and_then(|p| p.conditions.clone()).unwrap_or_default();
        let conditions = self.conditions(&out, &prev_conditions);

        // Status.
        let tracking = normalize(self.tracking.clone());
        let fleet_status = if suspended {
            prev.and_then(|p| p.fleet.clone())
        } else {
            Some(snapshot(
                fleet,
                self.obs.ready_pods,
                prev.and_then(|p| p.fleet.as_ref())
                    .and_then(|f| f.sampled_at.clone()),
            ))
        };
        let mut status = WorkerBackpressureStatus {
            observed_generation: self
                .obs
                .generation
                .or_else(|| prev.and_then(|p| p.observed_generation)),
            regime: Some(out.regime),
            replicas: Some(ReplicaStatus {
                current: c,
                desired: out.desired,
                recommended: out.recommended,
            }),
            ramp: out.ramp.clone(),
            tracking,
            fleet: fleet_status,
            config: self
                .obs
                .config
                .clone()
                .or_else(|| prev.and_then(|p| p.config.clone())),
            last_decision,
            policies: (!eff.policies.is_empty()).then(|| eff.policies.clone()),
            overrides,
            dry_run_by: eff.dry_run_by.clone().filter(|_| eff.dry_run),
            // Guard mode's clamp is reported by the caller after acting; carried until then.
            guard: prev.and_then(|p| p.guard.clone()),
            // Producer control is decided apart (`crate::producers`) and set by the caller.
            producers: prev.and_then(|p| p.producers.clone()),
            conditions: Some(conditions),
        };
        if !suspended
            && status_changed(prev, &status)
            && let Some(f) = status.fleet.as_mut()
        {
            f.sampled_at = Some(Time(now));
        }

        // Requeue.
        if let Some(expiry) = eff.brake.as_ref().and_then(|b| b.expires_at) {
            self.deadlines.push(expiry);
        }
        let requeue_after = self
            .deadlines
            .iter()
            .filter(|t| **t > now)
            .map(|t| until(*t, now))
            .fold(BASE_REQUEUE, Duration::min)
            .max(MIN_REQUEUE);

        Decision {
            mode: eff.mode,
            regime: out.regime,
            current_replicas: c,
            desired_replicas: out.desired,
            recommended_replicas: out.recommended,
            action: out.action,
            deferral: out.deferral,
            reason: out.reason,
            dry_run: dry,
            events,
            requeue_after,
            status,
        }
    }
}

/// Largest event message (the `note` of `events.k8s.io/v1` is limited to 1 kB).
const MAX_EVENT_MESSAGE: usize = 1024;

fn cap_message(mut message: String) -> String {
    if message.len() > MAX_EVENT_MESSAGE {
        let mut end = MAX_EVENT_MESSAGE - '…'.len_utf8();
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}

/// `None` for an empty tracking block, so that a fresh object writes no empty map.
fn normalize(mut t: TrackingStatus) -> Option<TrackingStatus> {
    if t.recommendations.as_ref().is_some_and(Vec::is_empty) {
        t.recommendations = None;
    }
    (t != TrackingStatus::default()).then_some(t)
}

/// The fleet snapshot written to status, rounded so that noise below the shown precision does
/// not rewrite the status.
fn snapshot(f: &FleetMetrics, ready: i32, sampled_at: Option<Time>) -> FleetStatus {
    FleetStatus {
        backoff: f.backoff.map(|v| round_to(v, 2)),
        failure_rate: f.failure_rate.map(|v| round_to(v, 2)),
        queue_age: f.queue_age.map(f64::round),
        queue_depth: f.queue_depth.map(two_significant),
        arrival_rate: f.arrival_rate.map(two_significant),
        completion_rate: f.completion_rate.map(two_significant),
        ready_pods: Some(ready),
        sampled_at,
    }
}

fn round_to(x: f64, decimals: i32) -> f64 {
    let f = 10f64.powi(decimals);
    (x * f).round() / f
}

pub(crate) fn two_significant(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return x;
    }
    let magnitude = x.abs().log10().floor() as i32;
    let decimals = 1 - magnitude;
    if decimals >= 0 {
        round_to(x, decimals)
    } else {
        let f = 10f64.powi(-decimals);
        (x / f).round() * f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_for_status() {
        assert_eq!(two_significant(312.7), 310.0);
        assert_eq!(two_significant(12345.0), 12000.0);
        assert_eq!(two_significant(0.456), 0.46);
        assert_eq!(two_significant(7.0), 7.0);
        assert_eq!(round_to(0.314159, 2), 0.31);
        assert_eq!(
            serde_json::to_string(&round_to(0.3, 2)).ok().as_deref(),
            Some("0.3")
        );
    }

    #[test]
    fn event_messages_are_capped_on_a_char_boundary() {
        let long = "é".repeat(1000);
        let capped = cap_message(long);
        assert!(capped.len() <= MAX_EVENT_MESSAGE);
        assert!(capped.ends_with('…'));
        assert_eq!(cap_message("short".into()), "short");
    }
}
