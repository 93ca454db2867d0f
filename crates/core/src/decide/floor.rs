//! The fleet's failure floor: failures that stayed where they were when the fleet's own load
//! fell by a quarter or more, below the point where an overload's failures would be gone.
//!
//! The workers learn a failure floor from their own experiments (the worker library's
//! `SetPoint` docs): outcomes at minimal concurrency after a full backoff. That takes minutes, and
//! a pod that has not learned it yet throttles as for an overload; meanwhile its backoff holds
//! scale-out for a backlog that more pods would serve (the simulator's scenario 7 held about 15
//! minutes at the start of every load-independent failure, the lab's `partial-failure` run the
//! whole of its 125 s).
//!
//! The fleet as a whole runs the same experiment sooner, and without the confusion that makes a
//! single pod's experiment unreliable: when every pod backs off, the fleet's calls fall, and
//! the dependency's answer to that fall is in the fleet failure rate.
//!
//! - A call rate `a = μ / (1 − f)` (completions `μ` over the share of calls that succeed `1 −
//!   f`): the dependency calls the fleet makes per second (a scale: a message that makes two
//!   calls doubles it, and the test only compares it with itself).
//! - The reference is the highest recent call rate (`status.tracking.loadPeak`), forgotten 10
//!   minutes after the fleet last ran at 80 % of it.
//! - **Evidence** (`status.tracking.floorEvidence`): the call rate is at most `0.8·(1 − s)` of
//!   the reference, and the failure rate is above `0.5 × s` and at most `worker.floorMax`. A
//!   failure rate that has moved by more than `2·√2·σ` since the evidence began (the spread of
//!   a difference of two window estimates, `σ = sqrt(f(1 − f)/n)` with `n = a ×
//!   metrics.rateWindow` calls in a window) starts it again from here.
//! - After two `metrics.rateWindow`s of evidence (so the failure rate covers only calls at the
//!   lower load, twice), the failure rates at its start and now, two windows with no call in
//!   common, are pooled: their mean must be significantly above `1.5 × s` (`mean − 2·σ/√2`
//!   is), or significantly between `0.5 × s` and `0.95 × s` (`mean − 2·σ/√2` above the one,
//!   `mean + 2·σ/√2` under the other; the stability band keeps both windows on the same side
//!   of each bound as their mean); if not, the evidence starts again from now. Then the
//!   fleet's floor is the lower of the two, capped at `worker.floorMax`
//!   (`status.tracking.fleetFloor`; event `FailureFloor`). Pooled rather than each window
//!   tested alone: a small fleet (the lab's 50-100 calls per window at 15 %) passes a
//!   one-window test only about every other window and never gathered its evidence.
//!   Not the lower confidence bound: with it (13.4 % for 15 %) the simulator's scenario 7
//!   aborted its ramp on the first noisy window above the effective set point; not the last
//!   window alone: the lab's 10-s windows at a few calls per second read 22.7 % for 15 %.
//!
//! Why this tells the classes apart. In an **overload** the failures are the calls above what the
//! dependency can take, `f = 1 − C/a`. The reference is at least the overload's equilibrium
//! `C/(1 − s)` (the workers push the calls down to it, no further), so calls at `0.8·(1 − s)` of
//! it are at most `0.8·C` and their overload failures are gone: the evidence breaks. An overload
//! *held* at the workers' equilibrium after the dependency lost capacity (the reference is the
//! calls before the loss) keeps `f` at the set point, on average a little under it (0.97 of it in
//! the simulator's quota overload): a floor under the set point must be significantly under
//! `0.95 × s`, and a floor above it significantly above `1.5 × s`, where the workers' equilibrium
//! does not wobble. A **load-independent** failure stays at `f0` whatever `a` is. An **outage**
//! fails above `floorMax` (most calls fail), and the calls at the end of one fail less and less as
//! capacity returns: the stability band breaks the evidence. **Noise** just under the set point (a
//! background share failing whatever the load, with short bursts over the set point: the
//! simulator's scenario 8) is a floor under the set point: after a burst the workers back off, the
//! calls fall, and the background failures stay where they were. Found, it makes the next burst
//! count against `f0 + s·(1 − f0)` and releases the hold the last one caused (without it, the
//! fleet backoff the bursts leave latched the hold for 37 minutes per hour). Below `0.5 × s` a
//! floor would leave the workers almost all of their set point and is not looked for. The load
//! test is the fleet's: another client of the same dependency that keeps its load while ours falls
//! (a shared overload) can pass it; then the hold still comes back as soon as the failure rate
//! rises above the effective set point (`f0 + s·(1 − f0)`).
//!
//! The floor counts like the workers' own: `decide` uses the higher of the two
//! ([`super::FleetMetrics::effective_set_point`]). It ends when the failure rate falls to the
//! set point or to half the floor, whichever is lower (healed; a floor under the set point
//! sits at the set point's level), or rises above `worker.floorMax` (an outage is not a
//! floor). `floorMax: 0` turns it off with the workers' own floor.

use std::time::Duration;

