//! The pure decision core: from the effective configuration, the previous status and one
//! observation, decide the regime, the replicas and everything the status, the events and the
//! target should show.
//!
//! [`decide`] reads no clock, holds no client and draws no random numbers: `now` comes in the
//! [`Observation`], and the previous [`WorkerBackpressureStatus`] is the only memory. The
//! operator and the simulator call it in a loop, feeding back the returned status; a restarted
//! operator therefore resumes a hold or a ramp exactly where the status says it was.
//!
//! # Regimes and transitions
//!
//! ```text
//!                 backoff > hold.backoffAbove for hold.for
//!   Healthy ⇄ Backlogged ───────────────────────────────────► DependencyFailing (held)
//!        ▲                                                        │      ▲
//!        │ last stage dwelt, or backlog target reached            │      │ backoff > rampUp.abortAbove
//!        │                                                        ▼      │ (or above hold for hold.for)
//!        └──────────────────────────── Recovering (staged ramp) ◄─┘──────┘
//!                      backoff < release.backoffBelow for release.for
//! ```
//!
//! * **Healthy / Backlogged**: HPA-like sizing from the queue ([`sizing`]): `Backlogged` when the
//!   queue needs more than it gets. Scale-out is limited to `max(maxPods, maxPercent%)` per
//!   `scaleUp.period`, scale-in to `scaleDown.maxPercent` per `scaleDown.period` and to the
//!   highest recommendation of the `scaleDown.stabilization` window. While the fleet backoff is
//!   above `hold.backoffAbove` but not yet for `hold.for`, scale-out is deferred (the regime
//!   does not change yet).
//! * **DependencyFailing**: the hold. No scale-out (no scale-in either unless
//!   `hold.allowScaleIn`). `status.replicas.recommended` shows what a backlog-only autoscaler
//!   would pick. Between the two thresholds nothing changes: that is the hysteresis.
//! * **Recovering**: after release, a ramp from the held replicas to the backlog-sized target:
//!   stage `k` aims at `from + ceil((to − from) × stages[k] / 100)` replicas (still subject to
//!   the scale-up step limit), and the next stage starts once the dwell has passed *and* the
//!   stage's replicas were reached (in DryRun, the dwell alone). At a stage boundary the target
//!   is lowered to the current backlog-sized target if that is smaller, and the ramp ends early
//!   when the stage already covers it. Backoff above `rampUp.abortAbove` aborts back to hold at
//!   the current replicas; the aborted ramp stays in status (with its abort count) until the
//!   next ramp starts.
//! * **MetricsUnavailable**: the fleet backoff is unknown, or the queue gives nothing to size
//!   from. `onMetricsUnavailable` applies (`Hold` keeps the current replicas, `Static` sets,
//!   `IfHigher` raises), clamped to `[minReplicas, maxReplicas]`, never to zero; a hold and a
//!   ramp are kept as they were and resume when metrics return. Evidence for a release does not
//!   survive a gap (`belowReleaseSince` is cleared); evidence for a hold does. One exception:
//!   with zero replicas and zero ready pods no worker can export a backoff, so (unless a query
//!   failed) the backoff is taken as 0 and a backlog activates the fleet.
//! * **Suspended**: `spec.suspend`; nothing changes and nothing is written to the target.
//!
//! The held state is `regime == DependencyFailing`; through `MetricsUnavailable` and
//! `Suspended` it is carried by the `ScaleOutHeld` condition.
//!
//! # Status stability
//!
//! Given the same inputs and an unchanged world, [`decide`] returns a status equal to the
//! previous one (so the caller writes nothing; see [`status_changed`]): every time written is
//! truncated to whole seconds, fleet numbers are rounded (backoff and failure rate to 0.01, queue
//! age to 1 s, depth and rates to two significant digits), `fleet.sampledAt` moves only when
//! something else in the status changes, `lastDecision` is replaced only by a different
//! decision or a regime change, and condition transition times move only on a status change.

mod conditions;
#[cfg(any(test, feature = "testing"))]
pub mod fixtures;
#[cfg(test)]
mod proptests;
pub mod sizing;
#[cfg(test)]
mod tests;
mod time;

