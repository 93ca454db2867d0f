//! The hold, the release, the staged ramp and its abort; the brake and the manual hold.

use super::*;

#[test]
fn backlogged_to_dependency_failing_after_hold_for() {
    let mut w = World::new(defaults(), 8);
    let ds = run("hold", &mut w, &INTO_HOLD);
    // Before hold.for elapsed, scale-out is deferred and the condition says so.
    assert!(ds[0].reason.contains("deferred"), "{}", ds[0].reason);
    let pending = condition(&ds[1].status, cond::SCALE_OUT_HELD);
    assert_eq!(
        (pending.status.as_str(), pending.reason.as_str()),
        ("False", "HoldPending")
    );

    let held = &ds[2];
    assert_eq!(
        held.recommended_replicas, 14,
        "what a backlog-only autoscaler would do"
    );
    let c = condition(&held.status, cond::SCALE_OUT_HELD);
    assert_eq!(c.status, "True");
    assert!(
        c.message.contains("0.31") && c.message.contains("would pick 14"),
        "{}",
        c.message
    );
    assert_eq!(
        condition(&held.status, cond::DEPENDENCY_HEALTHY).status,
        "False"
    );
    assert_eq!(condition(&held.status, cond::READY).status, "True");
    let rec = held.status.last_decision.as_ref().unwrap();
    assert_eq!(rec.action, HoldScaleOut);
    assert!(
        rec.reason.starts_with("fleet backoff 0.31 > 0.20 for 30s"),
        "{}",
        rec.reason
    );
    let kinds: Vec<(EventType, &str)> = held.events.iter().map(|e| (e.type_, e.reason)).collect();
    assert_eq!(
        kinds,
        vec![
            (EventType::Warning, "DependencyFailing"),
            (EventType::Warning, "ScaleOutHeld")
        ]
    );
}

#[test]
fn a_backoff_dip_restarts_the_hold_clock() {
    let mut w = World::new(defaults(), 8);
    run(
        "dip",
        &mut w,
        &[
            step(0, 0.31, Backlog, Backlogged, 8, Action::None),
            step(20, 0.31, Backlog, Backlogged, 8, Action::None),
            // One sample at the threshold (not above) resets the clock.
            step(5, 0.20, Backlog, Backlogged, 14, ScaleOut),
            step(15, 0.31, Backlog, Backlogged, 14, Action::None),
            step(29, 0.31, Backlog, Backlogged, 14, Action::None),
            step(1, 0.31, Backlog, DependencyFailing, 14, HoldScaleOut),
        ],
    );
}

#[test]
fn hold_stays_under_noise_between_thresholds() {
    let mut w = World::new(defaults(), 8);
    run("into hold", &mut w, &INTO_HOLD);
    // The dependency still fails above the set point: only the backoff can release.
    w.failure_rate = Some(0.08);
    let noise = [0.19, 0.06, 0.12, 0.051, 0.2, 0.07, 0.15, 0.05];
    let steps: Vec<Step> = noise
        .iter()
        .map(|b| step(45, *b, Backlog, DependencyFailing, 8, Action::None))
        .collect();
    let ds = run("noise", &mut w, &steps);
    assert!(ds.iter().all(|d| d.events.is_empty()));
}

