//! The fleet's own load test for a failure floor (`floor.rs`): failures that stay where they
//! were while the fleet's calls fall (by a quarter or more) are load-independent; failures that fall with the
//! calls are an overload; failures above `worker.floorMax` are an outage.

use super::*;

/// 8 pods serving a backlog at 180 completions/s with 0.5 % failures: the load peak.
fn busy_fleet(eff: Effective) -> World {
    let mut w = World::new(eff, 8);
    w.queue = Queue::Backlog;
    w.backoff = Some(0.0);
    w.failure_rate = Some(0.005);
    for _ in 0..4 {
        w.step(15);
    }
    w
}

/// Steps `n` times by 15 s with this backoff, failure rate and completion rate.
fn steps(w: &mut World, n: usize, b: f64, f: f64, completion: f64) -> Vec<Decision> {
    w.backoff = Some(b);
    w.failure_rate = Some(f);
    w.completion_rate = Some(completion);
    (0..n).map(|_| w.step(15)).collect()
}

fn fleet_floor(w: &World) -> Option<f64> {
    w.status
        .as_ref()
        .and_then(|s| s.tracking.as_ref())
        .and_then(|t| t.fleet_floor)
}

fn found(ds: &[Decision]) -> Vec<&DecisionEvent> {
    ds.iter()
        .flat_map(|d| &d.events)
        .filter(|e| e.reason == "FailureFloor")
        .collect()
}

/// Scenario 7's class: 16 % of calls fail whatever the load. The workers back off fully (their
/// own floor test takes minutes) and the fleet's calls fall from ~180/s to ~14/s while the
/// failures stay at 16 %: after two rate windows of that the operator has the floor, and the
/// hold it entered on the backoff is released on the failure rate although the workers still
/// throttle.
#[test]
fn failures_that_stay_while_the_calls_halve_are_a_floor_and_release_the_hold() {
    let mut w = busy_fleet(defaults());
    let ds = steps(&mut w, 8, 0.9, 0.16, 12.0);
    assert_eq!(ds[2].regime, Regime::DependencyFailing, "{}", ds[2].reason);
    assert_eq!(
        fleet_floor(&w),
        None,
        "not before two rate windows of evidence"
    );

    let ds = steps(&mut w, 1, 0.9, 0.16, 12.0);
    let events = found(&ds);
    assert_eq!(events.len(), 1, "{:?}", ds[0].events);
    assert_eq!(events[0].type_, EventType::Normal);
    assert!(
        events[0].message.contains("failure floor 16.0%")
            && events[0].message.contains("effective set point 20.2%")
            && events[0].message.contains(
                "pushed set point 20.2% until the failures fall to 5.0% or rise above 25.0%"
            ),
        "{}",
        events[0].message
    );
    assert_eq!(fleet_floor(&w), Some(0.16));

    let d = first_release(&mut w);
    assert_eq!(d.regime, Regime::Recovering, "{}", d.reason);
    assert!(d.desired_replicas > 8, "{}", d.reason);
    assert!(
        d.reason.contains("failure floor 16.0%") && d.reason.contains("still throttle"),
        "{}",
        d.reason
    );
    // More failures than the floor explains (overload on top of it) hold again.
    let ds = steps(&mut w, 3, 0.9, 0.26, 12.0);
    assert!(
        ds.iter()
            .all(|d| d.desired_replicas <= ds[0].current_replicas)
    );
    assert_eq!(fleet_floor(&w), None, "above floorMax the floor ends");
}

