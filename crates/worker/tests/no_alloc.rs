//! The hot path (record an outcome, ask for permits; and the gate's acquire/start/finish cycle
//! with metrics) allocates nothing. Counted with an instrumented global allocator; this file
//! holds a single test so no other test thread allocates meanwhile. The counts are process
//! wide, so the test harness's own thread can show up once: each measurement is repeated up to
//! five times and must be zero in at least one round, and far below one per call in every round.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::alloc::System;

use backpressure_api::v1alpha1::Algorithm;
use backpressure_worker::controller::{self, Nanos, Outcome, Settings};
use backpressure_worker::metrics::Metrics;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const CALLS: u64 = 100_000;

/// Runs `work` (CALLS calls) until a round allocates nothing; panics with the counts if none
/// does or if any round allocates anywhere near once per call.
fn assert_no_alloc(what: &str, mut work: impl FnMut()) {
    let mut rounds = Vec::new();
    for _ in 0..5 {
        let region = Region::new(GLOBAL);
        work();
        let stats = region.change();
        assert!(
            stats.allocations + stats.reallocations < 100,
            "{what}: {stats:?} in {CALLS} calls"
        );
        rounds.push(stats.allocations + stats.reallocations);
        if rounds.last() == Some(&0) {
            return;
        }
    }
    panic!("{what}: allocations in every round: {rounds:?}");
}

#[test]
fn hot_path_does_not_allocate() {
    for algorithm in [
        Algorithm::SetPoint,
        Algorithm::RatioThrottle,
        Algorithm::Fixed,
        Algorithm::Off,
    ] {
        let mut c = controller::build(
            Settings {
                algorithm,
                ..Settings::default()
            },
            1,
        );
        let mut permits = 0u64;
        let mut t = 0u64;
        assert_no_alloc(&format!("{algorithm:?}"), || {
            for _ in 0..CALLS {
                t += 1;
                let now = Nanos(t * 1_000_000);
                let outcome = if t.is_multiple_of(7) {
                    Outcome::DependencyFailure
                } else {
                    Outcome::Success
                };
                c.record(now, outcome);
                permits += u64::from(c.permits(now, (t % 4) as u32));
            }
        });
        assert!(permits > 0);
    }

    let metrics = Metrics::new("w");
    let gate = common::running_gate(&metrics);
    let mut calls = 0u64;
    assert_no_alloc("gate", || {
        for _ in 0..CALLS {
            calls += 1;
            let mut p = gate.try_acquire(1).expect("a permit");
            let m = p.start();
            drop(p);
            m.finish(if calls.is_multiple_of(50) {
                Outcome::DependencyFailure
            } else {
                Outcome::Success
            });
        }
    });
    assert_eq!(metrics.outcome_count(Outcome::Success), calls - calls / 50);
}
