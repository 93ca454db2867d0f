//! Table-driven tests of every regime transition, through the closed loop in
//! [`super::fixtures::World`] (status round-tripped through JSON between steps).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{Action, ConfigStatus, Regime, WorkerBackpressureStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::fixtures::{Queue, World, at, effective};
use super::*;
use crate::resolve::{Effective, Fallback};

/// One step of a scenario: advance `dt` seconds with this backoff and queue, then expect.
#[derive(Debug, Clone, Copy)]
struct Step {
    dt: i64,
    backoff: Option<f64>,
    queue: Queue,
    regime: Regime,
    desired: i32,
    action: Action,
}

const fn step(
    dt: i64,
    backoff: f64,
    queue: Queue,
    regime: Regime,
    desired: i32,
    action: Action,
) -> Step {
    Step {
        dt,
        backoff: Some(backoff),
        queue,
        regime,
        desired,
        action,
    }
}

fn run(name: &str, world: &mut World, steps: &[Step]) -> Vec<Decision> {
    let mut out = Vec::new();
    for (i, s) in steps.iter().enumerate() {
        world.backoff = s.backoff;
        world.queue = s.queue;
        let d = world.step(s.dt);
        let ctx = format!(
            "{name} step {i} (t={}): {:?} {} → {} {:?}: {}",
            world.t, d.regime, d.current_replicas, d.desired_replicas, d.action, d.reason
        );
        assert_eq!(d.regime, s.regime, "{ctx}");
        assert_eq!(d.desired_replicas, s.desired, "{ctx}");
        assert_eq!(d.action, s.action, "{ctx}");
        out.push(d);
    }
    out
}

fn condition<'s>(status: &'s WorkerBackpressureStatus, type_: &str) -> &'s Condition {
    status
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

fn defaults() -> Effective {
    effective(|_| {})
}

use Action::{AbortRamp, Fallback as Fb, HoldScaleOut, RampStage, ScaleIn, ScaleOut};
use Queue::{Backlog, Idle, Steady};
use Regime::{Backlogged, DependencyFailing, Healthy, MetricsUnavailable, Recovering};

/// Holds at 8 replicas with the backlog: 30 s above the hold threshold.
const INTO_HOLD: [Step; 3] = [
    step(0, 0.31, Backlog, Backlogged, 8, Action::None),
    step(15, 0.31, Backlog, Backlogged, 8, Action::None),
    step(15, 0.31, Backlog, DependencyFailing, 8, HoldScaleOut),
];