/// An overload: the failures are the calls above capacity, so they fall as the fleet's calls
/// fall. No floor, and the hold stays until the workers stop throttling.
#[test]
fn failures_that_fall_with_the_calls_are_an_overload() {
    let mut w = busy_fleet(defaults());
    let mut ds = steps(&mut w, 1, 0.7, 0.20, 68.0);
    ds.extend(steps(&mut w, 1, 0.7, 0.12, 53.0));
    ds.extend(steps(&mut w, 1, 0.7, 0.08, 50.0));
    ds.extend(steps(&mut w, 12, 0.7, 0.05, 48.0));
    assert!(found(&ds).is_empty(), "{:?}", found(&ds));
    assert_eq!(fleet_floor(&w), None);
    let last = ds.last().unwrap();
    assert_eq!(last.regime, Regime::DependencyFailing, "{}", last.reason);
    assert!(
        ds.iter()
            .all(|d| d.desired_replicas <= ds[0].current_replicas)
    );
}

/// A dependency coming back slowly from an outage: the fleet calls little (it probes) and the
/// failures pass through the floor's range on their way down for minutes. They fall
/// significantly within every two rate windows, so they are not a floor.
#[test]
fn failures_falling_as_capacity_returns_are_not_a_floor() {
    let mut w = busy_fleet(defaults());
    let mut ds = steps(&mut w, 4, 1.0, 0.95, 1.0);
    for k in 0..14 {
        let f = 0.24 - 0.011 * f64::from(k);
        ds.extend(steps(&mut w, 1, 0.9, f, 40.0));
    }
    assert!(found(&ds).is_empty(), "{:?}", found(&ds));
    assert_eq!(fleet_floor(&w), None);
}

/// A partial outage: 40 % of calls fail at the fleet's minimal load, steadily. Above
/// `worker.floorMax` (25 %) a failure is more likely an outage worth waiting out than a floor.
#[test]
fn failures_above_floor_max_are_an_outage() {
    let mut w = busy_fleet(defaults());
    let ds = steps(&mut w, 16, 0.95, 0.40, 6.0);
    assert!(found(&ds).is_empty(), "{:?}", found(&ds));
    assert_eq!(ds.last().unwrap().regime, Regime::DependencyFailing);
}

/// Failures at the fleet's full load say nothing about whether load causes them (an overload
/// before the workers react looks the same): without the fall in calls (here the calls stay
/// near the busy fleet's peak of 320/s) there is no test.
#[test]
fn failures_at_full_load_are_not_a_floor() {
    let mut w = busy_fleet(defaults());
    let ds = steps(&mut w, 16, 0.1, 0.12, 300.0);
    assert!(found(&ds).is_empty(), "{:?}", found(&ds));
    assert_eq!(fleet_floor(&w), None);
}

/// The floor follows the dependency: it ends when the failures fall back to the set point, and
/// `worker.floorMax: 0` turns the test off.
#[test]
fn the_floor_ends_at_the_set_point_and_floor_max_zero_turns_it_off() {
    let mut w = busy_fleet(defaults());
    steps(&mut w, 9, 0.9, 0.16, 12.0);
    assert_eq!(fleet_floor(&w), Some(0.16));
    steps(&mut w, 1, 0.3, 0.04, 150.0);
    assert_eq!(fleet_floor(&w), None);

    let mut eff = defaults();
    eff.worker.floor_max = Some(0.0);
    let mut w = busy_fleet(eff);
    let ds = steps(&mut w, 12, 0.9, 0.16, 12.0);
    assert!(found(&ds).is_empty());
    assert_eq!(ds.last().unwrap().regime, Regime::DependencyFailing);
}

/// The test's memory is the status: an operator restarted in the middle of the evidence finds
/// the floor at the same time as one that was not.
#[test]
fn the_load_test_survives_a_restart() {
    let mut w = busy_fleet(defaults());
    steps(&mut w, 5, 0.9, 0.16, 12.0);
    let mut r = w.restarted();
    steps(&mut w, 4, 0.9, 0.16, 12.0);
    steps(&mut r, 4, 0.9, 0.16, 12.0);
    assert_eq!(fleet_floor(&w), Some(0.16));
    assert_eq!(w.status, r.status);
}

