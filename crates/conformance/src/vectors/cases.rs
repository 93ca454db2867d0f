//! The cases of `controller.json`. Each is a script of calls on a [`Run`]; the traffic of the
//! longer ones comes from [`Run::serve`] with a seeded dependency model, so the file holds the
//! outcomes as plain data.

use backpressure_api::v1alpha1::Algorithm;
use backpressure_api::wire::{BrakeConfig, WorkerConfig};
use backpressure_worker::controller::{Mode, Nanos, Outcome, SplitMix64};

use super::Case;
use super::run::Run;

use Outcome::{DependencyFailure as Dep, MessageFailure as Msg, Success as Ok_};

const fn s(x: u64) -> Nanos {
    Nanos::from_secs(x)
}

const fn ms(x: u64) -> Nanos {
    Nanos::from_millis(x)
}

/// The default payload, with no startup ramp (`initialPermits` 0) unless a case wants it.
fn steady() -> WorkerConfig {
    WorkerConfig {
        initial_permits: Some(0),
        ..WorkerConfig::default()
    }
}

fn brake(min_backoff: f64, expires_at_unix: Option<i64>) -> Option<BrakeConfig> {
    Some(BrakeConfig {
        min_backoff,
        expires_at_unix,
    })
}

/// Always succeeds.
fn healthy() -> impl FnMut(&mut SplitMix64, u32) -> Outcome {
    |_, _| Ok_
}

/// Fails a share `p` of calls whatever the load (and `q` of the messages are bad).
fn bernoulli(p: f64, q: f64) -> impl FnMut(&mut SplitMix64, u32) -> Outcome {
    move |rng, _| {
        let u = rng.next_f64();
        if u < p {
            Dep
        } else if u < p + q {
            Msg
        } else {
            Ok_
        }
    }
}

/// Takes `capacity` concurrent calls; a call made with `k > capacity` in flight fails with
/// probability `(k - capacity) / k` (the share of calls over capacity).
fn capacity(capacity: u32) -> impl FnMut(&mut SplitMix64, u32) -> Outcome {
    move |rng, k| {
        let over = f64::from(k.saturating_sub(capacity)) / f64::from(k.max(1));
        if rng.next_f64() < over { Dep } else { Ok_ }
    }
}

/// Wakes at every change the controller announces (bin starts, the probe) with a `permits`
/// step, until a probe is granted.
fn wake_until_probe(r: &mut Run) {
    for _ in 0..100 {
        let Some(next) = r.next_change() else { break };
        if r.at(next).permits(0) == 1 {
            break;
        }
    }
}

/// Every case, in file order.
pub(super) fn all() -> Vec<Case> {
    vec![
        set_point_startup_ramp(),
        set_point_startup_ramp_large(),
        set_point_steady_success(),
        set_point_noise_under_set_point(),
        set_point_message_failures(),
        set_point_overload_burst(),
        set_point_probing_intervals(),
        set_point_probe_success_slow_start(),
        set_point_slow_start_interrupted(),
        set_point_peak_and_ssthresh(),
        set_point_probe_message_failure_and_empty_poll(),
        set_point_overload_then_recovery(),
        set_point_failure_floor_learned(),
        set_point_floor_outage(),
        set_point_floor_off(),
        set_point_reconfigure(),
        set_point_initial_permits_zero(),
        set_point_initial_permits_at_max(),
        set_point_max_permits_one(),
        set_point_starting_into_probing(),
        set_point_starting_reconfigured(),
        ratio_throttle_window(),
        ratio_throttle_probe_slow_start(),
        ratio_throttle_reconfigure(),
        ratio_throttle_reconfigure_while_probing(),
        ratio_throttle_probe_outcomes(),
        fixed(),
        off(),
        brake_partial(),
        brake_full_stops_probes(),
        brake_expiry_gentle_lift(),
        brake_lowered_then_removed(),
        brake_raised_during_fall(),
        brake_release_zero(),
        brake_expired_on_arrival(),
        algorithm_set_point_to_ratio(),
        algorithm_ratio_to_set_point(),
        algorithm_fixed_off_round_trip(),
        algorithm_change_under_brake(),
    ]
}

fn set_point_startup_ramp() -> Case {
    let mut r = Run::new(
        "set-point-startup-ramp",
        "The default payload (initialPermits absent: 2): the startup window grows by maxPermits/16/w per success against a healthy dependency until it reaches maxPermits (mode starting, then normal); backoff stays 0.",
        7,
        ms(0),
        WorkerConfig::default(),
        s(1),
    );
    r.serve(s(4), ms(100), u32::MAX, &mut healthy(), |_| false);
    r.finish()
}

