//! Guard mode's clamp: what the guarded autoscaler (an HPA or a KEDA ScaledObject) should look
//! like after a decision. Pure: the operator reads and patches the autoscaler (its `act::guard`
//! module maps a [`Clamp`] onto the autoscaler's fields and records the original values).
//!
//! Guard mode is as strict as Active mode: wherever Active mode would not scale out (or not
//! scale in), the guarded autoscaler may not either.
//!
//! | decision | Active mode | clamp |
//! |---|---|---|
//! | held (DependencyFailing, `ScaleOutHeld`) | no scale-out, no scale-in | [`Clamp::Freeze`] ([`Clamp::Hold`] with `hold.allowScaleIn`) |
//! | hold pending (backoff above `hold.backoffAbove`, not yet for `hold.for`) | scale-out and scale-in deferred | [`Clamp::Freeze`] ([`Clamp::Hold`] with `hold.allowScaleIn`) |
//! | failure rate above the workers' set point | scale-out deferred | [`Clamp::Hold`] |
//! | manual hold (`kubectl wbp hold`) | scale-out withheld | [`Clamp::Hold`] |
//! | ramp stage k | up to the stage's replicas | [`Clamp::Ceiling`]: the stage's replicas ([`stage_target`]) |
//! | anything else, DryRun | sized from the queue | [`Clamp::Free`]: the original settings |
//! | suspended | nothing | none: the autoscaler is left as it is |
//!
//! The deferrals ([`Deferral`]) apply whatever the backlog sizing recommends: the guarded
//! autoscaler sizes from its own metrics (CPU, a KEDA trigger), so it may want to scale out
//! when the queue does not, and that scale-out would load the same failing dependency.

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::Regime;

use crate::decide::{Decision, Deferral, stage_target};
use crate::resolve::Effective;

/// What the guarded autoscaler should look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clamp {
    /// Its original settings.
    Free,
    /// No scale-out at all; scale-in as the autoscaler decides.
    Hold,
    /// No scale-out and no scale-in: the replicas stay where they are.
    Freeze,
    /// Scale-out up to this many replicas (a ramp stage).
    Ceiling(i32),
}

/// Why the clamp is what it is, for the condition and events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClampPlan {
    /// The clamp.
    pub clamp: Clamp,
    /// Why, in words.
    pub why: String,
}

