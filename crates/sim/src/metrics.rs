//! The numbers of one run, as the report shows them.
//!
//! Definitions (all from the per-second samples unless noted):
//!
//! - **goodput**: messages completed in the goodput window divided by what the dependency could
//!   serve there: `min(Σ capacity(t)·(1 − p_fail(t)), backlog at the window start + arrivals in
//!   the window)`, computed from the scenario's timeline, not from the run;
//! - **failure rate**: failed dependency calls / calls, over the incident window (the whole run
//!   without one); the peak is the highest 5-minute rolling value;
//! - **max first-attempt age**: the highest value of the oldest-message gauge; **p99 wait**:
//!   the 99th percentile of each message's wait before its first delivery;
//! - **drain time**: from the recovery instant (end of the incident) to the first second the
//!   depth is back under `max(2 × pre-incident mean depth, 2 s of arrivals)`; its **theoretical
//!   minimum** is the shortest `T` with `∫(serve(t) − λ(t)) dt ≥ backlog`, where `serve(t) =
//!   min(capacity(t)·(1 − p_fail(t)), maxReplicas · maxPermits / mean processing time)` and the
//!   backlog is the depth at recovery above the pre-incident level;
//! - **peak load after recovery**: the highest 30-second sliding-window ratio of calls to
//!   capacity in the 10 minutes after recovery;
//! - **replica-hours**: pods (starting, ready and terminating) integrated over time;
//! - **overload rate**: calls the dependency rejected because the fleet's calls exceeded its
//!   capacity / calls, over the goodput window: the failures the fleet caused by its own load
//!   (outage and background failures are not counted);
//! - **held per hour**: seconds in `DependencyFailing` within the goodput window, per hour of
//!   the window; **held after recovery**: seconds in `DependencyFailing` after the incident's
//!   end.
//!
//! Producers and a bounded broker (issue 17):
//!
//! - **peak queue depth**: the highest broker depth (messages waiting, new or awaiting
//!   redelivery) at any tick, right after the tick's arrivals;
//! - **broker rejections**: publishes a full broker (`queue.capacity`) refused; **lost to the
//!   broker**: those of them nobody kept (all without producer control; none with it, the
//!   producers keep and resend them);
//! - **peak producer backlog**: the most messages waiting at the producers (the gate held
//!   them), at any tick;
//! - **end-to-end age**: per completed message, the time from its demand at the producer to its
//!   acknowledgement, so a wait at the producer counts (the age of the newest message when it is
//!   finally served: what a freshness promise is about); max and 99th percentile. Messages lost
//!   or dead-lettered are not in it;
//! - **system drain**: from the recovery instant to the first second at which the broker depth
//!   and the producer backlog are both back under their pre-incident level (each: `max(2 ×
//!   its mean over the 10 minutes before the incident, 2 s of arrivals)`), against the
//!   theoretical minimum for the sum of both backlogs at recovery above that level;
//! - **producer control**: seconds not `Open`, state changes, restrictions (entries into
//!   `Paused`/`Throttled`) and the time from recovery to the last reopening.

use backpressure_api::v1alpha1::{Action, ProducerState, Regime};

use crate::engine::{RunOutput, Sample};
use crate::scenario::{Scenario, Timeline, Window};

/// Drain after recovery.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Drain {
    /// Messages above the pre-incident level at recovery.
    pub backlog: f64,
    /// Seconds until drained; `None` if not drained before the run ended.
    pub secs: Option<f64>,
    /// The theoretical minimum in seconds.
    pub min_secs: f64,
}

impl Drain {
    /// Drain time over its minimum.
    pub fn ratio(&self) -> Option<f64> {
        self.secs.map(|s| s / self.min_secs.max(1.0))
    }
}

