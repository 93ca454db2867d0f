//! Acceptance tests of the simulator (issue 4): determinism, sanity, conservation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use backpressure_sim::metrics::summarize;
use backpressure_sim::policy::{
    BP_KEDA, BP_OURS, BP_STATIC, GREEDY_KEDA, Policy, ProducerControl, Scaler, Workers,
};
use backpressure_sim::report::{self, Provenance};
use backpressure_sim::{POLICIES, RunOutput, Scenario, Simulation, plot};

/// 40 simulated minutes: 10 min healthy, a 10 min hard outage, capacity back over 2 min.
const OUTAGE: &str = r#"
name: short-outage
title: Short outage
seed: 7
duration: 40m
producer: {rate: 60}
fleet: {replicas: 4, minReplicas: 4, maxReplicas: 16}
dependency:
  capacity: 150
  noise: 0.005
  outages:
    - {kind: hard, start: 10m, duration: 10m, recovery: 2m}
incident: {start: 10m, end: 20m}
# Redelivery after the visibility timeout (not the library's default redelivery backoff): the
# greedy fleet's DLQ then grows steadily through the outage.
workers: {redeliveryBackoff: null}
"#;

/// 30 simulated minutes of constant load at about half of what the fleet and the dependency
/// can serve.
const HEALTHY: &str = r#"
name: healthy
title: Healthy
seed: 11
duration: 30m
producer: {rate: 50}
fleet: {replicas: 6, minReplicas: 6, maxReplicas: 30}
dependency: {capacity: 200, noise: 0.005}
"#;

fn scenario(yaml: &str) -> Scenario {
    Scenario::from_yaml(yaml, "test").unwrap()
}

fn run(s: &Scenario, p: Policy) -> RunOutput {
    Simulation::new(s, p).run().unwrap()
}

#[test]
fn same_seed_gives_identical_outputs_and_another_seed_does_not() {
    let s = scenario(OUTAGE);
    for p in [BP_OURS, GREEDY_KEDA] {
        let a = run(&s, p);
        let b = run(&s, p);
        assert_eq!(a, b, "{}: two runs of the same scenario differ", p.name);
        assert_eq!(
            summarize(&s, Simulation::new(&s, p).timeline(), &a),
            summarize(&s, Simulation::new(&s, p).timeline(), &b)
        );
    }
    let mut other = s.clone();
    other.seed = 8;
    assert_ne!(run(&s, BP_OURS).samples, run(&other, BP_OURS).samples);
}

#[test]
fn results_do_not_depend_on_the_number_of_threads() {
    let scenarios = vec![scenario(OUTAGE), scenario(HEALTHY)];
    let one = report::run_all(&scenarios, 1).unwrap();
    let two = report::run_all(&scenarios, 3).unwrap();
    for (a, b) in one.iter().zip(&two) {
        for (x, y) in a.runs.iter().zip(&b.runs) {
            assert_eq!(x.output, y.output);
            assert_eq!(x.summary, y.summary);
        }
    }
}

#[test]
fn healthy_dependency_below_capacity_means_no_dlq_and_no_scaling() {
    let s = scenario(HEALTHY);
    for p in POLICIES {
        let out = run(&s, p);
        assert_eq!(out.dead_lettered, 0, "{}", p.name);
        assert!(
            out.samples.iter().all(|x| x.desired == 6 && x.pods == 6),
            "{}: replicas changed",
            p.name
        );
        assert!(out.completed > 85_000, "{}: {}", p.name, out.completed);
        // Nothing waits long: no backlog builds up.
        let m = summarize(&s, Simulation::new(&s, p).timeline(), &out);
        assert!(m.max_age < 2.0, "{}: max age {}", p.name, m.max_age);
        if p.workers == Workers::Backpressure {
            assert!(m.max_backoff < 0.2, "{}: backoff {}", p.name, m.max_backoff);
        }
    }
}

#[test]
fn hard_outage_with_greedy_workers_grows_the_dlq() {
    let s = scenario(OUTAGE);
    let greedy_static = Policy {
        key: "greedy-static",
        name: "greedy + static",
        workers: Workers::Greedy,
        scaler: Scaler::Static,
        producers: ProducerControl::None,
    };
    for p in [GREEDY_KEDA, greedy_static] {
        let out = run(&s, p);
        let dlq_at = |sec: usize| out.samples[sec].dead_lettered_total;
        assert_eq!(dlq_at(599), 0, "{}: DLQ before the outage", p.name);
        // Grows steadily through the outage: more every 2 minutes after the first 3.
        let mut prev = dlq_at(600 + 180);
        assert!(prev > 0, "{}", p.name);
        for sec in (600 + 300..1200).step_by(120) {
            assert!(dlq_at(sec) > prev, "{}: DLQ stalled at {sec}s", p.name);
            prev = dlq_at(sec);
        }
        // A large share of the ~36,000 messages that arrived during the outage (4 greedy pods
        // cannot even fail them all five times: 160 failed calls/s against 300/s needed).
        assert!(
            out.dead_lettered > 12_000,
            "{}: {}",
            p.name,
            out.dead_lettered
        );
    }
    // Backpressure workers keep the DLQ small in the same outage.
    let bp = run(&s, BP_STATIC);
    assert!(bp.dead_lettered < 20, "{}", bp.dead_lettered);
}

