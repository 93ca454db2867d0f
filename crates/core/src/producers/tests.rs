use std::time::Duration;

use backpressure_api::v1alpha1::{ProducerMode, ProducerState, ProducerStatus, TargetRef};
use backpressure_api::wire::GateState;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::decide::FleetMetrics;
use crate::resolve::EffectiveProducers;

pub(super) fn eff(mode: ProducerMode) -> EffectiveProducers {
    EffectiveProducers {
        target_ref: Some(TargetRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "producer".into(),
        }),
        mode,
        depth: Some((800.0, 200.0)),
        age: None,
        pause_dwell: Duration::from_secs(60),
        resume_dwell: Duration::from_secs(60),
    }
}

pub(super) fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

pub(super) fn depth(d: f64, completion: f64, arrival: f64) -> FleetMetrics {
    FleetMetrics {
        queue_depth: Some(d),
        completion_rate: Some(completion),
        arrival_rate: Some(arrival),
        ..FleetMetrics::default()
    }
}

/// Runs the decision over `(seconds, fleet)` steps, feeding the status back.
fn run(eff: &EffectiveProducers, steps: &[(i64, FleetMetrics)]) -> Vec<ProducerDecision> {
    let mut prev: Option<ProducerStatus> = None;
    let mut out = Vec::new();
    for (t, fleet) in steps {
        let d = decide_producers(eff, prev.as_ref(), fleet, at(*t));
        prev = Some(d.status.clone());
        out.push(d);
    }
    out
}

fn states(ds: &[ProducerDecision]) -> Vec<ProducerState> {
    ds.iter().map(|d| d.status.state).collect()
}

#[test]
fn producers_pause_above_the_high_watermark_and_not_between_the_watermarks() {
    let ds = run(
        &eff(ProducerMode::Pause),
        &[
            (0, depth(100.0, 50.0, 50.0)),
            (10, depth(800.0, 50.0, 80.0)),
            (20, depth(801.0, 0.0, 80.0)),
        ],
    );
    use ProducerState::*;
    assert_eq!(states(&ds), [Open, Open, Paused]);
    assert!(ds[0].event.is_none() && ds[1].event.is_none());
    let e = ds[2].event.as_ref().unwrap();
    assert_eq!(e.reason, "ProducersPaused");
    assert!(e.message.contains("queue depth 801 > 800"), "{}", e.message);
    assert!(ds[2].restricted());
    assert_eq!(ds[2].status.since, Some(Time(at(20))));
}

#[test]
fn a_pause_lasts_until_the_low_watermark_and_the_pause_dwell() {
    let e = eff(ProducerMode::Pause);
    let ds = run(
        &e,
        &[
            (0, depth(900.0, 0.0, 10.0)),
            // Between the watermarks: still paused, however long.
            (100, depth(500.0, 40.0, 0.0)),
            (200, depth(201.0, 40.0, 0.0)),
        ],
    );
    use ProducerState::*;
    assert_eq!(states(&ds), [Paused, Paused, Paused]);

    // Below the low watermark, but not yet paused for the dwell: still paused.
    let quick = run(
        &e,
        &[(0, depth(900.0, 0.0, 10.0)), (30, depth(100.0, 40.0, 0.0))],
    );
    assert_eq!(states(&quick), [Paused, Paused]);

    let resumed = run(
        &e,
        &[(0, depth(900.0, 0.0, 10.0)), (60, depth(100.0, 40.0, 0.0))],
    );
    assert_eq!(states(&resumed), [Paused, Resuming]);
    // It resumes at the fleet's completion rate: arrivals match the drain.
    assert_eq!(resumed[1].status.rate, Some(40.0));
    assert_eq!(
        resumed[1].event.as_ref().unwrap().reason,
        "ProducersResuming"
    );
}

#[test]
fn throttle_lets_producers_send_a_share_of_what_the_workers_complete() {
    let e = eff(ProducerMode::Throttle);
    let ds = run(
        &e,
        &[
            (0, depth(900.0, 100.0, 150.0)),
            (10, depth(950.0, 0.0, 90.0)),
            (20, depth(950.0, 40.0, 0.0)),
        ],
    );
    use ProducerState::*;
    assert_eq!(states(&ds), [Throttled, Throttled, Throttled]);
    assert_eq!(ds[0].status.rate, Some(90.0));
    // The dependency is down: nothing completes, nothing may be sent.
    assert_eq!(ds[1].status.rate, Some(0.0));
    assert_eq!(ds[2].status.rate, Some(36.0));
    // Only the transition is an event; rate changes inside Throttled are status.
    assert!(ds[0].event.is_some() && ds[1].event.is_none() && ds[2].event.is_none());
}

