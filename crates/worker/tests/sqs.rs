//! The SQS source (feature `sqs`) against a real SQS-compatible server: moto
//! (`tools/sqs/moto.sh` installs it; `BP_MOTO_SERVER` overrides), started on a free port.
//!
//! `cargo test -p backpressure-worker --features sqs --test sqs`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backpressure_api::v1alpha1::Algorithm;
use backpressure_api::wire::WorkerConfig;
use backpressure_envtest::sqs::{ACCESS_KEY_ID, ACCOUNT, Moto, REGION, SECRET_ACCESS_KEY};
use backpressure_worker::controller::{self, Outcome, Settings};
use backpressure_worker::permits::Gate;
use backpressure_worker::sources::sqs::{Credentials, SqsClient, SqsMessage, SqsSource};
use backpressure_worker::worker_loop::{Handler, Source, WorkerLoop};

fn dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("bp-sqs-{name}-{}", backpressure_envtest::unique()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn client(moto: &Moto) -> SqsClient {
    SqsClient::new(
        &moto.endpoint(),
        REGION,
        Credentials {
            access_key_id: ACCESS_KEY_ID.into(),
            secret_access_key: SECRET_ACCESS_KEY.into(),
            session_token: None,
        },
    )
    .unwrap()
}

async fn counts(client: &SqsClient, url: &str) -> (u64, u64) {
    let a = client
        .queue_attributes(
            url,
            &[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
            ],
        )
        .await
        .unwrap();
    let n = |k: &str| a.get(k).unwrap().parse::<u64>().unwrap();
    (
        n("ApproximateNumberOfMessages"),
        n("ApproximateNumberOfMessagesNotVisible"),
    )
}

fn fixed(permits: u32) -> Settings {
    Settings::from_config(&WorkerConfig {
        algorithm: Algorithm::Fixed,
        max_permits: permits,
        initial_permits: Some(permits),
        ..WorkerConfig::default()
    })
}

/// Succeeds on `ok-*`, fails `poison-*` as a message failure; remembers every delivery.
#[derive(Default)]
struct Recorder {
    seen: Mutex<HashMap<String, Vec<Option<u32>>>>,
}

impl Handler<SqsMessage> for Recorder {
    async fn handle(&self, m: &SqsMessage) -> Outcome {
        self.seen
            .lock()
            .unwrap()
            .entry(m.body.clone())
            .or_default()
            .push(m.receive_count);
        tokio::time::sleep(Duration::from_millis(20)).await;
        if m.body.starts_with("poison") {
            Outcome::MessageFailure
        } else {
            Outcome::Success
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_is_deleted_once_or_dead_lettered_by_the_redrive_policy() {
    let d = dir("loop");
    let moto = Moto::start(&d).unwrap();
    let sqs = client(&moto);
    let dlq = sqs
        .create_queue("orders-dlq", &BTreeMap::new())
        .await
        .unwrap();
    let redrive = format!(
        r#"{{"deadLetterTargetArn":"arn:aws:sqs:{REGION}:{ACCOUNT}:orders-dlq","maxReceiveCount":"3"}}"#
    );
    let url = sqs
        .create_queue(
            "orders",
            &BTreeMap::from([
                ("RedrivePolicy".to_owned(), redrive),
                ("VisibilityTimeout".to_owned(), "30".to_owned()),
            ]),
        )
        .await
        .unwrap();
    assert_eq!(sqs.queue_url("orders").await.unwrap(), url);
    for i in 0..25 {
        sqs.send_message(&url, &format!("ok-{i}")).await.unwrap();
    }
    for i in 0..4 {
        sqs.send_message(&url, &format!("poison-{i}"))
            .await
            .unwrap();
    }
    assert_eq!(counts(&sqs, &url).await, (29, 0));

    let source = Arc::new(SqsSource::new(sqs.clone(), url.clone()).wait_time(Duration::ZERO));
    let handler = Arc::new(Recorder::default());
    let gate = Gate::new(controller::build(fixed(4), 1));
    // Plain nacks (visibility 0): the poison messages come back at once and reach the DLQ
    // after their third receive.
    let worker = WorkerLoop::new(source.clone(), handler.clone(), gate).no_redelivery_backoff();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(worker.run(async move {
        let _ = stop_rx.await;
    }));
    let started = Instant::now();
    loop {
        let (main, dead) = (counts(&sqs, &url).await, counts(&sqs, &dlq).await);
        if main == (0, 0) && dead.0 == 4 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "queue {main:?}, DLQ {dead:?} after 60 s; moto log:\n{}",
            moto.log_tail(20)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_tx.send(()).unwrap();
    let stats = run.await.unwrap();

    let seen = handler.seen.lock().unwrap().clone();
    for i in 0..25 {
        assert_eq!(
            seen.get(&format!("ok-{i}")),
            Some(&vec![Some(1)]),
            "ok-{i} processed once, on its first receive"
        );
    }
    for i in 0..4 {
        assert_eq!(
            seen.get(&format!("poison-{i}")),
            Some(&vec![Some(1), Some(2), Some(3)]),
            "poison-{i}: the receive count grows to maxReceiveCount, then the DLQ"
        );
    }
    assert_eq!(seen.len(), 29);
    assert_eq!(stats.outcomes[Outcome::Success.index()], 25);
    assert_eq!(stats.outcomes[Outcome::MessageFailure.index()], 12);
    assert_eq!(stats.settle_errors, 0);
    let mut dead: Vec<String> = Vec::new();
    for _ in 0..10 {
        let got = sqs.receive_message(&dlq, 10, Duration::ZERO).await.unwrap();
        if got.is_empty() && dead.len() >= 4 {
            break;
        }
        dead.extend(got.into_iter().map(|m| m.body));
    }
    dead.sort();
    assert_eq!(dead, ["poison-0", "poison-1", "poison-2", "poison-3"]);
    // The queue's numbers as the worker saw them.
    assert_eq!(source.metrics().completions(), 25);
    assert_eq!(source.metrics().first_receives(), 29);
    assert_eq!(source.poll_depth().await.unwrap(), 0);
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_worker_receives_nothing_and_nack_after_delays_the_redelivery() {
    let d = dir("held");
    let moto = Moto::start(&d).unwrap();
    let sqs = client(&moto);
    let url = sqs.create_queue("held", &BTreeMap::new()).await.unwrap();
    for i in 0..5 {
        sqs.send_message(&url, &format!("m-{i}")).await.unwrap();
    }
    let source = Arc::new(SqsSource::new(sqs.clone(), url.clone()).wait_time(Duration::ZERO));
    assert_eq!(source.poll_depth().await.unwrap(), 5);
    assert_eq!(source.metrics().depth(), 5.0);

    // Held: the brake takes every permit before the loop starts.
    let settings = fixed(4);
    let gate = Gate::new(controller::build(settings.clone(), 1));
    let brake = backpressure_api::wire::BrakeConfig {
        min_backoff: 1.0,
        expires_at_unix: None,
    };
    gate.apply(settings, Some(&brake), 0);
    let handler = Arc::new(Recorder::default());
    let stats = WorkerLoop::new(source.clone(), handler.clone(), gate)
        .run(tokio::time::sleep(Duration::from_secs(3)))
        .await;
    assert_eq!(stats.received, 0, "{stats:?}");
    assert!(handler.seen.lock().unwrap().is_empty());
    assert_eq!(
        counts(&sqs, &url).await,
        (5, 0),
        "the backlog stays in SQS, nothing in flight"
    );

    // nack_after: invisible for the delay, then back with a grown receive count.
    let m = source.poll(1).await.unwrap().pop().unwrap();
    assert_eq!(source.receive_count(&m), Some(1));
    let body = m.body.clone();
    let nacked = Instant::now();
    source.nack_after(m, Duration::from_secs(3)).await.unwrap();
    assert_eq!(counts(&sqs, &url).await, (4, 1));
    let again = loop {
        let got = source.poll(10).await.unwrap();
        let (same, other): (Vec<_>, Vec<_>) = got.into_iter().partition(|m| m.body == body);
        for o in other {
            // Others go back at once (a plain nack).
            source.nack(o).await.unwrap();
        }
        if let Some(m) = same.into_iter().next() {
            break m;
        }
        assert!(
            nacked.elapsed() < Duration::from_secs(15),
            "{body} never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let waited = nacked.elapsed();
    assert!(
        waited >= Duration::from_millis(2900),
        "redelivered after {waited:?}, the delay was 3 s"
    );
    assert_eq!(source.receive_count(&again), Some(2));
    source.ack(again).await.unwrap();
    assert_eq!(counts(&sqs, &url).await, (4, 0));
    let _ = std::fs::remove_dir_all(&d);
}