#[test]
fn conservation_holds_at_every_sample() {
    let s = scenario(OUTAGE);
    for p in POLICIES {
        let out = run(&s, p);
        assert_eq!(out.samples.len(), 2400);
        for (i, x) in out.samples.iter().enumerate() {
            assert_eq!(
                x.produced_total,
                x.completed_total + x.depth + u64::from(x.in_flight) + x.dead_lettered_total,
                "{} at {i}s: {x:?}",
                p.name
            );
        }
        assert_eq!(
            out.produced,
            out.completed + out.queued_at_end + out.in_flight_at_end + out.dead_lettered
        );
        let arrivals: u64 = out.samples.iter().map(|x| u64::from(x.arrivals)).sum();
        assert_eq!(arrivals, out.produced);
    }
}

#[test]
fn our_policy_holds_during_the_outage_and_keda_scales_out() {
    let s = scenario(OUTAGE);
    let ours = run(&s, BP_OURS);
    let keda = run(&s, BP_KEDA);
    let during = |o: &RunOutput| {
        o.samples[600..1200]
            .iter()
            .map(|x| x.desired)
            .max()
            .unwrap()
    };
    assert_eq!(during(&ours), 4, "ours added replicas during the outage");
    assert!(
        during(&keda) > 4,
        "KEDA on the queue age never reacted to the age"
    );
}

#[test]
fn halving_the_tick_changes_the_results_little() {
    let s = scenario(OUTAGE);
    let mut fine = s.clone();
    fine.tick = backpressure_sim::scenario::Dur(0.05);
    for p in [BP_STATIC, GREEDY_KEDA] {
        let a = summarize(&s, Simulation::new(&s, p).timeline(), &run(&s, p));
        let b = summarize(&fine, Simulation::new(&fine, p).timeline(), &run(&fine, p));
        let rel = |x: f64, y: f64| (x - y).abs() / x.abs().max(y.abs()).max(1e-9);
        assert!(
            rel(a.completed as f64, b.completed as f64) < 0.02,
            "{}: {a:?} vs {b:?}",
            p.name
        );
        assert!(
            rel(a.max_age, b.max_age) < 0.05,
            "{}: max age {} vs {}",
            p.name,
            a.max_age,
            b.max_age
        );
        assert!(
            rel(a.failure_rate.unwrap(), b.failure_rate.unwrap()) < 0.05,
            "{}: failure rate",
            p.name
        );
    }
}

#[test]
fn report_and_plot_contain_every_column_and_line() {
    let scenarios = vec![scenario(OUTAGE)];
    let results = report::run_all(&scenarios, 2).unwrap();
    let md = report::markdown(
        &results,
        &Provenance {
            command: "test".into(),
            wall_secs: 1.0,
            jobs: 2,
            compressed: None,
            seed_runs: None,
        },
    );
    for column in [
        "completed",
        "goodput",
        "failed attempts",
        "DLQ",
        "failure rate",
        "max first-attempt age",
        "p99 first-attempt wait",
        "drain after recovery / theoretical min",
        "peak load / capacity",
        "replica-hours",
        "million events/s",
    ] {
        assert!(md.contains(column), "missing {column:?}");
    }
    for p in POLICIES {
        assert!(
            md.contains(&format!("| {} |", p.name)),
            "missing row {}",
            p.name
        );
    }
    let runs: Vec<_> = results[0].runs.iter().map(|r| r.output.clone()).collect();
    let svg = plot::render(&results[0].scenario, &runs).unwrap();
    assert!(svg.starts_with("<svg"));
    // 4 panels x 5 policies, plus the capacity line.
    let lines = svg.matches("<polyline").count();
    assert!(lines >= 21, "{lines}");
    assert!(svg.contains("first-attempt queue age"));
    assert!(svg.contains(BP_OURS.name));
}

/// `fleet.coldStart`: the initial replicas are new pods (none ready before `startupDelay`);
/// without it they serve from the first second.
#[test]
fn a_cold_start_begins_with_new_pods() {
    let warm = scenario(HEALTHY);
    let mut cold = warm.clone();
    cold.fleet.cold_start = true;
    for (s, is_cold) in [(&warm, false), (&cold, true)] {
        let out = run(s, BP_OURS);
        let startup = s.fleet.startup_delay.secs() as usize;
        let first = &out.samples[..startup - 1];
        assert_eq!(
            first.iter().all(|x| x.ready == 0 && x.completed == 0),
            is_cold,
            "cold start {is_cold}: ready {:?}",
            first.iter().map(|x| x.ready).collect::<Vec<_>>()
        );
        let after = &out.samples[startup + 1];
        assert_eq!(after.ready, s.fleet.replicas, "cold start {is_cold}");
        // No message is lost to the start: everything produced is done or still in the system.
        assert_eq!(
            out.produced,
            out.completed + out.dead_lettered + out.queued_at_end + out.in_flight_at_end
        );
    }
}