use std::fmt::Write as _;
use std::time::Duration;

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{
    Action, ConfigStatus, DecisionRecord, FleetStatus, Mode, RampStatus, Regime, ReplicaStatus,
    TrackingStatus, WorkerBackpressureStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::resolve::{Effective, Fallback, ResolveError};
use conditions::Status as CondStatus;
pub use sizing::{Sizing, TOLERANCE};
use time::{elapsed, human, plus, truncate, until};

/// Requeue interval when nothing is due sooner (the HPA's sync period).
pub const BASE_REQUEUE: Duration = Duration::from_secs(15);
/// Shortest requeue interval returned.
pub const MIN_REQUEUE: Duration = Duration::from_secs(1);

/// Fleet metrics as observed. `None` means unknown (missing, NaN or stale): never zero.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetMetrics {
    /// Mean backoff factor of the fleet, in [0, 1].
    pub backoff: Option<f64>,
    /// Dependency failures per attempt, in [0, 1].
    pub failure_rate: Option<f64>,
    /// Age in seconds of the oldest message on its first attempt.
    pub queue_age: Option<f64>,
    /// Messages waiting.
    pub queue_depth: Option<f64>,
    /// Messages arriving per second.
    pub arrival_rate: Option<f64>,
    /// Messages completed per second by the whole fleet.
    pub completion_rate: Option<f64>,
}

impl FleetMetrics {
    /// Non-finite or negative values become unknown; backoff and failure rate are capped at 1.
    pub fn sanitized(&self) -> Self {
        let ok = |v: Option<f64>| v.filter(|x| x.is_finite() && *x >= 0.0);
        let unit = |v: Option<f64>| ok(v).map(|x| x.min(1.0));
        FleetMetrics {
            backoff: unit(self.backoff),
            failure_rate: unit(self.failure_rate),
            queue_age: ok(self.queue_age),
            queue_depth: ok(self.queue_depth),
            arrival_rate: ok(self.arrival_rate),
            completion_rate: ok(self.completion_rate),
        }
    }
}

/// One observation of the world: plain data, including the time.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// When the observation was made. Truncated to whole seconds inside [`decide`].
    pub now: Timestamp,
    /// `metadata.generation` of the WorkerBackpressure.
    pub generation: Option<i64>,
    /// Replicas of the target from its `/scale` subresource (`spec.replicas`).
    pub current_replicas: i32,
    /// Ready pods of the target.
    pub ready_pods: i32,
    /// Fleet metrics.
    pub fleet: FleetMetrics,
    /// Why the metrics query failed, if it did.
    pub metrics_error: Option<String>,
    /// Worker configuration rollout (hash and pods in sync), if it was observed.
    pub config: Option<ConfigStatus>,
}

/// Kubernetes event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Expected behavior.
    Normal,
    /// Something an operator should look at.
    Warning,
}

impl EventType {
    /// `Normal` or `Warning`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// An event to publish on the WorkerBackpressure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionEvent {
    /// Normal or Warning.
    pub type_: EventType,
    /// Machine-readable reason, UpperCamelCase (`ScaledOut`, `DependencyFailing`, ...).
    pub reason: &'static str,
    /// What was done (`events.k8s.io/v1` `action`): an [`Action`] name or `Classify`.
    pub action: &'static str,
    /// The reason in words and numbers.
    pub message: String,
}

/// The outcome of one decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The mode the decision was made for (`Guard` applies `desired_replicas` as a clamp on
    /// the guarded autoscaler instead of writing `/scale`).
    pub mode: Mode,
    /// The regime the fleet is in.
    pub regime: Regime,
    /// Replicas of the target when observed.
    pub current_replicas: i32,
    /// Replicas the operator wants (in DryRun: would set).
    pub desired_replicas: i32,
    /// What a backlog-only autoscaler would pick (no hold, no ramp, no step limits).
    pub recommended_replicas: i32,
    /// What was decided this time ([`Action::None`] when nothing changes).
    pub action: Action,
    /// Why, in words and numbers.
    pub reason: String,
    /// The decision must not be applied to the target.
    pub dry_run: bool,
    /// Events to publish (regime changes, scaling actions, releases, policy overrides).
    pub events: Vec<DecisionEvent>,
    /// When to look again (the caller adds jitter).
    pub requeue_after: Duration,
    /// The new status: replicas, ramp, tracking, fleet snapshot, lastDecision, conditions.
    pub status: WorkerBackpressureStatus,
}

impl Decision {
    /// The replica count to write to the target's `/scale`, if any: `None` in DryRun, in
    /// Guard mode, while suspended, and when nothing changes.
    pub fn scale_to(&self) -> Option<i32> {
        (!self.dry_run
            && self.mode != Mode::Guard
            && self.regime != Regime::Suspended
            && self.desired_replicas != self.current_replicas)
            .then_some(self.desired_replicas)
    }

