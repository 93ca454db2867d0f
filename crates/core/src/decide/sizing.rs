//! Backlog sizing (what a backlog-only autoscaler would pick), HPA-style step limits and the
//! scale-down stabilization window.
//!
//! # Backlog sizing
//!
//! Notation: `c` current replicas (from `/scale`), `r` ready pods, `λ` arrival rate, `μ` fleet
//! completion rate (messages/s), `D` queue depth, `A` queue age (the oldest message not yet delivered once),
//! `T` `targetQueueAge`, `tol` = [`TOLERANCE`] (0.1, the HPA default).
//!
//! * Per-pod throughput `p = μ / r` (known when `r > 0` and `μ > 0`).
//! * Backlog `B = D`, or `λ·A` (Little's law) when the depth is unknown.
//! * Capacity needed to keep the age at or below `T`: `need = max(λ, B / T)`. Serving `B / T`
//!   clears today's backlog within one target age; serving `λ` keeps up with arrivals. (Equal
//!   to `λ + max(0, B − λ·T) / T`: only the backlog beyond what `T` seconds of arrivals would
//!   leave anyway has to be drained.)
//! * Rate-based size `n_rate = need / p`.
//! * Age-based size (the HPA `Value` rule, used when `p` is unknown and for scale-in):
//!   `n_age = max(c, 1) · A / T` when the age is above target, `c · A / T` when below.
//!
//! The raw recommendation, first rule that applies:
//!
//! 1. `A / T > 1 + tol` (backlogged): `max(c, n_early)` when `n_early` is known (sized by
//!    throughput, so no HPA runaway on a lagging age signal; never a scale-in while the queue is
//!    too old), else `n_age`.
//! 2. `n_early > max(c, 1)·(1 + tol)` while messages wait beyond noise (`A > tol · T`, or with
//!    the age unknown `D > λ · tol · T`): `n_early`. Arrivals or backlog exceed what the fleet
//!    completes before the age reaches the target: scale out early. Without the wait, `λ ≈ μ`
//!    up to the noise of two rate windows, and the ratio alone would add pods on noise.
//!    `n_early = need · r_w / μ` is `n_rate` with the ready pods counted for the share of the
//!    rate window they were ready (`r_w ≤ r`; `Decider::measured_pods`): `μ` right after pods
//!    became ready still counts the time before them, and `need / (μ / r)` took a fleet's own
//!    start (a cold start with a small backlog) for producers outpacing it. Rules 1 and 3 add
//!    pods on the same count: the age above target says pods are missing, not how many, and
//!    `need / (μ / r)` sized a cold start's fleet of the simulator (scenario 15) 2 → 26 for a
//!    load and a start-up backlog that 16 pods serve.
//! 3. `A / T < 1 − tol`: `n_age` (as an HPA on queue age would; the scale-down stabilization
//!    window and step limit temper it), but never below the keep-up size `n_keep = λ / p`
//!    (above `c` only as far as `λ·r_w / μ` agrees, the pods counted as in rule 2)
//!    while the fleet is saturated, `A / T > tol`; see below.
//! 4. `A / T` within tolerance: `c`.
//! 5. Age unknown: `n_rate` when below `c·(1 − tol)` (a draining fleet), else `c`.
//!
//! With `c = 0` and any sign of work (`λ > 0`, `D > 0` or `A > 0`) the result is at least 1.
//! The result is rounded up and clamped to `[minReplicas, maxReplicas]`; that clamped value is
//! `status.replicas.recommended`. Per-pod completion understates capacity while pods are idle,
//! which is why rule 1 only ever scales *out* and scale-in follows the age (rule 3).
//!
//! # The keep-up floor of rule 3
//!
//! The age is not proportional to load: it is ~0 at any utilization below 1 and grows without
//! bound above. So `c · A / T` says "almost no pods needed" as soon as a backlog is cleared,
//! also when the fleet is just keeping up with arrivals, and an age-only scale-in removes pods
//! until a backlog builds again: a sawtooth (in the simulator, a steady 5x surge shrank the
//! fleet 40 → 25 and back every ~9.5 minutes). The floor stops that scale-in where it starts to
//! hurt: while first-attempt messages wait longer than the tolerance allows for noise
//! (`A > tol · T`), the pods are busy, `p` is their real throughput, and rule 3 recommends at
//! least `n_keep = λ / p`, the size that keeps up with arrivals (which may exceed `c`: a small,
//! early scale-out). It is applied only then because an unsaturated fleet completes what
//! arrives, `μ ≈ λ`, so `λ / p ≈ r` whatever the spare capacity: as an unconditional floor it
//! would block every scale-in. So the fleet may still scale in below `n_keep` while the age is
//! ~0 (the operator keeps no memory of past throughput), but the first saturated decision
//! stops the shrinking at the keep-up size instead of waiting for the age to pass the target;
//! the cycle shrinks to the few pods between `n_keep` and the stabilized scale-in step.

