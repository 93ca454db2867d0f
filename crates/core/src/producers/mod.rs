//! Producer control: the watermark loop that pauses or throttles the producers of a queue
//! while its backlog is above a high watermark (`spec.producers`), decided purely from the
//! previous [`ProducerStatus`] (the only memory), the fleet metrics and `now`.
//!
//! It is independent of the worker hold ([`crate::decide`]): the hold protects the dependency
//! from more workers, producer control protects the queue (the broker's memory, the age of the
//! newest message) from a backlog the held fleet cannot drain.
//!
//! # States
//!
//! ```text
//!            level Above                                 level Below, restricted ≥ pauseDwell
//!   Open ───────────────► Paused (Pause) / Throttled ──────────────────────────────► Resuming
//!    ▲                      ▲   (Throttle: rate = 0.9 × completion)                  │  │
//!    │                      └──────────────── level Above ─────────────────────────────┘  │
//!    └──── a step of resumeDwell with arrivals < 0.9 × min(rate, previousRate), level Below ┘
//! ```
//!
//! The **level** of the queue: `Above` when any configured signal (depth, age) is above its
//! `pauseAbove`; `Below` when every configured signal is known and below its `resumeBelow`;
//! `Between` otherwise (between the watermarks, or partly unknown); `Unknown` when no
//! configured signal is known. Restricting needs `Above`, resuming needs `Below`: between the
//! watermarks nothing changes, which is the hysteresis, so noise between them cannot flap the
//! state. An unknown level changes nothing either (the last state stands).
//!
//! **Throttled** lets the producer workload send `0.9 ×` the fleet's completion rate, so the
//! backlog drains at a tenth of what the workers complete; with the dependency down (no
//! completions) that is 0, the same as a pause. An unknown completion rate keeps the last rate.
//!
//! **Resuming** is the way back without refilling the queue faster than the workers drain it:
//! it starts at the completion rate (at least [`MIN_RATE`]), so arrivals match the drain. Each
//! `resumeDwell` is a step. With the queue still below the low watermark the rate doubles (at
//! least the completion rate); between the watermarks it stays; and it never exceeds
//!
//! ```text
//!   cap = completion + room / resumeDwell,   room = messages until the watermarks' midpoint
//! ```
//!
//! (for the age watermarks, the midpoint age times the completion rate less the queue depth),
//! so one step at the
//! full rate, which is what producers holding a backlog send, fills the queue at most to the
//! midpoint; above the midpoint the cap is below the completion rate and the queue drains. The
//! producers are `Open` after a step in which they sent less than 0.9 × what they were
//! allowed, judged against the lower of this step's rate and the step before's
//! (`previousRate`: the arrival rate's `rate()` window, read from a scrape, can reach into the
//! step before); so never at the first step after a pause, whose window still holds the pause.
//! Above the high watermark they are restricted again.
//!
//! # Status stability
//!
//! Given the same inputs the same status comes back: times are truncated to seconds, rates
//! rounded to two significant digits, and the reason changes only with the state or a step.

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use std::time::Duration;

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{ProducerMode, ProducerState, ProducerStatus};
use backpressure_api::wire::{
    GateState, MAX_RETRY_AFTER_MS, PRODUCER_WIRE_VERSION, ProducerConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::decide::finish::two_significant;
use crate::decide::time::{elapsed, elapsed_at_least, human, truncate};
use crate::decide::{DecisionEvent, EventType, FleetMetrics};
use crate::resolve::EffectiveProducers;

/// Share of the fleet's completion rate a `Throttled` producer workload may send: the backlog
/// drains at the rest.
pub const THROTTLE_SHARE: f64 = 0.9;
/// A `Resuming` step whose arrivals stayed below this share of the allowed rate shows the limit
/// no longer binds: the producers are opened.
pub const NOT_BINDING_SHARE: f64 = 0.9;
/// Smallest allowed rate while resuming, in messages per second for the whole workload, so
/// that an idle fleet (no completions to measure) does not keep its producers at zero.
pub const MIN_RATE: f64 = 1.0;
/// Factor by which the allowed rate grows at each `Resuming` step below the low watermark.
pub const RESUME_GROWTH: f64 = 2.0;

/// Where the queue stands against the watermarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Some signal above its high watermark.
    Above,
    /// Between the watermarks, or some signal unknown and none above.
    Between,
    /// Every configured signal known and below its low watermark.
    Below,
    /// No configured signal known.
    Unknown,
}

