#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use backpressure_api::wire::{BrakeConfig, WorkerConfig};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};

use super::*;

fn settings(max_permits: u32, set_point: f64, reaction: u32) -> Settings {
    Settings {
        algorithm: Algorithm::SetPoint,
        set_point,
        reaction,
        max_permits,
        ..Settings::steady()
    }
}

fn plain(max_permits: u32, set_point: f64, reaction: u32) -> SetPoint {
    SetPoint::new(
        Settings {
            credit: 0.0,
            ..settings(max_permits, set_point, reaction)
        },
        1,
    )
}

const T0: Nanos = Nanos::from_secs(100);

fn back_off_fully(c: &mut dyn Controller, now: Nanos) {
    for _ in 0..10_000 {
        if c.mode() == Mode::Probing {
            return;
        }
        c.record(now, Outcome::DependencyFailure);
    }
    panic!("never backed off fully: {c:?}");
}

/// The first time at or after `from` when a probe is granted (with nothing in flight).
fn next_probe_time(c: &mut dyn Controller, from: Nanos) -> Nanos {
    let mut t = from;
    for _ in 0..10_000 {
        if c.permits(t, 0) == 1 {
            return t;
        }
        t = c
            .next_change(t)
            .unwrap_or(t + Nanos::from_millis(10))
            .max(t + Nanos(1));
    }
    panic!("no probe granted after {from:?}: {c:?}");
}

fn starting(max_permits: u32, initial_permits: u32) -> SetPoint {
    SetPoint::new(
        Settings {
            initial_permits,
            ..settings(max_permits, 0.05, 20)
        },
        1,
    )
}

#[test]
fn startup_ramps_one_permit_per_round_trip_without_backoff_and_keeps_the_credit() {
    let mut c = starting(16, 2);
    assert_eq!(c.mode(), Mode::Starting);
    assert_eq!((c.permits(T0, 0), c.limit(T0), c.backoff(T0)), (2, 2, 0.0));
    assert_eq!(
        c.permits(T0, 2),
        0,
        "in-flight messages count against the window"
    );
    // maxPermits/16 = 1 permit per w successes: about (16² - 2²)/2 = 126 successes to the top.
    let (mut successes, mut last) = (0u32, 2u32);
    while c.mode() == Mode::Starting {
        c.record(T0, Outcome::Success);
        successes += 1;
        let limit = c.limit(T0);
        assert!(limit == last || limit == last + 1, "{last} -> {limit}");
        assert_eq!(c.backoff(T0), 0.0);
        last = limit;
    }
    assert!((120..=135).contains(&successes), "{successes} successes");
    assert_eq!(
        (c.mode(), c.limit(T0), c.backoff(T0)),
        (Mode::Normal, 16, 0.0)
    );
    // A healthy startup leaves the fresh worker's credit intact: N failures change nothing.
    for _ in 0..20 {
        c.record(T0, Outcome::DependencyFailure);
    }
    assert_eq!(c.limit(T0), 16);
    c.record(T0, Outcome::DependencyFailure);
    assert_eq!(c.limit(T0), 15);
}

#[test]
fn startup_ramp_is_scaled_to_max_permits() {
    // maxPermits 160: g = 10 permits per round trip (w successes); w² grows by about 2g per
    // success, so 20 successes from 20 give about sqrt(400 + 400) = 28.
    let mut c = starting(160, 20);
    for _ in 0..20 {
        c.record(T0, Outcome::Success);
    }
    assert!((27..=29).contains(&c.limit(T0)), "{}", c.limit(T0));
}