use std::fmt::Write as _;
use std::time::Duration;

use backpressure_api::v1alpha1::RecommendationPoint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::FleetMetrics;
use super::time::{elapsed_at_least, minus};
use crate::resolve::{EffectiveScaleDown, EffectiveScaleUp, EffectiveScaling};

/// The HPA's default tolerance: ratios within ±10% of target cause no scaling.
pub const TOLERANCE: f64 = 0.1;

/// A backlog-only sizing of the fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct Sizing {
    /// The recommendation clamped to `[minReplicas, maxReplicas]`.
    pub replicas: i32,
    /// The recommendation before clamping.
    pub raw: i32,
    /// The queue needs more than it gets: age above target (beyond tolerance) or a raw
    /// recommendation above the current replicas.
    pub backlogged: bool,
    /// How the number was found, in words and numbers.
    pub basis: String,
    /// A scale-out the rates ask for before the age does (rule 2, or rule 3's keep-up floor
    /// above the current replicas), for a fleet that has pods.
    pub early: bool,
}

/// The most replicas that can work at once, whatever the backlog: a Kafka consumer group gives
/// each partition to one consumer, so consumers beyond the partition count idle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerCap {
    /// The cap (at least 1).
    pub replicas: i32,
    /// Why, for the decision message (`topic orders has 12 partitions (spec.queue.kafka.partitions)`).
    pub why: String,
}