#[test]
fn release_after_release_for_then_staged_ramp_with_dwell() {
    let mut w = World::new(defaults(), 8);
    run("into hold", &mut w, &INTO_HOLD);
    let ds = run("release", &mut w, &RELEASE_AND_RAMP);
    let released = &ds[2];
    let reasons: Vec<&str> = released.events.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, vec!["Recovering", "HoldReleased", "RampStage"]);
    assert!(
        released.events[1].message.contains("0.03 < 0.05 for 1m"),
        "{}",
        released.events[1].message
    );
    let ramp = released.ramp().unwrap();
    assert_eq!((ramp.stage, ramp.of, ramp.from, ramp.to), (1, 4, 8, 14));
    assert_eq!(ramp.next_stage_at.as_ref().unwrap().0, at(w.t - 120 + 60));
    assert_eq!(condition(&released.status, cond::RAMPING).status, "True");
    assert_eq!(
        condition(&released.status, cond::SCALE_OUT_HELD).status,
        "False"
    );
    // The dwell is respected: the requeue points at the next stage.
    assert_eq!(
        ds[3].requeue_after,
        Duration::from_secs(15).min(Duration::from_secs(30))
    );

    run(
        "finish",
        &mut w,
        &[
            step(60, 0.03, Backlog, Recovering, 14, RampStage),
            step(30, 0.03, Backlog, Recovering, 14, Action::None),
            // Dwell at the last stage over: the ramp is complete, the queue is still old.
            step(30, 0.03, Backlog, Backlogged, 14, Action::None),
            step(15, 0.03, Steady, Healthy, 14, Action::None),
        ],
    );
    assert_eq!(w.status.as_ref().unwrap().ramp, None);
}

#[test]
fn abort_mid_ramp_goes_back_to_hold_and_counts() {
    let mut w = World::new(defaults(), 8);
    run("into hold", &mut w, &INTO_HOLD);
    run("release", &mut w, &RELEASE_AND_RAMP[..5]);
    let ds = run(
        "abort",
        &mut w,
        &[
            step(10, 0.25, Backlog, DependencyFailing, 11, AbortRamp),
            step(30, 0.10, Backlog, DependencyFailing, 11, Action::None),
            step(30, 0.02, Backlog, DependencyFailing, 11, Action::None),
            step(60, 0.02, Backlog, Recovering, 12, RampStage),
        ],
    );
    let aborted = &ds[0];
    let ramp = aborted.ramp().unwrap();
    assert_eq!(
        (ramp.stage, ramp.aborts, ramp.next_stage_at.clone()),
        (2, Some(1), None)
    );
    let c = condition(&aborted.status, cond::RAMPING);
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Aborted"));
    assert!(
        aborted
            .reason
            .contains("0.25 > abort threshold 0.20, dependency failure rate 6.2% > set point 5.0% at ramp stage 2/4"),
        "{}",
        aborted.reason
    );
    assert!(
        aborted
            .events
            .iter()
            .any(|e| e.reason == "RampAborted" && e.type_ == EventType::Warning)
    );
    // The new ramp starts from the held 11 and keeps the abort count.
    let ramp = ds[3].ramp().unwrap();
    assert_eq!(
        (ramp.stage, ramp.from, ramp.to, ramp.aborts),
        (1, 11, 14, Some(1))
    );
}

#[test]
fn restart_mid_ramp_resumes_at_the_recorded_stage() {
    let mut w = World::new(defaults(), 8);
    run("into hold", &mut w, &INTO_HOLD);
    run("release", &mut w, &RELEASE_AND_RAMP[..5]);
    assert_eq!(w.status.as_ref().unwrap().ramp.as_ref().unwrap().stage, 2);
    // The operator dies; a new one starts 20 s later with nothing but the stored status.
    let mut restarted = w.restarted();
    run(
        "after restart",
        &mut restarted,
        &[
            step(20, 0.03, Backlog, Recovering, 11, Action::None),
            step(40, 0.03, Backlog, Recovering, 13, RampStage),
        ],
    );
    // The uninterrupted world makes the same decisions.
    run(
        "uninterrupted",
        &mut w,
        &[
            step(20, 0.03, Backlog, Recovering, 11, Action::None),
            step(40, 0.03, Backlog, Recovering, 13, RampStage),
        ],
    );
    assert_eq!(w.status, restarted.status);
}