#[test]
fn resuming_is_capped_by_the_room_below_the_midpoint_and_opens_once_the_limit_no_longer_binds() {
    let e = eff(ProducerMode::Pause);
    let ds = run(
        &e,
        &[
            (0, depth(900.0, 0.0, 10.0)),
            (60, depth(100.0, 40.0, 0.0)),
            // Within the step: nothing changes.
            (90, depth(100.0, 40.0, 40.0)),
            // A full step at the limit: the rate may double, but one dwell at the new rate
            // must not fill the queue past the watermarks' midpoint (500): 40 + 400 / 60.
            (120, depth(100.0, 40.0, 40.0)),
            // Arrivals 10 of the 40 allowed in the step before (the window may reach into it).
            (180, depth(150.0, 40.0, 10.0)),
        ],
    );
    use ProducerState::*;
    assert_eq!(states(&ds), [Paused, Resuming, Resuming, Resuming, Open]);
    assert_eq!(ds[1].status.rate, Some(40.0));
    assert_eq!(ds[1].status.previous_rate, Some(0.0));
    assert_eq!(ds[3].status.rate, Some(47.0));
    assert_eq!(ds[3].status.previous_rate, Some(40.0));
    let step = ds[3].event.as_ref().unwrap();
    assert_eq!(step.reason, "ProducersRateChanged");
    assert_eq!(step.type_, EventType::Normal);
    assert_eq!(ds[4].status.rate, None);
    assert_eq!(ds[4].status.previous_rate, None);
    assert_eq!(ds[4].event.as_ref().unwrap().reason, "ProducersOpen");
}

#[test]
fn resuming_doubles_with_room_and_never_opens_on_a_window_that_reaches_into_the_pause() {
    let mut e = eff(ProducerMode::Pause);
    e.depth = Some((100_000.0, 20_000.0));
    let ds = run(
        &e,
        &[
            (0, depth(200_000.0, 0.0, 10.0)),
            (60, depth(100.0, 40.0, 0.0)),
            // Arrivals 5 of the 40 allowed: the rate window still covers the pause (0).
            (120, depth(100.0, 40.0, 5.0)),
            (180, depth(100.0, 40.0, 75.0)),
            (240, depth(100.0, 40.0, 150.0)),
        ],
    );
    use ProducerState::*;
    assert_eq!(
        states(&ds),
        [Paused, Resuming, Resuming, Resuming, Resuming]
    );
    let rates: Vec<_> = ds.iter().map(|d| d.status.rate).collect();
    assert_eq!(
        rates,
        [None, Some(40.0), Some(80.0), Some(160.0), Some(320.0)]
    );
}

#[test]
fn resuming_falls_below_the_drain_rate_above_the_midpoint_and_restricts_above() {
    let e = eff(ProducerMode::Pause);
    let ds = run(
        &e,
        &[
            (0, depth(900.0, 0.0, 10.0)),
            (60, depth(100.0, 40.0, 0.0)),
            // Between the watermarks, above their midpoint: less than the workers drain.
            (120, depth(650.0, 40.0, 40.0)),
            (130, depth(850.0, 40.0, 40.0)),
        ],
    );
    use ProducerState::*;
    assert_eq!(states(&ds), [Paused, Resuming, Resuming, Paused]);
    assert_eq!(ds[2].status.rate, Some(38.0), "40 - 150 / 60");
    assert!(ds[2].event.as_ref().unwrap().message.contains("lowered"));
    assert_eq!(ds[3].event.as_ref().unwrap().reason, "ProducersPaused");
}

#[test]
fn unknown_signals_change_nothing_and_either_signal_above_pauses() {
    let mut e = eff(ProducerMode::Pause);
    e.age = Some((Duration::from_secs(600), Duration::from_secs(120)));
    let age = |a: f64| FleetMetrics {
        queue_age: Some(a),
        completion_rate: Some(10.0),
        ..FleetMetrics::default()
    };
    let ds = run(
        &e,
        &[
            (0, FleetMetrics::default()),
            (10, age(601.0)),
            (100, FleetMetrics::default()),
            // Depth unknown, age below: not every signal is below, so no resume.
            (200, age(10.0)),
        ],
    );
    use ProducerState::*;
    assert_eq!(states(&ds), [Open, Paused, Paused, Paused]);
    assert!(
        ds[1]
            .event
            .as_ref()
            .unwrap()
            .message
            .contains("queue age 601s > 600s")
    );
    assert_eq!(level(&e, &FleetMetrics::default()).0, Level::Unknown);
    assert_eq!(level(&e, &age(10.0)).0, Level::Between);
}