#[test]
fn startup_window_shrinks_above_the_set_point_and_never_below_one() {
    let mut c = starting(16, 2);
    while c.limit(T0) < 10 {
        c.record(T0, Outcome::Success);
    }
    let w = c.window_f64();
    // s = 5 %: a failure costs (1 - s)/s = 19 times what a success adds (1/w).
    c.record(T0, Outcome::DependencyFailure);
    assert!((c.window_f64() - (w - 19.0 / w)).abs() < 1e-9);
    assert_eq!(c.mode(), Mode::Starting);
    // Message failures say nothing about the dependency.
    c.record(T0, Outcome::MessageFailure);
    assert!((c.window_f64() - (w - 19.0 / w)).abs() < 1e-9);
    // A failure fraction above the set point (1 in 10) takes the window down to 1 and keeps it
    // there.
    for _ in 0..50 {
        for _ in 0..9 {
            c.record(T0, Outcome::Success);
        }
        c.record(T0, Outcome::DependencyFailure);
        assert_eq!(c.mode(), Mode::Starting);
    }
    assert!(c.limit(T0) <= 2, "{}", c.limit(T0));
    for _ in 0..40 {
        c.record(T0, Outcome::DependencyFailure);
        if c.mode() == Mode::Starting {
            assert_eq!(c.startup_window(), 1);
        }
    }
}

#[test]
fn an_outage_during_startup_ends_it_in_probing() {
    let mut c = starting(16, 2);
    // The integrator runs meanwhile: the credit (N failures), then its limit falls from 16; the
    // window stays at 1 until that limit is 1 too (startup over), and the next failure takes
    // the limit to 0: full backoff.
    for i in 0..38 {
        c.record(T0, Outcome::DependencyFailure);
        let expected = if i < 37 { Mode::Starting } else { Mode::Normal };
        assert_eq!(
            (c.mode(), c.limit(T0)),
            (expected, 1),
            "after {} failures",
            i + 1
        );
    }
    c.record(T0, Outcome::DependencyFailure);
    assert_eq!(
        (c.mode(), c.backoff(T0), c.limit(T0)),
        (Mode::Probing, 1.0, 0)
    );
}

#[test]
fn startup_ends_when_the_integrator_limits_more_than_the_window() {
    let mut c = starting(16, 2);
    for _ in 0..6 {
        c.record(T0, Outcome::Success);
    }
    // Window 8; 36 net failures lift the integrator (credit 1) to backoff > 1/2 while the
    // window sits at 1; then successes grow the window back up to the integrator's limit.
    for _ in 0..36 {
        c.record(T0, Outcome::DependencyFailure);
    }
    let own = limit_for(16, c.integrator());
    assert!(own < 16 && own > 1, "own limit {own}");
    while c.mode() == Mode::Starting {
        c.record(T0, Outcome::Success);
    }
    assert_eq!(c.mode(), Mode::Normal);
    assert_eq!(c.limit(T0), limit_for(16, c.integrator()));
    assert!(c.backoff(T0) > 0.0);
}

#[test]
fn startup_is_on_by_default_and_ends_on_carry_over_or_a_smaller_max() {
    assert_eq!(SetPoint::new(Settings::default(), 1).mode(), Mode::Starting);
    assert_eq!(SetPoint::new(Settings::steady(), 1).mode(), Mode::Normal);
    assert_eq!(starting(16, 16).mode(), Mode::Normal);
    assert_eq!(starting(16, 0).mode(), Mode::Normal);
    let mut c = starting(16, 2);
    c.start_from(T0, 0.25);
    assert_eq!((c.mode(), c.limit(T0)), (Mode::Normal, 12));
    let mut c = starting(16, 2);
    for _ in 0..3 {
        c.record(T0, Outcome::Success);
    }
    c.reconfigure(
        T0,
        Settings {
            initial_permits: 2,
            ..settings(3, 0.05, 20)
        },
    );
    assert_eq!((c.mode(), c.limit(T0)), (Mode::Normal, 3));
}

#[test]
fn integrator_steps_are_one_over_n_and_s_over_one_minus_s_n() {
    let mut c = plain(16, 0.05, 20);
    c.record(T0, Outcome::DependencyFailure);
    assert!((c.backoff(T0) - 1.0 / 20.0).abs() < 1e-12);
    c.record(T0, Outcome::Success);
    let expected = 1.0 / 20.0 - 0.05 / (0.95 * 20.0);
    assert!((c.backoff(T0) - expected).abs() < 1e-12);
    // 19 successes cancel one failure at s = 5%.
    let mut c = plain(16, 0.05, 20);
    c.record(T0, Outcome::DependencyFailure);
    for _ in 0..19 {
        c.record(T0, Outcome::Success);
    }
    assert!(c.backoff(T0) < 1e-9);
    // floor(16 * (1 - 1/20)) = 15 permits after one failure without credit.
    let mut c = plain(16, 0.05, 20);
    c.record(T0, Outcome::DependencyFailure);
    assert_eq!(c.permits(T0, 0), 15);
    assert_eq!(c.permits(T0, 10), 5);
    assert_eq!(c.permits(T0, 20), 0);
}

