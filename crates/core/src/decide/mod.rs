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
//!                 backoff > hold.backoffAbove (*) for hold.for
//!   Healthy ⇄ Backlogged ───────────────────────────────────► DependencyFailing (held)
//!        ▲                                                        │      ▲
//!        │ last stage dwelt, or backlog target reached            │      │ backoff > rampUp.abortAbove (*)
//!        │                                                        ▼      │ (or hold evidence for hold.for)
//!        └──────────────────────────── Recovering (staged ramp) ◄─┘──────┘
//!          release evidence for release.for: backoff < release.backoffBelow, or
//!          f ≤ s_eff with the fleet's failure floor, or
//!          f ≤ s_eff and backoff ≤ hold.backoffAbove with a floor, or
//!          f ≤ s_eff with no pod withheld
//! ```
//!
//! (*) With a failure floor, only while `f > s_eff`. The hold's clock also needs the hold to
//! withhold pods (a backlog-only autoscaler would add some) or `f > s_eff`
//! (`Decider::hold_evidence`). `f` is the fleet's dependency failure rate and `s_eff` the
//! effective set point ([`FleetMetrics::effective_set_point`]); an unknown failure rate counts as
//! above it. The failure floor is the higher of the workers' (their own experiments) and the
//! fleet's (its load test: failures that stayed where they were while the fleet's calls fell by a
//! quarter or more, `floor.rs`).
//!
//! * **Healthy / Backlogged**: HPA-like sizing from the queue ([`sizing`]): `Backlogged` when the
//!   queue needs more than it gets. Scale-out is limited to `max(maxPods, maxPercent%)` per
//!   `scaleUp.period`, scale-in to `scaleDown.maxPercent` per `scaleDown.period` and to the
//!   highest recommendation of the `scaleDown.stabilization` window. While the evidence for a
//!   hold (backoff above `hold.backoffAbove`; with a floor, also the failure rate above
//!   `s_eff`) has not lasted `hold.for` yet, scale-out is deferred (the regime does not change
//!   yet); so is any scale-out while the failure rate is above `s_eff`, and an early one (the
//!   rates ask for pods before the age passes its target) while it is unknown.
//! * **DependencyFailing**: the hold (`Decider::hold_evidence` and `Decider::release_evidence`
//!   for why the failure rate takes part). No scale-out (no scale-in either unless
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
//!
//! # Layout
//!
//! This file holds the types, [`decide`] and the dispatch between the regimes. Each regime is a
//! group of methods on one private decision state (`Decider`, in `decider.rs` with the step caps
//! the regimes share), in its own file: `normal.rs` (Healthy, Backlogged), `hold.rs`
//! (DependencyFailing and the manual hold), `ramp.rs` (release, stages, abort;
//! [`stage_target`]) and `unavailable.rs` (MetricsUnavailable, Suspended). The regimes fall
//! through to each other (a release that needs no ramp, or a finished ramp, sizes normally), so
//! they are not separate types. `finish.rs` assembles the status, events and requeue,
//! `conditions.rs` the conditions ([`set_condition`] for a caller's own), `floor.rs` the
//! fleet's load test for a failure floor (run before the regimes, on every observation with
//! metrics), and `not_ready.rs` the paths that decide nothing ([`invalid_spec`],
//! [`target_unavailable`]).

mod conditions;
mod decider;
pub(crate) mod finish;
#[cfg(any(test, feature = "testing"))]
pub mod fixtures;
mod floor;
mod hold;
mod normal;
mod not_ready;
#[cfg(test)]
mod proptests;
mod ramp;
pub mod sizing;
#[cfg(test)]
mod tests;
pub(crate) mod time;
mod unavailable;

use std::time::Duration;