/// From the hold, release after 60 s below 0.05 and ramp 8 → 14 in 25/50/75/100% stages.
const RELEASE_AND_RAMP: [Step; 6] = [
    step(15, 0.03, Backlog, DependencyFailing, 8, Action::None),
    step(30, 0.03, Backlog, DependencyFailing, 8, Action::None),
    step(30, 0.03, Backlog, Recovering, 10, RampStage),
    step(30, 0.03, Backlog, Recovering, 10, Action::None),
    step(30, 0.03, Backlog, Recovering, 11, RampStage),
    step(60, 0.03, Backlog, Recovering, 13, RampStage),
];

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
            .contains("0.25 > abort threshold 0.20 at ramp stage 2/4")
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
fn dry_run_reports_and_never_changes_the_target() {
    let mut eff = defaults();
    eff.dry_run = true;
    eff.dry_run_by = Some("spec.mode".into());
    let mut w = World::new(eff, 8);
    let d = w.step(0);
    assert_eq!(d.regime, Healthy);
    w.queue = Queue::Backlog;
    let d = w.step(15);
    assert_eq!(
        (d.regime, d.desired_replicas, d.action),
        (Backlogged, 14, ScaleOut)
    );
    assert_eq!(d.scale_to(), None);
    assert_eq!(w.current, 8, "the target never changes");
    let rec = d.status.last_decision.as_ref().unwrap();
    assert_eq!((rec.dry_run, rec.from, rec.to), (Some(true), 8, 14));
    assert_eq!(d.status.dry_run_by.as_deref(), Some("spec.mode"));
    let ev = d.events.iter().find(|e| e.reason == "ScaledOut").unwrap();
    assert!(
        ev.message
            .starts_with("DryRun (spec.mode): would set 8 → 14"),
        "{}",
        ev.message
    );
    assert!(
        condition(&d.status, cond::READY)
            .message
            .contains("dry run")
    );
    // Repeating the same would-be decision rewrites nothing and emits nothing.
    let again = w.step(15);
    assert_eq!(again.desired_replicas, 14);
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert!(!status_changed(Some(&d.status), &again.status));

    // The whole hold/release/ramp cycle runs in DryRun too, without the target moving.
    run(
        "dry hold",
        &mut w,
        &[
            step(15, 0.5, Backlog, Backlogged, 8, Action::None),
            step(30, 0.5, Backlog, DependencyFailing, 8, HoldScaleOut),
            step(30, 0.0, Backlog, DependencyFailing, 8, Action::None),
            step(60, 0.0, Backlog, Recovering, 10, RampStage),
            step(60, 0.0, Backlog, Recovering, 11, RampStage),
        ],
    );
    assert_eq!(w.current, 8);
    // Out of DryRun, the status says so at once (not only at the next decision record).
    w.eff.dry_run = false;
    w.eff.dry_run_by = None;
    assert_eq!(w.peek().status.dry_run_by, None);
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

#[test]
fn config_not_pushed_in_dry_run_is_unknown_not_out_of_sync() {
    let mut eff = defaults();
    eff.dry_run = true;
    let mut w = World::new(eff, 8);
    w.config = Some(ConfigStatus {
        hash: "9f2c1a".into(),
        pods_in_sync: 0,
        pods_total: 8,
        ..Default::default()
    });
    let d = w.step(15);
    let c = condition(&d.status, cond::CONFIG_IN_SYNC);
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("Unknown", "NotPushed")
    );
    assert!(c.message.contains("0 of 8 ready pods"), "{}", c.message);
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

#[test]
fn guard_mode_decides_but_never_writes_scale() {
    let mut eff = defaults();
    eff.mode = backpressure_api::v1alpha1::Mode::Guard;
    let mut w = World::new(eff, 8);
    w.queue(Backlog);
    let d = w.step(0);
    assert_eq!((d.desired_replicas, d.action), (14, ScaleOut));
    assert_eq!(d.scale_to(), None, "Guard clamps the autoscaler instead");
}

#[test]
fn guard_mode_ramp_advances_on_the_dwell_and_raises_the_ceiling_by_stage() {
    // The guarded autoscaler decides whether to use each stage's ceiling; the replicas never
    // move here (nothing scales the target), yet the ramp goes on stage by stage.
    let mut eff = defaults();
    eff.mode = backpressure_api::v1alpha1::Mode::Guard;
    let mut w = World::new(eff, 8);
    run("into hold", &mut w, &INTO_HOLD);
    let mut stages = Vec::new();
    let mut t_stage = Vec::new();
    for dt in [15, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30] {
        w.backoff(0.03).queue(Backlog);
        let d = w.step(dt);
        assert_eq!(d.scale_to(), None);
        assert_eq!(w.current, 8);
        if let Some(r) = d.ramp().filter(|_| d.regime == Recovering)
            && stages.last().map(|(s, _)| *s) != Some(r.stage)
        {
            stages.push((r.stage, stage_target(&w.eff, r)));
            t_stage.push(w.t);
        }
    }
    assert_eq!(stages, vec![(1, 10), (2, 11), (3, 13), (4, 14)]);
    for pair in t_stage.windows(2) {
        assert_eq!(pair[1] - pair[0], 60, "one stage per dwell: {t_stage:?}");
    }
    let last = w.status.as_ref().unwrap();
    assert_eq!(last.ramp, None, "the ramp completes: {last:?}");
    assert_eq!(last.regime, Some(Backlogged));
}

#[test]
fn stage_target_respects_the_bounds() {
    let eff = effective(|s| s.max_replicas = 12);
    let ramp = RampStatus {
        stage: 4,
        of: 4,
        from: 8,
        to: 20,
        stage_started_at: None,
        next_stage_at: None,
        aborts: None,
    };
    assert_eq!(stage_target(&eff, &ramp), 12);
    let first = RampStatus {
        stage: 1,
        ..ramp.clone()
    };
    assert_eq!(stage_target(&eff, &first), 11);
    // A stage number beyond the configured stages is the last stage.
    let beyond = RampStatus { stage: 9, ..ramp };
    assert_eq!(stage_target(&eff, &beyond), 12);
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
