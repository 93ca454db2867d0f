//! Recovering: the release out of a hold into a staged ramp, each stage of the ramp (reach the
//! stage's replicas, dwell, go on or end early), and the abort back to hold.

use std::fmt::Write as _;
use std::time::Duration;

use backpressure_api::v1alpha1::{Action, Mode, RampStatus, Regime};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::decider::{Decider, Outcome};
use super::sizing::Sizing;
use super::time::{human, plus};
use super::{DecisionEvent, EventType};
use crate::resolve::Effective;

impl Decider<'_> {
    /// Ends the hold after `release.for` below `release.backoffBelow`: a ramp at stage 1 toward the
    /// backlog-sized target, or normal sizing when that target needs no ramp.
    pub(super) fn release(
        &mut self,
        b: f64,
        below_for: Duration,
        sizing: &Sizing,
        stabilized: i32,
    ) -> Outcome {
        let s = &self.eff.scaling;
        let c = self.current;
        let released = if b < s.release.backoff_below {
            format!(
                "fleet backoff {b:.2} < {:.2} for {}: hold released",
                s.release.backoff_below,
                human(below_for)
            )
        } else if b <= s.hold.backoff_above {
            format!(
                "{} and fleet backoff {b:.2} ≤ {:.2} for {}: hold released",
                self.failure_rate_text(),
                s.hold.backoff_above,
                human(below_for)
            )
        } else {
            format!(
                "{} for {}: hold released (the workers still throttle for failures that do \
                 not come from load: fleet backoff {b:.2})",
                self.failure_rate_text(),
                human(below_for)
            )
        };
        let event = DecisionEvent {
            type_: EventType::Normal,
            reason: "HoldReleased",
            action: "Release",
            message: released.clone(),
        };
        let aborts = self.prev_ramp().and_then(|r| r.aborts);
        let to = sizing.replicas;
        let mut out = if to > c {
            let stages = s.ramp_up.stages.clone();
            let first = stages.first().copied().unwrap_or(100);
            let target = self.clamp(stage_replicas(c, to, first));
            let desired = target.min(self.up_cap()).max(c);
            let ramp = RampStatus {
                stage: 1,
                of: count(&stages),
                from: c,
                to,
                stage_started_at: Some(Time(self.now)),
                next_stage_at: Some(Time(plus(self.now, s.ramp_up.dwell))),
                aborts,
            };
            let mut out = self.outcome(Regime::Recovering, desired, to);
            out.action = Action::RampStage;
            out.reason = format!(
                "{released}; ramp stage 1/{} ({first}%): {c} → {target} toward {to}",
                ramp.of
            );
            if desired < target {
                let _ = write!(out.reason, " (step limit: {desired} now)");
            }
            out.ramp = Some(ramp);
            out
        } else {
            let mut out = self.normal(b, sizing, stabilized);
            out.reason = format!(
                "{released}; backlog-sized target {to} needs no ramp; {}",
                out.reason
            );
            out
        };
        out.events.push(event);
        out
    }

    /// Aborts a ramp back to the hold at the current replicas (backoff above `rampUp.abortAbove`
    /// with the failure rate above the effective set point, or the evidence for a hold for
    /// `hold.for`). The ramp stays in status with its abort
    /// count, and a new release needs a new period below the release threshold.
    pub(super) fn abort(
        &mut self,
        mut ramp: RampStatus,
        b: f64,
        above_for: Option<Duration>,
        sizing: &Sizing,
    ) -> Outcome {
        let s = &self.eff.scaling;
        let c = self.current;
        // A fresh release needs a fresh period below the release threshold.
        self.tracking.below_release_since = None;
        ramp.aborts = Some(ramp.aborts.unwrap_or(0).saturating_add(1));
        ramp.next_stage_at = None;
        let mut out = self.outcome(Regime::DependencyFailing, c, sizing.replicas);
        out.held = true;
        out.action = Action::AbortRamp;
        let why = if b > s.ramp_up.abort_above {
            format!(
                "fleet backoff {b:.2} > abort threshold {:.2}, {}",
                s.ramp_up.abort_above,
                self.failure_rate_text()
            )
        } else {
            format!(
                "fleet backoff {b:.2} > {:.2} for {}, {}",
                s.hold.backoff_above,
                human(above_for.unwrap_or_default()),
                self.failure_rate_text()
            )
        };
        out.reason = format!(
            "{why} at ramp stage {}/{}: back to hold at {c} replicas (abort {} since the last \
             full recovery)",
            ramp.stage,
            ramp.of,
            ramp.aborts.unwrap_or(1)
        );
        out.ramp = Some(ramp);
        out
    }

    /// One step of a ramp: within a stage, reach its replicas (step limits apply) and dwell; once
    /// both are done, go on to the next stage, or end the ramp (normal sizing) after the last
    /// stage or when the stage already covers the backlog-sized target.
    pub(super) fn ramp_step(
        &mut self,
        ramp: RampStatus,
        b: f64,
        sizing: &Sizing,
        stabilized: i32,
    ) -> Outcome {
        let s = &self.eff.scaling;
        let c = self.current;
        let stages = s.ramp_up.stages.clone();
        let n = count(&stages);
        let stage = ramp.stage.clamp(1, n.max(1));
        let pct = stage_percent(&stages, stage);
        let target = self.clamp(stage_replicas(ramp.from, ramp.to, pct));
        // In DryRun nothing scales, and in Guard mode the guarded autoscaler decides whether to
        // use the stage's ceiling: the dwell alone advances the ramp.
        let reached = c >= target || self.eff.dry_run || self.eff.mode == Mode::Guard;
        let next_at = ramp.next_stage_at.as_ref().map(|t| t.0);
        let dwelt = next_at.is_none_or(|t| self.now >= t);

        if dwelt && reached {
            if stage >= n {
                let mut out = self.normal(b, sizing, stabilized);
                out.reason = format!(
                    "ramp complete at {c} replicas after stage {stage}/{n}; {}",
                    out.reason
                );
                return out;
            }
            let rec = sizing.replicas;
            if rec <= target {
                let mut out = self.normal(b, sizing, stabilized);
                out.reason = format!(
                    "ramp complete at stage {stage}/{n}: backlog-sized target {rec} reached; {}",
                    out.reason
                );
                return out;
            }
            let to = ramp.to.min(rec).max(target);
            let next = stage + 1;
            let next_pct = stage_percent(&stages, next);
            let next_target = self.clamp(stage_replicas(ramp.from, to, next_pct).max(target));
            let desired = next_target.min(self.up_cap()).max(c);
            let mut out = self.outcome(Regime::Recovering, desired, rec);
            out.action = Action::RampStage;
            let health = if b > s.ramp_up.abort_above {
                format!(
                    "fleet backoff {b:.2} > abort threshold {:.2} but {}",
                    s.ramp_up.abort_above,
                    self.failure_rate_text()
                )
            } else {
                format!(
                    "fleet backoff {b:.2} ≤ abort threshold {:.2}",
                    s.ramp_up.abort_above
                )
            };
            out.reason = format!(
                "{health} after {} at stage {stage}/{n}: ramp stage {next}/{n} ({next_pct}%): \
                 {c} → {next_target} toward {to}",
                human(s.ramp_up.dwell)
            );
            if desired < next_target {
                let _ = write!(out.reason, " (step limit: {desired} now)");
            }
            out.ramp = Some(RampStatus {
                stage: next,
                of: n,
                from: ramp.from,
                to,
                stage_started_at: Some(Time(self.now)),
                next_stage_at: Some(Time(plus(self.now, s.ramp_up.dwell))),
                aborts: ramp.aborts,
            });
            if let Some(t) = out.ramp.as_ref().and_then(|r| r.next_stage_at.clone()) {
                self.due(t.0);
            }
            return out;
        }

        // Within the stage: reach its replicas (step limits apply), then dwell.
        if let Some(t) = next_at.filter(|t| *t > self.now) {
            self.due(t);
        }
        let mut desired = c;
        let mut out_action = Action::None;
        let mut reason = format!(
            "ramp stage {stage}/{n} ({pct}%): {target} replicas toward {}, fleet backoff {b:.2}",
            ramp.to
        );
        if c < target {
            desired = target.min(self.up_cap()).max(c);
            if desired > c {
                out_action = Action::ScaleOut;
                reason = format!(
                    "ramp stage {stage}/{n} ({pct}%): scaling out {c} → {desired} toward the \
                     stage's {target} replicas"
                );
            }
        }
        let mut out = self.outcome(Regime::Recovering, desired, sizing.replicas);
        out.action = out_action;
        out.reason = reason;
        out.ramp = Some(RampStatus {
            stage,
            of: n,
            ..ramp
        });
        out
    }
}