/// Sizes the fleet from the queue, or `None` when neither the age nor the rates are known. The
/// recommendation is clamped to `[minReplicas, maxReplicas]` and, with a `cap`, to at most
/// `cap.replicas` (never below `minReplicas`, which the object sets on purpose); the basis says
/// which bound applied. `counted` is the ready pods the completion rate stands for (fewer than
/// `ready` right after a rise: `Decider::measured_pods`), which rule 2 sizes with.
pub fn size(
    scaling: &EffectiveScaling,
    current: i32,
    ready: i32,
    counted: f64,
    fleet: &FleetMetrics,
    cap: Option<&ConsumerCap>,
) -> Option<Sizing> {
    let t = scaling.target_queue_age.as_secs_f64();
    let c = f64::from(current.max(0));
    let c_ref = c.max(1.0);
    let (up, down) = (1.0 + TOLERANCE, 1.0 - TOLERANCE);

    let per_pod = match (fleet.completion_rate, ready) {
        (Some(mu), r) if r > 0 && mu > 0.0 => Some(mu / f64::from(r)),
        _ => None,
    };
    let backlog = fleet
        .queue_depth
        .or_else(|| Some(fleet.arrival_rate? * fleet.queue_age?));
    let need = fleet
        .arrival_rate
        .map(|lambda| lambda.max(backlog.unwrap_or(0.0) / t));
    let n_rate = match (need, per_pod) {
        (Some(need), Some(p)) => Some(need / p),
        _ => None,
    };
    // Rules 2 and 3 add pods on the rates alone, before the age asks for them: with the pods
    // counted for the share of the rate window they were ready.
    let per_counted = match fleet.completion_rate {
        Some(mu) if counted > 0.0 && mu > 0.0 => Some(mu / counted.min(f64::from(ready))),
        _ => None,
    };
    let early = match (need, per_counted) {
        (Some(need), Some(p)) => Some(need / p),
        _ => None,
    };
    let ratio = fleet.queue_age.map(|a| a / t);

    let busy = fleet.arrival_rate.is_some_and(|l| l > 0.0)
        || fleet.queue_depth.is_some_and(|d| d > 0.0)
        || fleet.queue_age.is_some_and(|a| a > 0.0);

    let mut basis = String::new();
    let raw = if let Some(r) = ratio.filter(|r| *r > up) {
        let age = fleet.queue_age.unwrap_or_default();
        match early {
            Some(n) if n > c => {
                counted_basis(
                    &mut basis,
                    fleet,
                    backlog,
                    t,
                    per_counted,
                    counted,
                    ready,
                    n,
                );
                n
            }
            Some(_) => {
                let _ = write!(
                    basis,
                    "queue age {age:.0}s > target {t:.0}s, but the fleet's throughput clears \
                     the backlog within the target"
                );
                c
            }
            None => {
                let _ = write!(
                    basis,
                    "queue age {age:.0}s / target {t:.0}s × {c_ref:.0} replicas = {:.1} \
                     (completion per pod unknown)",
                    c_ref * r
                );
                c_ref * r
            }
        }
    } else if let Some(n) = early.filter(|n| *n > c_ref * up && waiting(fleet, t)) {
        counted_basis(
            &mut basis,
            fleet,
            backlog,
            t,
            per_counted,
            counted,
            ready,
            n,
        );
        n
    } else if let Some(r) = ratio.filter(|r| *r < down) {
        let age = fleet.queue_age.unwrap_or_default();
        let _ = write!(
            basis,
            "queue age {age:.0}s / target {t:.0}s × {c:.0} replicas = {:.1}",
            c * r
        );
        // The floor keeps pods with the ready pods' rate; it adds pods (above `c`) only as far
        // as the counted pods' rate agrees (rule 2's reason).
        let floor = keep_up(fleet, per_pod).map(|k| {
            if k > c {
                keep_up(fleet, per_counted).map_or(c, |a| a.min(k)).max(c)
            } else {
                k
            }
        });
        match floor.filter(|k| r > TOLERANCE && *k > c * r) {
            Some(k) => {
                let _ = write!(
                    basis,
                    ", but saturated (age > {:.0}% of target): arrivals {}/s at {}/s per ready \
                     pod need {k:.1}",
                    TOLERANCE * 100.0,
                    num(fleet.arrival_rate.unwrap_or_default()),
                    num(per_pod.unwrap_or_default()),
                );
                k
            }
            None => c * r,
        }
    } else if let Some(r) = ratio {
        let _ = write!(
            basis,
            "queue age {:.0}s within {:.0}% of target {t:.0}s",
            r * t,
            TOLERANCE * 100.0
        );
        c
    } else if let Some(n) = n_rate {
        if n < c * down {
            rate_basis(&mut basis, fleet, backlog, t, per_pod, f64::from(ready), n);
            n
        } else {
            let _ = write!(
                basis,
                "throughput matches arrivals within {:.0}% (queue age unknown)",
                TOLERANCE * 100.0
            );
            c
        }
    } else if current <= 0 && busy {
        let _ = write!(basis, "work is waiting and no replica runs");
        1.0
    } else {
        return None;
    };

    let mut raw = ceil_to_i32(raw);
    if current <= 0 && busy {
        raw = raw.max(1);
    }
    let bounded = raw.clamp(scaling.min_replicas, scaling.max_replicas);
    let replicas = match cap {
        Some(c) if bounded > c.replicas => c.replicas.max(scaling.min_replicas).min(bounded),
        _ => bounded,
    };
    let backlogged = ratio.is_some_and(|r| r > up) || raw > current;
    let early = current > 0 && raw > current && !ratio.is_some_and(|r| r > up);
    let _ = write!(basis, " → {raw}");
    match cap {
        Some(c) if replicas < bounded => {
            let _ = write!(
                basis,
                ", capped at {replicas}: {}, and more consumers than partitions idle",
                c.why
            );
        }
        _ if replicas != raw => {
            let _ = write!(
                basis,
                ", clamped to {replicas} by [{}, {}]",
                scaling.min_replicas, scaling.max_replicas
            );
        }
        _ => {}
    }
    Some(Sizing {
        replicas,
        raw,
        backlogged,
        basis,
        early,
    })
}

