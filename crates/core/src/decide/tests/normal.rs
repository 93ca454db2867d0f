//! Healthy and Backlogged: sizing, step limits, stabilization, bounds, activation from zero.

use super::*;

#[test]
fn healthy_to_backlogged_scales_out_within_step_limits() {
    let mut w = World::new(defaults(), 2);
    let ds = run(
        "backlog",
        &mut w,
        &[
            step(0, 0.0, Steady, Healthy, 2, Action::None),
            // Backlog sized to 14; one step from 2 may add max(4 pods, 100%) = 6.
            step(15, 0.0, Backlog, Backlogged, 6, ScaleOut),
            // Within the scale-up period nothing more is granted.
            step(5, 0.0, Backlog, Backlogged, 6, Action::None),
            step(10, 0.0, Backlog, Backlogged, 12, ScaleOut),
            step(15, 0.0, Backlog, Backlogged, 14, ScaleOut),
            step(15, 0.0, Backlog, Backlogged, 14, Action::None),
        ],
    );
    let d = &ds[1];
    assert_eq!(d.recommended_replicas, 14);
    let reasons: Vec<&str> = d.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, vec!["Backlogged", "ScaledOut"]);
    let msg = &d.events[1].message;
    assert!(
        msg.contains("arrivals 300/s") && msg.contains("2 → 6"),
        "{msg}"
    );
    assert!(msg.contains("step limit"), "{msg}");
    let rec = d.status.last_decision.as_ref().unwrap();
    assert_eq!((rec.action, rec.from, rec.to), (ScaleOut, 2, 6));
    assert_eq!(d.status.replicas.as_ref().unwrap().recommended, 14);
}

#[test]
fn stabilization_delays_and_limits_scale_down() {
    let mut w = World::new(defaults(), 10);
    run(
        "steady",
        &mut w,
        &[step(0, 0.0, Steady, Healthy, 10, Action::None)],
    );
    // The queue empties: the recommendation drops to 1, but the highest recommendation of the
    // last 300 s is 10 until 10 has been out of the window for 300 s.
    let mut steps = vec![step(15, 0.0, Idle, Healthy, 10, Action::None)];
    steps.extend((0..18).map(|_| step(15, 0.0, Idle, Healthy, 10, Action::None)));
    let ds = run("idle", &mut w, &steps);
    assert_eq!(ds[0].recommended_replicas, 1);
    assert!(
        ds[0].reason.contains("scale-in held by stabilization"),
        "{}",
        ds[0].reason
    );
    // The 10 was last recommended at t=0 and replaced at t=15: out of the window at t=315.
    assert_eq!(w.t, 285);
    run(
        "scale in",
        &mut w,
        &[
            step(30, 0.0, Idle, Healthy, 9, ScaleIn),
            step(30, 0.0, Idle, Healthy, 9, Action::None),
            step(30, 0.0, Idle, Healthy, 8, ScaleIn),
            step(60, 0.0, Idle, Healthy, 7, ScaleIn),
        ],
    );
    // A rise in the recommendation resets nothing upward: scale-out is immediate.
    run(
        "back up",
        &mut w,
        &[step(60, 0.0, Backlog, Backlogged, 14, ScaleOut)],
    );
}

#[test]
fn allow_scale_in_while_held() {
    for (allow, want, action) in [(true, 9, ScaleIn), (false, 10, Action::None)] {
        let mut w = World::new(
            effective(|s| {
                s.hold.allow_scale_in = allow;
                s.scale_down.stabilization = Duration::ZERO;
            }),
            10,
        );
        run(
            "held, queue empties",
            &mut w,
            &[
                step(0, 0.5, Steady, Healthy, 10, Action::None),
                step(30, 0.5, Steady, DependencyFailing, 10, HoldScaleOut),
                step(60, 0.5, Idle, DependencyFailing, want, action),
            ],
        );
    }
}

