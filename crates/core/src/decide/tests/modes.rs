//! DryRun and Guard mode, and the Guard ceiling of a ramp stage.

use super::*;

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