/// The summary of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Messages produced.
    pub produced: u64,
    /// Messages completed.
    pub completed: u64,
    /// Messages in the DLQ.
    pub dead_lettered: u64,
    /// Dependency calls.
    pub attempts: u64,
    /// Failed dependency calls.
    pub failed_attempts: u64,
    /// Goodput as a fraction of what the dependency could serve.
    pub goodput: Option<f64>,
    /// Failure rate over the incident window.
    pub failure_rate: Option<f64>,
    /// Highest 5-minute failure rate.
    pub failure_rate_peak: Option<f64>,
    /// Highest first-attempt age (s).
    pub max_age: f64,
    /// 99th percentile first-attempt wait (s).
    pub p99_wait: f64,
    /// Drain after recovery, when there was a backlog.
    pub drain: Option<Drain>,
    /// Peak calls/capacity in the 10 minutes after recovery.
    pub peak_load_after_recovery: Option<f64>,
    /// Replica-hours.
    pub replica_hours: f64,
    /// Highest replicas wanted.
    pub max_replicas: u32,
    /// Replicas added during the incident window.
    pub added_during_incident: u32,
    /// Seconds in the DependencyFailing regime (scale-out held).
    pub held_secs: f64,
    /// Held fraction of the incident window.
    pub held_fraction_incident: Option<f64>,
    /// Fraction of ready pod-seconds with permits below the maximum.
    pub throttled_fraction: f64,
    /// Highest fleet-mean backoff.
    pub max_backoff: f64,
    /// Ramp stages started after recovery.
    pub ramp_stages: u32,
    /// Ramps aborted back to hold.
    pub ramp_aborts: u32,
    /// Overload rejections / calls over the goodput window.
    pub overload_rate: Option<f64>,
    /// Seconds held per hour of the goodput window.
    pub held_per_hour: f64,
    /// Seconds held after the end of the incident (`None` without an incident).
    pub held_after_recovery: Option<f64>,
    /// Seconds held per hour of the goodput window while the dependency had headroom (see
    /// [`HEADROOM_LOAD`]): holds that protect nothing.
    pub held_with_headroom_per_hour: f64,
    /// Seconds held after the end of the incident while the dependency had headroom (`None`
    /// without an incident).
    pub held_with_headroom_after_recovery: Option<f64>,
    /// Messages the producers wanted to send.
    pub demanded: u64,
    /// Publishes the broker rejected (full).
    pub broker_rejected: u64,
    /// Messages lost to broker rejections.
    pub lost_to_broker: u64,
    /// Highest broker queue depth at any tick.
    pub peak_depth: u64,
    /// Highest producer backlog at any tick.
    pub peak_producer_backlog: u64,
    /// Highest demand-to-completion time (s).
    pub max_end_to_end: f64,
    /// 99th percentile demand-to-completion time (s).
    pub p99_end_to_end: f64,
    /// Drain of the broker and the producers after recovery, when either had a backlog.
    pub system_drain: Option<Drain>,
    /// Producer control: seconds the producers were not `Open` (`None` without control).
    pub restricted_secs: Option<f64>,
    /// Producer state changes.
    pub producer_changes: u32,
    /// Entries into `Paused` or `Throttled` (from `Open` or `Resuming`).
    pub restrictions: u32,
    /// Seconds from recovery to the last change to `Open` after it (`None` without an
    /// incident or producer control, or when the producers did not reopen after recovery).
    pub reopened_after: Option<f64>,
}

/// A second in which the dependency's calls stayed under this share of its capacity, and its
/// load-independent failures (outage, partial failure, noise) at or under [`OUTAGE_FAILURE`],
/// is a second with headroom: scaling out could not overload it, and there was no outage to
/// wait out. A hold then protects nothing (a hold while the fleet drains a backlog at the
/// dependency's capacity, or during an outage, does).
pub const HEADROOM_LOAD: f64 = 0.9;
/// Load-independent failures above this are an outage whose end is worth waiting for: the
/// worker library's default highest failure floor (`floorMax`).
pub const OUTAGE_FAILURE: f64 = backpressure_api::defaults::FLOOR_MAX;

impl Summary {
    /// DLQ messages per failed call.
    pub fn dlq_per_failed_attempt(&self) -> Option<f64> {
        (self.failed_attempts > 0).then(|| self.dead_lettered as f64 / self.failed_attempts as f64)
    }
}

fn window_range(samples: &[Sample], start: f64, end: f64) -> std::ops::Range<usize> {
    // Sample i covers second [i, i+1).
    let a = (start.max(0.0).floor() as usize).min(samples.len());
    let b = (end.max(0.0).ceil() as usize).clamp(a, samples.len());
    a..b
}