fn set_point_startup_ramp_large() -> Case {
    let mut r = Run::new(
        "set-point-startup-ramp-large",
        "maxPermits 64, initialPermits 2, healthy: outcomes while the window is at most maxPermits/4 are experiments, so floorEstimate goes from null to 0 (failures clearly under the set point) during the ramp.",
        11,
        ms(0),
        WorkerConfig {
            max_permits: 64,
            reaction: 64,
            initial_permits: Some(2),
            ..WorkerConfig::default()
        },
        s(1),
    );
    r.serve(s(60), ms(100), u32::MAX, &mut healthy(), |r| {
        r.mode() == Mode::Normal
    });
    r.finish()
}

fn set_point_steady_success() -> Case {
    let mut r = Run::new(
        "set-point-steady-success",
        "initialPermits 0: full permits from the start; successes with messages in flight, polls that return fewer messages than granted (releaseUnused), backoff 0 throughout.",
        3,
        ms(0),
        steady(),
        s(1),
    );
    r.serve(s(3), ms(200), 5, &mut healthy(), |_| false);
    r.finish()
}

fn set_point_noise_under_set_point() -> Case {
    let mut r = Run::new(
        "set-point-noise-under-set-point",
        "maxPermits 8, dependency failures at 2 % (set point 5 %) and 5 % message failures: the credit below zero absorbs them and the backoff stays at or near 0.",
        5,
        ms(0),
        WorkerConfig {
            max_permits: 8,
            ..steady()
        },
        s(1),
    );
    r.serve(s(10), ms(250), u32::MAX, &mut bernoulli(0.02, 0.05), |_| {
        false
    });
    r.finish()
}

fn set_point_message_failures() -> Case {
    let mut r = Run::new(
        "set-point-message-failures",
        "Message failures move nothing: not the startup window (starting), not the backoff (normal, after dependency failures spent the credit), not slow start.",
        9,
        ms(0),
        WorkerConfig::default(),
        s(1),
    );
    r.permits(0);
    r.record_n(5, Msg).permits(0);
    r.record_n(3, Ok_).record_n(3, Msg).permits(1);
    // Leave starting: grow the window to maxPermits.
    while r.mode() == Mode::Starting {
        r.record(Ok_);
    }
    r.after(ms(100)).record_n(26, Dep).permits(0);
    r.record_n(10, Msg).permits(2);
    // Full backoff, a successful probe, slow start.
    r.after(ms(100)).record_n(20, Dep).permits(0);
    let due = r.next_change().unwrap_or(r.now());
    r.at(due).permits(0);
    r.after(ms(50)).record(Ok_).permits(0);
    r.record_n(4, Msg).permits(0);
    r.record_n(2, Ok_).permits(3);
    r.finish()
}

fn set_point_overload_burst() -> Case {
    let mut r = Run::new(
        "set-point-overload-burst",
        "From full permits, a burst of dependency failures at one instant: the credit is spent after 20, the backoff rises by 1/N each, the limit follows floor(maxPermits(1-b)), and at limit 0 the controller is probing with backoff 1 and no permit until the first probe is due.",
        13,
        ms(0),
        steady(),
        s(1),
    );
    r.permits(0);
    r.record_n(12, Ok_).permits(4);
    for _ in 0..40 {
        r.record(Dep);
    }
    r.permits(0);
    r.after(ms(500)).permits(0);
    let due = r.next_change().unwrap_or(r.now());
    r.at(due).permits(0);
    r.finish()
}

fn set_point_probing_intervals() -> Case {
    let mut r = Run::new(
        "set-point-probing-intervals",
        "probeInitialMs 1000, probeMaxMs 8000: each failed probe doubles the interval up to the maximum, each wait is the interval times U[0.5,1) from the seeded SplitMix64; permits 1 ns before the probe is due are 0, at the due time 1, and 0 while the probe is in flight.",
        42,
        ms(0),
        WorkerConfig {
            probe_initial_ms: 1000,
            probe_max_ms: 8000,
            ..steady()
        },
        s(1),
    );
    r.record_n(40, Dep).permits(0);
    for _ in 0..9 {
        let Some(due) = r.next_change() else { break };
        r.at(due - Nanos(1)).permits(0);
        r.at(due).permits(0);
        r.permits(1);
        r.after(ms(30)).record(Dep);
    }
    r.finish()
}

fn set_point_probe_success_slow_start() -> Case {
    let mut r = Run::new(
        "set-point-probe-success-slow-start",
        "maxPermits 8: healthy traffic, an outage to full backoff, probes fail for a while, then a probe succeeds: slow start from 2 permits, +1 per success up to ssthresh = max(2, floor(peak/2)) with the peak decaying one permit per 3 s, then normal, and the backoff decays to 0 under success.",
        17,
        ms(0),
        WorkerConfig {
            max_permits: 8,
            ..steady()
        },
        s(1),
    );
    r.serve(s(3), ms(250), u32::MAX, &mut healthy(), |_| false);
    r.serve(s(12), ms(250), u32::MAX, &mut bernoulli(1.0, 0.0), |_| {
        false
    });
    r.serve(s(26), ms(250), u32::MAX, &mut healthy(), |_| false);
    r.finish()
}

