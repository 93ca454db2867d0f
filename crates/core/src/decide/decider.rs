//! The state of one decision ([`Decider`]) and what every regime shares: the previous status,
//! the step caps of `scaleUp` and `scaleDown`, the bounds, and the deadlines for the requeue.
//! Each regime is a method on [`Decider`] in its own file; they share these caps and fall
//! through to each other (a release or a completed ramp ends in normal sizing).

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{
    Action, RampStatus, Regime, TrackingStatus, WorkerBackpressureStatus,
};
use k8s_openapi::jiff::Timestamp;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::time::{elapsed, plus};
use super::{DecisionEvent, Deferral, FleetMetrics, Observation, conditions, sizing};
use crate::resolve::Effective;

/// What one branch of the decision produced, before the status is assembled.
#[derive(Debug)]
pub(super) struct Outcome {
    /// The regime the branch chose.
    pub(super) regime: Regime,
    /// Replicas wanted, before the hard bounds are applied in `finish`.
    pub(super) desired: i32,
    /// What a backlog-only autoscaler would pick.
    pub(super) recommended: i32,
    /// What was decided ([`Action::None`] when nothing changes).
    pub(super) action: Action,
    /// Why, in words and numbers.
    pub(super) reason: String,
    /// Scale-out is held (DependencyFailing, or a hold kept through a gap or a suspension).
    pub(super) held: bool,
    /// The ramp in progress, or the last aborted one while held.
    pub(super) ramp: Option<RampStatus>,
    /// `Ok(note)` when metrics are available (note: a partial failure), `Err(why)` otherwise.
    pub(super) metrics: Result<Option<String>, String>,
    /// Events of the branch itself (`HoldReleased`); `finish` adds the rest.
    pub(super) events: Vec<DecisionEvent>,
    /// Scale-out deferred short of a hold (Healthy and Backlogged only).
    pub(super) deferral: Option<Deferral>,
}

/// One decision in progress: the inputs, the tracking block being updated and the deadlines
/// found on the way. (Not the controller's `Context`: this lives for one call of
/// [`decide`](super::decide).)
pub(super) struct Decider<'a> {
    /// The effective configuration.
    pub(super) eff: &'a Effective,
    /// The previous status: the only memory.
    pub(super) prev: Option<&'a WorkerBackpressureStatus>,
    /// The observation.
    pub(super) obs: &'a Observation,
    /// The observation's time, truncated to whole seconds.
    pub(super) now: Timestamp,
    /// The observed fleet metrics, sanitized; the failure floor is the higher of the workers'
    /// and the fleet's own (`status.tracking.fleetFloor`, see `floor.rs`) once
    /// [`Decider::learn_floor`] has run.
    pub(super) fleet: FleetMetrics,
    /// The target's replicas (never negative).
    pub(super) current: i32,
    /// The previous status was held (see [`Decider::new`]).
    pub(super) held_prev: bool,
    /// `status.tracking`, carried over from the previous status and updated on the way.
    pub(super) tracking: TrackingStatus,
    /// Deadlines at which something becomes due (for the requeue).
    pub(super) deadlines: Vec<Timestamp>,
    /// The fleet backoff the decision used, once known.
    pub(super) backoff: Option<f64>,
}

impl<'a> Decider<'a> {
    /// Starts a decision. The previous status was held when its regime is DependencyFailing,
    /// or, through MetricsUnavailable and Suspended, when its `ScaleOutHeld` condition is true.
    pub(super) fn new(
        eff: &'a Effective,
        prev: Option<&'a WorkerBackpressureStatus>,
        obs: &'a Observation,
        now: Timestamp,
    ) -> Self {
        let held_prev = match prev.and_then(|p| p.regime) {
            Some(Regime::DependencyFailing) => true,
            Some(Regime::Healthy | Regime::Backlogged | Regime::Recovering) => false,
            Some(Regime::MetricsUnavailable | Regime::Suspended) | None => prev
                .and_then(|p| p.conditions.as_deref())
                .is_some_and(|c| conditions::is_true(c, cond::SCALE_OUT_HELD)),
        };
        Decider {
            eff,
            prev,
            obs,
            now,
            fleet: obs.fleet.sanitized(),
            current: obs.current_replicas.max(0),
            held_prev,
            tracking: prev.and_then(|p| p.tracking.clone()).unwrap_or_default(),
            deadlines: Vec::new(),
            backoff: None,
        }
    }

