//! Producer control end to end (issue 17): the operator decides the producer state from the
//! queue metrics Prometheus scrapes, and pushes it to the producer workload's pods (real
//! `ProducerGate`s behind the worker library's admin endpoint, checking a real TokenReview for
//! the producer workload's audience). A worker pod of the same namespace keeps the push token it
//! receives and replays it to the producers: refused, nothing changes.

use std::time::Duration;

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{ProducerState, WorkerBackpressureStatus};
use backpressure_api::wire::{GateState, PRODUCER_PATH, ProducerConfig, push_audience};
use backpressure_worker::producer::Admission;
use serde_json::json;

use crate::common::badpods::{self, Refusal};
use crate::common::fleet::{FleetKnobs, steady};
use crate::common::pods;
use crate::common::scene::{condition, has_condition};
use crate::common::serial;
use crate::common::world::{W, World};

/// PUTs a producer document to a producer pod, with `token` if any; the HTTP status.
async fn put(addr: std::net::SocketAddr, token: Option<&str>, doc: &ProducerConfig) -> u16 {
    let mut req = reqwest::Client::new()
        .put(format!("http://{addr}{PRODUCER_PATH}"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(doc).unwrap())
        .timeout(Duration::from_secs(10));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap().status().as_u16()
}

/// Waits until the producers are in `state` and both producer pods acknowledged it.
async fn wait_producers(
    w: &World,
    state: ProducerState,
    timeout: Duration,
) -> WorkerBackpressureStatus {
    let what = format!("producers {}, 2 of 2 producer pods in sync", state.as_str());
    w.wait_status(timeout, &what, |s| {
        s.producers.as_ref().is_some_and(|p| {
            p.state == state && p.pods_in_sync == Some(2) && p.pods_total == Some(2)
        })
    })
    .await
}

#[tokio::test]
async fn producers_are_paused_above_the_watermark_and_resumed_through_the_push() {
    let _serial = serial().await;
    let mut w = World::builder("producers")
        .replicas(2)
        .pods(1)
        .start()
        .await;
    let (client, ns) = (w.scene.client.clone(), w.scene.ns.clone());
    w.scene.deployment("api", 2).await;
    let producers = pods::start_producers(w.scene.env, &ns, "api", 2).await;
    // A pod of the worker target that keeps the worker push token it receives.
    let thief = badpods::start(&client, &ns, W, "w-thief", Refusal::Status(500)).await;
    w.fleet.set(steady);
    w.apply(json!({"producers": {
        "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "api"},
        "queueDepth": {"pauseAbove": 100, "resumeBelow": 20},
        "pauseDwell": "3s",
        "resumeDwell": "6s",
    }}))
    .await;
    w.start_operator().await;

    // Below the watermarks: open, and every producer pod acknowledged it.
    let s = wait_producers(&w, ProducerState::Open, Duration::from_secs(40)).await;
    assert!(
        has_condition(&s, cond::PRODUCERS_THROTTLED, "False"),
        "{s:?}"
    );
    assert!(producers.iter().all(|p| p.gate.state() == GateState::Open));

    // A backlog above the high watermark while the workers complete little: paused.
    let above = |k: &mut FleetKnobs| {
        steady(k);
        k.queue_depth = 500.0;
        k.completion_rate = 2.0;
    };
    w.fleet.set(above);
    let s = wait_producers(&w, ProducerState::Paused, Duration::from_secs(40)).await;
    let c = condition(&s, cond::PRODUCERS_THROTTLED).expect("ProducersThrottled");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "Paused"),
        "{c:?}"
    );
    assert!(c.message.contains("queue depth 500 > 100"), "{c:?}");
    for p in &producers {
        assert_eq!(p.gate.state(), GateState::Paused, "{}", p.name);
        assert!(
            matches!(p.gate.try_admit(), Admission::RetryAfter(d) if d >= Duration::from_secs(1)),
            "{}",
            p.name
        );
    }
    w.wait_event("ProducersPaused", Duration::from_secs(20))
        .await;

    // The worker token, replayed by the worker pod to the producers with an Open document:
    // its audience is the worker workload's, not the producers'. Without a token: refused too.
    let token = w
        .wait_for(
            Duration::from_secs(40),
            "the worker pod to receive a push token",
            || async { thief.captured_tokens().first().cloned() },
        )
        .await;
    // A generation ahead of the operator's (its clock in ms), so that only authentication
    // stands between the replay and the gates.
    let ahead = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
        + 60_000;
    let open = ProducerConfig {
        generation: ahead,
        ..ProducerConfig::default()
    }
    .with_hash();
    let paused_ack: Vec<_> = producers.iter().map(|p| p.gate.ack()).collect();
    for p in &producers {
        for t in [Some(token.as_str()), None] {
            let status = put(p.addr, t, &open).await;
            assert!(
                status == 401 || status == 403,
                "{}: a push with {} answered {status}",
                p.name,
                if t.is_some() {
                    "the worker's token"
                } else {
                    "no token"
                }
            );
        }
    }
    assert_eq!(
        producers.iter().map(|p| p.gate.ack()).collect::<Vec<_>>(),
        paused_ack
    );
    assert!(
        producers
            .iter()
            .all(|p| p.gate.state() == GateState::Paused)
    );
    assert_ne!(push_audience(&ns, W), push_audience(&ns, "api"));

    // Below the low watermark with the workers draining: resuming at the fleet's completion
    // rate, shared by the two producer pods, then open once the producers send less than
    // they may.
    let below = |k: &mut FleetKnobs| {
        steady(k);
        k.queue_depth = 5.0;
        k.completion_rate = 40.0;
        k.arrival_rate = 1.0;
    };
    w.fleet.set(below);
    let s = wait_producers(&w, ProducerState::Resuming, Duration::from_secs(40)).await;
    // The completion rate as the `rate()` window saw it when the queue fell (2 → 40/s).
    let rate = s.producers.as_ref().and_then(|p| p.rate).unwrap();
    assert!((2.0..=44.0).contains(&rate), "{s:?}");
    for p in &producers {
        let running = p.gate.running();
        assert_eq!(running.state, GateState::Throttled, "{}", p.name);
        let per_pod = running.rate_per_second.unwrap();
        assert!((per_pod - rate / 2.0).abs() < 1e-9, "{per_pod} of {rate}");
    }
    wait_producers(&w, ProducerState::Open, Duration::from_secs(60)).await;
    assert!(producers.iter().all(|p| p.gate.state() == GateState::Open));
    for reason in ["ProducersResuming", "ProducersOpen"] {
        w.wait_event(reason, Duration::from_secs(20)).await;
    }
}