fn set_point_slow_start_interrupted() -> Case {
    let mut r = Run::new(
        "set-point-slow-start-interrupted",
        "A successful probe enters slow start; a dependency failure during slow start returns to normal and is integrated (the backoff rises by 1/N).",
        19,
        ms(0),
        WorkerConfig {
            max_permits: 10,
            ..steady()
        },
        s(1),
    );
    r.permits(0);
    r.record_n(40, Dep).permits(0);
    let due = r.next_change().unwrap_or(r.now());
    r.at(due).permits(0);
    r.after(ms(40)).record(Ok_).permits(0);
    r.record(Ok_).record(Ok_).permits(1);
    r.after(ms(40)).record(Dep).permits(0);
    r.record_n(3, Ok_).permits(0);
    r.finish()
}

fn set_point_peak_and_ssthresh() -> Case {
    let mut r = Run::new(
        "set-point-peak-and-ssthresh",
        "The remembered peak of permits decays by one permit per 3 s and is raised to the limit at every outcome recorded in normal mode (a message failure too: here it keeps the peak at 8 after 30 s of decay); entering probing sets ssthresh = max(2, floor(peak/2)) = 4, where slow start ends.",
        131,
        ms(0),
        steady(),
        s(1),
    );
    r.permits(0);
    r.record_n(30, Dep).permits(0);
    r.after(s(30)).record(Msg).permits(0);
    r.record_n(12, Dep).permits(0);
    let due = r.next_change().unwrap_or(r.now());
    r.at(due).permits(0);
    r.after(ms(50)).record(Ok_).permits(0);
    while r.mode() == Mode::SlowStart {
        r.record(Ok_);
    }
    r.permits(0);
    r.finish()
}

fn set_point_probe_message_failure_and_empty_poll() -> Case {
    let mut r = Run::new(
        "set-point-probe-message-failure-and-empty-poll",
        "While probing: a probe grant whose poll comes back empty (releaseUnused 1) is granted again at once; a probe that ends in a message failure lets the next probe go at once without growing the interval; a late dependency failure after a released grant is no probe result.",
        23,
        ms(0),
        steady(),
        s(1),
    );
    r.record_n(40, Dep).permits(0);
    let due = r.next_change().unwrap_or(r.now());
    r.at(due).permits(0);
    r.release(1).permits(0);
    r.after(ms(10)).permits(0);
    r.after(ms(20)).record(Msg).permits(0);
    r.permits(1);
    r.after(ms(20)).release(1);
    r.after(ms(5)).record(Dep).permits(0);
    r.after(ms(20)).record(Dep).permits(0);
    let due = r.next_change().unwrap_or(r.now());
    r.at(due).permits(0);
    r.after(ms(20)).record(Ok_).permits(0);
    r.finish()
}

fn set_point_overload_then_recovery() -> Case {
    let mut r = Run::new(
        "set-point-overload-then-recovery",
        "maxPermits 8 against a dependency with a capacity: healthy (capacity 12), overloaded (capacity 3: the backoff settles where the failure fraction is near the set point), down (every call fails: probing), healthy again (probe, slow start, normal).",
        29,
        ms(0),
        WorkerConfig {
            max_permits: 8,
            ..steady()
        },
        s(1),
    );
    r.serve(s(4), ms(250), u32::MAX, &mut capacity(12), |_| false);
    r.serve(s(24), ms(250), u32::MAX, &mut capacity(3), |_| false);
    r.serve(s(36), ms(250), u32::MAX, &mut bernoulli(1.0, 0.0), |_| {
        false
    });
    r.serve(s(52), ms(250), u32::MAX, &mut capacity(12), |_| false);
    r.finish()
}

fn set_point_failure_floor_learned() -> Case {
    let mut r = Run::new(
        "set-point-failure-floor-learned",
        "A dependency that fails 20 % of calls whatever the load, from a fresh start (initialPermits 2): the startup window stays low (experiments), floorEstimate is null while the test is inconclusive, the backoff reaches 1, probes and slow starts add experiments, and once the failure fraction at minimal concurrency is significantly above the set point and the moving average exceeds 1.5 s a floor is adopted (failureFloor and floorEstimate > 0) and the effective set point rises; 20 minutes later the floor is still kept (hysteresis: its candidate is above the set point though the decayed experiments no longer pass the test); a lower floorMax caps it and a set point above it ends it.",
        31,
        ms(0),
        WorkerConfig::default(),
        s(1),
    );
    r.serve(s(400), ms(200), u32::MAX, &mut bernoulli(0.2, 0.0), |r| {
        r.floor_estimate().is_some_and(|f| f > 0.0)
    });
    let until = r.now() + s(20);
    r.serve(until, ms(200), u32::MAX, &mut bernoulli(0.2, 0.0), |_| {
        false
    });
    // 20 minutes later the experiments have decayed below 30 (no longer significant): the
    // floor is kept while min(fExp, fAvg, floorMax) stays above the set point (hysteresis).
    r.after(s(1200)).record(Ok_).permits(0);
    // A lower floorMax caps the floor; a set point at or above it ends the floor.
    r.after(ms(100)).reconfigure(|c| c.floor_max = Some(0.08));
    r.record(Ok_).permits(0);
    r.after(ms(100)).reconfigure(|c| c.set_point = 0.1);
    r.record(Ok_).record(Dep).permits(0);
    r.finish()
}