#[test]
fn pending_hold_defers_scale_in_too() {
    let mut w = World::new(
        effective(|s| s.scale_down.stabilization = Duration::ZERO),
        10,
    );
    let ds = run(
        "pending",
        &mut w,
        &[
            step(0, 0.0, Steady, Healthy, 10, Action::None),
            step(15, 0.5, Idle, Healthy, 10, Action::None),
            step(10, 0.0, Idle, Healthy, 9, ScaleIn),
        ],
    );
    assert!(
        ds[1].reason.contains("scale-in to 1 deferred"),
        "{}",
        ds[1].reason
    );
}

#[test]
fn bounds_win_over_everything() {
    // Replicas above a lowered maxReplicas are brought down at once, even while held.
    let mut w = World::new(effective(|s| s.max_replicas = 6), 8);
    let d = w.step(0);
    assert_eq!((d.desired_replicas, d.action), (6, ScaleIn));
    assert!(d.reason.contains("maxReplicas 6"), "{}", d.reason);
    let mut w = World::new(effective(|s| s.min_replicas = 3), 1);
    w.backoff = Some(0.9);
    w.step(0);
    let d = w.step(30);
    assert_eq!((d.regime, d.desired_replicas), (DependencyFailing, 3));
}

#[test]
fn a_fleet_scaled_to_zero_activates_on_backlog() {
    // No pods: no backoff series exists. That is not missing data.
    let mut w = World::new(effective(|s| s.min_replicas = 0), 0);
    w.backoff = None;
    w.queue(Idle);
    let d = w.step(0);
    assert_eq!(
        (d.regime, d.desired_replicas, d.action),
        (Backlogged, 1, ScaleOut),
        "{}",
        d.reason
    );
    let mut w = World::new(effective(|s| s.min_replicas = 0), 0);
    w.backoff = None;
    w.queue(Backlog);
    let d = w.step(0);
    assert_eq!((d.regime, d.action), (Backlogged, ScaleOut));
    assert_eq!(
        d.desired_replicas, 4,
        "0 → 4 (one scale-up step): {}",
        d.reason
    );
    // Once pods run, their backoff is required again.
    let d = w.step(15);
    assert_eq!((d.regime, d.desired_replicas), (MetricsUnavailable, 4));
    // A query error is never taken for "no pods".
    let mut w = World::new(effective(|s| s.min_replicas = 0), 0);
    w.backoff = None;
    w.error = Some("timeout".into());
    w.queue(Backlog);
    assert_eq!(w.step(0).regime, MetricsUnavailable);
}

#[test]
fn a_backlog_with_dependency_failures_above_the_set_point_does_not_scale_out() {
    // Backoff still low (the workers' credit absorbs the first failures), but 30% of the calls
    // fail: the backlog is the outage's, not the producer's.
    let w = {
        let mut w = World::new(defaults(), 2);
        w.backoff(0.05).queue(Backlog);
        w
    };
    let mut obs = w.observation();
    obs.fleet.failure_rate = Some(0.30);
    let d = decide(&w.eff, w.status.as_ref(), &obs);
    assert_eq!(d.desired_replicas, 2, "{}", d.reason);
    assert!(
        d.reason.contains("failure rate 30.0% > set point 5.0%"),
        "{}",
        d.reason
    );
    // The same backlog with failures at the noise level scales out.
    obs.fleet.failure_rate = Some(0.02);
    let d = decide(&w.eff, w.status.as_ref(), &obs);
    assert!(d.desired_replicas > 2, "{}", d.reason);
}

/// An effective configuration reading Kafka topic `orders` (maxReplicas 50), stating
/// `partitions` or leaving them to the exporter.
fn kafka(partitions: Option<i32>) -> Effective {
    use backpressure_api::v1alpha1::{KafkaQueue, QueueSpec, QueueSystem};
    let mut spec = super::super::fixtures::spec_for("export-worker");
    spec.queue = Some(QueueSpec {
        system: QueueSystem::Kafka,
        kafka: Some(KafkaQueue {
            topic: "orders".into(),
            consumer_group: "workers".into(),
            partitions,
            ..Default::default()
        }),
        ..Default::default()
    });
    let mut eff = crate::resolve::resolve(&spec, &[], at(0)).unwrap();
    eff.scaling.max_replicas = 50;
    eff
}