/// Whether messages wait beyond noise, the condition of rule 2: the age is above `tol · T`
/// (the saturation test of rule 3's keep-up floor) or, with the age unknown, the depth is above
/// the `λ · tol · T` that many seconds of arrivals leave in the queue (Little's law). With
/// neither known it says yes, as before the check existed.
///
/// A fleet that keeps up completes what arrives, so `λ / μ` wanders around 1 with the noise of
/// two counters over one rate window (±10% at 200 events per window), and rule 2 alone would
/// add a pod on noise. A fleet that does not keep up leaves messages waiting at once: a surge
/// saturates the pods and the age passes `tol · T` within about that many seconds.
fn waiting(fleet: &FleetMetrics, t: f64) -> bool {
    match (fleet.queue_age, fleet.queue_depth, fleet.arrival_rate) {
        (Some(a), _, _) => a > TOLERANCE * t,
        (None, Some(d), Some(lambda)) => d > lambda * TOLERANCE * t,
        _ => true,
    }
}

/// `n_keep = λ / p`: the replicas that keep up with arrivals at the measured per-pod completion
/// rate, when both are known.
/// [`rate_basis`] on the pods counted (rules 1 and 2), saying so when fewer than the ready ones.
#[allow(clippy::too_many_arguments)]
fn counted_basis(
    basis: &mut String,
    fleet: &FleetMetrics,
    backlog: Option<f64>,
    t: f64,
    per_counted: Option<f64>,
    counted: f64,
    ready: i32,
    n: f64,
) {
    rate_basis(basis, fleet, backlog, t, per_counted, counted, n);
    if counted < f64::from(ready) {
        let _ = write!(
            basis,
            " (of {ready} ready pods: those ready for part of the rate window count for that \
             part)"
        );
    }
}

fn keep_up(fleet: &FleetMetrics, per_pod: Option<f64>) -> Option<f64> {
    Some(fleet.arrival_rate? / per_pod?)
}

fn rate_basis(
    out: &mut String,
    fleet: &FleetMetrics,
    backlog: Option<f64>,
    t: f64,
    per_pod: Option<f64>,
    pods: f64,
    n: f64,
) {
    let lambda = fleet.arrival_rate.unwrap_or_default();
    let _ = write!(out, "arrivals {}/s", num(lambda));
    if let Some(b) = backlog {
        let _ = write!(
            out,
            ", backlog {} ({}/s to serve it within {t:.0}s)",
            num(b),
            num(b / t)
        );
    }
    let _ = write!(
        out,
        " at {}/s per ready pod ({}/s over {}) = {n:.1}",
        num(per_pod.unwrap_or_default()),
        num(fleet.completion_rate.unwrap_or_default()),
        num(pods),
    );
}