use backpressure_api::v1alpha1::{
    Action, ConfigStatus, Mode, RampStatus, Regime, WorkerBackpressureStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::resolve::{Effective, QueueSource};
pub use conditions::set_condition;
use decider::{Decider, Outcome};
pub use floor::{fleet_floor, worker_set_point};
pub use not_ready::{invalid_spec, target_unavailable};
pub use ramp::stage_target;
pub use sizing::{Sizing, TOLERANCE};
use time::{elapsed, plus, truncate};

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
    /// Age in seconds of the oldest message not yet delivered once (redeliveries do not count).
    pub queue_age: Option<f64>,
    /// Messages waiting.
    pub queue_depth: Option<f64>,
    /// Messages arriving per second.
    pub arrival_rate: Option<f64>,
    /// Messages completed per second by the whole fleet.
    pub completion_rate: Option<f64>,
    /// Mean failure floor of the fleet, in [0, 1]: the share of dependency calls the workers
    /// found to fail whatever their concurrency (`backpressure_failure_floor`; see the worker
    /// library's `SetPoint` docs). Unknown is read as 0: every failure is taken to respond to
    /// load, as before workers exported it.
    pub failure_floor: Option<f64>,
    /// The most consumers that can work at once, as the queue's exporter counts them (Kafka:
    /// the topic's partitions; `spec.queue.kafka.partitions` wins over it). Unknown: no cap.
    pub partitions: Option<f64>,
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
            failure_floor: unit(self.failure_floor),
            // A count of at least one; no consumer assigned (0) says nothing about the topic.
            partitions: self
                .partitions
                .filter(|x| x.is_finite() && *x >= 1.0)
                .map(f64::floor),
        }
    }

    /// The failure rate that load is not responsible for exceeding: `s_eff = f0 + s·(1 - f0)`
    /// for the workers' set point `s` and the fleet's failure floor `f0` (0 when unknown).
    ///
    /// A call fails whatever the load with probability `f0`, and the rest fail for overload
    /// with probability `g`: `f = f0 + (1 - f0)·g`. The workers keep `g` at or below `s`, so a
    /// fleet failure rate at or below `s_eff` says the dependency is not overloaded, and adding
    /// pods does not raise it as long as it stays there (each pod sees the same `f0`). Above
    /// `s_eff`, load is part of the cause.
    pub fn effective_set_point(&self, set_point: f64) -> f64 {
        let f0 = self
            .failure_floor
            .filter(|x| x.is_finite())
            .unwrap_or(0.0)
            .clamp(0.0, 1.0);
        f0 + set_point * (1.0 - f0)
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

/// Why scale-out is deferred in Healthy or Backlogged, short of a hold (module documentation, Healthy / Backlogged).
/// Active mode simply does not scale out (and, for a pending hold, does not scale in unless
/// `hold.allowScaleIn`); Guard mode clamps the guarded autoscaler the same way
/// ([`crate::guard::clamp_for`]). Set whenever the condition holds, also when the backlog
/// sizing wants no scale-out: the guarded autoscaler sizes from its own metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deferral {
    /// The fleet backoff is above `hold.backoffAbove` (where the workers report a failure
    /// floor, with the failure rate above the effective set point), not yet for `hold.for`: no
    /// scale-out, and no scale-in unless `hold.allowScaleIn`.
    HoldPending,
    /// The dependency failure rate is above the workers' set point: no scale-out (scale-in
    /// goes on).
    FailureRate,
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
    /// Scale-out deferred short of a hold, and why (`None` when held, ramping, without metrics,
    /// or when nothing defers it).
    pub deferral: Option<Deferral>,
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

/// The partition cap of a Kafka queue: the count the object states
/// (`spec.queue.kafka.partitions`), else the one its exporter reports, else none.
pub fn consumer_cap(effective: &Effective, fleet: &FleetMetrics) -> Option<sizing::ConsumerCap> {
    let Some(QueueSource::Kafka { topic, .. }) = &effective.metrics.queue.source else {
        return None;
    };
    let (replicas, from) = match effective.metrics.queue.partitions() {
        Some(p) => (p, "spec.queue.kafka.partitions"),
        None => {
            let p = fleet.sanitized().partitions?;
            (sizing::ceil_to_i32(p), "counted by the exporter")
        }
    };
    (replicas >= 1).then(|| sizing::ConsumerCap {
        replicas,
        why: format!("topic {topic} has {replicas} partitions ({from})"),
    })
}

/// Decides. See the module documentation for the rules.
pub fn decide(
    effective: &Effective,
    previous: Option<&WorkerBackpressureStatus>,
    observation: &Observation,
) -> Decision {
    let now = truncate(observation.now);
    let fleet = observation.fleet.sanitized();
    let mut state = Decider::new(effective, previous, observation, now);

    let mut found_floor = None;
    let out = if effective.suspend {
        state.suspended()
    } else {
        found_floor = state.learn_floor();
        let cap = consumer_cap(effective, &fleet);
        let measured = state.measured_pods(effective.metrics.rate_window);
        let sizing = sizing::size(
            &effective.scaling,
            state.current,
            observation.ready_pods,
            measured,
            &fleet,
            cap.as_ref(),
        );
        // With no pod at all there is no worker to export a backoff: its absence is expected,
        // not missing data, and must not keep a scaled-to-zero fleet from activating.
        let no_pods = state.current == 0 && observation.ready_pods == 0;
        let backoff = fleet
            .backoff
            .or((no_pods && observation.metrics_error.is_none()).then_some(0.0));
        match (backoff, sizing) {
            (Some(backoff), Some(sizing)) => state.available(backoff, &sizing),
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
                state.unavailable(why)
            }
        }
    };
    let mut out = state.manual_hold(out);
    if let Some(f0) = found_floor {
        out.events.push(floor::found_event(f0, &state));
    }
    state.finish(out, &fleet)
}