use backpressure_api::defaults;
use backpressure_api::v1alpha1::{FloorEvidence, LoadPeak, WorkerBackpressureStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::decider::Decider;
use super::time::elapsed;
use crate::resolve::Effective;

/// How long the highest call rate stays the reference after the fleet last ran near it.
const PEAK_MEMORY: Duration = Duration::from_secs(600);
/// "Near" the reference: at least this share of it.
const NEAR_PEAK: f64 = 0.8;
/// The call rate must fall to at most this share of the reference, times `1 − s`: an overload's
/// reference is at least its equilibrium `C/(1 − s)`, so at this share the calls are at most
/// `0.8·C` and its overload failures are gone.
const LOAD_DROP: f64 = 0.8;
/// A floor above the set point must be significantly above this multiple of it (as in the
/// workers): between `s` and `1.5·s` the workers' own equilibrium wobbles.
const ADOPT: f64 = 1.5;
/// A floor under the set point must be significantly above this share of it (less eats too
/// little of the set point to matter) ...
const ADOPT_LOW: f64 = 0.5;
/// ... and significantly under this share of it: an overload held at the workers' equilibrium
/// averages just under the set point (0.97 of it in the simulator's quota overload), and a
/// large fleet's windows are precise enough to make that "significant".
const BELOW_SET_POINT: f64 = 0.95;
/// A floor ends when the failures fall to the set point or to this share of the floor,
/// whichever is lower.
const HEALED: f64 = 0.5;
/// Standard errors of the significance tests.
const Z: f64 = 2.0;
/// Rate windows the evidence must last.
const EVIDENCE_WINDOWS: u32 = 2;

impl Decider<'_> {
    /// Updates the fleet's load test and its floor from this observation (module docs), and
    /// lays the floor over the workers' in `self.fleet`. Returns the floor when it was found
    /// by this observation.
    pub(super) fn learn_floor(&mut self) -> Option<f64> {
        let found = self.step_floor();
        if let Some(f0) = self.tracking.fleet_floor {
            let workers = self.fleet.failure_floor.unwrap_or(0.0);
            self.fleet.failure_floor = Some(workers.max(f0));
        }
        found
    }

    fn step_floor(&mut self) -> Option<f64> {
        let s = self.eff.worker.set_point;
        let max = floor_max(self.eff);
        self.tracking.fleet_floor = trusted(self.eff, self.tracking.fleet_floor);
        let (Some(f), Some(mu)) = (self.fleet.failure_rate, self.fleet.completion_rate) else {
            // Nothing to test with: what was found stands, the evidence does not.
            self.tracking.floor_evidence = None;
            return None;
        };
        if max <= s || f >= 1.0 {
            self.tracking.floor_evidence = None;
            self.tracking.fleet_floor = None;
            return None;
        }
        let now = self.now;
        let calls = mu / (1.0 - f);
        let peak = match self.tracking.load_peak.take() {
            Some(p) if calls <= p.calls => {
                let near = calls >= NEAR_PEAK * p.calls;
                let below_since = match p.below_since {
                    _ if near => None,
                    None => Some(Time(now)),
                    since => since,
                };
                let expired = below_since
                    .as_ref()
                    .is_some_and(|t| elapsed(t.0, now) >= PEAK_MEMORY);
                (!expired).then_some(LoadPeak {
                    calls: p.calls,
                    below_since,
                })
            }
            _ => None,
        }
        .unwrap_or(LoadPeak {
            calls: super::finish::two_significant(calls),
            below_since: None,
        });
        self.tracking.load_peak = Some(peak.clone());

        if let Some(f0) = self.tracking.fleet_floor {
            if f <= s.min(HEALED * f0) || f > max {
                self.tracking.fleet_floor = None;
            }
            self.tracking.floor_evidence = None;
            return None;
        }
        let window = self.eff.metrics.rate_window;
        let n = calls * window.as_secs_f64();
        let sigma = if n > 0.0 {
            (f * (1.0 - f) / n).sqrt()
        } else {
            f64::INFINITY
        };
        let evidence = calls <= LOAD_DROP * (1.0 - s) * peak.calls && f > ADOPT_LOW * s && f <= max;
        if !evidence {
            self.tracking.floor_evidence = None;
            return None;
        }
        // Failures that moved significantly since the evidence began (falling as capacity
        // returns, rising into an outage) start it again from here.
        let band = Z * std::f64::consts::SQRT_2 * sigma;
        if self
            .tracking
            .floor_evidence
            .as_ref()
            .is_some_and(|e| (f - e.failure_rate).abs() > band)
        {
            self.tracking.floor_evidence = None;
        }
        let evidence = self.tracking.floor_evidence.get_or_insert(FloorEvidence {
            since: Time(now),
            failure_rate: round3(f),
        });
        let (since, started) = (evidence.since.0, evidence.failure_rate);
        let needed = EVIDENCE_WINDOWS * window;
        if elapsed(since, now) < needed {
            self.due(super::time::plus(since, needed));
            return None;
        }
        // The windows at the start and now share no call: their mean has the spread of one
        // window over √2, and must be significantly above `1.5·s`, or significantly between
        // `0.5·s` and `0.95·s` (module docs). When it is not, the evidence starts again from
        // this window (a start that straddled the fall of the load reads low and would
        // otherwise weigh on every later test).
        let mean = 0.5 * (f + started);
        let spread = Z * sigma / std::f64::consts::SQRT_2;
        let f0 = round3(f.min(started).min(max));
        // The stability band keeps the two windows within `spread` of their mean, so both are
        // on the side of the bound their mean is.
        let above = mean - spread > ADOPT * s;
        let below = mean - spread > ADOPT_LOW * s && mean + spread < BELOW_SET_POINT * s;
        if !(above || below) || f0 <= ADOPT_LOW * s {
            self.tracking.floor_evidence = Some(FloorEvidence {
                since: Time(now),
                failure_rate: round3(f),
            });
            self.due(super::time::plus(now, needed));
            return None;
        }
        self.tracking.floor_evidence = None;
        self.tracking.fleet_floor = Some(f0);
        Some(f0)
    }
}