#[test]
fn ramp_waits_for_the_stage_to_be_reached() {
    // A slow scale-up step (1 pod per 15s) stretches a stage beyond its dwell.
    let mut w = World::new(
        effective(|s| {
            s.scale_up.max_pods = 1;
            s.scale_up.max_percent = 1;
            s.ramp_up.stages = vec![50, 100];
            s.ramp_up.dwell = Duration::from_secs(20);
        }),
        8,
    );
    run("into hold", &mut w, &INTO_HOLD);
    run(
        "slow ramp",
        &mut w,
        &[
            step(15, 0.0, Backlog, DependencyFailing, 8, Action::None),
            step(60, 0.0, Backlog, Recovering, 9, RampStage),
            step(15, 0.0, Backlog, Recovering, 10, ScaleOut),
            // Dwell over but 11 not reached yet: stay in stage 1.
            step(15, 0.0, Backlog, Recovering, 11, ScaleOut),
            step(15, 0.0, Backlog, Recovering, 12, RampStage),
        ],
    );
}

#[test]
fn hold_reason_names_the_brake() {
    let mut eff = defaults();
    eff.brake = Some(crate::resolve::EffectiveBrake {
        min_backoff: 0.5,
        expires_at: None,
        reason: Some("incident 42".into()),
        policy: "fleet-brake".into(),
    });
    let mut w = World::new(eff, 8);
    w.queue(Backlog).backoff(0.5);
    w.step(0);
    let d = w.step(30);
    assert_eq!(d.action, HoldScaleOut);
    let said = "emergency brake 0.50 from policy fleet-brake: incident 42";
    assert!(d.reason.contains(said), "{}", d.reason);
    // Whatever the regime, Ready says the workers are braked, and why.
    let ready = condition(&d.status, cond::READY);
    assert!(ready.message.contains(said), "{}", ready.message);
}

#[test]
fn a_manual_hold_withholds_scale_out_until_it_expires() {
    // Held by hand for 40 s from t=0: a backlog that would scale 2 → 6 does not.
    let mut eff = defaults();
    eff.manual_hold_until = Some(at(40));
    let mut w = World::new(eff, 2);
    let ds = run(
        "manual hold",
        &mut w,
        &[
            step(0, 0.0, Queue::Steady, Healthy, 2, Action::None),
            step(15, 0.0, Backlog, Backlogged, 2, HoldScaleOut),
            step(15, 0.0, Backlog, Backlogged, 2, HoldScaleOut),
            // Expired at 40 s: the backlog is served again.
            step(15, 0.0, Backlog, Backlogged, 6, ScaleOut),
        ],
    );
    let held = &ds[1];
    let c = condition(&held.status, cond::SCALE_OUT_HELD);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "ManualHold")
    );
    assert!(
        held.reason.contains("manual hold") && held.reason.contains("2 → 6"),
        "{}",
        held.reason
    );
    assert_eq!(held.status.replicas.as_ref().unwrap().desired, 2);
    assert_eq!(held.status.replicas.as_ref().unwrap().recommended, 14);
    assert!(
        held.events.iter().any(|e| e.reason == "ScaleOutHeld"),
        "{:?}",
        held.events
    );
    let released = &ds[3];
    assert_eq!(
        condition(&released.status, cond::SCALE_OUT_HELD).status,
        "False"
    );
}

/// Issue 13: failures the workers found to be load-independent (their failure floor) do not
/// defer scale-out for the backlog they cause; without the floor the same failure rate does.
#[test]
fn failure_floor_lets_a_backlog_scale_out() {
    let mut w = World::new(defaults(), 8);
    w.queue = Queue::Backlog;
    w.backoff = Some(0.0);
    w.failure_rate = Some(0.15);
    let d = w.peek();
    assert_eq!(d.desired_replicas, 8, "{}", d.reason);
    assert!(
        d.reason.contains("failure rate 15.0% > set point 5.0%"),
        "{}",
        d.reason
    );

    w.failure_floor = Some(0.15);
    let d = w.peek();
    assert_eq!(d.action, ScaleOut, "{}", d.reason);
    assert!(d.desired_replicas > 8, "{}", d.reason);

    // Overload on top of the floor (more than s of the remaining calls fail) defers again:
    // s_eff = 0.15 + 0.05 · 0.85 = 0.1925.
    w.failure_rate = Some(0.25);
    let d = w.peek();
    assert_eq!(d.desired_replicas, 8, "{}", d.reason);
    assert!(d.reason.contains("deferred"), "{}", d.reason);
}