/// The clamp a decision asks for, or `None` when the autoscaler must be left as it is
/// (suspended). See the module documentation for the table: held (the `ScaleOutHeld`
/// condition, which also covers a hold kept through missing metrics) and a pending hold stop
/// both directions unless `hold.allowScaleIn`; the failure-rate deferral and a manual hold stop
/// scale-out; a ramp in progress allows the current stage's replicas (never fewer than the
/// current replicas); DryRun and everything else restore the original settings.
pub fn clamp_for(
    effective: &Effective,
    decision: &Decision,
    manual_hold: Option<&str>,
) -> Option<ClampPlan> {
    if decision.regime == Regime::Suspended {
        return None;
    }
    let hold = &effective.scaling.hold;
    let held =
        decision.status.conditions.iter().flatten().any(|c| {
            c.type_ == cond::SCALE_OUT_HELD && c.status == "True" && c.reason != "ManualHold"
        });
    let ramp = decision.status.ramp.as_ref().filter(|_| {
        matches!(
            decision.regime,
            Regime::Recovering | Regime::MetricsUnavailable
        )
    });
    // Scale-in stops with scale-out where Active mode stops it: held, or a hold pending.
    let stop_in = |why: String| {
        if hold.allow_scale_in {
            (
                Clamp::Hold,
                format!("{why} (hold.allowScaleIn: scale-in allowed)"),
            )
        } else {
            (Clamp::Freeze, format!("{why}; no scale-in either"))
        }
    };
    let (clamp, why) = if held {
        stop_in("scale-out held while the dependency fails".to_owned())
    } else if decision.deferral == Some(Deferral::HoldPending) {
        let mut plan = stop_in(format!(
            "hold pending: fleet backoff above {:.2}, held once it stays there for {}s; \
             scale-out deferred",
            hold.backoff_above,
            hold.for_.as_secs()
        ));
        if let Some(until) = manual_hold {
            plan.1.push_str(&format!("; manual hold until {until}"));
        }
        plan
    } else if let Some(until) = manual_hold {
        (Clamp::Hold, format!("manual hold until {until}"))
    } else if decision.deferral == Some(Deferral::FailureRate) {
        (
            Clamp::Hold,
            "dependency failure rate above the workers' set point: scale-out deferred".to_owned(),
        )
    } else if let Some(r) = ramp {
        let stage = stage_target(effective, r);
        (
            Clamp::Ceiling(stage.max(decision.current_replicas)),
            format!(
                "ramp stage {}/{}: {} → {} replicas toward {}",
                r.stage, r.of, r.from, stage, r.to
            ),
        )
    } else {
        (Clamp::Free, "scale-out is not held".to_owned())
    };
    if effective.dry_run && clamp != Clamp::Free {
        return Some(ClampPlan {
            clamp: Clamp::Free,
            why: format!(
                "DryRun ({}): the autoscaler keeps its original settings; would clamp it: {why}",
                effective.dry_run_by.as_deref().unwrap_or("dry run")
            ),
        });
    }
    Some(ClampPlan { clamp, why })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use backpressure_api::v1alpha1::{Mode, Regime};

    use super::{Clamp, clamp_for};
    use crate::decide::fixtures::{Queue, World, effective};
    use crate::decide::{Decision, Deferral, decide};

    fn guard_world() -> World {
        let mut eff = effective(|_| {});
        eff.mode = Mode::Guard;
        World::new(eff, 8)
    }

    fn into_hold(w: &mut World) {
        w.queue(Queue::Backlog).backoff(0.31);
        w.step(0);
        w.step(15);
        w.step(15);
    }

    /// Decides on the world's observation with the dependency failure rate set to `f`.
    fn with_failure_rate(w: &World, f: f64) -> Decision {
        let mut obs = w.observation();
        obs.fleet.failure_rate = Some(f);
        decide(&w.eff, w.status.as_ref(), &obs)
    }

    #[test]
    fn held_ramping_and_free() {
        let mut w = guard_world();
        w.queue(Queue::Backlog);
        let d = w.step(0);
        let eff = w.eff.clone();
        assert_eq!(clamp_for(&eff, &d, None).unwrap().clamp, Clamp::Free);
        assert_eq!(
            clamp_for(&eff, &d, Some("2030-01-01T00:00:00Z"))
                .unwrap()
                .clamp,
            Clamp::Hold,
            "a manual hold stops scale-out only, as in Active mode"
        );
        into_hold(&mut w);
        let d = w.peek();
        let plan = clamp_for(&eff, &d, None).unwrap();
        assert_eq!(plan.clamp, Clamp::Freeze, "{}", d.reason);
        assert!(plan.why.contains("no scale-in either"), "{}", plan.why);
        // Metrics gone while held: still held.
        w.backoff = None;
        let d = w.step(15);
        assert_eq!(d.regime, Regime::MetricsUnavailable);
        assert_eq!(clamp_for(&eff, &d, None).unwrap().clamp, Clamp::Freeze);
        // Release after 60 s below 0.05: the ceiling is stage 1's replicas (8 → 10 of 14).
        w.backoff(0.03);
        w.step(15);
        w.step(30);
        let d = w.step(30);
        let plan = clamp_for(&eff, &d, None).unwrap();
        assert_eq!(plan.clamp, Clamp::Ceiling(10), "{}", d.reason);
        assert!(plan.why.contains("ramp stage 1/4"), "{}", plan.why);
    }

    #[test]
    fn held_with_allow_scale_in_stops_scale_out_only() {
        let mut w = guard_world();
        w.eff.scaling.hold.allow_scale_in = true;
        into_hold(&mut w);
        let d = w.peek();
        assert_eq!(d.regime, Regime::DependencyFailing);
        let plan = clamp_for(&w.eff, &d, None).unwrap();
        assert_eq!(plan.clamp, Clamp::Hold);
        assert!(plan.why.contains("allowScaleIn"), "{}", plan.why);
    }

    #[test]
    fn a_pending_hold_freezes_as_active_mode_defers_both_ways() {
        for queue in [Queue::Backlog, Queue::Idle] {
            let mut w = guard_world();
            w.queue(queue).backoff(0.31);
            let d = w.step(0);
            assert_ne!(d.regime, Regime::DependencyFailing, "{}", d.reason);
            assert_eq!(d.deferral, Some(Deferral::HoldPending), "{}", d.reason);
            let plan = clamp_for(&w.eff, &d, None).unwrap();
            // Also with an idle queue: the guarded autoscaler sizes from its own metrics.
            assert_eq!(plan.clamp, Clamp::Freeze, "{queue:?}: {}", plan.why);
            assert!(plan.why.contains("hold pending"), "{}", plan.why);
            // A manual hold on top does not loosen it.
            let manual = clamp_for(&w.eff, &d, Some("2030-01-01T00:00:00Z")).unwrap();
            assert_eq!(manual.clamp, Clamp::Freeze);
            assert!(manual.why.contains("manual hold"), "{}", manual.why);
            w.eff.scaling.hold.allow_scale_in = true;
            assert_eq!(clamp_for(&w.eff, &d, None).unwrap().clamp, Clamp::Hold);
        }
        // The backoff falls back under the threshold before hold.for: free again.
        let mut w = guard_world();
        w.queue(Queue::Backlog).backoff(0.31);
        w.step(0);
        w.backoff(0.0);
        let d = w.step(15);
        assert_eq!(d.deferral, None);
        assert_eq!(clamp_for(&w.eff, &d, None).unwrap().clamp, Clamp::Free);
    }

    #[test]
    fn a_failure_rate_above_the_set_point_stops_scale_out_only() {
        for queue in [Queue::Backlog, Queue::Idle] {
            let mut w = guard_world();
            w.queue(queue);
            w.step(0);
            let set_point = w.eff.worker.set_point;
            let d = with_failure_rate(&w, (set_point * 2.0).min(1.0));
            assert_eq!(d.deferral, Some(Deferral::FailureRate), "{}", d.reason);
            let plan = clamp_for(&w.eff, &d, None).unwrap();
            assert_eq!(plan.clamp, Clamp::Hold, "{queue:?}: {}", plan.why);
            assert!(plan.why.contains("failure rate"), "{}", plan.why);
            // At the set point: nothing deferred.
            let d = with_failure_rate(&w, set_point);
            assert_eq!(d.deferral, None, "{}", d.reason);
            assert_eq!(clamp_for(&w.eff, &d, None).unwrap().clamp, Clamp::Free);
        }
    }

    #[test]
    fn dry_run_restores_and_suspension_leaves_alone() {
        let mut w = guard_world();
        w.eff.dry_run = true;
        w.eff.dry_run_by = Some("policy fleet".into());
        into_hold(&mut w);
        let d = w.peek();
        let plan = clamp_for(&w.eff, &d, None).unwrap();
        assert_eq!(plan.clamp, Clamp::Free);
        assert!(plan.why.contains("DryRun (policy fleet)"), "{}", plan.why);
        let mut w = guard_world();
        w.eff.suspend = true;
        let d = w.step(0);
        assert_eq!(clamp_for(&w.eff, &d, None), None);
    }
}
