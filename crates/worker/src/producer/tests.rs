#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use backpressure_api::wire::{
    CONFIG_PATH, MAX_PAYLOAD_BYTES, PRODUCER_FILE_NAME, PRODUCER_PATH, WorkerConfig,
};
use http::StatusCode;

use super::*;
use crate::config::admin::{Admin, FailureLimit};
use crate::config::tests::{OPERATOR, StaticTokens, call, kubelet_update_file, put_from};
use crate::config::{ConfigState, FileWatcher};
use crate::controller::{self, Settings};
use crate::permits::Gate;

fn doc(generation: i64, state: GateState, rate: Option<f64>) -> ProducerConfig {
    ProducerConfig {
        generation,
        state,
        rate_per_second: rate,
        retry_after_ms: 2000,
        ..ProducerConfig::default()
    }
    .with_hash()
}

fn gate() -> (ProducerGate, Metrics) {
    let metrics = Metrics::producer("orders-api");
    (ProducerGate::new(Some(metrics.clone())), metrics)
}

fn tokens() -> Arc<StaticTokens> {
    Arc::new(StaticTokens(HashMap::from([
        ("good", Ok(OPERATOR)),
        ("other", Ok("system:serviceaccount:bp-system:someone-else")),
        ("down", Err(true)),
    ])))
}

/// A producer pod's admin server: the producer state only.
fn producer_admin(gate: &ProducerGate, metrics: &Metrics) -> Admin {
    Admin::for_producer(gate.clone(), Some(metrics.clone()))
        .with_verifier(tokens(), [OPERATOR.to_owned()])
}

fn worker_state() -> ConfigState {
    let gate = Gate::new(controller::build(Settings::steady(), 1));
    ConfigState::new(gate, WorkerConfig::default(), None)
}

async fn push(admin: &Admin, token: Option<&str>, body: Vec<u8>) -> (StatusCode, String) {
    call(admin, "PUT", PRODUCER_PATH, token, body).await
}

fn ack_of(cfg: &ProducerConfig) -> ConfigAck {
    ConfigAck {
        hash: cfg.hash.clone(),
        generation: cfg.generation,
    }
}

fn json(cfg: &ProducerConfig) -> Vec<u8> {
    serde_json::to_vec(cfg).unwrap()
}

/// Counts the polls of a future: a waiter that busy-polls shows up as many polls.
struct Counted<F> {
    inner: Pin<Box<F>>,
    polls: Arc<AtomicUsize>,
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        self.inner.as_mut().poll(cx)
    }
}

fn spawn_admit(gate: &ProducerGate) -> (tokio::task::JoinHandle<()>, Arc<AtomicUsize>) {
    let polls = Arc::new(AtomicUsize::new(0));
    let g = gate.clone();
    let task = tokio::spawn(Counted {
        inner: Box::pin(async move { g.admit().await }),
        polls: polls.clone(),
    });
    (task, polls)
}

/// Lets spawned tasks run without moving the (paused) clock.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

fn close(a: Duration, b: Duration) -> bool {
    a.abs_diff(b) < Duration::from_micros(10)
}

#[tokio::test(start_paused = true)]
async fn before_any_document_the_gate_is_open_and_admits_everything_at_once() {
    let (gate, metrics) = gate();
    assert_eq!(gate.state(), GateState::Open);
    assert_eq!(gate.ack(), ack_of(&ProducerConfig::default()));
    assert_eq!(gate.origin(), Origin::Initial);
    let start = Instant::now();
    for _ in 0..1000 {
        gate.admit().await;
        assert_eq!(gate.try_admit(), Admission::Admitted);
    }
    assert_eq!(Instant::now(), start, "nothing waited");
    assert_eq!(metrics.producer_admitted_count(), 2000);
    for s in GateState::ALL {
        assert_eq!(metrics.producer_refused_count(s), 0);
    }
}

