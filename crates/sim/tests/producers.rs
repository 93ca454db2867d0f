//! Producer control and a bounded broker (issue 17): the broker never stores more than its
//! capacity, the producers' gate never drops a message, and a scenario without a `producers`
//! section runs exactly as before.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use backpressure_api::v1alpha1::ProducerState;
use backpressure_sim::metrics::summarize;
use backpressure_sim::policy::{
    self, BP_KEDA, BP_OURS, BP_OURS_THROTTLE, BP_OURS_UNGATED, GREEDY_KEDA,
};
use backpressure_sim::{POLICIES, RunOutput, Scenario, Simulation};

/// 70 simulated minutes: 10 min healthy, a 15 min hard outage at 60 msg/s (54,000 messages)
/// into a broker that stores 20,000, capacity back over 2 min.
const BOUNDED: &str = r#"
name: bounded
title: Bounded broker
seed: 17
duration: 70m
producer: {rate: 60}
queue: {capacity: 20000}
producers:
  mode: Pause
  queueDepth: {pauseAbove: 5000, resumeBelow: 1000}
  resumeDwell: 90s
fleet: {replicas: 4, minReplicas: 4, maxReplicas: 16}
dependency:
  capacity: 150
  noise: 0.005
  outages:
    - {kind: hard, start: 10m, duration: 15m, recovery: 2m}
incident: {start: 10m, end: 25m}
"#;

fn scenario() -> Scenario {
    Scenario::from_yaml(BOUNDED, "test").unwrap()
}

fn run(s: &Scenario, p: policy::Policy) -> RunOutput {
    Simulation::new(s, p).run().unwrap()
}

/// Every message demanded is completed, dead-lettered, waiting at the broker, in flight,
/// waiting at the producers, or lost to a broker rejection: at every second and at the end.
fn assert_conserved(out: &RunOutput, name: &str) {
    for (i, x) in out.samples.iter().enumerate() {
        let demanded: u64 = out.samples[..=i].iter().map(|y| u64::from(y.demand)).sum();
        let lost: u64 = if out.producer_control {
            0
        } else {
            out.samples[..=i]
                .iter()
                .map(|y| u64::from(y.broker_rejected))
                .sum()
        };
        assert_eq!(
            demanded,
            x.completed_total
                + x.dead_lettered_total
                + x.depth
                + u64::from(x.in_flight)
                + x.producer_backlog
                + lost,
            "{name}: a message went missing at {i} s"
        );
    }
    assert_eq!(
        out.demanded,
        out.completed
            + out.dead_lettered
            + out.queued_at_end
            + out.in_flight_at_end
            + out.producer_backlog_at_end
            + out.lost_to_broker,
        "{name}: at the end"
    );
}

#[test]
fn the_broker_never_stores_more_than_its_capacity_and_rejects_without_control() {
    let s = scenario();
    let capacity = s.queue.capacity.unwrap();
    for p in policy::for_scenario(&s) {
        let out = run(&s, p);
        assert!(
            out.peak_stored <= capacity,
            "{}: stored {} > {capacity}",
            p.name,
            out.peak_stored
        );
        for x in &out.samples {
            assert!(x.depth + u64::from(x.in_flight) <= capacity, "{}", p.name);
        }
        assert_conserved(&out, p.name);
    }
    // Without producer control the 15-minute backlog does not fit: the broker fills up and
    // rejects, and the rejected messages are lost.
    let ungated = run(&s, BP_OURS_UNGATED);
    assert!(!ungated.producer_control);
    assert_eq!(ungated.peak_stored, capacity);
    assert!(
        ungated.broker_rejected > 10_000,
        "{}",
        ungated.broker_rejected
    );
    assert_eq!(ungated.lost_to_broker, ungated.broker_rejected);
    assert_eq!(ungated.peak_producer_backlog, 0);
}