    /// The ramp in progress (or the last aborted one while held).
    pub fn ramp(&self) -> Option<&RampStatus> {
        self.status.ramp.as_ref()
    }
}

/// Whether `new` differs from `old`, i.e. whether the status must be written.
pub fn status_changed(
    old: Option<&WorkerBackpressureStatus>,
    new: &WorkerBackpressureStatus,
) -> bool {
    old != Some(new)
}

/// Decides. See the module documentation for the rules.
pub fn decide(
    effective: &Effective,
    previous: Option<&WorkerBackpressureStatus>,
    observation: &Observation,
) -> Decision {
    let now = truncate(observation.now);
    let fleet = observation.fleet.sanitized();
    let mut cx = Ctx::new(effective, previous, observation, now);

    let out = if effective.suspend {
        cx.suspended()
    } else {
        let sizing = sizing::size(
            &effective.scaling,
            cx.current,
            observation.ready_pods,
            &fleet,
        );
        // With no pod at all there is no worker to export a backoff: its absence is expected,
        // not missing data, and must not keep a scaled-to-zero fleet from activating.
        let no_pods = cx.current == 0 && observation.ready_pods == 0;
        let backoff = fleet
            .backoff
            .or((no_pods && observation.metrics_error.is_none()).then_some(0.0));
        match (backoff, sizing) {
            (Some(backoff), Some(sizing)) => cx.available(backoff, &sizing),
            (backoff, sizing) => {
                let mut missing = Vec::new();
                if backoff.is_none() {
                    missing.push("fleet backoff");
                }
                if sizing.is_none() {
                    missing.push("queue age or arrival and completion rates");
                }
                let why = match &observation.metrics_error {
                    Some(e) => format!("query failed: {e}"),
                    None => format!("unknown: {}", missing.join(", ")),
                };
                cx.unavailable(why)
            }
        }
    };
    let out = cx.manual_hold(out);
    cx.finish(out, &fleet)
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
        .and_then(|c| conditions::find(c, type_))
        .filter(|c| c.status == value)
        .map_or(Time(truncate(now)), |c| c.last_transition_time.clone());
    let new = k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
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
    list.sort_by_key(|c| conditions::rank(&c.type_));
}

/// Status and events for an object whose configuration does not resolve: `Ready=False` and
/// `Stalled=True` (kstatus: Failed) naming every invalid field; the previous regime, replicas
/// and ramp are kept and nothing is decided. An event is returned only when the message
/// changed.
pub fn invalid_spec(
    previous: Option<&WorkerBackpressureStatus>,
    generation: Option<i64>,
    error: &ResolveError,
    now: Timestamp,
) -> (WorkerBackpressureStatus, Vec<DecisionEvent>) {
    let now = truncate(now);
    let mut status = previous.cloned().unwrap_or_default();
    let prev_conditions = status.conditions.take().unwrap_or_default();
    let message = error.to_string();
    let mut b = conditions::Builder::new(&prev_conditions, now, generation);
    b.set(
        cond::READY,
        CondStatus::False,
        "InvalidSpec",
        message.clone(),
    );
    for t in cond::ALL.iter().skip(1) {
        b.keep(t);
    }
    b.set(
        cond::STALLED,
        CondStatus::True,
        "InvalidSpec",
        message.clone(),
    );
    let new_conditions = b.build();
    let changed =
        conditions::find(&prev_conditions, cond::STALLED).map(|c| &c.message) != Some(&message);
    status.conditions = Some(new_conditions);
    status.observed_generation = generation.or(status.observed_generation);
    let events = if changed {
        vec![DecisionEvent {
            type_: EventType::Warning,
            reason: "InvalidSpec",
            action: "Classify",
            message,
        }]
    } else {
        Vec::new()
    };
    (status, events)
}