/// The replicas the current stage of `ramp` aims at (within `[minReplicas, maxReplicas]`): the
/// ceiling Guard mode gives the guarded autoscaler during a ramp.
pub fn stage_target(effective: &Effective, ramp: &RampStatus) -> i32 {
    let stages = &effective.scaling.ramp_up.stages;
    let pct = stage_percent(stages, ramp.stage.clamp(1, count(stages).max(1)));
    stage_replicas(ramp.from, ramp.to, pct).clamp(
        effective.scaling.min_replicas,
        effective.scaling.max_replicas,
    )
}

/// Replicas at `pct` percent of the way from `from` to `to`, rounded up.
fn stage_replicas(from: i32, to: i32, pct: i32) -> i32 {
    let (from, to) = (i64::from(from), i64::from(to));
    let step = ((to - from).max(0) * i64::from(pct.clamp(0, 100)) + 99) / 100;
    i32::try_from(from + step).unwrap_or(i32::MAX)
}

fn stage_percent(stages: &[i32], stage: i32) -> i32 {
    let i = usize::try_from(stage.max(1) - 1).unwrap_or(0);
    stages.get(i).or(stages.last()).copied().unwrap_or(100)
}

fn count(stages: &[i32]) -> i32 {
    i32::try_from(stages.len()).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_replicas_round_up() {
        assert_eq!(stage_replicas(8, 14, 25), 10);
        assert_eq!(stage_replicas(8, 14, 50), 11);
        assert_eq!(stage_replicas(8, 14, 100), 14);
        assert_eq!(stage_replicas(8, 8, 50), 8);
    }
}
