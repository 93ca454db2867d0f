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
        ..Settings::default()
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
fn startup_is_off_by_default_and_ends_on_carry_over_or_a_smaller_max() {
    assert_eq!(SetPoint::new(Settings::default(), 1).mode(), Mode::Normal);
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
                ..Settings::default()
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
    let mut c = build(Settings::default(), 1);
    let until = T0 + Nanos::from_secs(30);
    c.set_brake(Some(Brake {
        min_backoff: 0.5,
        until: Some(until),
    }));
    assert_eq!(c.backoff(T0), 0.5);
    assert_eq!(c.permits(T0, 0), 8);
    assert_eq!(c.next_change(T0), Some(until));
    assert_eq!(c.backoff(until), 0.0);
    assert_eq!(c.permits(until, 0), 16);
    // A full brake stops probes too.
    let mut c = plain(16, 0.05, 20);
    back_off_fully(&mut c, T0);
    c.set_brake(Some(Brake {
        min_backoff: 1.0,
        until: None,
    }));
    assert_eq!(c.permits(T0 + Nanos::from_secs(3600), 0), 0);
    // Fixed honours the brake, Off ignores it.
    let mut fixed = build(
        Settings {
            algorithm: Algorithm::Fixed,
            ..Settings::default()
        },
        1,
    );
    let mut off = build(
        Settings {
            algorithm: Algorithm::Off,
            ..Settings::default()
        },
        1,
    );
    for c in [&mut fixed, &mut off] {
        c.set_brake(Some(Brake {
            min_backoff: 0.75,
            until: None,
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
            ..Settings::default()
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
            ..Settings::default()
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
            ..Settings::default()
        },
        1,
        None,
    );
    assert_eq!(c.algorithm(), Algorithm::Fixed);
    assert_eq!(c.backoff(T0), 0.0);
    let mut sp = build(Settings::default(), 1);
    for _ in 0..50 {
        sp.record(T0, Outcome::DependencyFailure);
    }
    let mut c2 = build(
        Settings {
            algorithm: Algorithm::Fixed,
            ..Settings::default()
        },
        1,
    );
    c2.set_brake(Some(Brake {
        min_backoff: 0.25,
        until: None,
    }));
    apply_settings(&mut c2, T0, Settings::default(), 1, c2_brake());
    assert_eq!(c2.algorithm(), Algorithm::SetPoint);
    assert_eq!(c2.backoff(T0), 0.25, "carried from Fixed under brake");
}

fn c2_brake() -> Option<Brake> {
    Some(Brake {
        min_backoff: 0.25,
        until: None,
    })
}

#[test]
fn same_seed_same_probe_schedule() {
    let schedule = |seed| {
        let mut c = SetPoint::new(
            Settings {
                credit: 0.0,
                ..Settings::default()
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
    let mut c = RatioThrottle::new(Settings::default(), 5);
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

// ---------------------------------------------------------------------------------------------
// Property tests.

/// One operation of an arbitrary driver.
#[derive(Clone, Debug)]
enum Op {
    Record(u8),
    Permits(u8),
    Release(u8),
    Advance(u32),
    Brake(Option<(f64, u16)>),
    Reconfigure(u32, f64, u32),
    HealthCheck(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..3).prop_map(Op::Record),
        3 => any::<u8>().prop_map(Op::Permits),
        1 => any::<u8>().prop_map(Op::Release),
        3 => (0u32..120_000).prop_map(Op::Advance),
        1 => proptest::option::of((-0.5f64..1.5, 0u16..600)).prop_map(Op::Brake),
        1 => (0u32..80, -0.5f64..1.5, 0u32..100).prop_map(|(p, s, n)| Op::Reconfigure(p, s, n)),
        1 => any::<bool>().prop_map(Op::HealthCheck),
    ]
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::SetPoint),
        Just(Algorithm::RatioThrottle),
        Just(Algorithm::Fixed),
        Just(Algorithm::Off),
    ]
}

fn fixed_seed(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(0x00b0_0c0f_fee0),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A dependency whose failure probability depends on the offered load: it serves `capacity`
/// concurrent requests, and a request that arrives while `c` requests are in flight (itself
/// included) fails with probability `max(0, 1 - capacity / c)`: the excess is rejected
/// (a quota or a saturated pool). At the worker's full concurrency `P` the failure fraction is
/// `f = 1 - capacity / P`.
///
/// Each message takes a latency drawn uniformly from [0.5, 1.5) x `latency`. The worker asks the
/// controller for permits whenever something changes and starts that many messages.
struct LoadSim {
    now: Nanos,
    heap: BinaryHeap<Reverse<(Nanos, bool)>>,
    rng: SplitMix64,
    latency: Nanos,
}

impl LoadSim {
    fn new(seed: u64, latency: Nanos) -> Self {
        LoadSim {
            now: Nanos::from_secs(1),
            heap: BinaryHeap::new(),
            rng: SplitMix64::new(seed),
            latency,
        }
    }

    /// Starts what the controller allows, then completes the next message. Returns its outcome
    /// (`None` when nothing was in flight and time advanced instead).
    fn step(
        &mut self,
        c: &mut dyn Controller,
        fail_probability: &mut dyn FnMut(Nanos, usize) -> f64,
    ) -> Option<Outcome> {
        let k = c.permits(self.now, self.heap.len() as u32);
        for _ in 0..k {
            let concurrency = self.heap.len() + 1;
            let p = fail_probability(self.now, concurrency);
            let fail = self.rng.next_f64() < p;
            let jitter = 0.5 + self.rng.next_f64();
            let done = self.now + Nanos((self.latency.0 as f64 * jitter) as u64);
            self.heap.push(Reverse((done, fail)));
        }
        match self.heap.pop() {
            Some(Reverse((t, fail))) => {
                self.now = t;
                let outcome = if fail {
                    Outcome::DependencyFailure
                } else {
                    Outcome::Success
                };
                c.record(self.now, outcome);
                Some(outcome)
            }
            None => {
                let next = c
                    .next_change(self.now)
                    .unwrap_or(self.now + Nanos::from_millis(10));
                self.now = next.max(self.now + Nanos(1));
                None
            }
        }
    }
}

proptest! {
    #![proptest_config(fixed_seed(256))]

    /// Whatever the sequence of calls, the backoff stays in `[0, 1]`, the limit never exceeds
    /// maxPermits and a grant never exceeds the limit minus what is in flight.
    #[test]
    fn backoff_always_in_unit_interval(
        algorithm in algorithm(),
        max_permits in 1u32..64,
        set_point in 0.001f64..0.5,
        reaction in 1u32..100,
        seed in any::<u64>(),
        ops in proptest::collection::vec(op(), 1..400),
    ) {
        let mut c = build(Settings {
            algorithm,
            max_permits,
            set_point,
            reaction,
            ..Settings::default()
        }, seed);
        let mut now = Nanos::from_secs(1);
        let mut in_flight = 0u32;
        for op in ops {
            match op {
                Op::Record(o) => {
                    c.record(now, Outcome::ALL[o as usize]);
                    in_flight = in_flight.saturating_sub(1);
                }
                Op::Permits(max) => {
                    let limit = c.limit(now);
                    let k = c.permits(now, in_flight);
                    if c.mode() != Mode::Probing {
                        prop_assert!(k <= limit.saturating_sub(in_flight));
                    } else {
                        prop_assert!(k <= 1 && (k == 0 || in_flight == 0));
                    }
                    in_flight += k.min(u32::from(max));
                }
                Op::Release(n) => {
                    let n = u32::from(n).min(in_flight);
                    c.release_unused(now, n);
                    in_flight -= n;
                }
                Op::Advance(ms) => now = now + Nanos::from_millis(u64::from(ms)),
                Op::Brake(b) => c.set_brake(b.map(|(min, secs)| Brake {
                    min_backoff: min,
                    until: Some(now + Nanos::from_secs(u64::from(secs))),
                })),
                Op::Reconfigure(p, s, n) => {
                    let settings = Settings {
                        max_permits: p,
                        set_point: s,
                        reaction: n,
                        ..c.settings().clone()
                    };
                    c.reconfigure(now, settings);
                }
                Op::HealthCheck(h) => {
                    if c.health_check_due(now) {
                        c.record_health_check(now, h);
                    }
                }
            }
            let b = c.backoff(now);
            prop_assert!((0.0..=1.0).contains(&b), "backoff {b}");
            prop_assert!(c.limit(now) <= c.settings().max_permits);
            if let Some(t) = c.next_change(now) {
                prop_assert!(t > now);
            }
        }
    }
}

proptest! {
    #![proptest_config(fixed_seed(48))]

    /// Sustained load-dependent overload (the [`LoadSim`] model): the dependency fails a
    /// fraction `f > s` of attempts at the worker's full concurrency and less at lower
    /// concurrency. After a warm-up, the failure fraction of the worker's attempts converges to
    /// within 1 percentage point of the set point `s`.
    #[test]
    fn failure_fraction_converges_to_set_point_under_overload(
        algorithm in prop_oneof![Just(Algorithm::SetPoint), Just(Algorithm::RatioThrottle)],
        set_point in 0.01f64..0.2,
        excess in 0.02f64..0.7,
        max_permits in 4u32..64,
        extra_reaction in 0u32..40,
        latency_ms in 5u64..500,
        starting in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let initial_permits = if starting { RECOMMENDED_INITIAL_PERMITS } else { 0 };
        let f = (set_point + excess).min(0.95);
        let capacity = f64::from(max_permits) * (1.0 - f);
        // The model needs capacity for one message at the set point; below that, full backoff
        // and probing take over (tested separately).
        prop_assume!(capacity >= 1.5);
        let reaction = backpressure_api::defaults::reaction(max_permits) + extra_reaction;
        let mut c = build(
            Settings { algorithm, initial_permits, ..settings(max_permits, set_point, reaction) },
            seed,
        );
        let mut sim = LoadSim::new(seed ^ 0x5eed, Nanos::from_millis(latency_ms));
        let mut fail = |_now: Nanos, concurrency: usize| (1.0 - capacity / concurrency as f64).max(0.0);
        let (warmup, measured) = (5_000u32, 40_000u32);
        let (mut attempts, mut failures, mut seen) = (0u32, 0u32, 0u32);
        while attempts < measured {
            if let Some(outcome) = sim.step(c.as_mut(), &mut fail) {
                seen += 1;
                if seen > warmup {
                    attempts += 1;
                    failures += u32::from(outcome == Outcome::DependencyFailure);
                }
            }
        }
        let fraction = f64::from(failures) / f64::from(attempts);
        prop_assert!((fraction - set_point).abs() <= 0.01,
            "{algorithm:?}: failure fraction {fraction:.4} vs set point {set_point:.4} (f at full load {f:.3}, capacity {capacity:.2})");
    }

    /// A dependency that fails a fraction `f <= s/2` of attempts regardless of load (background
    /// noise clearly under the set point): the backoff stays at exactly 0 and permits at
    /// maxPermits for 50,000 attempts. (As `f` approaches `s` no finite-memory controller can
    /// promise this: the noise alone crosses the set point now and then.)
    #[test]
    fn backoff_stays_zero_under_the_set_point(
        set_point in 0.01f64..0.2,
        ratio in 0.0f64..0.5,
        max_permits in 1u32..64,
        extra_reaction in 0u32..40,
        seed in any::<u64>(),
    ) {
        let f = set_point * ratio;
        let reaction = backpressure_api::defaults::reaction(max_permits) + extra_reaction;
        let mut c = SetPoint::new(settings(max_permits, set_point, reaction), seed);
        let mut sim = LoadSim::new(seed ^ 0xfeed, Nanos::from_millis(50));
        let mut fail = |_now: Nanos, _c: usize| f;
        let mut n = 0;
        while n < 50_000 {
            if sim.step(&mut c, &mut fail).is_some() {
                n += 1;
            }
            prop_assert_eq!(c.backoff(sim.now), 0.0, "after {} attempts", n);
            prop_assert_eq!(c.limit(sim.now), max_permits);
        }
    }

    /// Starting up under background noise clearly under the set point: the backoff stays 0, the
    /// controller leaves [`Mode::Starting`] for [`Mode::Normal`] (not for a backoff) within
    /// `64 maxPermits + 200` attempts, and from then on permits stay at maxPermits.
    #[test]
    fn startup_under_noise_reaches_full_permits_without_backing_off(
        set_point in 0.01f64..0.2,
        ratio in 0.0f64..0.5,
        max_permits in 3u32..64,
        initial in 1u32..3,
        seed in any::<u64>(),
    ) {
        let f = set_point * ratio;
        let reaction = backpressure_api::defaults::reaction(max_permits);
        let mut c = SetPoint::new(
            Settings { initial_permits: initial, ..settings(max_permits, set_point, reaction) },
            seed,
        );
        prop_assert_eq!(c.mode(), Mode::Starting);
        let mut sim = LoadSim::new(seed ^ 0xabc, Nanos::from_millis(50));
        let mut fail = |_now: Nanos, _c: usize| f;
        // The window's drift is at least (1 - f/s) g/w >= g/(2w) per outcome with
        // g = maxPermits/16: at most about 16 maxPermits outcomes to the top on average.
        let bound = 64 * max_permits + 200;
        let mut n = 0u32;
        while c.mode() == Mode::Starting {
            if sim.step(&mut c, &mut fail).is_some() {
                n += 1;
            }
            prop_assert_eq!(c.backoff(sim.now), 0.0);
            prop_assert!(n < bound, "still starting after {} attempts: {:?}", n, c);
        }
        prop_assert_eq!(c.mode(), Mode::Normal);
        for _ in 0..5_000 {
            sim.step(&mut c, &mut fail);
            prop_assert_eq!(c.limit(sim.now), max_permits);
        }
    }

    /// A full outage (every attempt fails) long enough to back the worker off fully, then full
    /// recovery. After the outage ends the controller is back at maxPermits within
    /// `2 latency + probe_max + ceil((1-s)N/s) latency` (at most one failed probe in flight at
    /// the end, one probe interval of at most `probe_max`, then each round of at most `latency`
    /// completes at least one success, and each success lowers the backoff by at least
    /// `s/((1-s)N)`), and it needs exactly one successful probe to get there.
    #[test]
    fn recovers_to_full_permits_within_bounded_probe_intervals(
        set_point in 0.02f64..0.2,
        max_permits in 1u32..64,
        probe_initial_s in 1u64..5,
        probe_max_s in 5u64..120,
        latency_ms in 1u64..100,
        outage_s in 20u64..7200,
        seed in any::<u64>(),
    ) {
        let reaction = backpressure_api::defaults::reaction(max_permits);
        let s = Settings {
            probe_initial: Nanos::from_secs(probe_initial_s),
            probe_max: Nanos::from_secs(probe_max_s),
            ..settings(max_permits, set_point, reaction)
        };
        let mut c = SetPoint::new(s, seed);
        let latency = Nanos::from_millis(latency_ms);
        let mut sim = LoadSim::new(seed, latency);
        let start = sim.now + Nanos::from_secs(5);
        let end = start + Nanos::from_secs(outage_s);
        let mut fail = |now: Nanos, _c: usize| if now >= start && now < end { 1.0 } else { 0.0 };
        let mut probed_fully = false;
        while sim.now < end {
            sim.step(&mut c, &mut fail);
            probed_fully |= c.mode() == Mode::Probing;
        }
        prop_assert!(probed_fully, "a {outage_s} s outage backs off fully");
        // latency is the mean; the model's latency is at most 1.5 x it.
        let max_latency = latency.0 * 3 / 2;
        let rounds = ((1.0 - set_point) * f64::from(reaction) / set_point).ceil() as u64;
        let bound = Nanos(2 * max_latency + probe_max_s * 1_000_000_000 + rounds * max_latency);
        let mut probes_after_end = 0;
        let mut was_probing = c.mode() == Mode::Probing;
        while c.limit(sim.now) < max_permits {
            prop_assert!(sim.now - end <= bound,
                "not recovered {:?} after the outage (bound {:?}, mode {:?}, limit {})",
                sim.now - end, bound, c.mode(), c.limit(sim.now));
            let probing = c.mode() == Mode::Probing;
            if probing && sim.heap.is_empty() && c.permits(sim.now, 0) == 1 && sim.now >= end {
                probes_after_end += 1;
            }
            sim.step(&mut c, &mut fail);
            was_probing = probing;
        }
        let _ = was_probing;
        prop_assert!(probes_after_end <= 1, "{probes_after_end} probes after the outage");
        let intervals = (sim.now - end).0.div_ceil(probe_max_s * 1_000_000_000);
        prop_assert!(intervals <= bound.0.div_ceil(probe_max_s * 1_000_000_000));
    }

    /// Regression: a probe grant consumed by an empty poll must come back. Fully backed off, a
    /// worker whose polls keep coming back empty is granted a probe again at once (nothing is
    /// in flight), however many empty polls happen; when a message finally arrives and
    /// succeeds, the worker leaves full backoff.
    #[test]
    fn probe_permit_used_by_an_empty_poll_is_returned(
        algorithm in prop_oneof![Just(Algorithm::SetPoint), Just(Algorithm::RatioThrottle)],
        max_permits in 1u32..64,
        empty_polls in 1usize..50,
        poll_ms in 0u64..5000,
        seed in any::<u64>(),
    ) {
        let mut c = build(Settings {
            algorithm,
            max_permits,
            credit: 0.0,
            ..Settings::default()
        }, seed);
        let mut now = Nanos::from_secs(1);
        back_off_fully(c.as_mut(), now);
        now = next_probe_time(c.as_mut(), now);
        for i in 0..empty_polls {
            // The worker polls with the granted probe; the poll returns nothing.
            // (RatioThrottle's window may forget the failures meanwhile: then more than one.)
            prop_assert!(c.permits(now, 0) >= 1, "probe grant lost after {} empty polls", i);
            now = now + Nanos::from_millis(poll_ms);
            c.release_unused(now, 1);
        }
        prop_assert!(c.permits(now, 0) >= 1);
        c.record(now, Outcome::Success);
        if c.mode() == Mode::Probing {
            // RatioThrottle needs its window to forget; it keeps granting probes meanwhile.
            prop_assert_eq!(c.algorithm(), Algorithm::RatioThrottle);
            prop_assert_eq!(c.permits(now, 0), 1);
        } else {
            prop_assert!(c.limit(now) >= 1);
        }
    }
}