/// The queue level and a description of the signals, e.g. `queue depth 812 > 800`.
pub fn level(eff: &EffectiveProducers, fleet: &FleetMetrics) -> (Level, String) {
    let fleet = fleet.sanitized();
    let mut above = Vec::new();
    let mut parts = Vec::new();
    let mut known = 0;
    let mut below = 0;
    let mut configured = 0;
    let mut check = |name: &str, value: Option<f64>, pause: f64, resume: f64, unit: &str| {
        configured += 1;
        match value {
            Some(v) => {
                known += 1;
                let fmt = |x: f64| format!("{x:.0}{unit}");
                if v > pause {
                    above.push(format!("{name} {} > {}", fmt(v), fmt(pause)));
                } else if v < resume {
                    below += 1;
                    parts.push(format!("{name} {} < {}", fmt(v), fmt(resume)));
                } else {
                    parts.push(format!(
                        "{name} {} between {} and {}",
                        fmt(v),
                        fmt(resume),
                        fmt(pause)
                    ));
                }
            }
            None => parts.push(format!("{name} unknown")),
        }
    };
    if let Some((pause, resume)) = eff.depth {
        check("queue depth", fleet.queue_depth, pause, resume, "");
    }
    if let Some((pause, resume)) = eff.age {
        check(
            "queue age",
            fleet.queue_age,
            pause.as_secs_f64(),
            resume.as_secs_f64(),
            "s",
        );
    }
    if !above.is_empty() {
        return (Level::Above, above.join(", "));
    }
    let text = parts.join(", ");
    if configured == 0 || known == 0 {
        (Level::Unknown, text)
    } else if below == configured {
        (Level::Below, text)
    } else {
        (Level::Between, text)
    }
}

/// The watermarks as status shows them: `queueDepth 800/200, queueAge 10m/2m`.
pub fn watermarks_text(eff: &EffectiveProducers) -> String {
    let mut parts = Vec::new();
    if let Some((p, r)) = eff.depth {
        parts.push(format!("queueDepth {p:.0}/{r:.0}"));
    }
    if let Some((p, r)) = eff.age {
        parts.push(format!("queueAge {}/{}", human(p), human(r)));
    }
    parts.join(", ")
}

/// The outcome of one producer decision.
#[derive(Debug, Clone, PartialEq)]
pub struct ProducerDecision {
    /// The new producer status (the rollout fields, hash to pods, are carried from the previous
    /// status; the caller fills them after pushing).
    pub status: ProducerStatus,
    /// An event when the state changed or a resume step was taken.
    pub event: Option<DecisionEvent>,
}

impl ProducerDecision {
    /// Whether the producers are restricted (the `ProducersThrottled` condition).
    pub fn restricted(&self) -> bool {
        self.status.state != ProducerState::Open
    }
}