fn set_point_floor_outage() -> Case {
    let mut r = Run::new(
        "set-point-floor-outage",
        "Every call fails (an outage) with probeMaxMs 2000: the probes are experiments that all fail, and once 30 (time-decayed) of them are in, floorEstimate goes from null to 0 (above floorMax: an outage, no floor).",
        37,
        ms(0),
        WorkerConfig {
            probe_max_ms: 2000,
            ..steady()
        },
        s(1),
    );
    r.serve(s(200), ms(100), u32::MAX, &mut bernoulli(1.0, 0.0), |r| {
        r.floor_estimate().is_some()
    });
    let until = r.now() + s(3);
    r.serve(until, ms(100), u32::MAX, &mut bernoulli(1.0, 0.0), |_| {
        false
    });
    r.finish()
}

fn set_point_floor_off() -> Case {
    let mut r = Run::new(
        "set-point-floor-off",
        "floorMax 0 turns floor learning off: under the same 20 % load-independent failure the controller backs off fully and probes, failureFloor stays 0 and floorEstimate null.",
        31,
        ms(0),
        WorkerConfig {
            floor_max: Some(0.0),
            ..WorkerConfig::default()
        },
        s(1),
    );
    r.serve(s(45), ms(200), u32::MAX, &mut bernoulli(0.2, 0.0), |_| {
        false
    });
    r.finish()
}

fn set_point_reconfigure() -> Case {
    let mut r = Run::new(
        "set-point-reconfigure",
        "Reconfigure in place keeps the integrator: setPoint (new step sizes), maxPermits down and up (limit and peak follow), reaction; probe bounds changed while probing clamp the current interval (down to a lower maximum, up to a higher initial) without moving the probe already scheduled.",
        43,
        ms(0),
        steady(),
        s(1),
    );
    r.permits(0);
    r.record_n(30, Dep).permits(0);
    r.after(s(1)).reconfigure(|c| c.set_point = 0.2);
    r.record_n(10, Ok_).permits(0);
    r.after(s(1)).reconfigure(|c| c.max_permits = 8);
    r.permits(2);
    r.after(s(1)).reconfigure(|c| c.reaction = 40);
    r.record_n(10, Dep).permits(0);
    r.after(s(1)).reconfigure(|c| c.max_permits = 32);
    r.record_n(20, Dep).permits(0);
    r.record_n(20, Dep).permits(0);
    r.after(ms(100)).reconfigure(|c| {
        c.probe_initial_ms = 500;
        c.probe_max_ms = 1000;
    });
    for _ in 0..3 {
        let Some(due) = r.next_change() else { break };
        r.at(due).permits(0);
        r.after(ms(10)).record(Dep);
    }
    // Bounds above the current interval (1 s): it is clamped up to the new initial 3 s, so
    // the next failed probe waits 6 s x U[0.5, 1).
    r.after(ms(10)).reconfigure(|c| {
        c.probe_initial_ms = 3000;
        c.probe_max_ms = 20_000;
    });
    let due = r.next_change().unwrap_or(r.now());
    r.at(due).permits(0);
    r.after(ms(10)).record(Dep).permits(0);
    let due = r.next_change().unwrap_or(r.now());
    r.at(due - Nanos(1)).permits(0);
    r.at(due).permits(0);
    r.after(ms(10)).reconfigure(|c| {
        c.set_point = 0.05;
        c.max_permits = 4;
    });
    let due = r.next_change().unwrap_or(r.now());
    r.at(due).permits(0);
    r.after(ms(10)).record(Ok_).permits(0);
    r.record_n(3, Ok_).permits(0);
    r.finish()
}

fn set_point_initial_permits_zero() -> Case {
    let mut r = Run::new(
        "set-point-initial-permits-zero",
        "initialPermits 0: no startup ramp, normal at maxPermits from the first call.",
        2,
        ms(0),
        steady(),
        Nanos::ZERO,
    );
    r.permits(0);
    r.permits(5);
    r.record_n(3, Ok_).permits(16);
    r.record(Dep).permits(0);
    r.finish()
}

