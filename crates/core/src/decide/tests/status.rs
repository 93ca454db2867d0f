//! Status stability, conditions, policy overrides, the requeue and an invalid spec.

use super::*;

#[test]
fn unchanged_world_writes_nothing() {
    // For each state, a second decision on the same world returns an equal status and emits
    // no events.
    let mut worlds: Vec<(&str, World)> = Vec::new();
    let mut w = World::new(defaults(), 8);
    w.step(0);
    worlds.push(("healthy", w.clone()));
    run("hold", &mut w, &INTO_HOLD);
    worlds.push(("held", w.clone()));
    run("ramp", &mut w, &RELEASE_AND_RAMP[..4]);
    worlds.push(("ramping in dwell", w.clone()));
    let mut u = World::new(defaults(), 8);
    u.backoff = None;
    u.step(0);
    worlds.push(("metrics unavailable", u));
    let mut cfg = World::new(defaults(), 8);
    cfg.config = Some(ConfigStatus {
        hash: "9f2c1a".into(),
        pods_in_sync: 7,
        pods_total: 8,
        ..Default::default()
    });
    cfg.step(0);
    worlds.push(("config out of sync", cfg));
    for (name, mut w) in worlds {
        let before = w.status.clone().unwrap();
        let d = w.step(5);
        assert!(
            !status_changed(Some(&before), &d.status),
            "{name}: {:#?}\nvs\n{:#?}",
            before,
            d.status
        );
        assert!(d.events.is_empty(), "{name}: {:?}", d.events);
        assert_eq!(
            serde_json::to_string(&before).unwrap(),
            serde_json::to_string(&d.status).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn sampled_at_moves_only_with_the_snapshot() {
    let mut w = World::new(defaults(), 8);
    let first = w.step(0);
    let t0 = first.status.fleet.as_ref().unwrap().sampled_at.clone();
    assert_eq!(t0.as_ref().map(|t| t.0), Some(at(0)));
    // Noise below the written precision: nothing changes.
    w.backoff = Some(0.0004);
    let d = w.step(15);
    assert_eq!(d.status.fleet.as_ref().unwrap().sampled_at, t0);
    // A visible change moves it.
    w.backoff = Some(0.03);
    let d = w.step(15);
    assert_eq!(d.status.fleet.as_ref().unwrap().backoff, Some(0.03));
    assert_eq!(
        d.status
            .fleet
            .as_ref()
            .unwrap()
            .sampled_at
            .as_ref()
            .map(|t| t.0),
        Some(at(30))
    );
}

#[test]
fn config_in_sync_condition() {
    let mut w = World::new(defaults(), 8);
    let d = w.step(0);
    assert_eq!(condition(&d.status, cond::CONFIG_IN_SYNC).status, "Unknown");
    w.config = Some(ConfigStatus {
        hash: "9f2c1a".into(),
        pods_in_sync: 8,
        pods_total: 8,
        ..Default::default()
    });
    let d = w.step(15);
    let c = condition(&d.status, cond::CONFIG_IN_SYNC);
    assert_eq!(
        (c.status.as_str(), c.message.as_str()),
        ("True", "8 of 8 ready pods run config 9f2c1a")
    );
    assert_eq!(d.status.config.as_ref().unwrap().pods_in_sync, 8);
    // Not observed this time: the last observation stands.
    w.config = None;
    let d2 = w.step(15);
    assert_eq!(condition(&d2.status, cond::CONFIG_IN_SYNC), c);
}

/// The `ConfigInSync` condition of `eff` with none of 8 ready pods running the config.
fn config_none_in_sync(eff: Effective) -> Condition {
    let mut w = World::new(eff, 8);
    w.config = Some(ConfigStatus {
        hash: "9f2c1a".into(),
        pods_in_sync: 0,
        pods_total: 8,
        ..Default::default()
    });
    condition(&w.step(15).status, cond::CONFIG_IN_SYNC).clone()
}

#[test]
fn config_not_pushed_in_dry_run_is_unknown_not_out_of_sync() {
    let mut eff = defaults();
    eff.dry_run = true;
    let c = config_none_in_sync(eff);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("Unknown", "NotPushed")
    );
    assert!(c.message.contains("0 of 8 ready pods"), "{}", c.message);
}

/// Issue 16: metrics-only workers (`spec.worker.push: Disabled`) are not managed: `ConfigInSync`
/// is `Unknown` with reason `NotManaged`, never `False` (nothing to alert on).
#[test]
fn config_of_metrics_only_workers_is_not_managed() {
    let mut eff = defaults();
    eff.worker.push = false;
    let c = config_none_in_sync(eff);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("Unknown", "NotManaged")
    );
    assert!(
        c.message.contains("spec.worker.push is Disabled"),
        "{}",
        c.message
    );
}

#[test]
fn policy_overrides_are_reported_once() {
    let mut eff = defaults();
    eff.overrides.insert(
        "spec.worker.setPoint".into(),
        "0.3 lowered to 0.2 by policy platform-limits".into(),
    );
    eff.policies = vec!["platform-limits".into()];
    let mut w = World::new(eff, 8);
    let d = w.step(0);
    let ev = d
        .events
        .iter()
        .find(|e| e.reason == "PolicyOverride")
        .unwrap();
    assert!(
        ev.message
            .contains("spec.worker.setPoint: 0.3 lowered to 0.2")
    );
    assert_eq!(
        d.status.policies.as_deref(),
        Some(&["platform-limits".to_owned()][..])
    );
    let c = condition(&d.status, cond::POLICY_LIMITED);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "LimitsApplied")
    );
    assert!(
        c.message
            .contains("spec.worker.setPoint: 0.3 lowered to 0.2 by policy platform-limits")
    );
    let again = w.step(15);
    assert!(again.events.is_empty());
    assert_eq!(condition(&again.status, cond::POLICY_LIMITED), c);

    // Without overrides the condition says so.
    let d = World::new(defaults(), 8).step(0);
    let c = condition(&d.status, cond::POLICY_LIMITED);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "WithinLimits")
    );
}