/// Computes the summary of a run.
pub fn summarize(scenario: &Scenario, timeline: &Timeline, run: &RunOutput) -> Summary {
    let samples = &run.samples;
    let incident = scenario.incident;
    let (w_start, w_end) = incident.map_or((0.0, scenario.duration.secs()), |w| {
        (w.start.secs(), w.end.secs())
    });
    let win = window_range(samples, w_start, w_end);

    // Failure rate.
    let (att, fail) = samples[win.clone()].iter().fold((0u64, 0u64), |(a, f), s| {
        (a + u64::from(s.attempts), f + u64::from(s.failures))
    });
    let failure_rate = (att > 0).then(|| fail as f64 / att as f64);
    let failure_rate_peak = rolling_max_ratio(samples, 300, |s| (s.failures, s.attempts), 100);

    // Goodput.
    let g = scenario.goodput_window();
    let gw = window_range(samples, g.start.secs(), g.end.secs());
    let done: u64 = samples[gw.clone()]
        .iter()
        .map(|s| u64::from(s.completed))
        .sum();
    let arrived: u64 = samples[gw.clone()]
        .iter()
        .map(|s| u64::from(s.arrivals))
        .sum();
    let backlog_at_start = if gw.start == 0 {
        0.0
    } else {
        samples[gw.start - 1].depth as f64
    };
    let servable_by_dep: f64 = gw
        .clone()
        .map(|i| {
            let t = i as f64 + 0.5;
            timeline.capacity(t) * (1.0 - timeline.failure_probability(t))
        })
        .sum();
    let servable = servable_by_dep.min(backlog_at_start + arrived as f64);
    let goodput = (servable > 0.0).then(|| done as f64 / servable);
    let (g_att, g_rej) = samples[gw.clone()].iter().fold((0u64, 0u64), |(a, r), s| {
        (a + u64::from(s.attempts), r + u64::from(s.rejected))
    });
    let overload_rate = (g_att > 0).then(|| g_rej as f64 / g_att as f64);

    // Ages.
    let max_age = samples
        .iter()
        .map(|s| f64::from(s.queue_age))
        .fold(0.0, f64::max)
        .max(run.first_wait.max() as f64 * run.tick);
    let p99_wait = run.first_wait.quantile(0.99) as f64 * run.tick;

    // Drain and load after recovery.
    let mut drain = None;
    let mut peak_load_after_recovery = None;
    if let Some(w) = incident {
        let t_r = w.end.secs();
        let r = (t_r.round() as usize).min(samples.len().saturating_sub(1));
        let pre = window_range(samples, w.start.secs() - 600.0, w.start.secs());
        let base_depth = if pre.is_empty() {
            0.0
        } else {
            samples[pre.clone()]
                .iter()
                .map(|s| s.depth as f64)
                .sum::<f64>()
                / pre.len() as f64
        };
        let threshold = (2.0 * base_depth).max(2.0 * timeline.arrival_rate(t_r));
        if let Some(at_r) = samples.get(r) {
            let backlog = at_r.depth as f64 - base_depth;
            if at_r.depth as f64 > threshold {
                let secs = samples[r..]
                    .iter()
                    .position(|s| (s.depth as f64) <= threshold)
                    .map(|k| k as f64);
                drain = Some(Drain {
                    backlog,
                    secs,
                    min_secs: theoretical_drain(scenario, timeline, t_r, backlog),
                });
            }
        }
        let after = window_range(samples, t_r, t_r + 600.0);
        peak_load_after_recovery = peak_ratio(&samples[after], 30);
    }

    // Producers and the broker.
    let system_drain = incident.and_then(|w| system_drain(scenario, timeline, samples, w));
    let restricted_secs = run.producer_control.then(|| {
        samples
            .iter()
            .filter(|s| s.producer_state.is_some_and(|p| p != ProducerState::Open))
            .count() as f64
    });
    let restrictions = run
        .producer_log
        .iter()
        .filter(|l| matches!(l.state, ProducerState::Paused | ProducerState::Throttled))
        .count() as u32;
    let reopened_after = incident.and_then(|w| {
        run.producer_log
            .iter()
            .rev()
            .find(|l| l.state == ProducerState::Open && l.t >= w.end.secs())
            .map(|l| l.t - w.end.secs())
    });

    // Replicas and regimes.
    let replica_hours = samples.iter().map(|s| f64::from(s.pods)).sum::<f64>() / 3600.0;
    let max_replicas = samples.iter().map(|s| s.desired).max().unwrap_or(0);
    let added_during_incident = incident.map_or(0, |_| {
        let mut prev = if win.start > 0 {
            samples[win.start - 1].desired
        } else {
            scenario.fleet.replicas
        };
        let mut added = 0;
        for s in &samples[win.clone()] {
            added += s.desired.saturating_sub(prev);
            prev = s.desired;
        }
        added
    });
    let held = |s: &Sample| s.regime == Some(Regime::DependencyFailing);
    let held_secs = samples.iter().filter(|s| held(s)).count() as f64;
    let held_per_hour = if gw.is_empty() {
        0.0
    } else {
        samples[gw.clone()].iter().filter(|s| held(s)).count() as f64 * 3600.0 / gw.len() as f64
    };
    let held_after_recovery = incident.map(|w| {
        let after = window_range(samples, w.end.secs(), f64::INFINITY);
        samples[after].iter().filter(|s| held(s)).count() as f64
    });
    let headroom = |i: usize, s: &Sample| {
        f64::from(s.attempts) < HEADROOM_LOAD * f64::from(s.capacity)
            && timeline.failure_probability(i as f64 + 0.5) <= OUTAGE_FAILURE
    };
    let held_idle = |range: std::ops::Range<usize>| {
        range
            .filter(|&i| held(&samples[i]) && headroom(i, &samples[i]))
            .count() as f64
    };
    let held_with_headroom_per_hour = if gw.is_empty() {
        0.0
    } else {
        held_idle(gw.clone()) * 3600.0 / gw.len() as f64
    };
    let held_with_headroom_after_recovery =
        incident.map(|w| held_idle(window_range(samples, w.end.secs(), f64::INFINITY)));
    let held_fraction_incident = (incident.is_some() && !win.is_empty())
        .then(|| samples[win.clone()].iter().filter(|s| held(s)).count() as f64 / win.len() as f64);
    let (thr, rdy) = samples.iter().fold((0u64, 0u64), |(t, r), s| {
        (t + u64::from(s.throttled), r + u64::from(s.ready))
    });
    let throttled_fraction = if rdy > 0 {
        thr as f64 / rdy as f64
    } else {
        0.0
    };
    let max_backoff = samples
        .iter()
        .map(|s| f64::from(s.backoff))
        .fold(0.0, f64::max);
    let t_r = incident.map_or(f64::INFINITY, |w| w.end.secs());
    let ramp_stages = run
        .decisions
        .iter()
        .filter(|d| d.t >= t_r && d.decision.action == Some(Action::RampStage))
        .count() as u32;
    let ramp_aborts = run
        .decisions
        .iter()
        .filter(|d| d.decision.action == Some(Action::AbortRamp))
        .count() as u32;

    Summary {
        produced: run.produced,
        completed: run.completed,
        dead_lettered: run.dead_lettered,
        attempts: run.attempts,
        failed_attempts: run.failed_attempts,
        goodput,
        failure_rate,
        failure_rate_peak,
        max_age,
        p99_wait,
        drain,
        peak_load_after_recovery,
        replica_hours,
        max_replicas,
        added_during_incident,
        held_secs,
        held_fraction_incident,
        throttled_fraction,
        max_backoff,
        ramp_stages,
        ramp_aborts,
        overload_rate,
        held_per_hour,
        held_after_recovery,
        held_with_headroom_per_hour,
        held_with_headroom_after_recovery,
        demanded: run.demanded,
        broker_rejected: run.broker_rejected,
        lost_to_broker: run.lost_to_broker,
        peak_depth: run.peak_depth,
        peak_producer_backlog: run.peak_producer_backlog,
        max_end_to_end: run.end_to_end.max() as f64 * run.tick,
        p99_end_to_end: run.end_to_end.quantile(0.99) as f64 * run.tick,
        system_drain,
        restricted_secs,
        producer_changes: run.producer_log.len() as u32,
        restrictions,
        reopened_after,
    }
}

