//! Property tests of `decide`: bounds, determinism, no flapping.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use backpressure_api::v1alpha1::{Action, Regime};
use proptest::prelude::*;

use super::fixtures::{Queue, World, at, effective};
use super::*;
use crate::resolve::Fallback;

/// A metric as observe may deliver it: unknown, NaN, negative garbage, or a value.
fn metric(max: f64) -> impl Strategy<Value = Option<f64>> {
    prop_oneof![
        2 => Just(None),
        1 => Just(Some(f64::NAN)),
        1 => Just(Some(-1.0)),
        1 => Just(Some(f64::INFINITY)),
        8 => (0.0..max).prop_map(Some),
    ]
}

fn fleet_metrics() -> impl Strategy<Value = FleetMetrics> {
    (
        metric(1.0),
        metric(1.0),
        metric(3600.0),
        metric(1e6),
        metric(5000.0),
        metric(5000.0),
    )
        .prop_map(
            |(backoff, failure_rate, queue_age, queue_depth, arrival_rate, completion_rate)| {
                FleetMetrics {
                    backoff,
                    failure_rate,
                    queue_age,
                    queue_depth,
                    arrival_rate,
                    completion_rate,
                    failure_floor: None,
                    partitions: None,
                }
            },
        )
}

fn fallback() -> impl Strategy<Value = Fallback> {
    prop_oneof![
        Just(Fallback::Hold),
        (1i32..80).prop_map(Fallback::Static),
        (1i32..80).prop_map(Fallback::IfHigher),
    ]
}

/// One observation step: time advance, metrics, error, whether the target follows the
/// decision, and an occasional outside change of the replicas.
#[derive(Debug, Clone)]
struct Tick {
    dt: i64,
    fleet: FleetMetrics,
    error: bool,
    follows: bool,
    outside: Option<i32>,
    ready_lag: i32,
}

fn tick() -> impl Strategy<Value = Tick> {
    (
        0i64..200,
        fleet_metrics(),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.8),
        prop::option::weighted(0.05, 0i32..120),
        0i32..3,
    )
        .prop_map(|(dt, fleet, error, follows, outside, ready_lag)| Tick {
            dt,
            fleet,
            error,
            follows,
            outside,
            ready_lag,
        })
}