#[test]
fn kafka_partitions_cap_the_recommendation_and_the_decision_says_so() {
    // The backlog sizes to 14; the topic has 10 partitions.
    let mut w = World::new(kafka(Some(10)), 2);
    let ds = run(
        "stated partitions",
        &mut w,
        &[
            step(0, 0.0, Backlog, Backlogged, 6, ScaleOut),
            step(15, 0.0, Backlog, Backlogged, 10, ScaleOut),
            step(15, 0.0, Backlog, Backlogged, 10, Action::None),
        ],
    );
    assert_eq!(ds[2].recommended_replicas, 10);
    let msg = &ds[1].events.last().unwrap().message;
    assert!(
        msg.contains("capped at 10: topic orders has 10 partitions (spec.queue.kafka.partitions)"),
        "{msg}"
    );
    assert!(
        ds[2].reason.contains("more consumers than partitions idle"),
        "{}",
        ds[2].reason
    );

    // Unstated: the exporter's count caps (6), and without it nothing does.
    let mut w = World::new(kafka(None), 2);
    w.partitions = Some(6.0);
    let ds = run(
        "counted partitions",
        &mut w,
        &[
            step(0, 0.0, Backlog, Backlogged, 6, ScaleOut),
            step(15, 0.0, Backlog, Backlogged, 6, Action::None),
        ],
    );
    assert!(
        ds[1]
            .reason
            .contains("capped at 6: topic orders has 6 partitions (counted by the exporter)"),
        "{}",
        ds[1].reason
    );
    w.partitions = None;
    let d = w.step(15);
    assert_eq!(
        (d.recommended_replicas, d.desired_replicas),
        (14, 12),
        "{}",
        d.reason
    );

    // Fewer partitions than replicas running: the recommendation scales in to them.
    let mut w = World::new(kafka(Some(4)), 12);
    let d = w.step(0);
    assert_eq!(d.recommended_replicas, 4, "{}", d.reason);

    // A queue that is not Kafka has no cap, whatever a partitions series says.
    let mut w = World::new(defaults(), 2);
    w.partitions = Some(3.0);
    w.queue(Backlog);
    w.step(0);
    let d = w.step(15);
    assert_eq!(d.recommended_replicas, 14, "{}", d.reason);
}

