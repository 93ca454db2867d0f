#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use crate::policy::{BP_KEDA, BP_STATIC, GREEDY_KEDA, POLICIES, PRODUCER_VARIANTS};
use crate::scenario::{TargetMetric, Timeline};

fn file(name: &str) -> Scenario {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    Scenario::load(&dir.join(name)).unwrap()
}

fn target(metric: TargetMetric, max: Option<f64>, min: Option<f64>) -> Target {
    Target {
        metric,
        max,
        min,
        text: String::new(),
        policy: None,
    }
}

#[test]
fn seeds_change_the_spikes_and_nothing_else() {
    let s = file("1-intermittent-outage.yaml");
    let seeded = seeded(&s, 5);
    assert_eq!(seeded[0], s);
    let seeds: Vec<u64> = seeded.iter().map(|x| x.seed).collect();
    assert_eq!(seeds, (s.seed..s.seed + 5).collect::<Vec<_>>());
    let episodes: Vec<_> = seeded
        .iter()
        .map(|x| Timeline::new(x).episodes().to_vec())
        .collect();
    for (i, a) in episodes.iter().enumerate() {
        assert!(!a.is_empty());
        for b in &episodes[i + 1..] {
            assert_ne!(a, b, "two seeds gave the same spikes");
        }
    }
    for x in &seeded {
        assert_eq!(
            Scenario {
                seed: s.seed,
                ..x.clone()
            },
            s
        );
    }
}

#[test]
fn every_policy_runs_where_there_are_targets() {
    assert_eq!(policies(&file("1-intermittent-outage.yaml")), POLICIES);
    assert_eq!(policies(&file("3-producer-surge.yaml")), POLICIES);
    let mut none = file("1-intermittent-outage.yaml");
    none.targets.clear();
    assert!(policies(&none).is_empty());
    // A scenario with producer control also runs the variants of ours.
    let gated = file("12-bounded-broker-outage.yaml");
    let expected: Vec<Policy> = POLICIES.iter().chain(&PRODUCER_VARIANTS).copied().collect();
    assert_eq!(policies(&gated), expected);
}

#[test]
fn aggregates_met_median_and_worst() {
    // At most 1 (like scenario 1's DLQ): 0, 3, 1, 7, 7, unmeasurable.
    let t = target(TargetMetric::Dlq, Some(1.0), None);
    let values = [
        (10, Some(0.0)),
        (11, Some(3.0)),
        (12, Some(1.0)),
        (13, Some(7.0)),
        (14, Some(7.0)),
    ];
    let a = aggregate(&t, &values);
    assert_eq!((a.n, a.met, a.unmeasured), (5, 2, 0));
    assert_eq!(a.median, Some(3.0));
    // Ties: the first worst seed.
    assert_eq!(a.worst, Some((13, Some(7.0))));
    let mut with_none = values.to_vec();
    with_none.push((15, None));
    let a = aggregate(&t, &with_none);
    assert_eq!((a.n, a.met, a.unmeasured), (6, 2, 1));
    assert_eq!(a.median, Some(3.0));
    assert_eq!(a.worst, Some((15, None)));

    // At least 0.8 (scenario 6's held fraction): the worst is the lowest; even count.
    let t = target(TargetMetric::HeldFractionOfIncident, None, Some(0.8));
    let a = aggregate(
        &t,
        &[
            (1, Some(0.9)),
            (2, Some(0.7)),
            (3, Some(1.0)),
            (4, Some(0.8)),
        ],
    );
    assert_eq!((a.n, a.met), (4, 3));
    assert!((a.median.unwrap() - 0.85).abs() < 1e-12);
    assert_eq!(a.worst, Some((2, Some(0.7))));

    // All met: the worst is still the one closest to the bound.
    let a = aggregate(&t, &[(1, Some(0.95)), (2, Some(0.85)), (3, Some(0.99))]);
    assert_eq!(
        (a.met, a.median, a.worst),
        (3, Some(0.95), Some((2, Some(0.85))))
    );
    assert_eq!(aggregate(&t, &[]).worst, None);
}

