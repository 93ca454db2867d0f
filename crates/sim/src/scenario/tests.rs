#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

const MINIMAL: &str = r#"
name: t
title: T
seed: 1
duration: 2h
producer:
  rate: 10
  steps: [{at: 1h, rate: 20}]
  surges: [{start: 30m, duration: 10m, factor: 5}]
fleet: {replicas: 2, minReplicas: 1, maxReplicas: 4}
dependency:
  capacity: 100
  noise: 0.01
  capacitySteps: [{at: 90m, capacity: 50}]
  outages:
    - {kind: hard, start: 10m, duration: 5m, recovery: 10m}
    - {kind: intermittent, start: 1h, duration: 30m, meanGap: 2m, length: [10s, 1m], depth: [0.5, 1.0]}
"#;

#[test]
fn parses_with_defaults_and_expands_the_timeline() {
    let s = Scenario::from_yaml(MINIMAL, "t").unwrap();
    assert_eq!(s.tick, Dur(0.1));
    assert_eq!(s.queue.max_receives, 5);
    assert_eq!(s.workers.reaction(), 20);
    let tl = Timeline::new(&s);
    assert_eq!(tl.arrival_rate(0.0), 10.0);
    assert_eq!(tl.arrival_rate(1800.0 + 1.0), 50.0);
    assert_eq!(tl.arrival_rate(3600.0), 20.0);
    // Hard outage: capacity 0 and every call fails; then a linear return.
    assert_eq!(tl.capacity(700.0), 0.0);
    assert_eq!(tl.failure_probability(700.0), 1.0);
    assert!((tl.capacity(900.0 + 300.0) - 50.0).abs() < 1e-9);
    assert_eq!(tl.capacity(2000.0), 100.0);
    assert!((tl.failure_probability(2000.0) - 0.01).abs() < 1e-12);
    assert_eq!(tl.nominal_capacity(90.0 * 60.0 + 1.0), 50.0);
    // Spikes lie inside their period, are disjoint and ordered.
    let spikes: Vec<_> = tl.episodes().iter().filter(|e| e.start >= 3600.0).collect();
    assert!(!spikes.is_empty());
    for w in spikes.windows(2) {
        assert!(w[0].end <= w[1].start);
    }
    assert!(spikes.iter().all(|e| e.end <= 5400.0 && e.failure >= 0.5));
}

#[test]
fn spikes_depend_on_the_seed_only() {
    let a = Scenario::from_yaml(MINIMAL, "t").unwrap();
    let mut b = a.clone();
    b.seed = 2;
    let ea = Timeline::new(&a).episodes().to_vec();
    assert_eq!(ea, Timeline::new(&a).episodes().to_vec());
    assert_ne!(ea, Timeline::new(&b).episodes().to_vec());
}

#[test]
fn refuses_unknown_fields_and_bad_values() {
    let typo = MINIMAL.replace("noise:", "noyse:");
    assert!(matches!(
        Scenario::from_yaml(&typo, "t"),
        Err(ScenarioError::Parse { .. })
    ));
    let bad = MINIMAL.replace("replicas: 2,", "replicas: 9,");
    let err = Scenario::from_yaml(&bad, "t").unwrap_err();
    assert!(err.to_string().contains("fleet.replicas"), "{err}");
    let bad = MINIMAL.replace("duration: 2h", "duration: 2x");
    assert!(Scenario::from_yaml(&bad, "t").is_err());
}

#[test]
fn compression_scales_the_timeline_only() {
    let s = Scenario::from_yaml(MINIMAL, "t").unwrap();
    let q = s.compressed(0.5);
    assert_eq!(q.duration, Dur(3600.0));
    assert_eq!(q.producer.steps[0].at, Dur(1800.0));
    assert_eq!(q.fleet.startup_delay, s.fleet.startup_delay);
    assert_eq!(q.queue, s.queue);
}

/// Every committed scenario loads and validates, numbered in file order without gaps, with a
/// unique name and at least one target (a broken file would otherwise fail only `make bench`).
#[test]
fn every_committed_scenario_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let all = Scenario::load_dir(&dir).unwrap();
    assert!(all.len() >= 16, "{} scenarios", all.len());
    let mut names = std::collections::BTreeSet::new();
    for (i, s) in all.iter().enumerate() {
        assert!(names.insert(s.name.clone()), "{}: name used twice", s.name);
        assert!(!s.targets.is_empty(), "{}: no targets", s.name);
        let n = s.title.split('.').next().unwrap_or_default();
        assert_eq!(n, (i + 1).to_string(), "{}: title {:?}", s.name, s.title);
    }
}