fn observation(t: i64, current: i32, ready: i32, k: &Tick) -> Observation {
    Observation {
        now: at(t),
        generation: Some(1),
        current_replicas: current,
        ready_pods: ready,
        fleet: k.fleet.clone(),
        metrics_error: k.error.then(|| "timeout".to_owned()),
        config: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Replicas stay within [min, max] whatever the metrics, are never 0 when min >= 1, and
    /// missing data never takes a running fleet to zero. The same inputs always give the same
    /// decision, also when the previous status went through JSON.
    #[test]
    fn bounds_and_determinism(
        min in 0i32..6,
        span in 0i32..40,
        fb in fallback(),
        dry in prop::bool::weighted(0.2),
        start in 0i32..60,
        ticks in prop::collection::vec(tick(), 1..60),
    ) {
        let mut eff = effective(|s| {
            s.min_replicas = min;
            s.max_replicas = (min + span).max(1);
            s.on_metrics_unavailable = fb;
        });
        eff.dry_run = dry;
        let (lo, hi) = (eff.scaling.min_replicas, eff.scaling.max_replicas);
        let mut status: Option<WorkerBackpressureStatus> = None;
        let (mut t, mut current) = (0i64, start);
        for k in &ticks {
            t += k.dt;
            if let Some(n) = k.outside {
                current = n;
            }
            let ready = (current - k.ready_lag).max(0);
            let obs = observation(t, current, ready, k);
            let d = decide(&eff, status.as_ref(), &obs);

            prop_assert!(d.desired_replicas >= lo && d.desired_replicas <= hi,
                "{} not in [{lo}, {hi}]: {}", d.desired_replicas, d.reason);
            prop_assert!(d.recommended_replicas >= 0);
            if lo >= 1 {
                prop_assert!(d.desired_replicas >= 1);
            }
            if d.regime == Regime::MetricsUnavailable && current > 0 {
                prop_assert!(d.desired_replicas > 0, "scaled to zero on missing data");
            }
            if dry {
                prop_assert_eq!(d.scale_to(), None);
            }

            // Same inputs, same decision (also with the status read back from JSON).
            let again = decide(&eff, status.as_ref(), &obs);
            prop_assert_eq!(&again, &d);
            let via_json: Option<WorkerBackpressureStatus> = status
                .as_ref()
                .map(|s| serde_json::from_str(&serde_json::to_string(s).unwrap()).unwrap());
            prop_assert_eq!(&decide(&eff, via_json.as_ref(), &obs), &d);

            // The status survives the API server unchanged.
            let stored: WorkerBackpressureStatus =
                serde_json::from_str(&serde_json::to_string(&d.status).unwrap()).unwrap();
            prop_assert_eq!(&stored, &d.status, "status does not survive JSON");

            // Nothing to do, and the world stays as it is: the next decision writes nothing
            // and emits nothing.
            let prev_regime = status.as_ref().and_then(|s| s.regime);
            if d.action == Action::None
                && d.desired_replicas == current
                && prev_regime == Some(d.regime)
            {
                let next = decide(&eff, Some(&stored), &obs);
                prop_assert!(!status_changed(Some(&stored), &next.status),
                    "no-op rewrote the status: {:#?}\nvs\n{:#?}", stored, next.status);
                prop_assert!(next.events.is_empty(), "{:?}", next.events);
            }
            status = Some(stored);
            if k.follows
                && let Some(n) = d.scale_to()
            {
                current = n;
            }
        }
    }

    /// With backoff noise strictly inside the hysteresis band, the regime changes at most once
    /// (a ramp may complete), or twice where a hold may release (a release, then the end of its
    /// ramp); nothing flaps back. While the failure rate is
    /// above the set point (the dependency still failing) the band is between the release and
    /// hold thresholds, and a hold never releases. While the workers report a failure floor and
    /// the failure rate is at or below the effective set point, the backoff alone is no evidence
    /// of failure (see `Decider::hold_evidence`): with any backoff short of full, a healthy fleet
    /// never holds and a ramp is never aborted (a hold may be released, see
    /// `Decider::release_evidence`).
    #[test]
    fn no_flapping_between_thresholds(
        prefix in 0u8..3,
        queue in prop_oneof![Just(Queue::Steady), Just(Queue::Backlog), Just(Queue::Idle)],
        noise in prop::collection::vec((0.0501f64..0.1999, 1i64..90), 50..300),
        replicas in 1i32..30,
        at_set_point in any::<bool>(),
    ) {
        // At the set point: a floor of 10 % (s_eff = 0.145) and failures at 12 %.
        let (failure, noise): (f64, Vec<(f64, i64)>) = if at_set_point {
            let wide = |b: f64| 0.0501 + (b - 0.0501) * (0.95 - 0.0501) / (0.1999 - 0.0501);
            (0.12, noise.into_iter().map(|(b, dt)| (wide(b), dt)).collect())
        } else {
            (0.08, noise)
        };
        let mut w = World::new(effective(|_| {}), replicas);
        w.via_json = false;
        match prefix {
            // Held.
            1 => {
                w.backoff(0.6).queue(Queue::Backlog);
                w.step(0);
                w.step(30);
                prop_assert_eq!(w.status.as_ref().unwrap().regime, Some(Regime::DependencyFailing));
            }
            // Ramping.
            2 => {
                w.backoff(0.6).queue(Queue::Backlog);
                w.step(0);
                w.step(30);
                w.backoff(0.0);
                w.step(1);
                let d = w.step(60);
                prop_assume!(d.regime == Regime::Recovering);
            }
            _ => {
                w.backoff(0.1).queue(queue);
                w.step(0);
            }
        }
        w.queue(queue);
        w.failure_rate = Some(failure);
        w.failure_floor = at_set_point.then_some(0.10);
        let mut regime = w.status.as_ref().unwrap().regime;
        let mut changes = Vec::new();
        for (b, dt) in noise {
            let d = w.backoff(b).step(dt);
            if Some(d.regime) != regime {
                changes.push((w.t, regime, d.regime, d.reason.clone()));
                regime = Some(d.regime);
            }
        }
        // A release may be followed by the end of its ramp; nothing goes back.
        let most = if at_set_point { 2 } else { 1 };
        prop_assert!(changes.len() <= most, "{changes:#?}");
        if prefix == 1 && !at_set_point {
            prop_assert!(changes.is_empty(), "a hold must not release: {changes:#?}");
        }
        if at_set_point {
            prop_assert!(
                changes.iter().all(|c| c.2 != Regime::DependencyFailing),
                "no hold at the set point: {changes:#?}"
            );
        }
    }
}