/// Decides the producer state. See the module documentation.
pub fn decide_producers(
    eff: &EffectiveProducers,
    previous: Option<&ProducerStatus>,
    fleet: &FleetMetrics,
    now: Timestamp,
) -> ProducerDecision {
    let now = truncate(now);
    let fleet = fleet.sanitized();
    let prev_state = previous.map_or(ProducerState::Open, |p| p.state);
    let since = previous.and_then(|p| p.since.as_ref()).map_or(now, |t| t.0);
    let prev_rate = previous.and_then(|p| p.rate);
    let (level, signals) = level(eff, &fleet);
    let below_since = match level {
        Level::Below => Some(
            previous
                .and_then(|p| p.below_resume_since.as_ref())
                .map_or(now, |t| t.0),
        ),
        _ => None,
    };
    let completion = fleet.completion_rate;
    let throttle_rate = || {
        completion
            .map(|c| two_significant(c * THROTTLE_SHARE))
            .or(prev_rate)
            .unwrap_or(0.0)
    };
    // While resuming, a step may add at most the room left below the watermarks' midpoint over
    // one dwell on top of what the workers drain: `rate ≤ completion + room / resumeDwell`.
    let drain = completion.unwrap_or(0.0);
    let cap = room(eff, &fleet).map(|m| drain + m / eff.resume_dwell.as_secs_f64().max(1.0));
    let bounded = |r: f64| two_significant(cap.map_or(r, |cap| r.min(cap)).max(MIN_RATE));
    let restrict = || match eff.mode {
        ProducerMode::Throttle => (ProducerState::Throttled, Some(throttle_rate())),
        _ => (ProducerState::Paused, None),
    };

    let mut previous_rate = None;
    // (state, rate, entered now?, reason of a transition)
    let keep = |rate: Option<f64>| (prev_state, rate, false, None::<String>);
    let (state, rate, entered, why) = if eff.mode == ProducerMode::Off {
        let why = (prev_state != ProducerState::Open).then(|| "producer control is Off".to_owned());
        (ProducerState::Open, None, why.is_some(), why)
    } else {
        match prev_state {
            ProducerState::Open => match level {
                Level::Above => {
                    let (s, r) = restrict();
                    (
                        s,
                        r,
                        true,
                        Some(format!("{signals}: {}", restrict_words(s, r))),
                    )
                }
                _ => keep(None),
            },
            ProducerState::Paused | ProducerState::Throttled => {
                if level == Level::Below && elapsed_at_least(since, now, eff.pause_dwell) {
                    let r = bounded(drain);
                    previous_rate = Some(prev_rate.unwrap_or(0.0));
                    (
                        ProducerState::Resuming,
                        Some(r),
                        true,
                        Some(format!(
                            "{signals} after {}: resuming at {r} messages/s, the fleet's completion rate",
                            human(elapsed(since, now))
                        )),
                    )
                } else {
                    // The mode may have changed under a restricted state: follow it.
                    let (s, r) = restrict();
                    if s == prev_state {
                        keep(r)
                    } else {
                        (
                            s,
                            r,
                            true,
                            Some(format!("mode {:?}: {}", eff.mode, restrict_words(s, r))),
                        )
                    }
                }
            }
            ProducerState::Resuming => {
                let rate = prev_rate.unwrap_or_else(|| bounded(drain));
                let before = previous.and_then(|p| p.previous_rate).unwrap_or(0.0);
                match level {
                    Level::Above => {
                        let (s, r) = restrict();
                        (
                            s,
                            r,
                            true,
                            Some(format!(
                                "{signals} while resuming: {}",
                                restrict_words(s, r)
                            )),
                        )
                    }
                    Level::Unknown => {
                        previous_rate = Some(before);
                        keep(Some(rate))
                    }
                    _ if !elapsed_at_least(since, now, eff.resume_dwell) => {
                        previous_rate = Some(before);
                        keep(Some(rate))
                    }
                    // The arrival rate's window may reach into the step before: compare it with
                    // the lower of the two steps' rates.
                    Level::Below
                        if fleet
                            .arrival_rate
                            .is_some_and(|a| a < NOT_BINDING_SHARE * rate.min(before)) =>
                    {
                        let a = fleet.arrival_rate.unwrap_or_default();
                        (
                            ProducerState::Open,
                            None,
                            true,
                            Some(format!(
                                "{signals}, arrivals {} messages/s below the allowed {}: open",
                                two_significant(a),
                                rate.min(before)
                            )),
                        )
                    }
                    // A new step: the rate doubles below the low watermark (at least the
                    // completion rate), stays between them, and never exceeds the cap.
                    _ => {
                        let r = if level == Level::Below {
                            bounded((rate * RESUME_GROWTH).max(drain))
                        } else {
                            bounded(rate)
                        };
                        previous_rate = Some(rate);
                        let why = (r != rate).then(|| {
                            let verb = if r > rate { "raised" } else { "lowered" };
                            format!("{signals}: allowed rate {verb} from {rate} to {r} messages/s")
                        });
                        (ProducerState::Resuming, Some(r), true, why)
                    }
                }
            }
        }
    };

    let prev_reason = previous.and_then(|p| p.reason.clone());
    let reason = match (&why, prev_reason) {
        (Some(w), _) => Some(w.clone()),
        (None, Some(r)) => Some(r),
        (None, None) => Some(format!("{signals}: open")),
    };
    let since = if entered || previous.is_none() {
        now
    } else {
        since
    };
    let event = why.map(|message| DecisionEvent {
        type_: if matches!(state, ProducerState::Open | ProducerState::Resuming) {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason: event_reason(prev_state, state),
        action: "Producers",
        message,
    });
    let status = ProducerStatus {
        state,
        since: Some(Time(since)),
        rate,
        previous_rate: previous_rate.filter(|_| state == ProducerState::Resuming),
        below_resume_since: below_since.map(Time),
        watermarks: Some(watermarks_text(eff)),
        reason,
        hash: previous.and_then(|p| p.hash.clone()),
        generation: previous.and_then(|p| p.generation),
        pods_in_sync: previous.and_then(|p| p.pods_in_sync),
        pods_total: previous.and_then(|p| p.pods_total),
    };
    ProducerDecision { status, event }
}

/// Messages that may be added before the queue reaches the midpoint of its watermarks, by the
/// tightest configured signal (`None` when no configured signal is known). For the age, the
/// room is what the workers complete in the midpoint age less what already waits: a message
/// sent now waits about `depth / completion` (first in, first out), while the oldest message's
/// age trails the depth by that long and would let a step overshoot.
fn room(eff: &EffectiveProducers, fleet: &FleetMetrics) -> Option<f64> {
    let mid = |(pause, resume): (f64, f64)| (pause + resume) / 2.0;
    let depth = eff.depth.zip(fleet.queue_depth).map(|(w, d)| mid(w) - d);
    let completion = fleet.completion_rate.unwrap_or(0.0);
    let age = eff.age.and_then(|(pause, resume)| {
        let m = mid((pause.as_secs_f64(), resume.as_secs_f64()));
        match (fleet.queue_depth, fleet.queue_age) {
            (Some(d), _) => Some(m * completion - d),
            (None, Some(a)) => Some((m - a) * completion),
            (None, None) => None,
        }
    });
    match (depth, age) {
        (Some(d), Some(a)) => Some(d.min(a)),
        (d, a) => d.or(a),
    }
}

fn restrict_words(state: ProducerState, rate: Option<f64>) -> String {
    match (state, rate) {
        (ProducerState::Throttled, Some(r)) => format!(
            "producers throttled to {r} messages/s ({THROTTLE_SHARE} × the fleet's completion rate)"
        ),
        _ => "producers paused".to_owned(),
    }
}

fn event_reason(from: ProducerState, to: ProducerState) -> &'static str {
    match to {
        ProducerState::Open => "ProducersOpen",
        ProducerState::Paused => "ProducersPaused",
        ProducerState::Throttled => "ProducersThrottled",
        ProducerState::Resuming if from == ProducerState::Resuming => "ProducersRateChanged",
        ProducerState::Resuming => "ProducersResuming",
    }
}