/// The drain of the broker queue and the producer backlog together after the incident `w`
/// (see the module docs); `None` when neither is above its pre-incident level at recovery.
fn system_drain(
    scenario: &Scenario,
    timeline: &Timeline,
    samples: &[Sample],
    w: Window,
) -> Option<Drain> {
    let t_r = w.end.secs();
    let r = (t_r.round() as usize).min(samples.len().checked_sub(1)?);
    let pre = window_range(samples, w.start.secs() - 600.0, w.start.secs());
    let mean = |f: fn(&Sample) -> u64| {
        if pre.is_empty() {
            0.0
        } else {
            samples[pre.clone()]
                .iter()
                .map(|s| f(s) as f64)
                .sum::<f64>()
                / pre.len() as f64
        }
    };
    let (base_depth, base_held) = (mean(|s| s.depth), mean(|s| s.producer_backlog));
    let floor = 2.0 * timeline.arrival_rate(t_r);
    let (max_depth, max_held) = ((2.0 * base_depth).max(floor), (2.0 * base_held).max(floor));
    let drained = |s: &Sample| s.depth as f64 <= max_depth && s.producer_backlog as f64 <= max_held;
    let at_r = samples.get(r)?;
    if drained(at_r) {
        return None;
    }
    let backlog = (at_r.depth + at_r.producer_backlog) as f64 - base_depth - base_held;
    Some(Drain {
        backlog,
        secs: samples[r..].iter().position(drained).map(|k| k as f64),
        min_secs: theoretical_drain(scenario, timeline, t_r, backlog),
    })
}

