//! Missing metrics (each fallback, query errors, a hold through a gap) and suspension.

use super::*;

#[test]
fn metrics_unavailable_applies_each_fallback() {
    let cases: Vec<(&str, Fallback, i32, i32, i32)> = vec![
        // (name, fallback, min, current, desired)
        ("hold keeps current", Fallback::Hold, 1, 8, 8),
        ("hold keeps current with min 0", Fallback::Hold, 0, 3, 3),
        ("hold never below min", Fallback::Hold, 4, 2, 4),
        (
            "static lowers within the step limit",
            Fallback::Static(5),
            1,
            8,
            7,
        ),
        (
            "static raises within the step limit",
            Fallback::Static(30),
            1,
            8,
            16,
        ),
        ("if-higher raises", Fallback::IfHigher(12), 1, 8, 12),
        ("if-higher never lowers", Fallback::IfHigher(3), 1, 8, 8),
    ];
    for (name, fallback, min, current, want) in cases {
        let mut w = World::new(
            effective(|s| {
                s.on_metrics_unavailable = fallback;
                s.min_replicas = min;
            }),
            current,
        );
        w.backoff = None;
        w.queue = Queue::Unknown;
        let d = w.step(0);
        assert_eq!(d.regime, MetricsUnavailable, "{name}");
        assert_eq!(d.desired_replicas, want, "{name}: {}", d.reason);
        assert_eq!(
            d.action, Fb,
            "{name}: entering the regime applies the fallback"
        );
        assert_eq!(
            condition(&d.status, cond::METRICS_AVAILABLE).status,
            "False"
        );
        assert_eq!(
            condition(&d.status, cond::READY).reason,
            "MetricsUnavailable"
        );
        assert_eq!(
            condition(&d.status, cond::DEPENDENCY_HEALTHY).status,
            "Unknown",
            "{name}"
        );
    }
}

#[test]
fn query_error_then_recovery() {
    let mut w = World::new(defaults(), 8);
    run(
        "steady",
        &mut w,
        &[step(0, 0.0, Steady, Healthy, 8, Action::None)],
    );
    w.error = Some("connection refused".into());
    w.backoff = None;
    w.queue = Queue::Unknown;
    let d = w.step(15);
    assert_eq!(
        (d.regime, d.desired_replicas, d.action),
        (MetricsUnavailable, 8, Fb)
    );
    assert!(
        d.reason.contains("query failed: connection refused"),
        "{}",
        d.reason
    );
    let c = condition(&d.status, cond::METRICS_AVAILABLE);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "QueryFailed")
    );
    assert_eq!(
        d.status.fleet.as_ref().unwrap().backoff,
        None,
        "unknown is absent, not 0"
    );
    assert_eq!(d.recommended_replicas, 8);
    // Steady outage: nothing new.
    let again = w.step(15);
    assert_eq!(again.action, Action::None);
    assert!(again.events.is_empty());
    w.error = None;
    run(
        "back",
        &mut w,
        &[step(15, 0.0, Steady, Healthy, 8, Action::None)],
    );
    let back = w.status.clone().unwrap();
    assert_eq!(condition(&back, cond::METRICS_AVAILABLE).status, "True");
}

#[test]
fn partially_missing_metrics_are_unavailable_and_never_zero() {
    // Backoff known but no queue metric: cannot size, fallback keeps replicas.
    let mut w = World::new(effective(|s| s.min_replicas = 0), 5);
    w.queue = Queue::Unknown;
    let d = w.step(0);
    assert_eq!((d.regime, d.desired_replicas), (MetricsUnavailable, 5));
    assert!(
        d.reason
            .contains("queue age or arrival and completion rates")
    );
    // NaN backoff is unknown too.
    let mut w = World::new(effective(|s| s.min_replicas = 0), 5);
    w.backoff = Some(f64::NAN);
    let d = w.step(0);
    assert_eq!((d.regime, d.desired_replicas), (MetricsUnavailable, 5));
    assert!(d.reason.contains("fleet backoff"), "{}", d.reason);
}

#[test]
fn hold_survives_a_metrics_gap_but_release_evidence_does_not() {
    let mut w = World::new(defaults(), 8);
    run("into hold", &mut w, &INTO_HOLD);
    run(
        "below",
        &mut w,
        &[step(15, 0.02, Backlog, DependencyFailing, 8, Action::None)],
    );
    w.backoff = None;
    let gap = w.step(30);
    assert_eq!(gap.regime, MetricsUnavailable);
    assert_eq!(condition(&gap.status, cond::SCALE_OUT_HELD).status, "True");
    assert_eq!(
        gap.status.tracking.as_ref().unwrap().below_release_since,
        None
    );
    // Back: still held, and the release clock starts again.
    run(
        "after gap",
        &mut w,
        &[
            step(30, 0.02, Backlog, DependencyFailing, 8, Action::None),
            step(45, 0.02, Backlog, DependencyFailing, 8, Action::None),
            step(15, 0.02, Backlog, Recovering, 10, RampStage),
        ],
    );
}

#[test]
fn suspended_changes_nothing() {
    let mut w = World::new(defaults(), 8);
    run("hold", &mut w, &INTO_HOLD);
    let before = w.status.clone().unwrap();
    w.eff.suspend = true;
    w.queue = Queue::Idle;
    let d = w.step(15);
    assert_eq!(
        (d.regime, d.desired_replicas, d.action),
        (Regime::Suspended, 8, Action::None)
    );
    assert_eq!(d.scale_to(), None);
    assert_eq!(
        d.status.fleet, before.fleet,
        "no new snapshot while suspended"
    );
    assert_eq!(d.status.last_decision, before.last_decision);
    assert_eq!(condition(&d.status, cond::READY).reason, "Suspended");
    assert_eq!(d.events.len(), 1);
    assert_eq!(d.events[0].reason, "Suspended");
    let again = w.step(600);
    assert!(!status_changed(Some(&d.status), &again.status));
    // Resumed: still held (carried by ScaleOutHeld), backoff still high.
    w.eff.suspend = false;
    w.queue = Queue::Backlog;
    let d = w.step(15);
    assert_eq!((d.regime, d.desired_replicas), (DependencyFailing, 8));
}