/// A number for humans: integers without decimals, otherwise up to two decimals.
pub(crate) fn num(x: f64) -> String {
    if (x - x.round()).abs() < 0.005 {
        format!("{:.0}", x.round())
    } else if x.abs() >= 10.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// Rounds up, tolerating floating-point noise (13.000000001 is 13), saturating at `i32::MAX`.
pub(crate) fn ceil_to_i32(x: f64) -> i32 {
    if !x.is_finite() {
        return if x > 0.0 { i32::MAX } else { 0 };
    }
    let c = (x - 1e-9).ceil();
    if c >= f64::from(i32::MAX) {
        i32::MAX
    } else if c <= 0.0 {
        0
    } else {
        c as i32
    }
}

/// The most replicas one scale-up step may reach from `current`: the larger of `maxPods`
/// added and `maxPercent` added (rounded up), as the HPA's `selectPolicy: Max`.
pub fn scale_up_limit(current: i32, up: &EffectiveScaleUp) -> i32 {
    let c = i64::from(current.max(0));
    let by_pods = c + i64::from(up.max_pods);
    let by_percent = (c * (100 + i64::from(up.max_percent)) + 99) / 100;
    i32::try_from(by_pods.max(by_percent)).unwrap_or(i32::MAX)
}

/// The fewest replicas one scale-down step may reach from `current`: `maxPercent` removed,
/// rounded as the HPA does (the remaining count rounded down).
pub fn scale_down_limit(current: i32, down: &EffectiveScaleDown) -> i32 {
    let c = i64::from(current.max(0));
    let kept = c * (100 - i64::from(down.max_percent.clamp(0, 100))) / 100;
    i32::try_from(kept).unwrap_or(0)
}

/// Whether a period that started at `last` is over at `now` (no `last`: yes).
pub(crate) fn period_over(last: Option<&Time>, period: Duration, now: Timestamp) -> bool {
    last.is_none_or(|t| elapsed_at_least(t.0, now, period))
}

/// Adds `recommendation` made at `now` to the change points, drops points that left the
/// `window`, and returns the highest recommendation in the window (the HPA's scale-down
/// stabilization).
///
/// The points form a strictly decreasing sequence of `replicas`: a new recommendation removes
/// every earlier point it equals or exceeds (they can never again be the maximum) and takes
/// over the `since` of the earliest one it removed, so that the point before keeps its true
/// end. A point leaves the window when the next point started at or before `now - window`. A
/// recommendation equal to the last point changes nothing, so a steady state leaves the list
/// (and the status) untouched.
pub fn stabilize(
    points: &mut Vec<RecommendationPoint>,
    recommendation: i32,
    now: Timestamp,
    window: Duration,
) -> i32 {
    if points.last().map(|p| p.replicas) != Some(recommendation) {
        let mut since = now;
        while let Some(last) = points.last() {
            if last.replicas > recommendation {
                break;
            }
            since = last.since.0;
            points.pop();
        }
        points.push(RecommendationPoint {
            since: Time(since),
            replicas: recommendation,
        });
    }
    let cutoff = minus(now, window);
    while points.len() >= 2 && points[1].since.0 <= cutoff {
        points.remove(0);
    }
    points.first().map_or(recommendation, |p| p.replicas)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::decide::fixtures::{at, effective, fleet};

    #[test]
    fn design_example_sizes_to_fourteen() {
        // A worked example: 8 replicas, 300/s arriving, 180/s completing, depth 12000, age 412s.
        let eff = effective(|s| s.max_replicas = 50);
        let f = FleetMetrics {
            queue_age: Some(412.0),
            queue_depth: Some(12000.0),
            arrival_rate: Some(300.0),
            completion_rate: Some(180.0),
            ..fleet(0.0)
        };
        let s = size(&eff.scaling, 8, 8, 8.0, &f, None).unwrap();
        assert_eq!(s.replicas, 14, "{}", s.basis);
        assert!(s.backlogged);
        assert!(s.basis.contains("22.5/s per ready pod"), "{}", s.basis);
    }

    #[test]
    fn table() {
        let eff = effective(|s| {
            s.min_replicas = 0;
            s.max_replicas = 100;
        });
        // (name, current, ready, age, depth, arrival, completion, want)
        type Case = (
            &'static str,
            i32,
            i32,
            Option<f64>,
            Option<f64>,
            Option<f64>,
            Option<f64>,
            Option<i32>,
        );
        let cases: Vec<Case> = vec![
            (
                "steady healthy fleet keeps its size",
                10,
                10,
                Some(60.0),
                Some(100.0),
                Some(100.0),
                Some(100.0),
                Some(10),
            ),
            (
                "arrivals outpace completions by 50%",
                10,
                10,
                Some(30.0),
                Some(100.0),
                Some(150.0),
                Some(100.0),
                Some(15),
            ),
            (
                "arrivals 11% above completions, nothing waits: noise, no scale-out",
                2,
                2,
                Some(0.05),
                Some(2.0),
                Some(20.0),
                Some(18.0),
                Some(1),
            ),
            (
                "arrivals 11% above completions, messages wait: scale out early",
                2,
                2,
                Some(7.0),
                Some(140.0),
                Some(20.0),
                Some(18.0),
                Some(3),
            ),
            (
                "age unknown, arrivals above completions, depth within noise: keeps its size",
                2,
                2,
                None,
                Some(5.0),
                Some(20.0),
                Some(18.0),
                Some(2),
            ),
            (
                "age unknown, arrivals above completions, depth growing: scale out early",
                2,
                2,
                None,
                Some(500.0),
                Some(20.0),
                Some(18.0),
                Some(3),
            ),
            (
                "idle queue: age-based scale-in",
                10,
                10,
                Some(6.0),
                Some(0.0),
                Some(50.0),
                Some(50.0),
                Some(1),
            ),
            (
                "age 30/60 halves",
                10,
                10,
                Some(30.0),
                None,
                None,
                None,
                Some(5),
            ),
            (
                "unknown per-pod: HPA ratio",
                4,
                0,
                Some(120.0),
                None,
                Some(10.0),
                None,
                Some(8),
            ),
            (
                "age above, rates say enough",
                10,
                10,
                Some(120.0),
                Some(10.0),
                Some(10.0),
                Some(100.0),
                Some(10),
            ),
            (
                "within tolerance",
                10,
                10,
                Some(63.0),
                None,
                None,
                None,
                Some(10),
            ),
            (
                "draining, age unknown",
                10,
                10,
                None,
                Some(0.0),
                Some(20.0),
                Some(100.0),
                Some(2),
            ),
            ("nothing known", 10, 10, None, Some(5.0), None, None, None),
            (
                "zero replicas with work",
                0,
                0,
                None,
                Some(5.0),
                Some(1.0),
                None,
                Some(1),
            ),
            (
                "zero replicas, age known",
                0,
                0,
                Some(10.0),
                None,
                None,
                None,
                Some(1),
            ),
            (
                "zero replicas, empty queue",
                0,
                0,
                Some(0.0),
                Some(0.0),
                Some(0.0),
                None,
                Some(0),
            ),
            (
                "saturated under target: keep-up floor, a small scale-out",
                30,
                30,
                Some(30.0),
                Some(15000.0),
                Some(500.0),
                Some(480.0),
                Some(32),
            ),
            (
                "saturated, keep-up below the age size: the age size",
                30,
                30,
                Some(50.0),
                Some(3000.0),
                Some(100.0),
                Some(480.0),
                Some(25),
            ),
            (
                "caught up (age within tolerance of 0): no floor, age-based scale-in",
                40,
                40,
                Some(0.5),
                Some(0.0),
                Some(500.0),
                Some(500.0),
                Some(1),
            ),
            (
                "clamped to max",
                10,
                10,
                Some(600.0),
                Some(1e6),
                Some(1000.0),
                Some(10.0),
                Some(100),
            ),
        ];
        for (name, c, r, age, depth, arrival, completion, want) in cases {
            let f = FleetMetrics {
                queue_age: age,
                queue_depth: depth,
                arrival_rate: arrival,
                completion_rate: completion,
                ..fleet(0.0)
            };
            let got = size(&eff.scaling, c, r, f64::from(r), &f, None);
            assert_eq!(got.as_ref().map(|s| s.replicas), want, "{name}: {got:?}");
        }
    }

    #[test]
    fn step_limits_match_the_hpa() {
        let up = EffectiveScaleUp {
            max_pods: 4,
            max_percent: 100,
            period: Duration::from_secs(15),
        };
        assert_eq!(scale_up_limit(1, &up), 5, "4 pods beat 100% of 1");
        assert_eq!(scale_up_limit(10, &up), 20, "100% beats 4 pods");
        assert_eq!(scale_up_limit(0, &up), 4);
        let up50 = EffectiveScaleUp {
            max_percent: 50,
            max_pods: 1,
            ..up
        };
        assert_eq!(scale_up_limit(3, &up50), 5, "ceil(4.5)");
        let down = EffectiveScaleDown {
            max_percent: 10,
            period: Duration::from_secs(60),
            stabilization: Duration::from_secs(300),
        };
        assert_eq!(scale_down_limit(8, &down), 7, "floor(7.2)");
        assert_eq!(scale_down_limit(100, &down), 90);
        assert_eq!(scale_down_limit(1, &down), 0);
    }

    #[test]
    fn stabilization_keeps_the_window_maximum_with_few_points() {
        let w = Duration::from_secs(300);
        let mut pts = Vec::new();
        assert_eq!(stabilize(&mut pts, 10, at(0), w), 10);
        assert_eq!(stabilize(&mut pts, 10, at(15), w), 10);
        assert_eq!(pts.len(), 1, "steady state adds nothing");
        assert_eq!(stabilize(&mut pts, 6, at(30), w), 10);
        assert_eq!(stabilize(&mut pts, 8, at(45), w), 10);
        assert_eq!(stabilize(&mut pts, 5, at(60), w), 10);
        assert_eq!(
            pts.iter().map(|p| p.replicas).collect::<Vec<_>>(),
            vec![10, 8, 5]
        );
        // 10 held until 30s, so it leaves the window at 330s; 8 (since 30s, taking over the
        // 6's start) held until 60s and leaves at 360s.
        assert_eq!(stabilize(&mut pts, 5, at(329), w), 10);
        assert_eq!(stabilize(&mut pts, 5, at(330), w), 8);
        assert_eq!(stabilize(&mut pts, 5, at(360), w), 5);
        assert_eq!(pts.len(), 1);
        // A higher recommendation replaces everything at or below it.
        assert_eq!(stabilize(&mut pts, 9, at(400), w), 9);
        assert_eq!(pts.len(), 1);
        // Zero window: the current recommendation.
        assert_eq!(stabilize(&mut pts, 3, at(401), Duration::ZERO), 3);
    }

    proptest::proptest! {
        /// Whenever the fleet is saturated (age above the tolerance) and throughput is known,
        /// the raw recommendation keeps up with arrivals within the tolerance
        /// (`raw · (1 + tol) >= λ / p`; rule 4 keeps `c` in that band), and below the target
        /// band at least `ceil(λ / p)`; with the age below the tolerance the floor never applies
        /// (scale-in stays possible).
        #[test]
        fn never_below_keep_up_while_saturated(
            current in 1i32..200,
            ready in 1i32..200,
            age in 0.0f64..600.0,
            depth in proptest::option::of(0.0f64..1e6),
            arrival in 0.0f64..5000.0,
            completion in 0.001f64..5000.0,
        ) {
            let eff = effective(|s| {
                s.min_replicas = 0;
                s.max_replicas = 100_000;
            });
            let t = eff.scaling.target_queue_age.as_secs_f64();
            let f = FleetMetrics {
                queue_age: Some(age),
                queue_depth: depth,
                arrival_rate: Some(arrival),
                completion_rate: Some(completion),
                ..fleet(0.0)
            };
            let s = size(&eff.scaling, current, ready, f64::from(ready), &f, None).unwrap();
            let keep = ceil_to_i32(arrival / (completion / f64::from(ready)));
            let k = arrival / (completion / f64::from(ready));
            if age / t > TOLERANCE {
                proptest::prop_assert!(
                    f64::from(s.raw) * (1.0 + TOLERANCE) >= k - 1e-6,
                    "{} vs {k}: {}", s.raw, s.basis
                );
            }
            if age / t > TOLERANCE && age / t < 1.0 - TOLERANCE {
                proptest::prop_assert!(s.raw >= keep, "{} < {keep}: {}", s.raw, s.basis);
            }
            if age / t <= TOLERANCE {
                proptest::prop_assert!(!s.basis.contains("saturated"), "{}", s.basis);
            }
        }

        /// The deque answers exactly what a brute-force maximum over the window answers.
        #[test]
        fn stabilization_matches_brute_force(
            recs in proptest::collection::vec((0i32..20, 1i64..120), 1..80),
            window in 0u64..400,
        ) {
            let window = Duration::from_secs(window);
            let mut pts = Vec::new();
            let mut history: Vec<(i64, i32)> = Vec::new();
            let mut t = 0i64;
            for (rec, dt) in recs {
                t += dt;
                history.push((t, rec));
                let got = stabilize(&mut pts, rec, at(t), window);
                // A recommendation made at t_i holds until t_{i+1}; it is in the window when
                // it still held after now - window.
                let cutoff = t - window.as_secs() as i64;
                let want = history
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| history.get(i + 1).is_none_or(|(end, _)| *end > cutoff))
                    .map(|(_, (_, r))| *r)
                    .max()
                    .unwrap();
                proptest::prop_assert_eq!(got, want);
                proptest::prop_assert!(pts.windows(2).all(|w| w[0].replicas > w[1].replicas));
            }
        }
    }
}