fn set_point_initial_permits_at_max() -> Case {
    let mut r = Run::new(
        "set-point-initial-permits-at-max",
        "initialPermits at or above maxPermits (40 > 16) starts at maxPermits in normal mode; so does initialPermits equal to maxPermits (after a configure, which does not restart the ramp).",
        4,
        ms(0),
        WorkerConfig {
            initial_permits: Some(40),
            ..WorkerConfig::default()
        },
        s(1),
    );
    r.permits(0);
    r.record_n(2, Ok_).permits(1);
    r.reconfigure(|c| c.initial_permits = Some(16));
    r.permits(0);
    r.finish()
}

fn set_point_max_permits_one() -> Case {
    let mut r = Run::new(
        "set-point-max-permits-one",
        "maxPermits 1 (initialPermits 2 is above it: no ramp): the limit drops to 0 as soon as the integrator is above 0, so the first net failure after the credit enters probing; a probe success leaves slow start at once (ssthresh is capped by maxPermits).",
        6,
        ms(0),
        WorkerConfig {
            max_permits: 1,
            reaction: 5,
            ..WorkerConfig::default()
        },
        s(1),
    );
    r.permits(0);
    r.record_n(4, Dep).permits(0);
    r.record(Dep).permits(0);
    r.record(Dep).permits(0);
    let due = r.next_change().unwrap_or(r.now());
    r.at(due).permits(0);
    r.after(ms(10)).record(Ok_).permits(0);
    r.record_n(3, Ok_).permits(0);
    r.finish()
}

fn set_point_starting_into_probing() -> Case {
    let mut r = Run::new(
        "set-point-starting-into-probing",
        "A fresh controller (initialPermits 4) meets an outage: each dependency failure shrinks the startup window by g(1-s)/s/w (not below 1) and raises the integrator; when the integrator's limit reaches 0 the controller leaves starting for probing.",
        8,
        ms(0),
        WorkerConfig {
            initial_permits: Some(4),
            ..WorkerConfig::default()
        },
        s(1),
    );
    r.permits(0);
    r.record_n(2, Ok_).permits(2);
    for _ in 0..40 {
        r.record(Dep);
    }
    r.permits(0);
    r.finish()
}

fn set_point_starting_reconfigured() -> Case {
    let mut r = Run::new(
        "set-point-starting-reconfigured",
        "During the startup ramp a configure lowers maxPermits below the window: the ramp ends (normal at the new maxPermits); a later raise of maxPermits does not restart it.",
        10,
        ms(0),
        WorkerConfig {
            initial_permits: Some(3),
            max_permits: 32,
            reaction: 32,
            ..WorkerConfig::default()
        },
        s(1),
    );
    r.permits(0);
    r.record_n(8, Ok_).permits(2);
    r.after(ms(100)).reconfigure(|c| c.max_permits = 16);
    r.permits(0);
    r.after(ms(100)).reconfigure(|c| c.max_permits = 4);
    r.permits(0);
    r.after(ms(100)).reconfigure(|c| c.max_permits = 32);
    r.permits(0);
    r.finish()
}

fn ratio_throttle_window() -> Case {
    let mut r = Run::new(
        "ratio-throttle-window",
        "RatioThrottle with ratioWindowMs 3000 (30 bins of 100 ms): backoff = max(0, (requests - K accepts)/(requests + 1)), K = 1/(1 - s), attempts weighted 1/(1 - backoff); 30 % failures raise it, healthy traffic brings it down, and bins older than the window are forgotten (readings at later times without calls).",
        47,
        ms(0),
        WorkerConfig {
            algorithm: Algorithm::RatioThrottle,
            ratio_window_ms: Some(3000),
            ..steady()
        },
        s(1),
    );
    r.serve(s(5), ms(100), u32::MAX, &mut bernoulli(0.3, 0.02), |_| {
        false
    });
    r.serve(s(8), ms(100), u32::MAX, &mut healthy(), |_| false);
    r.record_n(12, Dep).permits(0);
    r.after(ms(1500)).permits(0);
    r.after(ms(1450)).permits(0);
    r.after(ms(100)).permits(0);
    r.after(s(10)).permits(3);
    r.finish()
}

fn ratio_throttle_probe_slow_start() -> Case {
    let mut r = Run::new(
        "ratio-throttle-probe-slow-start",
        "RatioThrottle, maxPermits 8: an outage from the start drives the window's backoff to limit 0 (probing, same schedule as SetPoint); a successful probe clears the window and starts a slow start at 2 permits, +1 per success (weight 1), normal at maxPermits.",
        53,
        ms(0),
        WorkerConfig {
            algorithm: Algorithm::RatioThrottle,
            max_permits: 8,
            ..steady()
        },
        s(1),
    );
    r.serve(s(7), ms(250), u32::MAX, &mut bernoulli(1.0, 0.0), |_| false);
    r.serve(s(22), ms(250), u32::MAX, &mut healthy(), |_| false);
    r.finish()
}