#[tokio::test(start_paused = true)]
async fn a_throttle_admits_its_rate_within_one_token_over_ten_seconds() {
    for rate in [0.5, 3.3, 40.0] {
        let (gate, metrics) = gate();
        gate.apply(doc(1, GateState::Throttled, Some(rate)), Origin::Push)
            .unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        let mut admitted = 0u64;
        loop {
            gate.admit().await;
            if Instant::now() > end {
                break;
            }
            admitted += 1;
        }
        let want = rate * 10.0;
        assert!(
            (admitted as f64 - want).abs() <= 1.0,
            "rate {rate}: {admitted} admitted in 10 s"
        );
        assert_eq!(metrics.producer_admitted_count(), admitted + 1);
        // Every admission but the first had to wait for its token.
        assert_eq!(
            metrics.producer_refused_count(GateState::Throttled),
            admitted
        );
    }
}

#[tokio::test(start_paused = true)]
async fn try_admit_says_when_the_next_token_comes_and_holds_at_most_a_second_of_them() {
    let (gate, metrics) = gate();
    let t0 = Instant::now();
    gate.apply(doc(1, GateState::Throttled, Some(2.0)), Origin::Push)
        .unwrap();
    assert_eq!(gate.try_admit_at(t0), Admission::Admitted);
    let Admission::RetryAfter(wait) = gate.try_admit_at(t0) else {
        panic!("a second message in the same instant")
    };
    assert!(close(wait, Duration::from_millis(500)), "{wait:?}");
    let Admission::RetryAfter(wait) = gate.try_admit_at(t0 + Duration::from_millis(250)) else {
        panic!("half a token")
    };
    assert!(close(wait, Duration::from_millis(250)), "{wait:?}");
    assert_eq!(
        gate.try_admit_at(t0 + Duration::from_millis(500)),
        Admission::Admitted
    );
    // Idle for ten seconds: two tokens (one second's worth), not twenty.
    let later = t0 + Duration::from_millis(10_500);
    assert_eq!(gate.try_admit_at(later), Admission::Admitted);
    assert_eq!(gate.try_admit_at(later), Admission::Admitted);
    assert!(matches!(gate.try_admit_at(later), Admission::RetryAfter(_)));
    // An instant before the last one does not refill backwards.
    assert!(matches!(gate.try_admit_at(t0), Admission::RetryAfter(_)));
    assert_eq!(metrics.producer_admitted_count(), 4);
    assert_eq!(metrics.producer_refused_count(GateState::Throttled), 4);

    // Below one per second the bucket still holds one token: one message every 1/rate.
    gate.apply(doc(2, GateState::Throttled, Some(0.25)), Origin::Push)
        .unwrap();
    let t1 = later + Duration::from_secs(100);
    assert_eq!(gate.try_admit_at(t1), Admission::Admitted);
    let Admission::RetryAfter(wait) = gate.try_admit_at(t1) else {
        panic!()
    };
    assert!(close(wait, Duration::from_secs(4)), "{wait:?}");
}

#[tokio::test(start_paused = true)]
async fn a_new_rate_while_throttled_keeps_the_tokens_up_to_the_new_bucket() {
    let (gate, _) = gate();
    let t0 = Instant::now();
    gate.apply(doc(1, GateState::Throttled, Some(10.0)), Origin::Push)
        .unwrap();
    assert_eq!(gate.try_admit_at(t0), Admission::Admitted);
    tokio::time::advance(Duration::from_secs(1)).await;
    // Ten tokens at the old rate, capped at two by the new one.
    gate.apply(doc(2, GateState::Throttled, Some(2.0)), Origin::Push)
        .unwrap();
    let t1 = Instant::now();
    assert_eq!(gate.try_admit_at(t1), Admission::Admitted);
    assert_eq!(gate.try_admit_at(t1), Admission::Admitted);
    let Admission::RetryAfter(wait) = gate.try_admit_at(t1) else {
        panic!()
    };
    assert!(close(wait, Duration::from_millis(500)), "{wait:?}");
}

