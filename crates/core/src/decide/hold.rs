//! DependencyFailing, the hold: entering it, staying in it (no scale-out; scale-in only with
//! `hold.allowScaleIn`), and the manual hold (`kubectl wbp hold`) laid over any regime. The
//! release out of the hold is in [`super::ramp`].

use std::fmt::Write as _;
use std::time::Duration;

use backpressure_api::v1alpha1::{Action, Regime};

use super::decider::{Decider, Outcome};
use super::sizing::Sizing;
use super::time::{human, truncate};

impl Decider<'_> {
    /// A manual hold (`kubectl wbp hold`) withholds any scale-out until it expires; the rest of
    /// the decision (regime, recommendation, scale-in) stands.
    pub(super) fn manual_hold(&mut self, mut out: Outcome) -> Outcome {
        let Some(until) = self.eff.manual_hold_until.filter(|u| *u > self.now) else {
            return out;
        };
        self.due(truncate(until));
        if out.desired > self.current && !self.eff.suspend {
            out.reason = format!(
                "manual hold until {} (kubectl wbp hold): scale-out {} → {} withheld; {}",
                truncate(until),
                self.current,
                out.desired,
                out.reason
            );
            out.desired = self.current;
            out.action = Action::HoldScaleOut;
        }
        out
    }

    /// Enters the hold: fleet backoff above `hold.backoffAbove` for `hold.for`. The replicas stay
    /// where they are; a brake in force is named in the reason.
    pub(super) fn start_hold(&mut self, b: f64, above_for: Duration, sizing: &Sizing) -> Outcome {
        let s = &self.eff.scaling;
        let c = self.current;
        let mut out = self.outcome(Regime::DependencyFailing, c, sizing.replicas);
        out.held = true;
        out.action = Action::HoldScaleOut;
        out.reason = format!(
            "fleet backoff {b:.2} > {:.2} for {}: holding scale-out at {c} replicas (a \
             backlog-only autoscaler would pick {}: {})",
            s.hold.backoff_above,
            human(above_for),
            sizing.replicas,
            sizing.basis
        );
        if let Some(brake) = &self.eff.brake {
            let _ = write!(out.reason, "; {brake}");
        }
        out
    }

    /// Stays in the hold until the release is due: no scale-out; scale-in only with
    /// `hold.allowScaleIn` (stabilization and the step limit apply).
    pub(super) fn stay_held(&mut self, b: f64, sizing: &Sizing, stabilized: i32) -> Outcome {
        let s = &self.eff.scaling;
        let c = self.current;
        let mut out = self.outcome(Regime::DependencyFailing, c, sizing.replicas);
        out.held = true;
        out.ramp = self.prev_ramp();
        out.reason = format!(
            "holding at {c} replicas: fleet backoff {b:.2}, release after {} below {:.2} (a \
             backlog-only autoscaler would pick {})",
            human(s.release.for_),
            s.release.backoff_below,
            sizing.replicas
        );
        if s.hold.allow_scale_in && stabilized < c {
            let floor = self.down_floor();
            out.desired = stabilized.max(floor).min(c);
            if out.desired < c {
                out.action = Action::ScaleIn;
                out.reason = format!(
                    "held, scale-in allowed: highest recommendation in the last {} is \
                     {stabilized}: scaling in {c} → {}",
                    human(s.scale_down.stabilization),
                    out.desired
                );
            }
        }
        out
    }
}