/// Highest ratio num/den over sliding windows of `len` samples whose denominator is at least
/// `min_den`.
fn rolling_max_ratio(
    samples: &[Sample],
    len: usize,
    f: impl Fn(&Sample) -> (u32, u32),
    min_den: u64,
) -> Option<f64> {
    if samples.len() < len {
        return None;
    }
    let (mut num, mut den) = (0u64, 0u64);
    let mut best: Option<f64> = None;
    for i in 0..samples.len() {
        let (n, d) = f(&samples[i]);
        num += u64::from(n);
        den += u64::from(d);
        if i >= len {
            let (n0, d0) = f(&samples[i - len]);
            num -= u64::from(n0);
            den -= u64::from(d0);
        }
        if i + 1 >= len && den >= min_den {
            let r = num as f64 / den as f64;
            best = Some(best.map_or(r, |b: f64| b.max(r)));
        }
    }
    best
}

/// Highest calls/capacity over sliding windows of `len` seconds.
fn peak_ratio(samples: &[Sample], len: usize) -> Option<f64> {
    if samples.len() < len {
        return None;
    }
    let (mut calls, mut cap) = (0.0f64, 0.0f64);
    let mut best: Option<f64> = None;
    for i in 0..samples.len() {
        calls += f64::from(samples[i].attempts);
        cap += f64::from(samples[i].capacity);
        if i >= len {
            calls -= f64::from(samples[i - len].attempts);
            cap -= f64::from(samples[i - len].capacity);
        }
        if i + 1 >= len && cap > 0.0 {
            let r = calls / cap;
            best = Some(best.map_or(r, |b: f64| b.max(r)));
        }
    }
    best
}

/// The shortest time to serve `backlog` extra messages after `t_r`, at the best rate the system
/// could reach (dependency capacity net of failures, capped by the largest fleet), while new
/// messages keep arriving.
pub fn theoretical_drain(scenario: &Scenario, timeline: &Timeline, t_r: f64, backlog: f64) -> f64 {
    let w = &scenario.workers;
    let d = &scenario.dependency;
    let service = w.processing.mean.secs() + d.latency.mean.secs();
    let fleet_rate =
        f64::from(scenario.fleet.max_replicas) * f64::from(w.max_permits) / service.max(1e-9);
    let mut served = 0.0;
    let mut t = t_r;
    let horizon = t_r + 7.0 * 86400.0;
    while served < backlog && t < horizon {
        let serve = (timeline.capacity(t + 0.5) * (1.0 - timeline.failure_probability(t + 0.5)))
            .min(fleet_rate);
        served += serve - timeline.arrival_rate(t + 0.5);
        t += 1.0;
    }
    t - t_r
}