#[test]
fn with_producer_control_the_gate_holds_the_backlog_and_drops_nothing() {
    let s = scenario();
    for p in [BP_OURS, BP_OURS_THROTTLE] {
        let out = run(&s, p);
        assert!(out.producer_control, "{}", p.name);
        assert_conserved(&out, p.name);
        assert_eq!(out.lost_to_broker, 0, "{}", p.name);
        assert_eq!(out.broker_rejected, 0, "{}", p.name);
        // Restricted during the outage, held most of it at the producers, open again after.
        let first = out.producer_log.first().expect("a restriction");
        assert!(
            matches!(
                first.state,
                ProducerState::Paused | ProducerState::Throttled
            ),
            "{}: {first:?}",
            p.name
        );
        assert!((600.0..1500.0).contains(&first.t), "{}: {first:?}", p.name);
        assert!(out.peak_producer_backlog > 30_000, "{}", p.name);
        // Until the first resume step the depth stays under pauseAbove + 22 s of arrivals
        // (one 15 s decision interval on a scrape up to 7 s old), with room for the Poisson
        // noise: the gate closes when the decision says so. (After it, how high the depth
        // goes depends on the core's resume steps, which the report measures.)
        let resumed = out
            .producer_log
            .iter()
            .find(|l| l.state == ProducerState::Resuming)
            .map_or(out.samples.len(), |l| l.t as usize);
        let peak = out.samples[..resumed]
            .iter()
            .map(|x| x.depth)
            .max()
            .unwrap();
        assert!(
            peak <= 5_000 + 22 * 60 + 300,
            "{}: peak depth {peak}",
            p.name
        );
        assert_eq!(
            out.producer_log.last().map(|l| l.state),
            Some(ProducerState::Open),
            "{}",
            p.name
        );
        assert_eq!(out.producer_backlog_at_end, 0, "{}", p.name);
        // Every message demanded was completed or dead-lettered by the end: none lost.
        assert_eq!(
            out.completed + out.dead_lettered + out.queued_at_end + out.in_flight_at_end,
            out.demanded,
            "{}",
            p.name
        );
        // The wait at the producers counts in the end-to-end age: at least the outage for the
        // first message held.
        let m = summarize(&s, Simulation::new(&s, p).timeline(), &out);
        assert!(m.max_end_to_end > 600.0, "{}: {}", p.name, m.max_end_to_end);
        assert!(m.restricted_secs.is_some_and(|x| x > 600.0), "{}", p.name);
        assert!(
            m.system_drain.is_some_and(|d| d.secs.is_some()),
            "{}",
            p.name
        );
    }
}

#[test]
fn policies_without_our_operator_never_gate_the_producers() {
    let s = scenario();
    for p in [GREEDY_KEDA, BP_KEDA, BP_OURS_UNGATED] {
        assert!(p.producers_for(&s).is_none(), "{}", p.name);
        let out = run(&s, p);
        assert!(
            !out.producer_control && out.producer_log.is_empty(),
            "{}",
            p.name
        );
    }
}

#[test]
fn without_a_producers_section_ours_and_its_ungated_variant_are_the_same_run() {
    // The same scenario without producer control and without a broker limit: bp-ours runs
    // exactly like bp-ours-ungated, publishes every message and rejects none.
    let mut s = scenario();
    s.producers = None;
    s.queue.capacity = None;
    assert_eq!(policy::for_scenario(&s), POLICIES);
    let ours = run(&s, BP_OURS);
    let mut ungated = run(&s, BP_OURS_UNGATED);
    ungated.policy = BP_OURS;
    assert_eq!(ours, ungated);
    assert_eq!(ours.broker_rejected, 0);
    assert_eq!(
        ours.demanded,
        ours.samples
            .iter()
            .map(|x| u64::from(x.arrivals))
            .sum::<u64>()
    );
    // Without a producer wait the end-to-end age of a message is its first-attempt wait plus
    // its processing (and its redeliveries): never shorter than the wait.
    assert!(ours.end_to_end.max() >= ours.first_wait.max());
}

#[test]
fn a_gated_producer_keeps_what_a_full_broker_refuses() {
    // A broker smaller than the high watermark: it fills before producer control reacts, so
    // the broker refuses publishes while the gate is open. The producers keep them: nothing
    // is lost, the refused messages are published later.
    let mut s = scenario();
    s.queue.capacity = Some(3_000);
    // The broker's age stays under the scaling target with the backlog held at the producers
    // (the operator does not see it), so give the fleet enough pods to drain it by the end.
    s.fleet.replicas = 6;
    s.fleet.min_replicas = 6;
    let out = run(&s, BP_OURS);
    assert!(out.broker_rejected > 0, "the broker never refused");
    assert_eq!(out.lost_to_broker, 0);
    assert!(out.peak_stored <= 3_000);
    assert_conserved(&out, "bp-ours, broker of 3,000");
    assert_eq!(
        out.producer_backlog_at_end, 0,
        "the producers did not drain"
    );
    assert_eq!(
        out.completed + out.dead_lettered + out.queued_at_end + out.in_flight_at_end,
        out.demanded - out.producer_backlog_at_end
    );
    // Without producer control the same broker loses what it refuses.
    let ungated = run(&s, BP_OURS_UNGATED);
    assert!(ungated.lost_to_broker > 0);
    assert_conserved(&ungated, "bp-ours-ungated, broker of 3,000");
}