/// The floor is the lower of the failure rates at the evidence's start and end: a noisy last
/// window at a few calls per second does not raise it.
#[test]
fn the_floor_is_the_lower_end_of_the_evidence() {
    let mut w = busy_fleet(defaults());
    steps(&mut w, 1, 0.9, 0.16, 12.0);
    steps(&mut w, 8, 0.9, 0.185, 12.0);
    assert_eq!(fleet_floor(&w), Some(0.16));
}

/// A status edited by hand cannot lift the set point: a fleet floor outside what the load test
/// writes (above `worker.floorMax`, not a number) is dropped, and the overload holds.
#[test]
fn a_floor_written_into_the_status_by_hand_is_not_trusted() {
    let mut w = busy_fleet(defaults());
    steps(&mut w, 3, 0.9, 0.2, 40.0);
    let tracking = w.status.as_mut().unwrap().tracking.get_or_insert_default();
    tracking.fleet_floor = Some(0.9);
    let d = w.step(15);
    assert_eq!(fleet_floor(&w), None, "{}", d.reason);
    assert_eq!(d.regime, Regime::DependencyFailing, "{}", d.reason);
}

/// The workers run the set point `decide` holds against: the spec's without a floor, the
/// effective one `f0 + s·(1 − f0)` while the fleet has one, the spec's again when it ends.
#[test]
fn the_pushed_set_point_follows_the_fleet_floor() {
    let eff = defaults();
    let mut w = busy_fleet(eff.clone());
    assert_eq!(
        crate::decide::worker_set_point(&eff, w.status.as_ref()),
        0.05
    );
    steps(&mut w, 9, 0.9, 0.16, 12.0);
    assert_eq!(fleet_floor(&w), Some(0.16));
    assert_eq!(
        crate::decide::fleet_floor(&eff, w.status.as_ref()),
        Some(0.16)
    );
    // 0.16 + 0.05 × 0.84
    assert_eq!(
        crate::decide::worker_set_point(&eff, w.status.as_ref()),
        0.202
    );
    // Healed: the failure rate at the set point ends the floor and the push goes back to s.
    steps(&mut w, 1, 0.0, 0.04, 180.0);
    assert_eq!(fleet_floor(&w), None);
    assert_eq!(
        crate::decide::worker_set_point(&eff, w.status.as_ref()),
        0.05
    );
}

/// A floor edited into the status by hand is not pushed: the workers' set point moves only
/// within what the load test can write (above half the set point, at most `floorMax`).
#[test]
fn a_floor_written_into_the_status_by_hand_is_not_pushed() {
    let eff = defaults();
    let mut w = busy_fleet(eff.clone());
    for (forged, pushed) in [
        (0.9, 0.05),
        (f64::NAN, 0.05),
        (f64::INFINITY, 0.05),
        (0.01, 0.05),
        (0.25, 0.2875),
    ] {
        let tracking = w.status.as_mut().unwrap().tracking.get_or_insert_default();
        tracking.fleet_floor = Some(forged);
        assert_eq!(
            crate::decide::worker_set_point(&eff, w.status.as_ref()),
            pushed,
            "forged floor {forged}"
        );
    }
}

/// A small fleet (the lab's): about one call per second at the lower load, 15 % failing. One
/// window alone (about 70 calls) is not significantly above `1.5 × s`; the two windows of the
/// evidence pooled are.
#[test]
fn a_small_fleet_finds_its_floor_from_the_two_windows_pooled() {
    let mut w = busy_fleet(defaults());
    let ds = steps(&mut w, 12, 0.9, 0.15, 1.0);
    assert_eq!(found(&ds).len(), 1, "{:?}", ds.last().map(|d| &d.reason));
    assert_eq!(fleet_floor(&w), Some(0.15));
}

/// The same small fleet with 9 % failing: above `1.5 × s` in every window, but not
/// significantly at its few calls, so no floor however long it lasts.
#[test]
fn a_small_fleet_slightly_above_the_threshold_is_not_a_floor() {
    let mut w = busy_fleet(defaults());
    let ds = steps(&mut w, 30, 0.9, 0.09, 1.0);
    assert!(found(&ds).is_empty(), "{:?}", found(&ds));
    assert_eq!(fleet_floor(&w), None);
}