fn ratio_throttle_reconfigure() -> Case {
    let mut r = Run::new(
        "ratio-throttle-reconfigure",
        "RatioThrottle reconfigured: a new setPoint changes K and the backoff of the same window; a new ratioWindowMs clears the window; maxPermits changes the limit.",
        59,
        ms(0),
        WorkerConfig {
            algorithm: Algorithm::RatioThrottle,
            ..steady()
        },
        s(1),
    );
    r.permits(0);
    r.record_n(20, Ok_).record_n(6, Dep).permits(0);
    r.after(ms(200)).reconfigure(|c| c.set_point = 0.2);
    r.permits(0);
    r.after(ms(200)).reconfigure(|c| c.max_permits = 40);
    r.permits(1);
    r.record_n(10, Dep).permits(0);
    r.after(ms(200))
        .reconfigure(|c| c.ratio_window_ms = Some(10_000));
    r.permits(0);
    r.after(ms(500)).record_n(3, Dep).permits(0);
    r.finish()
}

fn ratio_throttle_reconfigure_while_probing() -> Case {
    let mut r = Run::new(
        "ratio-throttle-reconfigure-while-probing",
        "RatioThrottle, maxPermits 4: an outage, a probe, a slow start to 4 permits, a second outage; a reconfigure while probing (slowStartLimit still at maxPermits) passes through normal and re-enters probing, restarting the probe schedule (a new jittered wait from probeInitialMs).",
        127,
        ms(0),
        WorkerConfig {
            algorithm: Algorithm::RatioThrottle,
            max_permits: 4,
            ..steady()
        },
        s(1),
    );
    r.serve(s(4), ms(250), u32::MAX, &mut bernoulli(1.0, 0.0), |_| false);
    r.serve(s(14), ms(250), u32::MAX, &mut healthy(), |r| {
        r.mode() == Mode::Normal
    });
    let until = r.now() + s(3);
    r.serve(until, ms(250), u32::MAX, &mut bernoulli(1.0, 0.0), |_| {
        false
    });
    r.reconfigure(|c| c.probe_max_ms = 30_000);
    wake_until_probe(&mut r);
    r.after(ms(100)).record(Ok_).permits(0);
    r.finish()
}

fn ratio_throttle_probe_outcomes() -> Case {
    let mut r = Run::new(
        "ratio-throttle-probe-outcomes",
        "RatioThrottle probing: a probe that ends in a message failure is added to the window as accepted (the backoff falls) and the next probe may go at once; an empty poll (releaseUnused) disarms the grant; a failed probe is added to the window and doubles the interval; a successful probe clears the window; a dependency failure in slow start returns to normal.",
        137,
        ms(0),
        WorkerConfig {
            algorithm: Algorithm::RatioThrottle,
            max_permits: 4,
            ..steady()
        },
        s(1),
    );
    r.permits(0);
    r.record_n(6, Dep).permits(0);
    wake_until_probe(&mut r);
    r.after(ms(30)).record(Msg).permits(0);
    r.release(1).permits(0);
    r.after(ms(30)).record(Dep).permits(0);
    wake_until_probe(&mut r);
    r.after(ms(30)).record(Ok_).permits(0);
    r.record(Ok_).permits(1);
    r.after(ms(30)).record(Dep).permits(0);
    r.finish()
}

fn fixed() -> Case {
    let mut r = Run::new(
        "fixed",
        "Fixed: maxPermits whatever the outcomes (backoff 0, mode normal), minus what is in flight; a brake caps it (0.5: half the permits), its removal lifts gently after the offset.",
        61,
        s(5),
        WorkerConfig {
            algorithm: Algorithm::Fixed,
            ..steady()
        },
        s(1),
    );
    r.permits(0);
    r.record_n(50, Dep).permits(3);
    r.record_n(5, Msg).permits(16);
    r.after(s(1)).reconfigure(|c| c.brake = brake(0.5, None));
    r.permits(2);
    r.after(s(1)).reconfigure(|c| c.brake = None);
    for _ in 0..8 {
        r.after(s(5)).permits(0);
    }
    r.finish()
}

fn off() -> Case {
    let mut r = Run::new(
        "off",
        "Off: maxPermits always, backoff 0, the brake ignored (even a full one).",
        67,
        s(5),
        WorkerConfig {
            algorithm: Algorithm::Off,
            ..steady()
        },
        s(1),
    );
    r.permits(0);
    r.record_n(50, Dep).permits(7);
    r.after(s(1)).reconfigure(|c| c.brake = brake(1.0, None));
    r.permits(0);
    r.record_n(3, Ok_).permits(20);
    r.after(s(1)).reconfigure(|c| c.brake = None);
    r.after(s(1)).permits(0);
    r.finish()
}