#[tokio::test(start_paused = true)]
async fn paused_try_admit_hands_back_the_retry_after_of_the_document() {
    let (gate, metrics) = gate();
    gate.apply(doc(1, GateState::Paused, None), Origin::Push)
        .unwrap();
    for _ in 0..3 {
        assert_eq!(
            gate.try_admit(),
            Admission::RetryAfter(Duration::from_secs(2))
        );
    }
    // A throttle to zero admits nothing either.
    gate.apply(doc(2, GateState::Throttled, Some(0.0)), Origin::Push)
        .unwrap();
    assert_eq!(
        gate.try_admit(),
        Admission::RetryAfter(Duration::from_secs(2))
    );
    assert_eq!(metrics.producer_refused_count(GateState::Paused), 3);
    assert_eq!(metrics.producer_refused_count(GateState::Throttled), 1);
    assert_eq!(metrics.producer_admitted_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_paused_admit_sleeps_without_polling_until_a_push_opens_the_gate() {
    let (gate, metrics) = gate();
    let admin = producer_admin(&gate, &metrics);
    let (status, text) = push(&admin, Some("good"), json(&doc(1, GateState::Paused, None))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let (waiter, polls) = spawn_admit(&gate);
    // An hour passes: the waiter is not admitted, and was not woken to look again.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(!waiter.is_finished());
    assert!(polls.load(Ordering::SeqCst) <= 2, "{polls:?}");
    // The push wakes it at once (no time passes).
    let (status, text) = push(&admin, Some("good"), json(&doc(2, GateState::Open, None))).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let before = Instant::now();
    tokio::time::timeout(Duration::from_millis(1), waiter)
        .await
        .expect("woken by the push")
        .unwrap();
    assert_eq!(Instant::now(), before);
    assert_eq!(metrics.producer_admitted_count(), 1);
    assert_eq!(metrics.producer_refused_count(GateState::Paused), 1);
}

#[tokio::test(start_paused = true)]
async fn waiters_are_admitted_in_order_and_a_cancelled_one_takes_no_token() {
    let (gate, _) = gate();
    gate.apply(doc(1, GateState::Paused, None), Origin::Push)
        .unwrap();
    // Cancelled while paused: it takes nothing.
    assert!(
        tokio::time::timeout(Duration::from_secs(1), gate.admit())
            .await
            .is_err()
    );
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let (g, order) = (gate.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            g.admit().await;
            order.lock().unwrap().push((i, Instant::now()));
        }));
        settle().await;
    }
    let t0 = Instant::now();
    gate.apply(doc(2, GateState::Throttled, Some(1.0)), Origin::Push)
        .unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(
        order.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    // One token a second: at 0 (the bucket's first), 1 and 2 s (rounded up to the timer's
    // millisecond).
    for (k, (_, at)) in order.iter().enumerate() {
        let since = *at - t0;
        let want = Duration::from_secs(k as u64);
        assert!(
            since >= want && since <= want + Duration::from_millis(2),
            "{k}: {since:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_stale_generation_is_refused_with_409_and_leaves_the_state() {
    let (gate, metrics) = gate();
    let admin = producer_admin(&gate, &metrics);
    let paused = doc(5, GateState::Paused, None);
    assert_eq!(
        push(&admin, Some("good"), json(&paused)).await.0,
        StatusCode::OK
    );
    let (waiter, _) = spawn_admit(&gate);
    settle().await;
    let (status, text) = push(&admin, Some("good"), json(&doc(4, GateState::Open, None))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    assert!(text.contains("older"), "{text}");
    assert_eq!(gate.state(), GateState::Paused);
    assert_eq!(gate.ack(), ack_of(&paused));
    settle().await;
    assert!(!waiter.is_finished(), "a refused push admitted a waiter");
    // The same document again is accepted and changes nothing.
    assert_eq!(
        push(&admin, Some("good"), json(&paused)).await.0,
        StatusCode::OK
    );
    let (status, text) = call(&admin, "GET", PRODUCER_PATH, None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<ConfigAck>(&text).unwrap(),
        ack_of(&paused)
    );
    waiter.abort();
}

#[tokio::test(start_paused = true)]
async fn an_unauthenticated_push_is_refused_and_leaves_the_state() {
    let (gate, metrics) = gate();
    let admin = producer_admin(&gate, &metrics);
    let paused = doc(1, GateState::Paused, None);
    assert_eq!(
        push(&admin, Some("good"), json(&paused)).await.0,
        StatusCode::OK
    );
    let (waiter, _) = spawn_admit(&gate);
    let open = json(&doc(2, GateState::Open, None));
    for (token, want) in [
        (None, StatusCode::UNAUTHORIZED),
        (Some("forged"), StatusCode::UNAUTHORIZED),
        (Some("other"), StatusCode::FORBIDDEN),
        (Some("down"), StatusCode::SERVICE_UNAVAILABLE),
    ] {
        let (status, text) = push(&admin, token, open.clone()).await;
        assert_eq!(status, want, "{token:?}: {text}");
        assert!(text.contains("\"error\""), "{text}");
        assert_eq!(gate.state(), GateState::Paused, "{token:?}");
        assert_eq!(gate.ack(), ack_of(&paused));
    }
    settle().await;
    assert!(!waiter.is_finished(), "a refused push admitted a waiter");
    // Without a verifier no push is accepted at all.
    let closed = Admin::for_producer(gate.clone(), None);
    assert_eq!(
        push(&closed, Some("good"), open).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(gate.state(), GateState::Paused);
    waiter.abort();
}

#[tokio::test(start_paused = true)]
async fn a_document_with_a_bad_field_is_refused_with_400_naming_the_field() {
    let (gate, metrics) = gate();
    let admin = producer_admin(&gate, &metrics);
    let throttled = doc(3, GateState::Throttled, Some(5.0));
    assert_eq!(
        push(&admin, Some("good"), json(&throttled)).await.0,
        StatusCode::OK
    );
    let unhashed = |cfg: ProducerConfig| ProducerConfig {
        hash: String::new(),
        ..cfg
    };
    let mut no_rate = serde_json::to_value(unhashed(doc(4, GateState::Throttled, None))).unwrap();
    no_rate.as_object_mut().unwrap().remove("ratePerSecond");
    let mut negative =
        serde_json::to_value(unhashed(doc(4, GateState::Throttled, Some(1.0)))).unwrap();
    negative["ratePerSecond"] = serde_json::json!(-3.0);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (serde_json::to_vec(&no_rate).unwrap(), "ratePerSecond"),
        (serde_json::to_vec(&negative).unwrap(), "ratePerSecond"),
        (
            json(&unhashed(ProducerConfig {
                retry_after_ms: MAX_RETRY_AFTER_MS + 1,
                ..doc(4, GateState::Paused, None)
            })),
            "retryAfterMs",
        ),
        (
            json(&unhashed(doc(i64::MAX, GateState::Paused, None))),
            "generation",
        ),
        (
            json(&unhashed(doc(-1, GateState::Paused, None))),
            "generation",
        ),
        (
            json(&ProducerConfig {
                state: GateState::Open,
                ..doc(4, GateState::Paused, None)
            }),
            "hash",
        ),
        (
            serde_json::to_vec(&serde_json::json!({"version": "v0", "generation": 4, "state": "Paused", "retryAfterMs": 1})).unwrap(),
            "version",
        ),
        (
            serde_json::to_vec(&WorkerConfig::default()).unwrap(),
            "malformed",
        ),
        (b"{not json".to_vec(), "malformed"),
    ];
    for (body, field) in cases {
        let (status, text) = push(&admin, Some("good"), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {text}");
        assert!(text.contains(field), "{text} should name {field}");
        assert_eq!(gate.ack(), ack_of(&throttled), "{field}");
        assert_eq!(gate.state(), GateState::Throttled);
    }
    let (status, _) = push(&admin, Some("good"), vec![b' '; MAX_PAYLOAD_BYTES + 1]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(gate.ack(), ack_of(&throttled));
}

#[tokio::test(start_paused = true)]
async fn failed_authentications_on_either_endpoint_share_one_limit() {
    let (gate, metrics) = gate();
    let admin = Admin::new(worker_state(), None)
        .with_producer(gate.clone())
        .with_verifier(tokens(), [OPERATOR.to_owned()])
        .with_failure_limit(FailureLimit {
            burst: 3,
            refill: Duration::from_secs(2),
        });
    let attacker = "10.0.0.66:40000";
    let open = json(&doc(1, GateState::Paused, None));
    for _ in 0..3 {
        let (status, _) = put_from(&admin, CONFIG_PATH, attacker, Some("forged"), vec![]).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    let (status, retry) =
        put_from(&admin, PRODUCER_PATH, attacker, Some("good"), open.clone()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry.as_deref(), Some("2"));
    assert_eq!(gate.state(), GateState::Open);
    let (status, _) = put_from(&admin, PRODUCER_PATH, "10.0.0.7:1", Some("good"), open).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(gate.state(), GateState::Paused);
    let _ = metrics;
}

#[tokio::test]
async fn each_pod_serves_the_documents_it_runs() {
    let (gate, metrics) = gate();
    // A producer-only pod: no worker config.
    let producer = producer_admin(&gate, &metrics);
    for method in ["GET", "PUT"] {
        let body = serde_json::to_vec(&WorkerConfig::default()).unwrap();
        let (status, text) = call(&producer, method, CONFIG_PATH, Some("good"), body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method}: {text}");
    }
    let (status, text) = call(&producer, "GET", PRODUCER_PATH, None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_str::<ConfigAck>(&text).unwrap(),
        gate.ack()
    );
    assert_eq!(
        call(&producer, "POST", PRODUCER_PATH, None, vec![]).await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
    let (status, text) = call(&producer, "GET", "/metrics", None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains("backpressure_producer_state"), "{text}");
    assert!(!text.contains("backpressure_permits"), "{text}");
    // A worker-only pod: no producer gate.
    let worker = Admin::new(worker_state(), None).with_verifier(tokens(), [OPERATOR.to_owned()]);
    let body = json(&doc(1, GateState::Paused, None));
    for method in ["GET", "PUT"] {
        let (status, _) = call(&worker, method, PRODUCER_PATH, Some("good"), body.clone()).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method}");
    }
    assert_eq!(
        call(&worker, "GET", CONFIG_PATH, None, vec![]).await.0,
        StatusCode::OK
    );
    // Both: each document to its own receiver.
    let both = Admin::new(worker_state(), None)
        .with_producer(gate.clone())
        .with_verifier(tokens(), [OPERATOR.to_owned()]);
    assert_eq!(
        call(&both, "PUT", PRODUCER_PATH, Some("good"), body)
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(gate.state(), GateState::Paused);
    let cfg = WorkerConfig {
        generation: 1,
        max_permits: 3,
        ..WorkerConfig::default()
    }
    .with_hash();
    let (status, text) = call(
        &both,
        "PUT",
        CONFIG_PATH,
        Some("good"),
        serde_json::to_vec(&cfg).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(both.state().unwrap().ack().generation, 1);
    assert_eq!(both.producer().unwrap().ack().generation, 1);
}

/// A pod that is a worker of one workload and a producer of another checks each push with the
/// verifier of its own audience: a worker token does not move the producer gate.
#[tokio::test]
async fn a_producer_verifier_checks_producer_pushes_only() {
    let (gate, _) = gate();
    let worker_tokens = Arc::new(StaticTokens(HashMap::from([("worker-aud", Ok(OPERATOR))])));
    let producer_tokens = Arc::new(StaticTokens(HashMap::from([(
        "producer-aud",
        Ok(OPERATOR),
    )])));
    let admin = Admin::new(worker_state(), None)
        .with_producer(gate.clone())
        .with_verifier(worker_tokens, [OPERATOR.to_owned()])
        .with_producer_verifier(producer_tokens);
    let paused = json(&doc(1, GateState::Paused, None));
    assert_eq!(
        push(&admin, Some("worker-aud"), paused.clone()).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(gate.state(), GateState::Open);
    assert_eq!(
        push(&admin, Some("producer-aud"), paused).await.0,
        StatusCode::OK
    );
    assert_eq!(gate.state(), GateState::Paused);
    let cfg = serde_json::to_vec(
        &WorkerConfig {
            generation: 1,
            ..WorkerConfig::default()
        }
        .with_hash(),
    )
    .unwrap();
    assert_eq!(
        call(
            &admin,
            "PUT",
            CONFIG_PATH,
            Some("producer-aud"),
            cfg.clone()
        )
        .await
        .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(&admin, "PUT", CONFIG_PATH, Some("worker-aud"), cfg)
            .await
            .0,
        StatusCode::OK
    );
}

async fn wait_for(gate: &ProducerGate, generation: i64) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while gate.ack().generation != generation {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("generation {generation} not applied: {:?}", gate.ack()));
}

#[tokio::test]
async fn the_mounted_producer_state_is_hot_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let (gate, _) = gate();
    let path = dir.path().join(PRODUCER_FILE_NAME);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(FileWatcher::new(gate.clone(), &path).run(
        Duration::from_millis(20),
        async move {
            let _ = stopped.await;
        },
    ));
    let update = |stamp: &str, bytes: Vec<u8>| {
        kubelet_update_file(dir.path(), stamp, PRODUCER_FILE_NAME, &bytes);
    };
    update(
        "..2024_01_01_00_00_00.1",
        json(&doc(1, GateState::Paused, None)),
    );
    wait_for(&gate, 1).await;
    assert_eq!(gate.state(), GateState::Paused);
    assert_eq!(gate.origin(), Origin::File);
    update(
        "..2024_01_01_00_01_00.2",
        json(&doc(2, GateState::Throttled, Some(7.0))),
    );
    wait_for(&gate, 2).await;
    assert_eq!(gate.state(), GateState::Throttled);
    // An older or invalid file is refused; the running state stays.
    update(
        "..2024_01_01_00_02_00.3",
        json(&doc(1, GateState::Open, None)),
    );
    update("..2024_01_01_00_03_00.4", b"{\"state\": \"Open\"}".to_vec());
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(gate.ack().generation, 2);
    assert_eq!(gate.state(), GateState::Throttled);
    update(
        "..2024_01_01_00_04_00.5",
        json(&doc(3, GateState::Open, None)),
    );
    wait_for(&gate, 3).await;
    assert_eq!(gate.state(), GateState::Open);
    let _ = stop.send(());
}

/// A restriction whose lease ends without a newer document (the operator is gone) opens the
/// gate by itself: waiters are admitted at the end of the lease, never later, and a refused
/// caller is not told to wait past it.
#[tokio::test(start_paused = true)]
async fn a_lapsed_lease_opens_the_gate_without_a_document() {
    let (gate, metrics) = gate();
    let now_unix = 1_800_000_000;
    let leased = ProducerConfig {
        generation: 1,
        state: GateState::Paused,
        retry_after_ms: 60_000,
        expires_at_unix: Some(now_unix + 10),
        ..ProducerConfig::default()
    }
    .with_hash();
    gate.apply_at(leased, Origin::Push, now_unix).unwrap();
    let start = Instant::now();
    assert_eq!(gate.state(), GateState::Paused);
    assert_eq!(
        gate.try_admit(),
        Admission::RetryAfter(Duration::from_secs(10)),
        "not past the lease"
    );
    let waiter = tokio::spawn({
        let gate = gate.clone();
        async move { gate.admit().await }
    });
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(!waiter.is_finished());
    assert_eq!(gate.state(), GateState::Paused);
    tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("admitted when the lease ends")
        .unwrap();
    assert_eq!(Instant::now() - start, Duration::from_secs(10));
    assert_eq!(gate.state(), GateState::Open);
    assert_eq!(gate.try_admit(), Admission::Admitted);
    let text = metrics.encode();
    assert!(
        text.contains(r#"backpressure_producer_state{workload="orders-api",state="Open"} 1"#),
        "{text}"
    );

    // A lease already over when the document arrives: open at once.
    let late = ProducerConfig {
        generation: 2,
        state: GateState::Throttled,
        rate_per_second: Some(0.0),
        expires_at_unix: Some(now_unix - 1),
        ..ProducerConfig::default()
    }
    .with_hash();
    gate.apply_at(late, Origin::Push, now_unix).unwrap();
    assert_eq!(gate.try_admit(), Admission::Admitted);
}