/// The window where the evidence begins straddles the fall of the load and reads low (11 %
/// for a floor of 16 %): pooled with the later windows it is not significant at a small
/// fleet's calls, so the evidence starts again from a window wholly at the lower load, and
/// the floor is the 16 % of the windows after the fall, not the start's 11 %.
#[test]
fn a_start_window_that_straddles_the_fall_of_the_load_does_not_stick() {
    let mut w = busy_fleet(defaults());
    let mut ds = steps(&mut w, 1, 0.9, 0.112, 1.0);
    ds.extend(steps(&mut w, 20, 0.9, 0.16, 1.0));
    assert_eq!(found(&ds).len(), 1, "{:?}", ds.last().map(|d| &d.reason));
    assert_eq!(fleet_floor(&w), Some(0.16));
}

/// Scenario 8's class: 4 % of calls fail whatever the load for a 5 % set point, and a short
/// burst over it made the workers back off. Their calls fell below `0.8·(1 − s)` of the peak
/// while the failures stayed at 4 %, significantly under the set point, for two rate windows:
/// a floor under the set point, so that the next burst is measured against `f0 + s·(1 − f0)`
/// and the backoff left by this one does not hold a backlog the dependency has room for.
#[test]
fn failures_that_stay_under_the_set_point_while_the_calls_fall_are_a_floor() {
    let mut w = busy_fleet(defaults());
    let ds = steps(&mut w, 3, 0.5, 0.04, 120.0);
    assert_eq!(ds[2].regime, Regime::DependencyFailing, "{}", ds[2].reason);
    let ds = steps(&mut w, 6, 0.5, 0.04, 120.0);
    assert_eq!(found(&ds).len(), 1, "{:?}", ds.last().map(|d| &d.reason));
    assert_eq!(fleet_floor(&w), Some(0.04));
    // 0.04 + 0.05 × 0.96
    assert_eq!(
        crate::decide::worker_set_point(&defaults(), w.status.as_ref()),
        0.088
    );
    let d = first_release(&mut w);
    assert_ne!(d.regime, Regime::DependencyFailing, "{}", d.reason);
    // Failures at the set point are this floor's own level, not a heal ...
    steps(&mut w, 4, 0.0, 0.045, 180.0);
    assert_eq!(fleet_floor(&w), Some(0.04));
    // ... failures halved are: the floor is over.
    steps(&mut w, 1, 0.0, 0.015, 180.0);
    assert_eq!(fleet_floor(&w), None);
}

/// An overload held at the workers' equilibrium after the dependency lost capacity: the calls
/// fell to half the peak and the failures stay just under the set point (0.97 of it, as the
/// simulator's quota overload averages), at a large fleet's calls (1,000/s) where that is
/// significantly under `s`. Not a floor: a floor under the set point must be significantly
/// under `0.95·s`.
#[test]
fn an_overload_at_the_workers_equilibrium_is_not_a_floor_under_the_set_point() {
    let mut w = busy_fleet(defaults());
    steps(&mut w, 4, 0.0, 0.005, 2000.0);
    let ds = steps(&mut w, 30, 0.6, 0.0485, 1000.0);
    assert!(found(&ds).is_empty(), "{:?}", found(&ds));
    assert_eq!(fleet_floor(&w), None);
}

/// Failures at a quarter of the set point are no floor: they leave the workers almost all of
/// it.
#[test]
fn failures_well_under_the_set_point_are_not_a_floor() {
    let mut w = busy_fleet(defaults());
    let ds = steps(&mut w, 16, 0.5, 0.0125, 120.0);
    assert!(found(&ds).is_empty(), "{:?}", found(&ds));
    assert_eq!(fleet_floor(&w), None);
}