#[test]
fn message_failures_never_drive_backoff() {
    for algorithm in [Algorithm::SetPoint, Algorithm::RatioThrottle] {
        let mut c = build(
            Settings {
                algorithm,
                ..Settings::steady()
            },
            3,
        );
        for i in 0..10_000u64 {
            c.record(T0 + Nanos::from_millis(i), Outcome::MessageFailure);
        }
        let end = T0 + Nanos::from_secs(10);
        assert_eq!(c.backoff(end), 0.0, "{algorithm:?}");
        assert_eq!(c.permits(end, 0), 16, "{algorithm:?}");
    }
}

#[test]
fn credit_absorbs_one_reaction_of_failures_then_backs_off() {
    let mut c = SetPoint::new(settings(16, 0.05, 20), 1);
    assert_eq!(c.integrator(), -1.0, "starts with full credit");
    for _ in 0..20 {
        c.record(T0, Outcome::DependencyFailure);
    }
    assert_eq!(c.backoff(T0), 0.0);
    assert_eq!(c.permits(T0, 0), 16);
    c.record(T0, Outcome::DependencyFailure);
    assert!(c.backoff(T0) > 0.0);
    assert_eq!(c.permits(T0, 0), 15);
    for _ in 0..19 {
        c.record(T0, Outcome::DependencyFailure);
    }
    assert_eq!(c.mode(), Mode::Probing);
    assert_eq!(c.backoff(T0), 1.0);
}

#[test]
fn probing_grants_one_message_on_a_doubling_jittered_interval() {
    let mut c = plain(16, 0.05, 20);
    back_off_fully(&mut c, T0);
    assert_eq!(c.permits(T0, 0), 0, "the first probe waits an interval");
    let due = c.next_change(T0).unwrap();
    let wait = due - T0;
    assert!(
        wait >= Nanos::from_secs(1) && wait < Nanos::from_secs(2),
        "{wait:?}"
    );
    assert_eq!(c.permits(due, 1), 0, "never with something in flight");
    assert_eq!(c.permits(due, 0), 1);
    // Failed probes double the interval up to 60 s; each wait is the interval x U[0.5,1).
    let mut now = due;
    let mut intervals = Vec::new();
    for _ in 0..8 {
        c.record(now, Outcome::DependencyFailure);
        let next = c.next_change(now).unwrap();
        intervals.push((c.probe_interval(), next - now));
        now = next;
        assert_eq!(c.permits(now, 0), 1);
    }
    let expected = [4u64, 8, 16, 32, 60, 60, 60, 60];
    for ((interval, wait), secs) in intervals.iter().zip(expected) {
        assert_eq!(*interval, Nanos::from_secs(secs));
        assert!(
            wait.0 >= interval.0 / 2 && wait.0 < interval.0,
            "{wait:?} vs {interval:?}"
        );
    }
    let waits: Vec<_> = intervals.iter().skip(4).map(|(_, w)| *w).collect();
    assert!(
        waits.windows(2).any(|w| w[0] != w[1]),
        "jittered: {waits:?}"
    );
}