#[test]
fn off_opens_restricted_producers_and_never_restricts() {
    let paused = run(&eff(ProducerMode::Pause), &[(0, depth(900.0, 0.0, 0.0))]);
    let off = eff(ProducerMode::Off);
    let d = decide_producers(
        &off,
        Some(&paused[0].status),
        &depth(900.0, 0.0, 0.0),
        at(5),
    );
    assert_eq!(d.status.state, ProducerState::Open);
    assert_eq!(d.event.as_ref().unwrap().reason, "ProducersOpen");
    let again = decide_producers(&off, Some(&d.status), &depth(5000.0, 0.0, 0.0), at(10));
    assert_eq!(again.status.state, ProducerState::Open);
    assert!(again.event.is_none());
}

#[test]
fn the_same_inputs_give_the_same_status_and_no_event() {
    let e = eff(ProducerMode::Throttle);
    for fleet in [
        depth(100.0, 10.0, 10.0),
        depth(900.0, 12.345, 10.0),
        depth(500.0, 10.0, 10.0),
    ] {
        let first = decide_producers(&e, None, &fleet, at(0));
        let second = decide_producers(&e, Some(&first.status), &fleet, at(0));
        assert_eq!(second.status, first.status);
        assert!(second.event.is_none());
    }
}

#[test]
fn the_pushed_document_shares_the_rate_among_ready_pods() {
    let e = eff(ProducerMode::Throttle);
    let d = decide_producers(&e, None, &depth(900.0, 100.0, 10.0), at(0));
    let doc = render_producer_config(&e, &d.status, 3, at(0));
    assert_eq!(doc.state, GateState::Throttled);
    assert_eq!(doc.rate_per_second, Some(30.0));
    assert_eq!(doc.validate(), Ok(()));
    let p = decide_producers(
        &eff(ProducerMode::Pause),
        None,
        &depth(900.0, 0.0, 0.0),
        at(0),
    );
    let doc = render_producer_config(&e, &p.status, 0, at(0));
    assert_eq!(doc.state, GateState::Paused);
    assert_eq!(doc.retry_after_ms, 60_000);
    let open = decide_producers(&e, None, &depth(0.0, 0.0, 0.0), at(0));
    let doc = render_producer_config(&e, &open.status, 2, at(0));
    assert_eq!((doc.state, doc.expires_at_unix), (GateState::Open, None));
}

#[test]
fn a_restriction_carries_a_lease_renewed_once_a_step() {
    let e = eff(ProducerMode::Pause);
    let p = decide_producers(&e, None, &depth(900.0, 0.0, 0.0), at(0));
    let step = LEASE_STEP.as_secs() as i64;
    for t in [0, 1, 299, 300, 7_777] {
        let now = at(t);
        let end = render_producer_config(&e, &p.status, 2, now)
            .expires_at_unix
            .unwrap();
        let left = end - now.as_second();
        assert!(left > step && left <= 2 * step, "lease of {left} s at {t}");
    }
    // Within one step the document does not change (no push per reconcile); across, it does.
    let hash = |t: i64| render_producer_config(&e, &p.status, 2, at(t)).hash;
    let into_step = at(0).as_second().rem_euclid(step);
    let start = -into_step;
    assert_eq!(hash(start + 1), hash(start + step - 1));
    assert_ne!(hash(start + 1), hash(start + step + 1));
}

#[test]
fn the_age_room_counts_what_already_waits_not_the_oldest_messages_age() {
    let mut e = eff(ProducerMode::Pause);
    e.depth = None;
    e.age = Some((Duration::from_secs(120), Duration::from_secs(30)));
    let fleet = |age: f64, depth: f64, arrival: f64| FleetMetrics {
        queue_age: Some(age),
        queue_depth: Some(depth),
        completion_rate: Some(100.0),
        arrival_rate: Some(arrival),
        ..FleetMetrics::default()
    };
    let ds = run(
        &e,
        &[
            (0, fleet(200.0, 30_000.0, 0.0)),
            (60, fleet(5.0, 1_000.0, 0.0)),
            (120, fleet(5.0, 1_000.0, 100.0)),
            // The oldest message is still young, but what waits already takes 80 s to drain:
            // past the midpoint age (75 s), so the rate falls below the completion rate.
            (180, fleet(20.0, 8_000.0, 200.0)),
        ],
    );
    use ProducerState::*;
    assert_eq!(states(&ds), [Paused, Resuming, Resuming, Resuming]);
    assert_eq!(ds[1].status.rate, Some(100.0));
    // 100 + (75 s × 100/s − 1000) / 60 s = 208.
    assert_eq!(ds[2].status.rate, Some(200.0));
    // 100 + (7500 − 8000) / 60 = 92.
    assert_eq!(ds[3].status.rate, Some(92.0));
}