fn brake_partial() -> Case {
    let mut r = Run::new(
        "brake-partial",
        "A brake of 0.5 on a healthy SetPoint: backoff max(own, 0.5), limit floor(16 * 0.5) = 8, permits minus in flight; the controller's own backoff applies on top when it is higher.",
        71,
        s(10),
        steady(),
        s(1),
    );
    r.permits(0);
    r.reconfigure(|c| c.brake = brake(0.5, None));
    r.permits(0);
    r.permits(5);
    r.record_n(10, Ok_).permits(9);
    r.record_n(40, Dep).permits(0);
    r.record_n(10, Dep).permits(0);
    r.after(s(1)).reconfigure(|c| c.brake = brake(0.25, None));
    r.permits(0);
    r.finish()
}

fn brake_full_stops_probes() -> Case {
    let mut r = Run::new(
        "brake-full-stops-probes",
        "A full brake (minBackoff 1) while probing: no probe even when one is due; removed, it is held for the offset (12 s) and falls by 1 per brakeRelease (60 s); probes resume once the brake's cap is above 0.",
        73,
        s(12),
        steady(),
        s(1),
    );
    r.record_n(40, Dep).permits(0);
    r.after(ms(100)).reconfigure(|c| c.brake = brake(1.0, None));
    let due = r.next_change().unwrap_or(r.now());
    r.at(due).permits(0);
    r.after(s(20)).permits(0);
    r.reconfigure(|c| c.brake = None);
    for _ in 0..20 {
        r.after(ms(1000)).permits(0);
    }
    r.after(ms(10)).record(Ok_).permits(0);
    r.finish()
}

fn brake_expiry_gentle_lift() -> Case {
    let mut r = Run::new(
        "brake-expiry-gentle-lift",
        "A full brake that expires 30 s after it is pushed (expiresAtUnix), default brakeRelease 60 s, offset 12 s: held until expiry plus the offset, then the level falls linearly (limit floor(16(1 - level))) to 0 at 102 s after the push; the controller's own state is untouched.",
        79,
        s(12),
        steady(),
        s(1),
    );
    r.permits(0);
    let push = r.now();
    let unix = Run::unix_at(push);
    r.reconfigure(|c| c.brake = brake(1.0, Some(unix + 30)));
    r.permits(0);
    for _ in 0..54 {
        r.after(s(2)).permits(0);
    }
    r.record_n(3, Ok_).permits(4);
    r.finish()
}

fn brake_lowered_then_removed() -> Case {
    let mut r = Run::new(
        "brake-lowered-then-removed",
        "brakeReleaseMs 20000, offset 4 s: a brake of 0.9 lowered to 0.4 is held at 0.9 for the offset, then falls by 1 per 20 s; removed while falling (the 0.4 brake itself still in force), the level reached is held for the offset again and then falls to 0.",
        83,
        s(4),
        WorkerConfig {
            brake_release_ms: Some(20_000),
            ..steady()
        },
        s(1),
    );
    r.reconfigure(|c| c.brake = brake(0.9, None));
    r.permits(0);
    r.after(s(5)).reconfigure(|c| c.brake = brake(0.4, None));
    for _ in 0..7 {
        r.after(s(1)).permits(0);
    }
    r.reconfigure(|c| c.brake = None);
    for _ in 0..14 {
        r.after(ms(1500)).permits(0);
    }
    r.finish()
}

fn brake_raised_during_fall() -> Case {
    let mut r = Run::new(
        "brake-raised-during-fall",
        "A brake of 0.8 removed (falling after a 2 s offset over brakeReleaseMs 10000), then a brake of 0.6 pushed during the fall while the fall is above it (the fall goes on to 0.6), then one of 0.9 (in force at once).",
        89,
        s(2),
        WorkerConfig {
            brake_release_ms: Some(10_000),
            ..steady()
        },
        s(1),
    );
    r.reconfigure(|c| c.brake = brake(0.8, None));
    r.after(s(1)).reconfigure(|c| c.brake = None);
    r.after(s(2)).permits(0);
    r.after(ms(500)).reconfigure(|c| c.brake = brake(0.6, None));
    for _ in 0..4 {
        r.after(ms(500)).permits(0);
    }
    r.reconfigure(|c| c.brake = brake(0.9, None));
    r.after(ms(500)).permits(0);
    r.after(s(1)).reconfigure(|c| c.brake = None);
    for _ in 0..8 {
        r.after(s(2)).permits(0);
    }
    r.finish()
}

fn brake_release_zero() -> Case {
    let mut r = Run::new(
        "brake-release-zero",
        "brakeReleaseMs 0: a brake lifts in one step, on removal and on expiry (after the offset, which is 0 here since it is a share of brakeRelease/2).",
        97,
        ms(0),
        WorkerConfig {
            brake_release_ms: Some(0),
            ..steady()
        },
        s(1),
    );
    r.reconfigure(|c| c.brake = brake(1.0, None));
    r.permits(0);
    r.after(s(1)).reconfigure(|c| c.brake = None);
    r.permits(0);
    let unix = Run::unix_at(r.now());
    r.after(s(1))
        .reconfigure(|c| c.brake = brake(0.75, Some(unix + 11)));
    r.permits(0);
    r.after(s(9)).permits(0);
    r.after(ms(999)).permits(0);
    r.after(ms(1)).permits(0);
    r.finish()
}

