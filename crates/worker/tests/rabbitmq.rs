//! `sources::rabbitmq` against a real RabbitMQ (the Debian `rabbitmq-server`, started by
//! `backpressure_envtest::RabbitMq`): a `WorkerLoop` over the source acks every message once or
//! dead-letters it, a held gate takes nothing, failed messages come back, and a connection cut by
//! the broker loses nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use backpressure_api::wire::BrakeConfig;
use backpressure_envtest::RabbitMq;
use backpressure_worker::controller::{self, Algorithm, Nanos, Outcome, Settings};
use backpressure_worker::permits::Gate;
use backpressure_worker::sources::rabbitmq::lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use backpressure_worker::sources::rabbitmq::lapin::types::{AMQPValue, FieldTable};
use backpressure_worker::sources::rabbitmq::lapin::{
    BasicProperties, Channel, Connection, ConnectionProperties,
};
use backpressure_worker::sources::rabbitmq::{RabbitMqMessage, RabbitMqSource};
use backpressure_worker::worker_loop::{Handler, LoopStats, WorkerLoop};

/// One broker for the test binary (it takes 10-20 s to start).
fn broker() -> &'static RabbitMq {
    static BROKER: OnceLock<RabbitMq> = OnceLock::new();
    BROKER.get_or_init(|| {
        let b = RabbitMq::start().expect("start rabbitmq-server");
        eprintln!("rabbitmq-server started in {:?}", b.start_time());
        b
    })
}

async fn channel(uri: &str) -> (Connection, Channel) {
    let conn = Connection::connect(uri, ConnectionProperties::default())
        .await
        .expect("connect");
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirm.select");
    (conn, ch)
}

/// Declares a durable queue (`args` as given) and returns its ready count.
async fn declare(ch: &Channel, name: &str, args: FieldTable) -> u32 {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        args,
    )
    .await
    .expect("queue.declare")
    .message_count()
}

async fn ready(ch: &Channel, name: &str) -> u32 {
    ch.queue_declare(
        name.into(),
        QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await
    .expect("passive queue.declare")
    .message_count()
}

/// A quorum queue dead-lettering to `<name>.dlq` after `limit` redeliveries.
async fn quorum_with_dlq(ch: &Channel, name: &str, limit: i64) {
    let dlq = format!("{name}.dlq");
    declare(ch, &dlq, FieldTable::default()).await;
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(limit));
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dlq.as_str().into()),
    );
    declare(ch, name, args).await;
}

/// Publishes `ids` as persistent messages and waits for the broker's confirms.
async fn publish(ch: &Channel, queue: &str, ids: impl IntoIterator<Item = u32>) {
    for id in ids {
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                id.to_string().as_bytes(),
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .expect("publish");
        assert!(confirm.await.expect("confirm").is_ack());
    }
}

