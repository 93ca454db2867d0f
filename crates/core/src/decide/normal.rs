//! Healthy and Backlogged: HPA-like sizing from the queue with the step limits and the
//! scale-down stabilization window (see [`super::sizing`] for the sizing itself). Scale-out is
//! deferred while the fleet backoff is above `hold.backoffAbove` (not yet for `hold.for`) or the
//! dependency failure rate is above the workers' effective set point (the set point on top of
//! the fleet's load-independent failure floor, [`super::FleetMetrics::effective_set_point`]).
//! An early scale-out (the rates ask for pods before the queue age passes its target) also
//! waits while the failure rate is unknown: it is the signal that tells an outage's first
//! seconds from producers outpacing the fleet. Scale-out on the age itself does not wait.

use std::fmt::Write as _;

use backpressure_api::v1alpha1::{Action, Regime};

use super::Deferral;
use super::decider::{Decider, Outcome};
use super::sizing::Sizing;
use super::time::human;

impl Decider<'_> {
    /// Healthy or Backlogged: size from the queue with step limits and stabilization.
    pub(super) fn normal(&mut self, b: f64, sizing: &Sizing, stabilized: i32) -> Outcome {
        let s = &self.eff.scaling;
        let c = self.current;
        let rec = sizing.replicas;
        let regime = if sizing.backlogged {
            Regime::Backlogged
        } else {
            Regime::Healthy
        };
        let mut out = self.outcome(regime, c, rec);
        // A backlog is only worth more pods while the dependency keeps up: with dependency
        // failures above the set point the backlog is (or is about to be) the outage's, even
        // before the workers' backoff shows it (docs/design.md).
        // The failures the workers found to be load-independent (their failure floor) do not
        // count: more pods do not raise them, and the backlog they cause needs more pods.
        let set_point = self.fleet.effective_set_point(self.eff.worker.set_point);
        let failing = self.fleet.failure_rate.filter(|f| *f > set_point);
        let pending = self.hold_evidence(b, sizing);
        out.deferral = if pending {
            Some(Deferral::HoldPending)
        } else if failing.is_some() {
            Some(Deferral::FailureRate)
        } else {
            None
        };
        if rec > c {
            if pending {
                out.reason = format!(
                    "{}; scale-out to {rec} deferred: fleet backoff {b:.2} > hold threshold \
                     {:.2} (hold after {})",
                    sizing.basis,
                    s.hold.backoff_above,
                    human(s.hold.for_)
                );
            } else if let Some(f) = failing {
                out.reason = format!(
                    "{}; scale-out to {rec} deferred: dependency failure rate {:.1}% > set point \
                     {:.1}%",
                    sizing.basis,
                    f * 100.0,
                    set_point * 100.0
                );
            } else if sizing.early && self.fleet.failure_rate.is_none() {
                // An early scale-out is a prediction from the rates; the failure rate is what
                // tells an outage's first seconds (completions falling, a backlog starting)
                // from producers outpacing the fleet. Without it, wait for the age (rule 1).
                out.reason = format!(
                    "{}; early scale-out to {rec} deferred: dependency failure rate unknown \
                     (scaling out once the queue age passes its target)",
                    sizing.basis
                );
            } else {
                let cap = self.up_cap();
                out.desired = rec.min(cap).max(c);
                if out.desired > c {
                    out.action = Action::ScaleOut;
                    out.reason = format!(
                        "{}, fleet backoff {b:.2}: scaling out {c} → {}",
                        sizing.basis, out.desired
                    );
                    if out.desired < rec {
                        let up = &self.eff.scaling.scale_up;
                        let _ = write!(
                            out.reason,
                            " (step limit: +max({} pods, {}%) per {})",
                            up.max_pods,
                            up.max_percent,
                            human(up.period)
                        );
                    }
                } else {
                    out.reason = format!(
                        "{}; scale-out to {rec} waits for the scale-up period",
                        sizing.basis
                    );
                }
            }
        } else if stabilized < c && pending && !s.hold.allow_scale_in {
            out.reason = format!(
                "{}; scale-in to {stabilized} deferred: fleet backoff {b:.2} > hold threshold {:.2}",
                sizing.basis, s.hold.backoff_above
            );
        } else if stabilized < c {
            let floor = self.down_floor();
            out.desired = stabilized.max(floor).min(c);
            let window = human(s.scale_down.stabilization);
            if out.desired < c {
                out.action = Action::ScaleIn;
                out.reason = format!(
                    "{}; highest recommendation in the last {window} is {stabilized}: scaling \
                     in {c} → {}",
                    sizing.basis, out.desired
                );
                if out.desired > stabilized {
                    let _ = write!(
                        out.reason,
                        " (step limit: -{}% per {})",
                        s.scale_down.max_percent,
                        human(s.scale_down.period)
                    );
                }
            } else {
                out.reason = format!(
                    "{}; scale-in to {stabilized} waits for the scale-down period",
                    sizing.basis
                );
            }
        } else if rec < c {
            out.reason = format!(
                "{}; scale-in held by stabilization: highest recommendation in the last {} \
                 is {stabilized}",
                sizing.basis,
                human(s.scale_down.stabilization)
            );
        } else {
            out.reason = format!("{}: {c} replicas fit", sizing.basis);
        }
        out
    }
}