#[test]
fn the_page_says_which_targets_hold() {
    let base = file("1-intermittent-outage.yaml");
    let t = base.targets[0].clone();
    let sweep = Sweep {
        scenarios: vec![ScenarioSweep {
            scenario: base.clone(),
            seeds: vec![101, 102, 103],
            policies: vec![BP_OURS],
            targets: vec![TargetSweep {
                target: t,
                values: vec![(101, Some(1.0)), (102, Some(37.0)), (103, Some(0.0))],
                by_policy: vec![
                    (
                        GREEDY_KEDA,
                        vec![(101, Some(900.0)), (102, Some(70.0)), (103, Some(1500.0))],
                    ),
                    (
                        BP_STATIC,
                        vec![(101, Some(1.0)), (102, Some(3.0)), (103, None)],
                    ),
                    (
                        BP_OURS,
                        vec![(101, Some(1.0)), (102, Some(37.0)), (103, Some(0.0))],
                    ),
                ],
            }],
        }],
        seeds: 3,
        runs: 9,
        events: 1,
        sim_secs: 1.0,
    };
    let md = markdown(
        &sweep,
        &Provenance {
            command: "test".into(),
            wall_secs: 1.0,
            jobs: 1,
        },
    );
    assert!(
        md.contains("| **2 of 3** | 1 | 37 (102) | 1 (101) |"),
        "{md}"
    );
    assert!(md.contains("**0 of 1 hold on every seed**."), "{md}");
    assert!(
        md.contains("| scenario 1 | DLQ <= 1 | 101: 1, **102: 37**, 103: 0 |"),
        "{md}"
    );
    assert!(
        md.contains(
            "The report's seed 101 measures 1; of the other 2 seeds, 1 do worse and 1 better"
        ),
        "{md}"
    );
    // The comparison: per policy median / worst / met; "—" where a policy has no values.
    assert!(
        md.contains(
            "| scenario 1 | DLQ <= 1 | 900 / 1500 (103) / 0 of 3 | 2 / not measurable (103) \
             / 1 of 3 | — | **1 / 37 (102) / 2 of 3** |"
        ),
        "{md}"
    );
    assert!(
        md.contains(
            "| scenario 1 | DLQ <= 1 | lower | 3 of 3 | 1 of 2 (1 tie); 1 not comparable | — |"
        ),
        "{md}"
    );
    assert!(
        md.contains(
            "- **scenario 1, DLQ <= 1**: ours has median 1 (meets it on 2 of 3 seeds); the \
             best other median is 2 (backpressure + static, meets it on 1 of 3), the worst \
             900 (greedy + KEDA queue age (Value), meets it on 0 of 3). Seed by seed, ours is \
             at least as good as greedy + KEDA queue age (Value) on 3 of 3 and backpressure + static on 1 of 2 (1 \
             tie); 1 not comparable."
        ),
        "{md}"
    );
}

fn summary(dlq: u64, max_age: f64, held: f64) -> Summary {
    Summary {
        produced: 0,
        completed: 0,
        dead_lettered: dlq,
        attempts: 0,
        failed_attempts: 0,
        goodput: None,
        failure_rate: None,
        failure_rate_peak: None,
        max_age,
        p99_wait: 0.0,
        drain: None,
        peak_load_after_recovery: None,
        replica_hours: 0.0,
        max_replicas: 0,
        added_during_incident: 0,
        held_secs: held,
        held_fraction_incident: Some(held / 100.0),
        throttled_fraction: 0.0,
        max_backoff: 0.0,
        ramp_stages: 0,
        ramp_aborts: 0,
        overload_rate: None,
        held_per_hour: 0.0,
        held_after_recovery: None,
        held_with_headroom_per_hour: 0.0,
        held_with_headroom_after_recovery: None,
        demanded: 0,
        broker_rejected: 0,
        lost_to_broker: 0,
        peak_depth: 0,
        peak_producer_backlog: 0,
        max_end_to_end: 0.0,
        p99_end_to_end: 0.0,
        system_drain: None,
        restricted_secs: None,
        producer_changes: 0,
        restrictions: 0,
        reopened_after: None,
    }
}