    /// The pods the fleet completion rate stands for: the ready pods, counted for the share of
    /// the completion rate's window (`metrics.rateWindow`) they were ready when the fleet has
    /// just started from no ready pod.
    ///
    /// `μ` is a rate over the last window `w`. Right after the first pods of a fleet become
    /// ready (a cold start, an activation from zero, every pod restarted) it still covers
    /// mostly time when no pod ran: `p = μ / r` understates what a pod completes, `need / p`
    /// overstates the pods needed, and the lab's fleet on a real node was scaled out 2 → 6 on
    /// its own start while a small backlog waited. So until `w` has passed since such a rise
    /// the pods counted are `r · elapsed / w`; a further rise inside that window starts from
    /// the count of that moment (`r₀ + (r − r₀) · elapsed / w`, never above `r`). The HPA is as
    /// careful with pods that have just started (its CPU initialization period).
    ///
    /// A rise from pods already ready (a scale-out step) is not corrected: the older pods'
    /// completions dominate `μ`, and the new pods' own slow start (their permits ramp up)
    /// makes `μ / r` about what the fleet completes now. Correcting there too (measured in the
    /// simulator) let the fleet of scenario 7 fall behind after each step, then add pods in
    /// larger jumps whose backoff held it: 7.5 → 14 min of latching hold per hour and 1.11x →
    /// 1.34x dead letters per failed call. Falls, and no rise, count the ready pods as they
    /// are.
    ///
    /// The rise is found against `status.fleet.readyPods`; its time and the count before it
    /// are kept in `status.tracking` until the window has passed.
    pub(super) fn measured_pods(&mut self, window: Duration) -> f64 {
        let ready = self.obs.ready_pods.max(0);
        let r = f64::from(ready);
        let prev_ready = self
            .prev
            .and_then(|p| p.fleet.as_ref())
            .and_then(|f| f.ready_pods)
            .map(|p| p.max(0));
        // The pods counted now with `to` ready since the last rise, if its window is still open.
        let (now, since, before) = (
            self.now,
            self.tracking.ready_rose_at.clone(),
            self.tracking.pods_before_rise,
        );
        let counted = |to: f64| match (&since, before) {
            (Some(since), Some(before)) if elapsed(since.0, now) < window => {
                let share = elapsed(since.0, now).as_secs_f64() / window.as_secs_f64();
                Some((before + (to - before) * share).clamp(0.0, to))
            }
            _ => None,
        };
        if let Some(p) = prev_ready.filter(|p| ready > *p) {
            // A rise from no ready pod, or inside the window of one: the new pods count from
            // now, on top of what was counted a moment ago.
            let open = counted(f64::from(p));
            if p == 0 || open.is_some() {
                let before = open.unwrap_or(0.0);
                self.tracking.ready_rose_at = Some(Time(now));
                self.tracking.pods_before_rise = Some(round_to_hundredths(before));
                return before;
            }
        }
        counted(r).unwrap_or_else(|| {
            self.tracking.ready_rose_at = None;
            self.tracking.pods_before_rise = None;
            r
        })
    }

    /// The ramp of the previous status (in progress, or the last aborted one).
    pub(super) fn prev_ramp(&self) -> Option<RampStatus> {
        self.prev.and_then(|p| p.ramp.clone())
    }

    /// `status.replicas.desired` of the previous status.
    pub(super) fn prev_desired(&self) -> Option<i32> {
        self.prev
            .and_then(|p| p.replicas.as_ref())
            .map(|r| r.desired)
    }

    /// `status.replicas.recommended` of the previous status.
    pub(super) fn prev_recommended(&self) -> Option<i32> {
        self.prev
            .and_then(|p| p.replicas.as_ref())
            .map(|r| r.recommended)
    }

    /// `n` within `[minReplicas, maxReplicas]`.
    pub(super) fn clamp(&self, n: i32) -> i32 {
        n.clamp(self.eff.scaling.min_replicas, self.eff.scaling.max_replicas)
    }

    /// Something becomes due at `at`: the requeue will not be later.
    pub(super) fn due(&mut self, at: Timestamp) {
        self.deadlines.push(at);
    }

    /// The most replicas a scale-up may reach now: one step from current once the period is
    /// over; within the period, what was already granted (the previous desired).
    pub(super) fn up_cap(&mut self) -> i32 {
        let up = &self.eff.scaling.scale_up;
        let last = self.tracking.last_scale_up.clone();
        if sizing::period_over(last.as_ref(), up.period, self.now) {
            sizing::scale_up_limit(self.current, up)
        } else {
            if let Some(t) = last {
                self.due(plus(t.0, up.period));
            }
            self.current
                .max(self.prev_desired().unwrap_or(self.current))
        }
    }

    /// The fewest replicas a scale-down may reach now (see [`Decider::up_cap`]).
    pub(super) fn down_floor(&mut self) -> i32 {
        let down = &self.eff.scaling.scale_down;
        let last = self.tracking.last_scale_down.clone();
        if sizing::period_over(last.as_ref(), down.period, self.now) {
            sizing::scale_down_limit(self.current, down)
        } else {
            if let Some(t) = last {
                self.due(plus(t.0, down.period));
            }
            self.current
                .min(self.prev_desired().unwrap_or(self.current))
        }
    }

    /// An outcome of `regime` with no action and no reason yet; metrics as observed.
    pub(super) fn outcome(&self, regime: Regime, desired: i32, recommended: i32) -> Outcome {
        Outcome {
            regime,
            desired,
            recommended,
            action: Action::None,
            reason: String::new(),
            held: false,
            ramp: None,
            metrics: Ok(self.obs.metrics_error.clone()),
            events: Vec::new(),
            deferral: None,
        }
    }
}

/// `x` rounded to two decimals (what `status.tracking` keeps of a pod count).
fn round_to_hundredths(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