/// Issue 13: with a failure floor, a backoff above the hold threshold is no evidence of failure
/// while the failure rate is at or below the effective set point (pods that have not learned
/// the floor yet): no hold, no deferral, the backlog scales out. The same backoff with failures
/// above it holds after `hold.for`.
#[test]
fn with_a_floor_backoff_without_failures_above_the_set_point_does_not_hold() {
    let mut w = World::new(defaults(), 8);
    w.queue = Queue::Backlog;
    w.backoff = Some(0.5);
    w.failure_floor = Some(0.15);
    // s_eff = 0.15 + 0.05 · 0.85 = 0.1925.
    w.failure_rate = Some(0.16);
    let mut scaled = false;
    for dt in [0, 15, 15, 30, 30] {
        let d = w.step(dt);
        assert_ne!(d.regime, Regime::DependencyFailing, "{}", d.reason);
        assert_eq!(d.deferral, None, "{}", d.reason);
        scaled |= d.action == ScaleOut;
    }
    assert!(scaled, "the backlog scales out");

    w.failure_rate = Some(0.25);
    let d = w.step(15);
    assert_eq!(d.deferral, Some(Deferral::HoldPending), "{}", d.reason);
    let d = w.step(30);
    assert_eq!(d.regime, Regime::DependencyFailing, "{}", d.reason);
}

/// Without a failure floor the backoff alone is evidence: an overload held at the workers'
/// equilibrium shows a failure rate at (even a little under) the set point with the backoff
/// high, and must neither scale out nor fail to hold. (Requiring failures above the set point
/// there let a fleet of fast workers, whose equilibrium comes within seconds, scale 8 → 17 into
/// a quota overload in the simulator.)
#[test]
fn without_a_floor_an_overload_at_its_equilibrium_holds_on_the_backoff() {
    let mut w = World::new(defaults(), 8);
    w.queue = Queue::Backlog;
    w.backoff = Some(0.35);
    w.failure_rate = Some(0.048);
    let mut held = false;
    for dt in [0, 15, 15, 15, 30] {
        let d = w.step(dt);
        assert!(d.desired_replicas <= 8, "{}", d.reason);
        held |= d.regime == Regime::DependencyFailing;
    }
    assert!(held, "holds after hold.for");
}

/// Issue 13: a hold that withholds nothing (no backlog waits for more pods) is released once
/// the failure rate is at or below the set point and the backoff at or below the hold threshold
/// for `release.for`, although the noisy fleet's backoff never goes below
/// `release.backoffBelow`; while a backlog waits (and no failure floor explains the failures)
/// the same fleet stays held until the backoff is below it.
#[test]
fn a_hold_releases_on_the_failure_rate_only_where_it_withholds_nothing() {
    let mut w = World::new(defaults(), 8);
    run("hold", &mut w, &INTO_HOLD);
    w.backoff = Some(0.10);
    w.failure_rate = Some(0.045);
    for _ in 0..12 {
        let d = w.step(15);
        assert_eq!(d.regime, Regime::DependencyFailing, "{}", d.reason);
    }
    w.queue = Queue::Idle;
    let d = first_release(&mut w);
    assert!(
        d.reason
            .contains("failure rate 4.5% ≤ set point 5.0% and fleet backoff 0.10 ≤ 0.20"),
        "{}",
        d.reason
    );
    assert!(d.events.iter().any(|e| e.reason == "HoldReleased"));
}