#[test]
fn every_policy_is_measured_like_ours_except_our_operator_states() {
    let run = SeedRun {
        scenario: file("1-intermittent-outage.yaml"),
        summaries: vec![
            (GREEDY_KEDA, summary(1200, 400.0, 0.0)),
            (BP_STATIC, summary(0, 800.0, 0.0)),
            (BP_OURS, summary(9, 100.0, 50.0)),
        ],
    };
    let dlq = target(TargetMetric::Dlq, Some(1.0), None);
    assert_eq!(report::policy_value(&run, &dlq, GREEDY_KEDA), Some(1200.0));
    assert_eq!(report::policy_value(&run, &dlq, BP_STATIC), Some(0.0));
    assert_eq!(
        report::policy_value(&run, &dlq, BP_KEDA),
        None,
        "did not run"
    );
    assert_eq!(
        report::policy_value(&run, &dlq, BP_OURS),
        report::target_value(&run, &dlq)
    );
    // The relative target: each policy's age over greedy + KEDA queue age's.
    let age = target(TargetMetric::MaxAgeVsKeda, Some(1.1), None);
    assert_eq!(report::policy_value(&run, &age, BP_STATIC), Some(2.0));
    assert_eq!(report::policy_value(&run, &age, GREEDY_KEDA), Some(1.0));
    assert_eq!(report::target_value(&run, &age), Some(0.25));
    // Held and ramp stages exist only under our operator.
    for m in [
        TargetMetric::HeldSeconds,
        TargetMetric::HeldFractionOfIncident,
        TargetMetric::RampStages,
    ] {
        let t = target(m, None, Some(0.0));
        assert!(report::policy_value(&run, &t, BP_OURS).is_some());
        assert_eq!(report::policy_value(&run, &t, BP_STATIC), None);
        assert_eq!(report::policy_value(&run, &t, GREEDY_KEDA), None);
    }
}

#[test]
fn direction_comes_from_the_bound() {
    assert_eq!(
        better(&target(TargetMetric::Dlq, Some(1.0), None)),
        Some(Better::Lower)
    );
    assert_eq!(
        better(&target(TargetMetric::Goodput, None, Some(0.95))),
        Some(Better::Higher)
    );
    assert_eq!(
        better(&target(TargetMetric::Goodput, Some(1.0), Some(0.9))),
        None
    );
    assert_eq!(better(&target(TargetMetric::Goodput, None, None)), None);
}

#[test]
fn head_to_head_counts_seeds_at_least_as_good() {
    let ours = [
        (1, Some(1.0)),
        (2, Some(5.0)),
        (3, Some(2.0)),
        (4, Some(0.0)),
    ];
    let other = [
        (1, Some(3.0)),
        (2, Some(4.0)),
        (3, Some(2.0)),
        (4, Some(9.0)),
    ];
    // Lower is better: 1 < 3, 5 > 4, 2 = 2, 0 < 9.
    assert_eq!(
        head_to_head(Better::Lower, &ours, &other),
        HeadToHead {
            compared: 4,
            at_least_as_good: 3,
            ties: 1,
            not_comparable: 0
        }
    );
    // Higher is better: only 5 > 4 and the tie.
    assert_eq!(
        head_to_head(Better::Higher, &ours, &other),
        HeadToHead {
            compared: 4,
            at_least_as_good: 2,
            ties: 1,
            not_comparable: 0
        }
    );
    // Against itself: every seed a tie, whichever the direction.
    for d in [Better::Lower, Better::Higher] {
        let h = head_to_head(d, &ours, &ours);
        assert_eq!((h.compared, h.at_least_as_good, h.ties), (4, 4, 4));
    }
    // Within 1e-12 is a tie, beyond is not.
    let h = head_to_head(Better::Higher, &[(1, Some(1.0))], &[(1, Some(1.0 + 1e-13))]);
    assert_eq!((h.at_least_as_good, h.ties), (1, 1));
    let h = head_to_head(Better::Higher, &[(1, Some(1.0))], &[(1, Some(1.0 + 1e-9))]);
    assert_eq!((h.at_least_as_good, h.ties), (0, 0));
}