/// The lab's cold start on a real node (CI, `outage-and-recovery`): the pods of a 2-replica
/// fleet become ready while a small backlog waits, and the first completion rate still covers
/// mostly the time before them: `17.2/s over 2` pods read as 8.6/s per pod, and the early
/// scale-out of rule 2 took the fleet's own start for producers outpacing it (2 → 3 there,
/// 2 → 6 in CI, which an outage then met over-provisioned).
#[test]
fn pods_that_just_became_ready_are_counted_for_their_share_of_the_rate_window() {
    let mut eff = effective(|s| {
        s.target_queue_age = std::time::Duration::from_secs(10);
        s.min_replicas = 2;
        s.max_replicas = 10;
    });
    eff.metrics.rate_window = std::time::Duration::from_secs(10);
    let observe = |t: i64, ready: i32, depth: f64, age: f64, completion: Option<f64>| Observation {
        now: at(t),
        generation: Some(1),
        current_replicas: 2,
        ready_pods: ready,
        fleet: FleetMetrics {
            backoff: Some(0.0),
            failure_rate: Some(0.0),
            queue_age: Some(age),
            queue_depth: Some(depth),
            arrival_rate: Some(19.9),
            completion_rate: completion,
            ..FleetMetrics::default()
        },
        metrics_error: None,
        config: None,
    };
    // Pods starting: nothing to measure a per-pod rate with.
    let d0 = decide(&eff, None, &observe(0, 0, 26.0, 1.0, None));
    assert_eq!(d0.desired_replicas, 2, "{}", d0.reason);
    // Ready 2 s later; the window has seen them for 2 of its 10 s.
    let starting = observe(2, 2, 42.0, 2.0, Some(17.2));
    let d1 = decide(&eff, Some(&d0.status), &starting);
    assert_eq!(d1.desired_replicas, 2, "{}", d1.reason);
    let tracking = d1.status.tracking.as_ref().unwrap();
    assert_eq!(tracking.pods_before_rise, Some(0.0));
    // The same numbers with the pods ready for the whole window: producers outpace the fleet
    // (need 19.9/s at 8.6/s per pod), an early scale-out.
    let settled = observe(12, 2, 42.0, 2.0, Some(17.2));
    let d2 = decide(&eff, Some(&d1.status), &settled);
    assert_eq!(
        (d2.action, d2.desired_replicas),
        (ScaleOut, 3),
        "{}",
        d2.reason
    );
    assert!(
        d2.status
            .tracking
            .as_ref()
            .is_none_or(|t| t.ready_rose_at.is_none() && t.pods_before_rise.is_none()),
        "{:?}",
        d2.status.tracking
    );
    // Without the status's memory of the rise (the rule removed) the start itself scaled out.
    let mut forgot = d1.status.clone();
    forgot.tracking = None;
    forgot.fleet.as_mut().unwrap().ready_pods = Some(2);
    let d = decide(&eff, Some(&forgot), &observe(3, 2, 42.0, 2.0, Some(17.2)));
    assert_eq!(d.action, ScaleOut, "{}", d.reason);
}

/// With the queue older than its target (rule 1) right after a start, the pods are still
/// counted for the share of the rate window they were ready: 10 pods ready for half of it, a
/// completion rate of 50/s is 10/s per pod, and 10 replicas keep up with 100/s; taken as 5/s
/// per ready pod, the same numbers asked for 20 (the simulator's cold start overshot 2 → 26).
#[test]
fn a_backlogged_start_is_sized_on_the_pods_counted() {
    let mut eff = effective(|s| {
        s.target_queue_age = std::time::Duration::from_secs(10);
        s.min_replicas = 2;
        s.max_replicas = 40;
    });
    eff.metrics.rate_window = std::time::Duration::from_secs(10);
    let observe = |t: i64, ready: i32, completion: Option<f64>| Observation {
        now: at(t),
        generation: Some(1),
        current_replicas: 10,
        ready_pods: ready,
        fleet: FleetMetrics {
            backoff: Some(0.0),
            failure_rate: Some(0.0),
            queue_age: Some(20.0),
            queue_depth: Some(0.0),
            arrival_rate: Some(100.0),
            completion_rate: completion,
            ..FleetMetrics::default()
        },
        metrics_error: None,
        config: None,
    };
    let d0 = decide(&eff, None, &observe(0, 0, None));
    let d1 = decide(&eff, Some(&d0.status), &observe(5, 10, Some(1.0)));
    let d2 = decide(&eff, Some(&d1.status), &observe(10, 10, Some(50.0)));
    assert_eq!(d2.desired_replicas, 10, "{}", d2.reason);
    assert!(d2.reason.contains("clears the backlog"), "{}", d2.reason);
    // Without the memory of the rise, the ready pods' rate sizes it.
    let mut forgot = d1.status.clone();
    forgot.tracking = None;
    forgot.fleet.as_mut().unwrap().ready_pods = Some(10);
    let d = decide(&eff, Some(&forgot), &observe(10, 10, Some(50.0)));
    assert_eq!(
        (d.action, d.desired_replicas),
        (ScaleOut, 20),
        "{}",
        d.reason
    );
}