/// Status and events for an object whose target cannot be read (missing, no `/scale`, another
/// scope, an unreadable selector): `Ready=False` with `reason` and `message`; the previous
/// regime, replicas and ramp are kept, nothing is decided and nothing is written to any target.
/// Not `Stalled`: the target may appear at any time. An event is returned only when the
/// message changed.
pub fn target_unavailable(
    previous: Option<&WorkerBackpressureStatus>,
    generation: Option<i64>,
    reason: &'static str,
    message: &str,
    now: Timestamp,
) -> (WorkerBackpressureStatus, Vec<DecisionEvent>) {
    let now = truncate(now);
    let mut status = previous.cloned().unwrap_or_default();
    let prev_conditions = status.conditions.take().unwrap_or_default();
    let mut b = conditions::Builder::new(&prev_conditions, now, generation);
    b.set(cond::READY, CondStatus::False, reason, message.to_owned());
    for t in cond::ALL.iter().skip(1) {
        b.keep(t);
    }
    let changed = conditions::find(&prev_conditions, cond::READY)
        .map(|c| (c.reason.as_str(), c.message.as_str()))
        != Some((reason, message));
    status.conditions = Some(b.build());
    status.observed_generation = generation.or(status.observed_generation);
    let events = if changed {
        vec![DecisionEvent {
            type_: EventType::Warning,
            reason,
            action: "Classify",
            message: message.to_owned(),
        }]
    } else {
        Vec::new()
    };
    (status, events)
}

/// What one branch of the decision produced, before the status is assembled.
#[derive(Debug)]
struct Outcome {
    regime: Regime,
    desired: i32,
    recommended: i32,
    action: Action,
    reason: String,
    held: bool,
    ramp: Option<RampStatus>,
    /// `Ok(note)` when metrics are available (note: a partial failure), `Err(why)` otherwise.
    metrics: Result<Option<String>, String>,
    events: Vec<DecisionEvent>,
}

struct Ctx<'a> {
    eff: &'a Effective,
    prev: Option<&'a WorkerBackpressureStatus>,
    obs: &'a Observation,
    now: Timestamp,
    current: i32,
    held_prev: bool,
    tracking: TrackingStatus,
    /// Deadlines at which something becomes due (for the requeue).
    deadlines: Vec<Timestamp>,
    backoff: Option<f64>,
}

impl<'a> Ctx<'a> {
    fn new(
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
        Ctx {
            eff,
            prev,
            obs,
            now,
            current: obs.current_replicas.max(0),
            held_prev,
            tracking: prev.and_then(|p| p.tracking.clone()).unwrap_or_default(),
            deadlines: Vec::new(),
            backoff: None,
        }
    }

    fn prev_ramp(&self) -> Option<RampStatus> {
        self.prev.and_then(|p| p.ramp.clone())
    }

    fn prev_desired(&self) -> Option<i32> {
        self.prev
            .and_then(|p| p.replicas.as_ref())
            .map(|r| r.desired)
    }

    fn prev_recommended(&self) -> Option<i32> {
        self.prev
            .and_then(|p| p.replicas.as_ref())
            .map(|r| r.recommended)
    }

    fn clamp(&self, n: i32) -> i32 {
        n.clamp(self.eff.scaling.min_replicas, self.eff.scaling.max_replicas)
    }

    fn due(&mut self, at: Timestamp) {
        self.deadlines.push(at);
    }

