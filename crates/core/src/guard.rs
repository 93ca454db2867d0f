//! Guard mode's clamp: what the guarded autoscaler (an HPA or a KEDA ScaledObject) should look
//! like after a decision. Pure: the operator reads and patches the autoscaler (its `act::guard`
//! module maps a [`Clamp`] onto the autoscaler's fields and records the original values).
//!
//! | decision | clamp |
//! |---|---|
//! | held (DependencyFailing, `ScaleOutHeld`, manual hold) | [`Clamp::Hold`]: no scale-out |
//! | ramp stage k | [`Clamp::Ceiling`]: the stage's replicas ([`stage_target`]) |
//! | anything else, DryRun | [`Clamp::Free`]: the original settings |
//! | suspended | none: the autoscaler is left as it is |

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::Regime;

use crate::decide::{Decision, stage_target};
use crate::resolve::Effective;

/// What the guarded autoscaler should look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clamp {
    /// Its original settings.
    Free,
    /// No scale-out at all.
    Hold,
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
/// (suspended). Held (the `ScaleOutHeld` condition, which also covers a hold kept through
/// missing metrics, or a manual hold) disables scale-out; a ramp in progress allows the
/// current stage's replicas (never fewer than the current replicas); DryRun and everything
/// else restore the original settings.
pub fn clamp_for(
    effective: &Effective,
    decision: &Decision,
    manual_hold: Option<&str>,
) -> Option<ClampPlan> {
    if decision.regime == Regime::Suspended {
        return None;
    }
    let held = decision
        .status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == cond::SCALE_OUT_HELD && c.status == "True");
    let ramp = decision.status.ramp.as_ref().filter(|_| {
        matches!(
            decision.regime,
            Regime::Recovering | Regime::MetricsUnavailable
        )
    });
    let (clamp, why) = if held {
        (
            Clamp::Hold,
            "scale-out held while the dependency fails".to_owned(),
        )
    } else if let Some(until) = manual_hold {
        (Clamp::Hold, format!("manual hold until {until}"))
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

    use backpressure_api::v1alpha1::Mode;

    use super::{Clamp, clamp_for};
    use crate::decide::fixtures::{Queue, World, effective};

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
            "a manual hold clamps"
        );
        into_hold(&mut w);
        let d = w.peek();
        let plan = clamp_for(&eff, &d, None).unwrap();
        assert_eq!(plan.clamp, Clamp::Hold, "{}", d.reason);
        // Metrics gone while held: still held.
        w.backoff = None;
        let d = w.step(15);
        assert_eq!(clamp_for(&eff, &d, None).unwrap().clamp, Clamp::Hold);
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