#[test]
fn requeue_points_at_the_next_deadline() {
    let mut w = World::new(defaults(), 8);
    w.backoff = Some(0.3);
    w.queue = Queue::Backlog;
    let d = w.step(0);
    assert_eq!(d.requeue_after, Duration::from_secs(15));
    let d = w.step(22);
    assert_eq!(d.requeue_after, Duration::from_secs(8), "hold due at 30s");
    let mut eff = defaults();
    eff.brake = Some(crate::resolve::EffectiveBrake {
        min_backoff: 0.5,
        expires_at: Some(at(3)),
        reason: None,
        policy: "p".into(),
    });
    let d = World::new(eff, 8).step(0);
    assert_eq!(d.requeue_after, Duration::from_secs(3), "brake lifts at 3s");
}

#[test]
fn invalid_spec_is_stalled_and_keeps_the_rest() {
    let mut w = World::new(defaults(), 8);
    w.step(0);
    let prev = w.status.clone().unwrap();
    let err = ResolveError {
        errors: vec![crate::resolve::FieldError {
            field: "spec.scaling.hold.for".into(),
            message: "invalid duration".into(),
        }],
    };
    let (status, events) = invalid_spec(Some(&prev), Some(2), &err, at(15));
    assert_eq!(status.regime, prev.regime);
    assert_eq!(status.replicas, prev.replicas);
    assert_eq!(status.observed_generation, Some(2));
    let ready = condition(&status, cond::READY);
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert!(ready.message.contains("spec.scaling.hold.for"));
    assert_eq!(condition(&status, cond::STALLED).status, "True");
    assert_eq!(events.len(), 1);
    let (again, events) = invalid_spec(Some(&status), Some(2), &err, at(30));
    assert_eq!(again, status);
    assert!(events.is_empty());
    // Fixed: Stalled disappears with the next decision.
    w.status = Some(status);
    let d = w.step(15);
    assert!(
        d.status
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .all(|c| c.type_ != cond::STALLED)
    );
    assert_eq!(condition(&d.status, cond::READY).status, "True");
}