#[test]
fn head_to_head_leaves_missing_values_out() {
    // Ours missing on seed 2, the other on seed 3, the other lacks seed 4 altogether; the
    // other's extra seed 9 is not one of ours.
    let ours = [(1, Some(1.0)), (2, None), (3, Some(2.0)), (4, Some(0.0))];
    let other = [(1, Some(3.0)), (2, Some(0.0)), (3, None), (9, Some(100.0))];
    assert_eq!(
        head_to_head(Better::Lower, &ours, &other),
        HeadToHead {
            compared: 1,
            at_least_as_good: 1,
            ties: 0,
            not_comparable: 3
        }
    );
    assert_eq!(
        head_to_head(Better::Higher, &ours, &other),
        HeadToHead {
            compared: 1,
            at_least_as_good: 0,
            ties: 0,
            not_comparable: 3
        }
    );
    assert_eq!(
        head_to_head(Better::Lower, &[], &other),
        HeadToHead {
            compared: 0,
            at_least_as_good: 0,
            ties: 0,
            not_comparable: 0
        }
    );
}

#[test]
fn comparator_medians_are_ordered_best_first() {
    let values = |m: f64| vec![(1, Some(m)), (2, Some(m)), (3, None)];
    let mut t = TargetSweep {
        target: target(TargetMetric::Goodput, None, Some(0.95)),
        values: values(0.9),
        by_policy: vec![
            (GREEDY_KEDA, values(0.5)),
            (BP_STATIC, values(0.99)),
            (BP_KEDA, vec![(1, None), (2, None)]),
            (BP_OURS, values(0.9)),
        ],
    };
    // Higher is better; ours and the policy without a median are left out.
    assert_eq!(
        comparator_medians(&t),
        [(BP_STATIC, 0.99), (GREEDY_KEDA, 0.5)]
    );
    t.target = target(TargetMetric::Goodput, Some(0.95), None);
    assert_eq!(
        comparator_medians(&t),
        [(GREEDY_KEDA, 0.5), (BP_STATIC, 0.99)]
    );
}

#[test]
fn a_short_sweep_is_deterministic_whatever_the_threads() {
    // Scenario 3 compressed to 9 minutes: two policies per seed (ours and the comparator).
    let s = file("3-producer-surge.yaml").compressed(0.05);
    let one = run(std::slice::from_ref(&s), 2, 1).unwrap();
    let two = run(std::slice::from_ref(&s), 2, 2).unwrap();
    assert_eq!(one, two);
    assert_eq!(one.runs, 2 * POLICIES.len());
    let t = &one.scenarios[0].targets[0];
    assert_eq!(t.values.len(), 2);
    // Every policy measured with the same metric; ours is the target's value, and the
    // comparator of the relative target is 1x against itself.
    let by: Vec<Policy> = t.by_policy.iter().map(|(p, _)| *p).collect();
    assert_eq!(by, POLICIES);
    assert_eq!(t.by_policy[3].1, t.values);
    assert!(
        t.by_policy[0]
            .1
            .iter()
            .all(|(_, v)| v.is_some_and(|x| (x - 1.0).abs() < 1e-12)),
        "{t:?}"
    );
    assert!(t.values.iter().all(|(_, v)| v.is_some()), "{t:?}");
    assert_ne!(t.values[0].1, t.values[1].1, "two seeds, the same value");
    assert!(matches!(run(&[s], 0, 1), Err(SweepError::NoSeeds)));
}