/// Issue 13: with a failure floor the release does not wait for every pod to have learned it:
/// failures at the floor and a backoff at or below the hold threshold release the hold while a
/// backlog waits, and the ramp starts.
#[test]
fn with_a_failure_floor_a_hold_releases_while_a_backlog_waits() {
    let mut w = World::new(defaults(), 8);
    run("hold", &mut w, &INTO_HOLD);
    w.backoff = Some(0.15);
    w.failure_rate = Some(0.16);
    let d = w.step(90);
    assert_eq!(
        d.regime,
        Regime::DependencyFailing,
        "no floor yet: {}",
        d.reason
    );
    w.failure_floor = Some(0.15);
    let d = first_release(&mut w);
    assert_eq!(d.regime, Regime::Recovering, "{}", d.reason);
    assert!(d.reason.contains("failure floor 15.0%"), "{}", d.reason);
}

/// Issue 13: pods that join a fleet with a failure floor back off until they have learned it;
/// their backoff does not abort the ramp while the failure rate stays under the effective set
/// point. Failures above it (overload on top of the floor) abort it.
#[test]
fn a_ramp_is_aborted_by_failures_not_by_pods_learning_a_floor() {
    let mut w = World::new(defaults(), 8);
    run("hold", &mut w, &INTO_HOLD);
    w.backoff = Some(0.03);
    let mut ramping = false;
    for _ in 0..8 {
        if w.step(15).regime == Regime::Recovering {
            ramping = true;
            break;
        }
    }
    assert!(ramping);
    w.backoff = Some(0.35);
    w.failure_rate = Some(0.16);
    w.failure_floor = Some(0.15);
    for _ in 0..4 {
        let d = w.step(15);
        assert_ne!(d.action, AbortRamp, "{}", d.reason);
        assert_ne!(d.regime, Regime::DependencyFailing, "{}", d.reason);
    }
    w.failure_rate = Some(0.25);
    let d = w.step(15);
    assert_eq!(d.action, AbortRamp, "{}", d.reason);
}

/// A hold that withholds nothing (the queue needs no more pods) while the failure rate is under
/// the set point protects nothing: it is released whatever the backoff, no new hold starts in
/// that state, and the pods the queue does not need scale in. A backlog makes the backoff count
/// again (no failure floor: the backoff alone holds).
#[test]
fn a_hold_that_withholds_nothing_under_the_set_point_ends_and_does_not_return() {
    let mut w = World::new(defaults(), 8);
    w.backoff(0.6).queue(Queue::Backlog);
    w.step(0);
    let d = w.step(30);
    assert_eq!(d.regime, Regime::DependencyFailing, "{}", d.reason);

    // The backlog is served; the pods still throttle after a burst, 4 % of calls fail.
    w.queue(Queue::Idle);
    w.failure_rate = Some(0.04);
    let d = first_release(&mut w);
    assert_ne!(d.regime, Regime::DependencyFailing, "{}", d.reason);
    let ds: Vec<Decision> = (0..40).map(|_| w.step(15)).collect();
    assert!(
        ds.iter().all(|d| d.regime != Regime::DependencyFailing),
        "{:?}",
        ds.iter().map(|d| &d.reason).collect::<Vec<_>>()
    );
    assert!(ds.last().unwrap().desired_replicas < 8);

    // Failures above the set point hold even with nothing to withhold.
    let c = w.current;
    w.failure_rate = Some(0.08);
    let ds: Vec<Decision> = (0..4).map(|_| w.step(15)).collect();
    assert_eq!(ds.last().unwrap().regime, Regime::DependencyFailing);
    assert!(ds.iter().all(|d| d.desired_replicas <= c));

    // Under the set point again, then a backlog: the backoff alone holds it.
    w.failure_rate = Some(0.04);
    first_release(&mut w);
    w.queue(Queue::Backlog);
    let ds: Vec<Decision> = (0..4).map(|_| w.step(15)).collect();
    assert!(ds.iter().all(|d| d.desired_replicas <= d.current_replicas));
    assert_eq!(ds.last().unwrap().regime, Regime::DependencyFailing);
}