/// Halfway through the window after a fleet's first 2 pods became ready the completion rate
/// stands for 1 pod: the early scale-out sizes with 1, not 2, and a second rise inside the
/// window starts from there. A rise from pods already ready (a scale-out step) is not
/// corrected.
#[test]
fn a_rise_inside_the_window_of_another_starts_from_the_pods_counted_then() {
    let mut eff = effective(|s| s.target_queue_age = std::time::Duration::from_secs(10));
    eff.metrics.rate_window = std::time::Duration::from_secs(10);
    let observe = |t: i64, ready: i32| Observation {
        now: at(t),
        generation: Some(1),
        current_replicas: ready.max(2),
        ready_pods: ready,
        fleet: FleetMetrics {
            backoff: Some(0.0),
            failure_rate: Some(0.0),
            queue_age: Some(5.0),
            queue_depth: Some(100.0),
            arrival_rate: Some(120.0),
            completion_rate: Some(30.0),
            ..FleetMetrics::default()
        },
        metrics_error: None,
        config: None,
    };
    let d0 = decide(&eff, None, &observe(0, 0));
    let d1 = decide(&eff, Some(&d0.status), &observe(1, 2));
    let d2 = decide(&eff, Some(&d1.status), &observe(6, 2));
    assert!(
        d2.reason
            .contains("at 30/s per ready pod (30/s over 1) = 4.0"),
        "the window counts 2 × 5/10 pods: {}",
        d2.reason
    );
    let d3 = decide(&eff, Some(&d2.status), &observe(6, 4));
    let tracking = d3.status.tracking.as_ref().unwrap();
    assert_eq!(tracking.pods_before_rise, Some(1.0));
    let d4 = decide(&eff, Some(&d3.status), &observe(16, 4));
    assert!(d4.reason.contains("(30/s over 4) = 16.0"), "{}", d4.reason);
    // A scale-out step from 4 ready pods: counted as they are.
    let d5 = decide(&eff, Some(&d4.status), &observe(17, 8));
    assert!(d5.reason.contains("(30/s over 8) = 32.0"), "{}", d5.reason);
    assert!(
        d5.status
            .tracking
            .as_ref()
            .is_none_or(|t| t.ready_rose_at.is_none()),
        "{:?}",
        d5.status.tracking
    );
}

/// An over-provisioned fleet in an outage's first seconds: completions fall (`μ` 20 → 12/s
/// over 6 idle pods) and a backlog starts while the age is still far under its target. The
/// rates alone ask for 10 pods; the failure rate is what says why. Unknown, the early scale-out
/// waits for the age; known and low, it goes ahead; an age above target scales out either way,
/// and so does a fleet at zero.
#[test]
fn an_early_scale_out_waits_for_a_known_failure_rate() {
    let eff = effective(|s| {
        s.target_queue_age = std::time::Duration::from_secs(10);
        s.max_replicas = 10;
    });
    let observe = |replicas: i32, age: f64, failure_rate: Option<f64>| Observation {
        now: at(100),
        generation: Some(1),
        current_replicas: replicas,
        ready_pods: replicas,
        fleet: FleetMetrics {
            backoff: Some(0.0),
            failure_rate,
            queue_age: Some(age),
            queue_depth: Some(187.0),
            arrival_rate: Some(20.0),
            completion_rate: Some(12.0),
            ..FleetMetrics::default()
        },
        metrics_error: None,
        config: None,
    };
    let d = decide(&eff, None, &observe(6, 2.0, None));
    assert_eq!(
        (d.action, d.desired_replicas),
        (Action::None, 6),
        "{}",
        d.reason
    );
    assert!(d.reason.contains("failure rate unknown"), "{}", d.reason);
    assert_eq!(d.recommended_replicas, 10, "{}", d.reason);
    let d = decide(&eff, None, &observe(6, 2.0, Some(0.01)));
    assert_eq!(
        (d.action, d.desired_replicas),
        (ScaleOut, 10),
        "{}",
        d.reason
    );
    let d = decide(&eff, None, &observe(6, 30.0, None));
    assert_eq!(d.action, ScaleOut, "{}", d.reason);
    let d = decide(&eff, None, &observe(0, 2.0, None));
    assert!(d.desired_replicas >= 1, "{}", d.reason);
}