/// The `ProducersThrottled` condition: (status, reason, message).
pub fn condition(status: &ProducerStatus) -> (bool, &'static str, String) {
    (
        status.state != ProducerState::Open,
        status.state.as_str(),
        status.reason.clone().unwrap_or_default(),
    )
}

/// The condition type, re-exported for callers.
pub const CONDITION: &str = cond::PRODUCERS_THROTTLED;

/// The step of a restriction's lease: a restricting document pushed at `now` lapses at the end
/// of the next whole step after the current one, between one and two steps later, so the
/// document (and its hash) changes once a step while the restriction holds, and producers whose
/// operator is gone are open again within two steps.
pub const LEASE_STEP: Duration = Duration::from_secs(300);

/// The document pushed to each of `ready_pods` producer pods at `now`: the workload's rate
/// shared among them (with no ready pods, the whole rate), the retry-after of a pause (the
/// pause dwell, between 1 s and a minute), a restriction's lease ([`LEASE_STEP`]), and
/// `generation` left to the caller ([`crate::resolve::next_config_generation`]). Its hash
/// changes with the state, the rate, and each lease step.
pub fn render_producer_config(
    eff: &EffectiveProducers,
    status: &ProducerStatus,
    ready_pods: i32,
    now: Timestamp,
) -> ProducerConfig {
    let pods = f64::from(ready_pods.max(1));
    let (state, rate_per_second) = match status.state {
        ProducerState::Open => (GateState::Open, None),
        ProducerState::Paused => (GateState::Paused, None),
        ProducerState::Throttled | ProducerState::Resuming => (
            GateState::Throttled,
            Some(status.rate.unwrap_or(0.0).max(0.0) / pods),
        ),
    };
    let retry_after = match status.state {
        ProducerState::Paused => eff
            .pause_dwell
            .clamp(Duration::from_secs(1), Duration::from_secs(60)),
        _ => Duration::from_secs(1),
    };
    ProducerConfig {
        version: PRODUCER_WIRE_VERSION.to_owned(),
        generation: 0,
        hash: String::new(),
        state,
        rate_per_second,
        retry_after_ms: u64::try_from(retry_after.as_millis())
            .unwrap_or(MAX_RETRY_AFTER_MS)
            .min(MAX_RETRY_AFTER_MS),
        expires_at_unix: (state != GateState::Open).then(|| {
            let step = LEASE_STEP.as_secs() as i64;
            (now.as_second().div_euclid(step) + 2) * step
        }),
    }
    .with_hash()
}