    /// The most replicas a scale-up may reach now: one step from current once the period is
    /// over; within the period, what was already granted (the previous desired).
    fn up_cap(&mut self) -> i32 {
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

    /// The fewest replicas a scale-down may reach now (see [`Ctx::up_cap`]).
    fn down_floor(&mut self) -> i32 {
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

    fn outcome(&self, regime: Regime, desired: i32, recommended: i32) -> Outcome {
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
        }
    }

    // --- branches -----------------------------------------------------------------------------

    /// A manual hold (`kubectl wbp hold`) withholds any scale-out until it expires; the rest of
    /// the decision (regime, recommendation, scale-in) stands.
    fn manual_hold(&mut self, mut out: Outcome) -> Outcome {
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

    fn suspended(&mut self) -> Outcome {
        self.tracking.below_release_since = None;
        let c = self.current;
        let mut out = self.outcome(Regime::Suspended, c, self.prev_recommended().unwrap_or(c));
        out.reason = "spec.suspend is true: the target and its pods are left as they are".into();
        out.held = self.held_prev;
        out.ramp = self.prev_ramp();
        out
    }

    fn unavailable(&mut self, why: String) -> Outcome {
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

    fn available(&mut self, b: f64, sizing: &Sizing) -> Outcome {
        self.backoff = Some(b);
        let s = &self.eff.scaling;
        let now = self.now;
        if b > s.hold.backoff_above {
            self.tracking.above_hold_since.get_or_insert(Time(now));
        } else {
            self.tracking.above_hold_since = None;
        }
        if b < s.release.backoff_below {
            self.tracking.below_release_since.get_or_insert(Time(now));
        } else {
            self.tracking.below_release_since = None;
        }
        let mut points = self.tracking.recommendations.take().unwrap_or_default();
        let stabilized = sizing::stabilize(
            &mut points,
            sizing.replicas,
            now,
            s.scale_down.stabilization,
        );
        if points.len() >= 2 {
            // The current maximum leaves the window when the point after it started
            // `stabilization` ago.
            self.due(plus(points[1].since.0, s.scale_down.stabilization));
        }
        self.tracking.recommendations = Some(points);

        let above_for = self
            .tracking
            .above_hold_since
            .as_ref()
            .map(|t| elapsed(t.0, now));
        let below_for = self
            .tracking
            .below_release_since
            .as_ref()
            .map(|t| elapsed(t.0, now));
        let hold_due = above_for.is_some_and(|d| d >= s.hold.for_);
        let release_due = below_for.is_some_and(|d| d >= s.release.for_);

        if self.held_prev {
            if release_due {
                return self.release(b, below_for.unwrap_or_default(), sizing, stabilized);
            }
            if let Some(t) = &self.tracking.below_release_since {
                self.due(plus(t.0, s.release.for_));
            }
            return self.stay_held(b, sizing, stabilized);
        }
        if let Some(ramp) = self.prev_ramp() {
            if b > s.ramp_up.abort_above || hold_due {
                return self.abort(ramp, b, above_for, sizing);
            }
            if let Some(t) = &self.tracking.above_hold_since {
                self.due(plus(t.0, s.hold.for_));
            }
            return self.ramp_step(ramp, b, sizing, stabilized);
        }
        if hold_due {
            return self.start_hold(b, above_for.unwrap_or_default(), sizing);
        }
        if let Some(t) = &self.tracking.above_hold_since {
            self.due(plus(t.0, s.hold.for_));
        }
        self.normal(b, sizing, stabilized)
    }

    /// Healthy or Backlogged: size from the queue with step limits and stabilization.
    fn normal(&mut self, b: f64, sizing: &Sizing, stabilized: i32) -> Outcome {
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
        // before the workers' backoff shows it (DESIGN.md §1).
        let set_point = self.eff.worker.set_point;
        let failing = self
            .obs
            .fleet
            .sanitized()
            .failure_rate
            .filter(|f| *f > set_point);
        if rec > c {
            if b > s.hold.backoff_above {
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
        } else if stabilized < c && b > s.hold.backoff_above && !s.hold.allow_scale_in {
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

    fn start_hold(&mut self, b: f64, above_for: Duration, sizing: &Sizing) -> Outcome {
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

    fn stay_held(&mut self, b: f64, sizing: &Sizing, stabilized: i32) -> Outcome {
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

    fn release(
        &mut self,
        b: f64,
        below_for: Duration,
        sizing: &Sizing,
        stabilized: i32,
    ) -> Outcome {
        let s = &self.eff.scaling;
        let c = self.current;
        let released = format!(
            "fleet backoff {b:.2} < {:.2} for {}: hold released",
            s.release.backoff_below,
            human(below_for)
        );
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

    fn abort(
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
                "fleet backoff {b:.2} > abort threshold {:.2}",
                s.ramp_up.abort_above
            )
        } else {
            format!(
                "fleet backoff {b:.2} > {:.2} for {}",
                s.hold.backoff_above,
                human(above_for.unwrap_or_default())
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

    fn ramp_step(&mut self, ramp: RampStatus, b: f64, sizing: &Sizing, stabilized: i32) -> Outcome {
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
            out.reason = format!(
                "fleet backoff {b:.2} ≤ abort threshold {:.2} after {} at stage {stage}/{n}: \
                 ramp stage {next}/{n} ({next_pct}%): {c} → {next_target} toward {to}",
                s.ramp_up.abort_above,
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

    // --- assembly -----------------------------------------------------------------------------

    fn finish(mut self, mut out: Outcome, fleet: &FleetMetrics) -> Decision {
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
            reason: out.reason,
            dry_run: dry,
            events,
            requeue_after,
            status,
        }
    }

    fn conditions(
        &self,
        out: &Outcome,
        prev: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    ) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
        let eff = self.eff;
        let s = &eff.scaling;
        let mut b = conditions::Builder::new(prev, self.now, self.obs.generation);
        let regime = out.regime.as_str();
        let dry = if eff.dry_run { " (dry run)" } else { "" };

        if out.regime == Regime::Suspended {
            b.set(
                cond::READY,
                CondStatus::True,
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
                CondStatus::True,
                "Reconciled",
                format!(
                    "regime {regime}: desired {} replicas{dry}{brake}",
                    out.desired
                ),
            ),
            Err(why) => b.set(
                cond::READY,
                CondStatus::False,
                "MetricsUnavailable",
                format!("{why}; desired {} replicas{dry}{brake}", out.desired),
            ),
        }

        match self.backoff.or(self.obs.fleet.sanitized().backoff) {
            Some(v) if v <= s.hold.backoff_above => b.set(
                cond::DEPENDENCY_HEALTHY,
                CondStatus::True,
                "BackoffBelowHold",
                format!(
                    "fleet backoff {v:.2} ≤ hold threshold {:.2}",
                    s.hold.backoff_above
                ),
            ),
            Some(v) => b.set(
                cond::DEPENDENCY_HEALTHY,
                CondStatus::False,
                "BackoffAboveHold",
                format!(
                    "fleet backoff {v:.2} > hold threshold {:.2}",
                    s.hold.backoff_above
                ),
            ),
            None => b.set(
                cond::DEPENDENCY_HEALTHY,
                CondStatus::Unknown,
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
            b.set(
                cond::SCALE_OUT_HELD,
                CondStatus::True,
                "DependencyFailing",
                msg,
            );
        } else if let Some(until) = self.eff.manual_hold_until.filter(|u| *u > self.now) {
            b.set(
                cond::SCALE_OUT_HELD,
                CondStatus::True,
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
                CondStatus::False,
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
                CondStatus::False,
                "NotHeld",
                "scale-out is not held".into(),
            );
        }

        match (&out.ramp, out.held) {
            (Some(r), false) => b.set(
                cond::RAMPING,
                CondStatus::from_bool(true),
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
                CondStatus::False,
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
                CondStatus::False,
                "NotRamping",
                "no ramp in progress".into(),
            ),
        }

        match &out.metrics {
            Ok(None) => b.set(
                cond::METRICS_AVAILABLE,
                CondStatus::True,
                "MetricsAvailable",
                "fleet backoff and queue metrics are known".into(),
            ),
            Ok(Some(partial)) => b.set(
                cond::METRICS_AVAILABLE,
                CondStatus::True,
                "PartialMetrics",
                format!("enough metrics to decide; a query failed: {partial}"),
            ),
            Err(why) => b.set(
                cond::METRICS_AVAILABLE,
                CondStatus::False,
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
                CondStatus::False,
                "WithinLimits",
                "no BackpressurePolicy limit overrides a value".into(),
            );
        } else {
            b.set(
                cond::POLICY_LIMITED,
                CondStatus::True,
                "LimitsApplied",
                eff.overrides
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            );
        }

        match &self.obs.config {
            // Nothing is pushed in DryRun: the pods keep whatever they run, which is not a
            // fault to alert on (ConfigOutOfSync counts `False` only).
            Some(cfg) if eff.dry_run => b.set(
                cond::CONFIG_IN_SYNC,
                CondStatus::Unknown,
                "NotPushed",
                format!(
                    "DryRun: the operator pushes no config; {} of {} ready pods run config {}",
                    cfg.pods_in_sync, cfg.pods_total, cfg.hash
                ),
            ),
            Some(cfg) if cfg.pods_in_sync >= cfg.pods_total => b.set(
                cond::CONFIG_IN_SYNC,
                CondStatus::True,
                "InSync",
                format!(
                    "{} of {} ready pods run config {}",
                    cfg.pods_in_sync, cfg.pods_total, cfg.hash
                ),
            ),
            Some(cfg) => b.set(
                cond::CONFIG_IN_SYNC,
                CondStatus::False,
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
                        CondStatus::Unknown,
                        "NotObserved",
                        "the pods' configuration has not been observed yet".into(),
                    );
                }
            }
        }
        b.build()
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

fn two_significant(x: f64) -> f64 {
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
mod unit {
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

    #[test]
    fn stage_replicas_round_up() {
        assert_eq!(stage_replicas(8, 14, 25), 10);
        assert_eq!(stage_replicas(8, 14, 50), 11);
        assert_eq!(stage_replicas(8, 14, 100), 14);
        assert_eq!(stage_replicas(8, 8, 50), 8);
    }
}