/// Takes every message left in `queue` (acking it) and returns their IDs.
async fn drain(ch: &Channel, queue: &str) -> Vec<u32> {
    let mut ids = Vec::new();
    while let Some(m) = ch
        .basic_get(queue.into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
    {
        ids.push(id_of(&m.delivery.data));
    }
    ids
}

fn id_of(data: &[u8]) -> u32 {
    std::str::from_utf8(data)
        .expect("utf-8 body")
        .parse()
        .expect("numeric body")
}

fn gate(max_permits: u32) -> Gate {
    Gate::new(controller::build(
        Settings {
            algorithm: Algorithm::Fixed,
            max_permits,
            initial_permits: 0,
            brake_release: Nanos(0),
            ..Settings::default()
        },
        7,
    ))
}

/// What the handler saw.
#[derive(Default)]
struct Seen {
    /// Successful handlings by ID.
    succeeded: BTreeMap<u32, u32>,
    /// Receive counts the source reported, by ID, in order.
    receives: BTreeMap<u32, Vec<Option<u32>>>,
    in_flight: u32,
    peak: u32,
}

/// IDs divisible by 10 always fail (poison), by 7 fail on their first delivery only; the rest
/// succeed. Each handling takes `work`.
struct Work {
    seen: Mutex<Seen>,
    work: Duration,
    /// Once 20 messages succeeded, hold every message in flight until this turns true.
    hold: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Work {
    fn new(work: Duration) -> Self {
        Work {
            seen: Mutex::new(Seen::default()),
            work,
            hold: None,
        }
    }
}

impl Handler<RabbitMqMessage> for Work {
    async fn handle(&self, m: &RabbitMqMessage) -> Outcome {
        let id = id_of(&m.data);
        let first = {
            let mut s = self.seen.lock().unwrap();
            s.in_flight += 1;
            s.peak = s.peak.max(s.in_flight);
            let r = s.receives.entry(id).or_default();
            r.push(m.receive_count());
            r.len() == 1
        };
        tokio::time::sleep(self.work).await;
        if let Some(hold) = &self.hold
            && self.seen.lock().unwrap().succeeded.len() >= 20
        {
            let _ = hold.clone().wait_for(|released| *released).await;
        }
        let outcome = if id.is_multiple_of(10) || (id.is_multiple_of(7) && first) {
            Outcome::MessageFailure
        } else {
            Outcome::Success
        };
        let mut s = self.seen.lock().unwrap();
        s.in_flight -= 1;
        if outcome == Outcome::Success {
            *s.succeeded.entry(id).or_default() += 1;
        }
        outcome
    }
}

/// Runs `worker` until `done` says so (checked every 100 ms) or `timeout`, then stops it.
async fn run_until<F>(
    worker: WorkerLoop<RabbitMqSource, Work>,
    timeout: Duration,
    mut done: impl FnMut() -> F,
) -> LoopStats
where
    F: std::future::Future<Output = bool>,
{
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(worker.run(async move {
        let _ = stop_rx.await;
    }));
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline && !done().await {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(());
    run.await.expect("worker loop")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_is_acked_once_or_dead_lettered_and_failures_come_back() {
    let b = broker();
    let (_conn, ch) = channel(&b.amqp_uri()).await;
    let q = "exactly-once";
    quorum_with_dlq(&ch, q, 2).await;
    let n = 200u32;
    publish(&ch, q, 0..n).await;
    assert_eq!(ready(&ch, q).await, n);

    let source =
        Arc::new(RabbitMqSource::new(b.amqp_uri(), q).poll_wait(Duration::from_millis(200)));
    let work = Arc::new(Work::new(Duration::from_millis(5)));
    let permits = 6;
    let worker = WorkerLoop::new(source, work.clone(), gate(permits)).no_redelivery_backoff();
    let dlq = format!("{q}.dlq");
    let poison = (0..n).filter(|i| i.is_multiple_of(10)).count() as u32;
    let w = work.clone();
    let stats = run_until(worker, Duration::from_secs(60), || {
        let (ch, dlq, w) = (&ch, &dlq, &w);
        async move {
            let ok = w.seen.lock().unwrap().succeeded.len() as u32;
            ok == n - poison && ready(ch, dlq).await == poison
        }
    })
    .await;

    let seen = std::mem::take(&mut *work.seen.lock().unwrap());
    assert_eq!(stats.settle_errors, 0, "{stats:?}");
    assert!(seen.peak <= permits, "{} messages in flight", seen.peak);
    // Every good message was acked exactly once, every poison one dead-lettered, none both.
    let dead: BTreeSet<u32> = drain(&ch, &dlq).await.into_iter().collect();
    assert_eq!(
        dead,
        (0..n)
            .filter(|i| i.is_multiple_of(10))
            .collect::<BTreeSet<_>>()
    );
    for id in 0..n {
        let times = seen.succeeded.get(&id).copied().unwrap_or(0);
        let expected = u32::from(!id.is_multiple_of(10));
        assert_eq!(times, expected, "message {id} succeeded {times} times");
    }
    assert_eq!(ready(&ch, q).await, 0);
    // Failed messages came back, counted by the broker (x-delivery-count): the first-time
    // failures once more, the poison ones until the delivery limit (2 redeliveries) sent them to
    // the dead-letter queue.
    for id in (0..n).filter(|i| i.is_multiple_of(7) && !i.is_multiple_of(10)) {
        assert_eq!(seen.receives[&id], [Some(1), Some(2)], "message {id}");
    }
    for id in (0..n).filter(|i| i.is_multiple_of(10)) {
        assert_eq!(
            seen.receives[&id],
            [Some(1), Some(2), Some(3)],
            "message {id}"
        );
    }
    let first_only = (0..n).filter(|i| !i.is_multiple_of(7) && !i.is_multiple_of(10));
    for id in first_only {
        assert_eq!(seen.receives[&id], [Some(1)], "message {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_gate_takes_nothing_and_the_permits_bound_the_unacked_messages() {
    let b = broker();
    let (_conn, ch) = channel(&b.amqp_uri()).await;
    let q = "held";
    declare(&ch, q, FieldTable::default()).await;
    // IDs the handler never fails.
    let ids: Vec<u32> = (1u32..)
        .filter(|i| !i.is_multiple_of(7) && !i.is_multiple_of(10))
        .take(60)
        .collect();
    publish(&ch, q, ids).await;

    let settings = Settings {
        algorithm: Algorithm::Fixed,
        max_permits: 3,
        initial_permits: 0,
        brake_release: Nanos(0),
        ..Settings::default()
    };
    let g = Gate::new(controller::build(settings.clone(), 7));
    let brake = BrakeConfig {
        min_backoff: 1.0,
        expires_at_unix: None,
    };
    g.apply(settings.clone(), Some(&brake), 0);
    let source =
        Arc::new(RabbitMqSource::new(b.amqp_uri(), q).poll_wait(Duration::from_millis(200)));
    let work = Arc::new(Work::new(Duration::from_millis(20)));
    let held = WorkerLoop::new(source.clone(), work.clone(), g.clone());
    let stats = run_until(held, Duration::from_secs(3), || async { false }).await;
    assert_eq!(stats.received, 0, "{stats:?}");
    assert_eq!(stats.polls, 0, "a held worker polled: {stats:?}");
    assert_eq!(ready(&ch, q).await, 60, "the backlog stays in the broker");

    // Released: it works through the queue, never more than its 3 permits unacked.
    g.apply(settings, None, 0);
    let released = WorkerLoop::new(source, work.clone(), g).no_redelivery_backoff();
    let w = work.clone();
    let stats = run_until(released, Duration::from_secs(60), || {
        let w = w.clone();
        async move { w.seen.lock().unwrap().succeeded.len() == 60 }
    })
    .await;
    assert!(stats.received >= 60, "{stats:?}");
    let seen = std::mem::take(&mut *work.seen.lock().unwrap());
    assert!(seen.peak <= 3, "{} messages in flight", seen.peak);
    assert!(seen.succeeded.values().all(|&k| k == 1));
    assert_eq!(ready(&ch, q).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_by_the_broker_loses_no_message() {
    let b = broker();
    // A vhost of its own: the cut closes its connections only, not the other tests'.
    tokio::task::spawn_blocking(|| {
        let b = broker();
        b.rabbitmqctl(&["add_vhost", "cut"])?;
        b.rabbitmqctl(&["set_permissions", "-p", "cut", "guest", ".*", ".*", ".*"])
    })
    .await
    .expect("join")
    .expect("add vhost cut");
    let uri = b.amqp_uri().replace("/%2f", "/cut");
    let (_conn, ch) = channel(&uri).await;
    let q = "cut";
    declare(&ch, q, FieldTable::default()).await;
    let ids = (1u32..=300).filter(|i| !i.is_multiple_of(7) && !i.is_multiple_of(10));
    let expected: BTreeSet<u32> = ids.clone().collect();
    publish(&ch, q, ids).await;

    let source = Arc::new(
        RabbitMqSource::new(uri.clone(), q)
            .poll_wait(Duration::from_millis(200))
            .poll_interval(Duration::from_millis(20)),
    );
    // After 20 messages the worker holds the ones in flight (its 4 permits' worth) until the
    // connection is cut.
    let (release, hold) = tokio::sync::watch::channel(false);
    let work = Arc::new(Work {
        hold: Some(hold),
        ..Work::new(Duration::from_millis(20))
    });
    let worker = WorkerLoop::new(source, work.clone(), gate(4))
        .no_redelivery_backoff()
        .poll_error_pause(Duration::from_millis(200));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(worker.run(async move {
        let _ = stop_rx.await;
    }));
    // Cut every client connection of the vhost (the test's own included) while messages are
    // in flight.
    let deadline = Instant::now() + Duration::from_secs(30);
    while work.seen.lock().unwrap().in_flight < 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ctl = tokio::task::spawn_blocking(|| {
        broker().rabbitmqctl(&["close_all_connections", "--vhost", "cut", "test cut"])
    })
    .await
    .expect("join");
    ctl.expect("rabbitmqctl close_all_connections");
    let cut_at = work.seen.lock().unwrap().succeeded.len();
    // Let the lost channel's close reach the client before the held messages are acked.
    tokio::time::sleep(Duration::from_millis(500)).await;
    release.send(true).expect("release");
    let deadline = Instant::now() + Duration::from_secs(60);
    while work.seen.lock().unwrap().succeeded.len() < expected.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(());
    let stats = run.await.expect("worker loop");

    let seen = std::mem::take(&mut *work.seen.lock().unwrap());
    assert!(
        cut_at < expected.len(),
        "the cut came after the work ({cut_at})"
    );
    // Reconnected: everything was processed; the messages held on the cut channel came back
    // (their acks failed) and were processed again: at least once, never lost.
    let done: BTreeSet<u32> = seen.succeeded.keys().copied().collect();
    assert_eq!(done, expected, "{stats:?}");
    // The 4 messages held at the cut could not be acked on the closed channel.
    assert_eq!(stats.settle_errors, 4, "{stats:?}");
    let (_conn, ch) = channel(&uri).await;
    assert_eq!(ready(&ch, q).await, 0);
    // Exactly those were processed twice (redelivered by the broker), no other.
    let twice = seen.succeeded.values().filter(|&&k| k > 1).count();
    assert_eq!(twice, 4, "{stats:?}");
}