fn brake_expired_on_arrival() -> Case {
    let mut r = Run::new(
        "brake-expired-on-arrival",
        "A brake whose expiresAtUnix is already past when it arrives: its expiry is now, so it is held for the offset and then falls like any expired brake.",
        101,
        s(3),
        WorkerConfig {
            brake_release_ms: Some(10_000),
            ..steady()
        },
        s(1),
    );
    r.permits(0);
    let unix = Run::unix_at(r.now());
    r.reconfigure(|c| c.brake = brake(0.5, Some(unix - 100)));
    r.permits(0);
    for _ in 0..6 {
        r.after(s(1)).permits(0);
    }
    r.finish()
}

fn algorithm_set_point_to_ratio() -> Case {
    let mut r = Run::new(
        "algorithm-set-point-to-ratio",
        "A configure that changes the algorithm rebuilds the controller: SetPoint at backoff > 0 to RatioThrottle, whose window starts empty (it ignores the carried backoff); the brake is carried over.",
        103,
        s(1),
        steady(),
        s(1),
    );
    r.permits(0);
    r.record_n(30, Dep).permits(0);
    r.after(s(1)).reconfigure(|c| c.brake = brake(0.25, None));
    r.permits(0);
    r.after(s(1))
        .reconfigure(|c| c.algorithm = Algorithm::RatioThrottle);
    r.permits(0);
    r.record_n(5, Dep).permits(0);
    r.finish()
}

fn algorithm_ratio_to_set_point() -> Case {
    let mut r = Run::new(
        "algorithm-ratio-to-set-point",
        "RatioThrottle to SetPoint: the new SetPoint starts from the old backoff (integrator = backoff, normal mode, or probing when its limit is 0; no startup ramp); a second change at full backoff enters probing at once.",
        107,
        ms(0),
        WorkerConfig {
            algorithm: Algorithm::RatioThrottle,
            ..WorkerConfig::default()
        },
        s(1),
    );
    r.permits(0);
    r.record_n(10, Ok_).record_n(5, Dep).permits(0);
    r.after(ms(10))
        .reconfigure(|c| c.algorithm = Algorithm::SetPoint);
    r.permits(0);
    r.record_n(3, Ok_).permits(0);
    r.after(ms(10))
        .reconfigure(|c| c.algorithm = Algorithm::RatioThrottle);
    r.record_n(40, Dep).permits(0);
    r.after(ms(10))
        .reconfigure(|c| c.algorithm = Algorithm::SetPoint);
    r.permits(0);
    let due = r.next_change().unwrap_or(r.now());
    r.at(due).permits(0);
    r.finish()
}

fn algorithm_fixed_off_round_trip() -> Case {
    let mut r = Run::new(
        "algorithm-fixed-off-round-trip",
        "SetPoint to Fixed (the brake carried and honoured), to Off (the brake ignored), back to SetPoint (starts from Off's backoff 0 in normal mode, brake honoured again).",
        109,
        s(2),
        steady(),
        s(1),
    );
    r.record_n(30, Dep).permits(0);
    r.after(s(1)).reconfigure(|c| c.brake = brake(0.5, None));
    r.after(s(1))
        .reconfigure(|c| c.algorithm = Algorithm::Fixed);
    r.permits(1);
    r.after(s(1)).reconfigure(|c| c.algorithm = Algorithm::Off);
    r.permits(1);
    r.after(s(1))
        .reconfigure(|c| c.algorithm = Algorithm::SetPoint);
    r.permits(1);
    r.record_n(10, Dep).permits(0);
    r.finish()
}

fn algorithm_change_under_brake() -> Case {
    let mut r = Run::new(
        "algorithm-change-under-brake",
        "The backoff carried into a rebuilt SetPoint is the old controller's own, without the brake: RatioThrottle (own backoff 0) under a brake of 0.5 becomes a SetPoint held at 0.5 by the brake only, back to full permits as soon as the brake is removed (instantly: brakeReleaseMs 0).",
        113,
        ms(0),
        WorkerConfig {
            algorithm: Algorithm::RatioThrottle,
            brake_release_ms: Some(0),
            ..steady()
        },
        s(1),
    );
    r.permits(0);
    r.record_n(5, Ok_).permits(0);
    r.after(s(1)).reconfigure(|c| c.brake = brake(0.5, None));
    r.after(s(1))
        .reconfigure(|c| c.algorithm = Algorithm::SetPoint);
    r.permits(0);
    r.after(s(1)).reconfigure(|c| c.brake = None);
    r.permits(0);
    r.record_n(20, Ok_).permits(0);
    r.finish()
}