/// The highest floor `eff` lets the load test find (`worker.floorMax`, at most
/// [`defaults::MAX_FLOOR_MAX`]).
fn floor_max(eff: &Effective) -> f64 {
    eff.worker
        .floor_max
        .unwrap_or(defaults::FLOOR_MAX)
        .min(defaults::MAX_FLOOR_MAX)
}

/// A floor read from the status, when it is within the bounds the load test writes: finite,
/// above half the set point and at most `floorMax` (a status edited by hand must not lift the set
/// point past what the spec allows).
fn trusted(eff: &Effective, floor: Option<f64>) -> Option<f64> {
    let (s, max) = (eff.worker.set_point, floor_max(eff));
    floor.filter(|f0| f0.is_finite() && *f0 > ADOPT_LOW * s && *f0 <= max)
}

/// The fleet's failure floor in `status` (`status.tracking.fleetFloor`), if it is one the load
/// test could have written for `eff`.
pub fn fleet_floor(eff: &Effective, status: Option<&WorkerBackpressureStatus>) -> Option<f64> {
    trusted(
        eff,
        status
            .and_then(|s| s.tracking.as_ref())
            .and_then(|t| t.fleet_floor),
    )
}

/// The set point the operator pushes to the workers: the spec's `s`, or with a fleet floor
/// `f0` in `status` the effective set point `f0 + s·(1 − f0)`, the one `decide` holds against.
///
/// A worker learns a floor from its own experiments only after a full backoff and minutes of
/// outcomes at minimal concurrency; until then it throttles a load-independent failure as an
/// overload, and a fleet the operator no longer holds serves a fraction of what the dependency
/// could. The fleet's load test answers the same question for every pod at once, so the
/// operator hands its answer on in the one field every worker already obeys. The guarantee of
/// the set point is unchanged for the failures load causes: with a floor `f0`, a worker at
/// `s_eff` keeps the overload failures among the rest at `s`. Old workers and the SDKs need
/// nothing new; the floor's end (the failure rate at `s`, or above `floorMax`) pushes `s` back.
pub fn worker_set_point(eff: &Effective, status: Option<&WorkerBackpressureStatus>) -> f64 {
    let s = eff.worker.set_point;
    fleet_floor(eff, status).map_or(s, |f0| pushed(f0, s))
}

/// The set point pushed over a floor `f0`: `f0 + s·(1 − f0)`, six decimals.
fn pushed(f0: f64, s: f64) -> f64 {
    round6(f0 + s * (1.0 - f0))
}

/// `x` rounded to six decimals: a pushed set point with a stable spelling (and hash).
fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// `x` rounded to three decimals (what `status.tracking` keeps of a failure rate).
fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The `FailureFloor` event of a floor the fleet's load test has just found.
pub(super) fn found_event(f0: f64, state: &Decider<'_>) -> super::DecisionEvent {
    let f = state.fleet.failure_rate.unwrap_or(f0);
    let now = state
        .fleet
        .completion_rate
        .map(|mu| super::finish::two_significant(mu / (1.0 - f).max(1e-9)));
    let peak = state.tracking.load_peak.as_ref().map(|p| p.calls);
    let message = format!(
        "dependency failures stayed at {:.1}% while the fleet's calls fell from {}/s to {}/s: \
         failure floor {:.1}% (load-independent), effective set point {:.1}%; the workers \
         are pushed set point {:.1}% until the failures fall to {:.1}% or rise above {:.1}%",
        f * 100.0,
        peak.map_or("?".to_owned(), |p| p.to_string()),
        now.map_or("?".to_owned(), |p| p.to_string()),
        f0 * 100.0,
        state.fleet.effective_set_point(state.eff.worker.set_point) * 100.0,
        pushed(f0, state.eff.worker.set_point) * 100.0,
        state.eff.worker.set_point.min(HEALED * f0) * 100.0,
        floor_max(state.eff) * 100.0,
    );
    super::DecisionEvent {
        type_: super::EventType::Normal,
        reason: "FailureFloor",
        action: "Classify",
        message,
    }
}
