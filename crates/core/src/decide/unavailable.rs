//! The regimes that keep what was: MetricsUnavailable (`onMetricsUnavailable` applies; a hold
//! and a ramp are kept and resume when metrics return) and Suspended (nothing changes).

use std::fmt::Write as _;

use backpressure_api::v1alpha1::{Action, Regime};

use super::decider::{Decider, Outcome};
use crate::resolve::Fallback;

impl Decider<'_> {
    /// `spec.suspend`: nothing changes; a hold and a ramp are carried as they were.
    pub(super) fn suspended(&mut self) -> Outcome {
        self.tracking.below_release_since = None;
        let c = self.current;
        let mut out = self.outcome(Regime::Suspended, c, self.prev_recommended().unwrap_or(c));
        out.reason = "spec.suspend is true: the target and its pods are left as they are".into();
        out.held = self.held_prev;
        out.ramp = self.prev_ramp();
        out
    }

    /// The fleet backoff or the sizing is unknown (`why`): `onMetricsUnavailable` applies within
    /// the step limits and the bounds, never down to zero; a hold and a ramp are kept.
    pub(super) fn unavailable(&mut self, why: String) -> Outcome {
        self.tracking.below_release_since = None;
        let c = self.current;
        let (target, what) = match self.eff.scaling.on_metrics_unavailable {
            Fallback::Hold => (c, format!("fallback Hold keeps {c} replicas")),
            Fallback::Static(n) => (n, format!("fallback Static sets {n} replicas")),
            Fallback::IfHigher(n) => (
                c.max(n),
                format!("fallback IfHigher raises to at least {n} replicas"),
            ),
        };
        let target = self.clamp(target);
        let mut desired = if target > c {
            target.min(self.up_cap())
        } else if target < c {
            target.max(self.down_floor())
        } else {
            c
        };
        if desired < 1 && c > 0 {
            // Never scale to zero on missing data.
            desired = c;
        }
        let entering = self.prev.and_then(|p| p.regime) != Some(Regime::MetricsUnavailable);
        let mut out = self.outcome(
            Regime::MetricsUnavailable,
            desired,
            self.prev_recommended().unwrap_or(desired),
        );
        out.action = if entering || desired != c {
            Action::Fallback
        } else {
            Action::None
        };
        out.reason = format!("metrics unavailable ({why}): {what}");
        if desired != c {
            let _ = write!(out.reason, ", {c} → {desired}");
        }
        out.held = self.held_prev;
        out.ramp = self.prev_ramp();
        out.metrics = Err(why);
        out
    }
}