#[test]
fn successful_probe_slow_starts_to_half_the_peak() {
    let mut c = plain(16, 0.05, 20);
    back_off_fully(&mut c, T0);
    assert_eq!(c.ssthresh(), 8, "peak 16 / 2");
    let t = next_probe_time(&mut c, T0);
    assert_eq!(c.permits(t, 0), 1);
    c.record(t, Outcome::Success);
    assert_eq!(c.mode(), Mode::SlowStart);
    assert_eq!(c.limit(t), 2);
    assert_eq!(
        c.probe_interval(),
        Nanos::from_secs(2),
        "reset after success"
    );
    let mut limits = vec![c.limit(t)];
    while c.mode() == Mode::SlowStart {
        c.record(t, Outcome::Success);
        limits.push(c.limit(t));
    }
    assert_eq!(limits, vec![2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(c.mode(), Mode::Normal);
}

#[test]
fn slow_start_ends_at_the_first_dependency_failure() {
    let mut c = plain(16, 0.05, 20);
    back_off_fully(&mut c, T0);
    let t = next_probe_time(&mut c, T0);
    c.permits(t, 0);
    c.record(t, Outcome::Success);
    c.record(t, Outcome::Success);
    assert_eq!(c.limit(t), 3);
    c.record(t, Outcome::DependencyFailure);
    assert_eq!(c.mode(), Mode::Normal);
    assert_eq!(c.limit(t), 2);
}

#[test]
fn the_peak_decays_so_a_long_outage_restarts_low() {
    let mut c = plain(16, 0.05, 20);
    // 16 permits at T0, then a minute at 4 permits: the remembered peak decays 1 permit / 3 s.
    let mut now = T0;
    c.record(now, Outcome::Success);
    c.set_backoff(now, 0.75);
    assert_eq!(c.limit(now), 4);
    now = now + Nanos::from_secs(60);
    back_off_fully(&mut c, now);
    assert_eq!(c.ssthresh(), 2);
    // Without the minute at 4 permits, the peak is still 16.
    let mut c = plain(16, 0.05, 20);
    c.record(T0, Outcome::Success);
    c.set_backoff(T0, 0.75);
    back_off_fully(&mut c, T0 + Nanos::from_secs(1));
    assert_eq!(c.ssthresh(), 7);
}

#[test]
fn late_outcomes_in_probing_are_not_probe_results() {
    let mut c = plain(16, 0.05, 20);
    back_off_fully(&mut c, T0);
    let interval = c.probe_interval();
    // Messages taken before full backoff keep failing: the probe schedule does not grow.
    for _ in 0..10 {
        c.record(T0, Outcome::DependencyFailure);
    }
    assert_eq!(c.probe_interval(), interval);
    c.record(T0, Outcome::Success);
    assert_eq!(
        c.mode(),
        Mode::Probing,
        "one late success is not a probe result"
    );
}

#[test]
fn message_failure_probe_allows_another_probe_at_once() {
    let mut c = plain(16, 0.05, 20);
    back_off_fully(&mut c, T0);
    let t = next_probe_time(&mut c, T0);
    c.record(t, Outcome::MessageFailure);
    assert_eq!(c.mode(), Mode::Probing);
    assert_eq!(c.permits(t, 0), 1);
}

#[test]
fn health_check_replaces_message_probes() {
    let mut c = SetPoint::new(
        Settings {
            health_check_probes: true,
            credit: 0.0,
            ..settings(16, 0.05, 20)
        },
        9,
    );
    back_off_fully(&mut c, T0);
    let mut now = T0;
    let mut checks = 0;
    for _ in 0..1000 {
        assert_eq!(c.permits(now, 0), 0, "no message probes");
        if c.health_check_due(now) {
            checks += 1;
            assert!(!c.health_check_due(now), "one check at a time");
            c.record_health_check(now, checks >= 3);
            if c.mode() != Mode::Probing {
                break;
            }
        }
        now = c.next_change(now).unwrap();
    }
    assert_eq!(checks, 3);
    assert_eq!(c.mode(), Mode::SlowStart);
    assert_eq!(c.permits(now, 0), 2);
}

#[test]
fn brake_is_a_minimum_backoff_until_it_expires() {
    let mut c = build(Settings::steady(), 1);
    let until = T0 + Nanos::from_secs(30);
    c.set_brake(Some(Brake {
        min_backoff: 0.5,
        until: Some(until),
        ..Brake::default()
    }));
    assert_eq!(c.backoff(T0), 0.5);
    assert_eq!(c.permits(T0, 0), 8);
    assert_eq!(c.next_change(T0), Some(until));
    assert_eq!(c.backoff(until), 0.0);
    assert_eq!(c.permits(until, 0), 16);
    // A full brake stops probes too (what the CRD and docs say).
    let mut c = plain(16, 0.05, 20);
    back_off_fully(&mut c, T0);
    c.set_brake(Some(Brake {
        min_backoff: 1.0,
        until: None,
        ..Brake::default()
    }));
    assert_eq!(c.permits(T0 + Nanos::from_secs(3600), 0), 0);
    // Fixed honours the brake, Off ignores it.
    let mut fixed = build(
        Settings {
            algorithm: Algorithm::Fixed,
            ..Settings::steady()
        },
        1,
    );
    let mut off = build(
        Settings {
            algorithm: Algorithm::Off,
            ..Settings::steady()
        },
        1,
    );
    for c in [&mut fixed, &mut off] {
        c.set_brake(Some(Brake {
            min_backoff: 0.75,
            until: None,
            ..Brake::default()
        }));
        for _ in 0..100 {
            c.record(T0, Outcome::DependencyFailure);
        }
    }
    assert_eq!(fixed.permits(T0, 0), 4);
    assert_eq!(fixed.backoff(T0), 0.75);
    assert_eq!(off.permits(T0, 0), 16);
    assert_eq!(off.backoff(T0), 0.0);
}

fn secs(s: u64) -> Nanos {
    T0 + Nanos::from_secs(s)
}

/// A brake as a gate with this release and offset holds it after `succeed`.
fn lifting(min_backoff: f64, until: Option<Nanos>, offset: u64) -> Brake {
    let b = Brake {
        min_backoff,
        until,
        ..Brake::default()
    };
    Brake::succeed(
        None,
        Some(b),
        T0,
        Nanos::from_secs(60),
        Nanos::from_secs(offset),
    )
    .unwrap()
}

#[test]
fn an_expiring_brake_lifts_gently_after_this_pods_offset() {
    let brake = lifting(1.0, Some(secs(10)), 20);
    let mut c = build(Settings::steady(), 1);
    c.set_brake(Some(brake));
    let permits = |c: &mut Box<dyn Controller>, t: u64| c.permits(secs(t), 0);
    assert_eq!(permits(&mut c, 0), 0);
    // Expired at 10 s, held for this pod's 20 s offset, then 1/60 per second.
    assert_eq!(permits(&mut c, 10), 0);
    assert_eq!(permits(&mut c, 29), 0);
    assert_eq!(c.next_change(secs(29)), Some(secs(30)));
    assert_eq!(permits(&mut c, 45), 4, "a quarter of the way");
    assert!((c.backoff(secs(45)) - 0.75).abs() < 1e-9);
    // While falling, the worker is woken for each permit (60 s / 16 permits).
    assert_eq!(
        c.next_change(secs(45)),
        Some(secs(45) + Nanos::from_millis(3750))
    );
    assert_eq!(permits(&mut c, 60), 8);
    assert_eq!(permits(&mut c, 90), 16);
    assert_eq!(c.backoff(secs(90)), 0.0);
    assert_eq!(c.next_change(secs(90)), None);
    // Another pod (another offset) lifts at another moment: no common step.
    let mut other = build(Settings::steady(), 1);
    other.set_brake(Some(lifting(1.0, Some(secs(10)), 5)));
    assert_eq!(other.permits(secs(30), 0), 4);
    assert_eq!(c.permits(secs(30), 0), 0);
}

#[test]
fn a_removed_or_lowered_brake_falls_to_the_new_level() {
    let release = Nanos::from_secs(60);
    let offset = Nanos::from_secs(6);
    let full = lifting(1.0, None, 6);
    // Lowered to 0.5 at 0 s: held at 1 until 6 s, then falls to 0.5 by 36 s.
    let half = Brake {
        min_backoff: 0.5,
        ..Brake::default()
    };
    let lowered = Brake::succeed(Some(&full), Some(half), T0, release, offset).unwrap();
    assert_eq!(lowered.active(secs(5)), Some(1.0));
    assert!((lowered.active(secs(21)).unwrap() - 0.75).abs() < 1e-9);
    assert_eq!(lowered.active(secs(40)), Some(0.5));
    // The same brake pushed again mid-fall: the fall goes on, no new offset.
    let again = Brake::succeed(Some(&lowered), Some(half), secs(21), release, offset).unwrap();
    assert!((again.active(secs(21)).unwrap() - 0.75).abs() < 1e-9);
    assert!((again.active(secs(27)).unwrap() - 0.65).abs() < 1e-9);
    // Removed at 40 s: from 0.5 to nothing, after the offset.
    let removed = Brake::succeed(Some(&again), None, secs(40), release, offset).unwrap();
    assert_eq!(removed.active(secs(46)), Some(0.5));
    assert!((removed.active(secs(61)).unwrap() - 0.25).abs() < 1e-9);
    assert_eq!(removed.active(secs(76)), None);
    // Once lifted, a new push leaves nothing behind.
    assert_eq!(
        Brake::succeed(Some(&removed), None, secs(80), release, offset),
        None
    );
    // A removed brake that had already expired and lifted leaves nothing either.
    let expired = lifting(0.5, Some(secs(1)), 0);
    assert_eq!(
        Brake::succeed(Some(&expired), None, secs(100), release, offset),
        None
    );
    // A removal in the middle of an expiry's fall continues that fall.
    let mid = Brake::succeed(Some(&expired), None, secs(16), release, offset).unwrap();
    assert!((mid.active(secs(16)).unwrap() - 0.25).abs() < 1e-9);
    // Release 0: one step, as before.
    let step = Brake::succeed(Some(&full), None, T0, Nanos::ZERO, Nanos::ZERO);
    assert_eq!(step.and_then(|b| b.active(T0)), None);
}

#[test]
fn brake_from_wire_converts_unix_expiry() {
    let now = Nanos::from_secs(50);
    let b = Brake::from_wire(
        &BrakeConfig {
            min_backoff: 0.3,
            expires_at_unix: Some(1_000_010),
        },
        now,
        1_000_000,
    );
    assert_eq!(b.until, Some(Nanos::from_secs(60)));
    assert_eq!(b.active(Nanos::from_secs(59)), Some(0.3));
    assert_eq!(b.active(Nanos::from_secs(60)), None);
    let expired = Brake::from_wire(
        &BrakeConfig {
            min_backoff: 0.3,
            expires_at_unix: Some(999_000),
        },
        now,
        1_000_000,
    );
    assert_eq!(expired.active(now), None);
}

#[test]
fn reconfigure_keeps_state_and_algorithm_change_carries_backoff() {
    let mut c = build(
        Settings {
            credit: 0.0,
            ..Settings::steady()
        },
        1,
    );
    for _ in 0..10 {
        c.record(T0, Outcome::DependencyFailure);
    }
    let b = c.backoff(T0);
    assert!((b - 0.5).abs() < 1e-9);
    apply_settings(
        &mut c,
        T0,
        Settings {
            max_permits: 32,
            ..Settings::steady()
        },
        1,
        None,
    );
    assert_eq!(c.backoff(T0), b);
    assert_eq!(c.permits(T0, 0), 16);
    // To Fixed and back: SetPoint starts from the carried backoff.
    apply_settings(
        &mut c,
        T0,
        Settings {
            algorithm: Algorithm::Fixed,
            ..Settings::steady()
        },
        1,
        None,
    );
    assert_eq!(c.algorithm(), Algorithm::Fixed);
    assert_eq!(c.backoff(T0), 0.0);
    let mut sp = build(Settings::steady(), 1);
    for _ in 0..50 {
        sp.record(T0, Outcome::DependencyFailure);
    }
    let mut c2 = build(
        Settings {
            algorithm: Algorithm::Fixed,
            ..Settings::steady()
        },
        1,
    );
    c2.set_brake(Some(Brake {
        min_backoff: 0.25,
        until: None,
        ..Brake::default()
    }));
    apply_settings(&mut c2, T0, Settings::steady(), 1, c2_brake());
    assert_eq!(c2.algorithm(), Algorithm::SetPoint);
    assert_eq!(
        c2.backoff(T0),
        0.25,
        "the brake applies to the new controller"
    );
    // The brake's level was not carried into the new integrator: removed, it leaves nothing.
    apply_settings(&mut c2, T0, Settings::steady(), 1, None);
    assert_eq!(
        c2.backoff(T0),
        0.0,
        "the brake outlived itself in the integrator"
    );
}

fn c2_brake() -> Option<Brake> {
    Some(Brake {
        min_backoff: 0.25,
        until: None,
        ..Brake::default()
    })
}

#[test]
fn same_seed_same_probe_schedule() {
    let schedule = |seed| {
        let mut c = SetPoint::new(
            Settings {
                credit: 0.0,
                ..Settings::steady()
            },
            seed,
        );
        back_off_fully(&mut c, T0);
        let mut now = T0;
        let mut out = Vec::new();
        for _ in 0..6 {
            now = next_probe_time(&mut c, now);
            out.push(now);
            c.record(now, Outcome::DependencyFailure);
        }
        out
    };
    assert_eq!(schedule(42), schedule(42));
    assert_ne!(schedule(42), schedule(43));
}

#[test]
fn from_config_uses_the_wire_knobs() {
    let cfg = WorkerConfig {
        algorithm: Algorithm::RatioThrottle,
        max_permits: 7,
        probe_initial_ms: 500,
        probe_max_ms: 4000,
        ..WorkerConfig::default()
    };
    let c = from_config(&cfg, 1);
    assert_eq!(c.algorithm(), Algorithm::RatioThrottle);
    assert_eq!(c.settings().max_permits, 7);
    assert_eq!(c.settings().probe_initial, Nanos::from_millis(500));
    assert_eq!(c.settings().probe_max, Nanos::from_secs(4));
    assert_eq!(c.limit(T0), 7);
}

#[test]
fn ratio_throttle_backs_off_probes_and_forgets_after_the_window() {
    let mut c = RatioThrottle::new(Settings::steady(), 5);
    let mut now = T0;
    for _ in 0..200 {
        c.record(now, Outcome::DependencyFailure);
        now = now + Nanos::from_millis(5);
    }
    assert_eq!(c.mode(), Mode::Probing);
    assert_eq!(c.limit(now), 0);
    // The outage ends: probes succeed and the window forgets the failures.
    let end = now + Nanos::from_secs(60);
    while now < end {
        let k = c.permits(now, 0);
        for _ in 0..k {
            c.record(now, Outcome::Success);
        }
        now = c
            .next_change(now)
            .unwrap_or(now + Nanos::from_millis(100))
            .min(now + Nanos::from_millis(100));
    }
    assert_eq!(c.mode(), Mode::Normal);
    assert_eq!(c.limit(now), 16);
}

mod proptests;

/// Drives one `SetPoint` for `secs` seconds of 100 ms ticks: messages take 1 s, and each fails
/// with `fail(limit at its start, t)` drawn from a seeded generator. Returns the controller and
/// the failure fraction and mean permits over the last `tail` seconds.
fn drive(secs: u64, tail: u64, fail: impl Fn(u32, u64) -> f64) -> (SetPoint, f64, f64) {
    let mut c = SetPoint::new(settings(16, 0.05, 20), 7);
    let mut rng = SplitMix64::new(11);
    let mut in_flight: Vec<(u64, bool)> = Vec::new();
    let (mut att, mut fails, mut permit_sum, mut samples) = (0u64, 0u64, 0u64, 0u64);
    for tick in 0..secs * 10 {
        let now = Nanos::from_millis(tick * 100);
        let mut i = 0;
        while i < in_flight.len() {
            if in_flight[i].0 <= tick {
                let (_, ok) = in_flight.swap_remove(i);
                let o = if ok {
                    Outcome::Success
                } else {
                    Outcome::DependencyFailure
                };
                c.record(now, o);
                if tick >= (secs - tail) * 10 {
                    att += 1;
                    fails += u64::from(!ok);
                }
            } else {
                i += 1;
            }
        }
        let limit = c.limit(now);
        let k = c.permits(now, in_flight.len() as u32);
        for _ in 0..k {
            let ok = rng.next_f64() >= fail(limit.max(1), tick / 10);
            in_flight.push((tick + 10, ok));
        }
        if tick >= (secs - tail) * 10 {
            permit_sum += u64::from(c.limit(now));
            samples += 1;
        }
    }
    let f = fails as f64 / att.max(1) as f64;
    (c, f, permit_sum as f64 / samples.max(1) as f64)
}

/// Issue 13: 15 % of calls fail whatever the concurrency. The controller learns a floor of
/// about 15 % from its probing and slow start and then runs at (nearly) full permits instead of
/// throttling to about one permit.
#[test]
fn load_independent_failures_learn_a_floor_and_stop_throttling() {
    let (c, f, permits) = drive(1800, 600, |_, _| 0.15);
    assert!(
        (0.12..=0.18).contains(&c.failure_floor()),
        "floor {}",
        c.failure_floor()
    );
    assert!(permits >= 14.0, "mean permits {permits}");
    assert!((0.12..=0.18).contains(&f), "failure fraction {f}");
    // The plain integrator (floor off) throttles the same dependency to a few permits.
    let mut plain_settings = settings(16, 0.05, 20);
    plain_settings.floor_max = 0.0;
    let c = SetPoint::new(plain_settings, 7);
    assert_eq!(c.failure_floor(), 0.0);
}

/// Issue 13: failures that respond to the worker's own concurrency (a dependency that serves 6
/// calls at once and rejects the share above) are overload: no floor, and the failure fraction
/// is held at the set point as before.
#[test]
fn overload_learns_no_floor_and_keeps_the_set_point() {
    let (c, f, _) = drive(1800, 900, |limit, _| {
        (1.0 - 6.0 / f64::from(limit)).max(0.0) + 0.005
    });
    assert_eq!(c.failure_floor(), 0.0);
    assert!(f <= 0.06, "failure fraction {f}");
}

/// Issue 13: an outage (every call fails) and a dependency flapping between down and up every
/// minute are not load-independent failures: no floor; the controller backs off as before.
#[test]
fn outages_and_flapping_learn_no_floor() {
    let (c, _, permits) = drive(1800, 600, |_, t| if t >= 60 { 1.0 } else { 0.0 });
    assert_eq!(c.failure_floor(), 0.0);
    assert!(permits < 1.0, "mean permits {permits}");
    let (c, _, _) = drive(
        3600,
        600,
        |_, t| if (t / 60) % 2 == 1 { 1.0 } else { 0.005 },
    );
    assert_eq!(c.failure_floor(), 0.0);
}

/// Issue 13: once the dependency heals, the floor follows it down and ends.
#[test]
fn floor_ends_when_the_dependency_heals() {
    let (c, f, permits) = drive(3600, 300, |_, t| if t < 1800 { 0.15 } else { 0.005 });
    assert_eq!(c.failure_floor(), 0.0);
    assert!(f < 0.02 && permits >= 15.0, "{f} {permits}");
}

/// Issue 13: what a controller tells the fleet about its floor. A fresh controller has tested
/// nothing (`None`: exported as NaN, left out of the fleet's average); after a load-independent
/// failure it reports the floor; an overload and an outage never report one (their experiments
/// are few, about one probe a minute in an outage, or conclusive that there is none).
#[test]
fn floor_estimate_is_unknown_until_tested() {
    let c = SetPoint::new(settings(16, 0.05, 20), 7);
    assert_eq!(c.floor_estimate(), None);
    let (c, _, _) = drive(600, 60, |_, _| 0.005);
    assert_eq!(
        c.floor_estimate(),
        None,
        "a healthy pod never ran an experiment"
    );

    let (c, _, _) = drive(1800, 600, |_, _| 0.15);
    let f0 = c.floor_estimate().expect("a floor was learned");
    assert!((0.12..=0.18).contains(&f0), "floor {f0}");

    let (c, _, _) = drive(1800, 900, |limit, _| {
        (1.0 - 6.0 / f64::from(limit)).max(0.0) + 0.005
    });
    assert_eq!(c.floor_estimate().unwrap_or(0.0), 0.0, "overload: no floor");
    let (c, _, _) = drive(1800, 600, |_, t| if t >= 60 { 1.0 } else { 0.0 });
    assert_eq!(c.floor_estimate().unwrap_or(0.0), 0.0, "outage: no floor");
    // Failures that stop when the worker backs off (an overload of this worker alone: all its
    // calls fail above 1 permit): its probes and slow start succeed, conclusively no floor.
    let (c, _, _) = drive(900, 60, |limit, _| if limit > 1 { 0.9 } else { 0.0 });
    assert_eq!(c.floor_estimate(), Some(0.0));
}