impl Decider<'_> {
    /// Whether the dependency fails more than the workers accept: the fleet failure rate is
    /// above the effective set point ([`FleetMetrics::effective_set_point`]), or unknown.
    fn failing_beyond_set_point(&self) -> bool {
        let s_eff = self.fleet.effective_set_point(self.eff.worker.set_point);
        self.fleet.failure_rate.is_none_or(|f| f > s_eff)
    }

    /// The fleet failure rate against the effective set point, in words: `dependency failure
    /// rate 15.3% ≤ set point 19.3% (failure floor 15.0%)`.
    pub(super) fn failure_rate_text(&self) -> String {
        let fleet = &self.fleet;
        let s_eff = fleet.effective_set_point(self.eff.worker.set_point);
        let floor = fleet
            .failure_floor
            .filter(|f0| *f0 > 0.0)
            .map(|f0| format!(" (failure floor {:.1}%)", f0 * 100.0))
            .unwrap_or_default();
        match fleet.failure_rate {
            Some(f) => format!(
                "dependency failure rate {:.1}% {} set point {:.1}%{floor}",
                f * 100.0,
                if f > s_eff { ">" } else { "≤" },
                s_eff * 100.0
            ),
            None => "dependency failure rate unknown".to_owned(),
        }
    }

    /// Whether this observation is evidence for holding (the clock of `hold.for`,
    /// `status.tracking.aboveHoldSince`, runs while it is): the fleet backoff is above
    /// `hold.backoffAbove`, where the workers report a failure floor the fleet failure rate is
    /// above the effective set point ([`Self::backoff_means_failure`]), and either the hold
    /// would withhold pods (a backlog-only autoscaler would add some) or the failure rate is
    /// above the effective set point (or unknown).
    ///
    /// A hold that withholds nothing while the dependency fails no more than the workers accept
    /// protects nothing: it only keeps the pods a surge or a ramp left, and more pods than the
    /// queue needs split the same calls into fewer outcomes each, so their integrators come
    /// back from a burst more slowly (the simulator's scenario 8, seed 815: 33 pods held 43
    /// minutes after a ramp was aborted on a burst, with no backlog and the failure rate under
    /// the set point). As soon as a backlog asks for pods, the backoff counts again (and defers
    /// the scale-out while `hold.for` runs). In Guard mode the hold always withholds
    /// ([`Self::withholds`]).
    pub(super) fn hold_evidence(&self, b: f64, sizing: &Sizing) -> bool {
        b > self.eff.scaling.hold.backoff_above
            && self.backoff_means_failure()
            && (self.withholds(sizing) || self.failing_beyond_set_point())
    }

    /// Whether a hold would withhold pods: a backlog-only autoscaler would add some. Always in
    /// Guard mode: the guarded autoscaler sizes from its own metrics (CPU, say), which this
    /// sizing does not know, so the hold is the only guarantee that it does not scale out.
    fn withholds(&self, sizing: &Sizing) -> bool {
        self.eff.mode == Mode::Guard || sizing.replicas > self.current
    }

    /// Whether a fleet backoff above a threshold is evidence of a failing dependency: always,
    /// unless the workers report a failure floor and the failure rate is at or below the
    /// effective set point.
    ///
    /// With a floor, the pods that have not learned it yet (every pod a scale-out adds) back
    /// off until they do, while the failure rate stays at the floor: their backoff says nothing
    /// about the dependency, and holding or aborting a ramp on it latched scenario 7 of the
    /// simulator for most of every hour. Without a floor the backoff is the workers' own verdict
    /// and the failure rate cannot overrule it: an overload held at the workers' equilibrium
    /// shows a failure rate at (on average a little under) the set point with the backoff high,
    /// exactly like noise just under the set point after a burst, and fast workers reach that
    /// equilibrium within seconds, before `hold.for` (requiring failures above the set point
    /// there scaled scenario 11's fleet 8 → 17 into its quota overload).
    fn backoff_means_failure(&self) -> bool {
        let floor = self.fleet.failure_floor.is_some_and(|f0| f0 > 0.0);
        !floor || self.failing_beyond_set_point()
    }

    /// Whether this observation is evidence for releasing a hold (the clock of `release.for`,
    /// `status.tracking.belowReleaseSince`, runs while it is):
    ///
    /// - the fleet backoff is below `release.backoffBelow` (the workers have stopped
    ///   throttling), or
    /// - the fleet's load test found a failure floor (`floor.rs`) and the fleet failure rate is
    ///   known and at or below the effective set point: the backoff counts no more than it does
    ///   for the hold ([`Self::backoff_means_failure`]), or
    /// - the failure rate is known and at or below the effective set point, the backoff at or
    ///   below `hold.backoffAbove`, and either the workers report a failure floor or a
    ///   backlog-only autoscaler would not add pods, or
    /// - the failure rate is known and at or below the effective set point and the hold
    ///   withholds nothing ([`Self::withholds`]: never in Guard mode), whatever the backoff: such
    ///   a hold protects nothing ([`Self::hold_evidence`] does not run then either, so the
    ///   release does not flap back).
    ///
    /// Why the backoff does not count with the fleet's floor: the pods that have not learned
    /// it yet throttle as for an overload (those of the simulator's scenario 7 stayed at full
    /// backoff for about 15 minutes while the fleet's load test had found the floor in 3), and
    /// a release that waited for them held the backlog they cause. The ramp that follows is the
    /// same; its abort, like the hold, counts the backoff only with `f > s_eff`. Why only the
    /// fleet's: the workers' mean floor may be the floor of a few pods whose experiments fell
    /// inside one spike of an intermittent outage; released on it whatever the backoff, the
    /// simulator's scenario 1 dead-lettered up to 74 messages on a seed where it had 48.
    ///
    /// Why the second arm. Near the set point the workers' integrator has almost no drift
    /// (`E[Δx] = (f − s)/((1 − s)N)` per outcome), so a fleet on a healthy-but-noisy dependency
    /// hovers at a backoff of a few hundredths to a few tenths and may never stay below
    /// `release.backoffBelow` for a whole `release.for`: the hold latched for an hour on noise.
    /// With a failure floor, the pods that have not tested it yet (a new pod, one whose
    /// experiments are still too few) keep backing off until they do, and the fleet mean stays
    /// above `release.backoffBelow` for as long as pods join. In both cases the failure rate
    /// says the workers are not failing beyond what they accept, and nothing is gained by
    /// holding. Why not always: while a backlog waits for the pods the hold withholds, a
    /// dependency recovering from an outage or an overload is recovered only when the workers
    /// stop throttling (with the failure rate as evidence there, the simulator's gradual
    /// recovery released while capacity was still returning and its peak load after recovery
    /// rose above 1.1x). Hysteresis stays: a hold needs the backoff above `hold.backoffAbove`
    /// for `hold.for` (with a floor, and the failure rate above the effective set point), a
    /// release needs the failure rate at or below the set point (without a floor, with the
    /// backoff at or below `hold.backoffAbove`), or the backoff below `release.backoffBelow`,
    /// for `release.for`.
    fn release_evidence(&self, b: f64, sizing: &Sizing) -> bool {
        let s = &self.eff.scaling;
        let fleet = &self.fleet;
        let floor = fleet.failure_floor.is_some_and(|f0| f0 > 0.0);
        let more_pods = sizing.replicas > self.current;
        let known = fleet.failure_rate.is_some() && !self.failing_beyond_set_point();
        b < s.release.backoff_below
            || (self.tracking.fleet_floor.is_some() && known)
            || ((floor || !more_pods) && b <= s.hold.backoff_above && known)
            || (!self.withholds(sizing) && known)
    }

    /// The dispatch once the fleet backoff and a sizing are known: update the hold and release
    /// clocks and the stabilization window, then pick the regime's branch (release or stay
    /// held, abort or step a ramp, start a hold, or normal sizing).
    fn available(&mut self, b: f64, sizing: &Sizing) -> Outcome {
        self.backoff = Some(b);
        let s = &self.eff.scaling;
        let now = self.now;
        if self.hold_evidence(b, sizing) {
            self.tracking.above_hold_since.get_or_insert(Time(now));
        } else {
            self.tracking.above_hold_since = None;
        }
        if self.release_evidence(b, sizing) {
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
            if (b > s.ramp_up.abort_above && self.backoff_means_failure()) || hold_due {
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
}
