//! `sources::redis_streams` against a real `redis-server` (Debian package `redis-server`,
//! installed by `make deps`; started by `backpressure_envtest::RedisServer`), driven by the real
//! `WorkerLoop`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backpressure_api::wire::BrakeConfig;
use backpressure_envtest::RedisServer;
use backpressure_worker::controller::{self, Algorithm, Outcome, Settings};
use backpressure_worker::permits::Gate;
use backpressure_worker::sources::redis_streams::{
    Nacked, RETRY_CONSUMER, RedisStreamsConfig, RedisStreamsSource, StreamMessage,
};
use backpressure_worker::worker_loop::{Handler, RedeliveryBackoff, WorkerLoop};
use redis::Value;

struct Redis {
    server: RedisServer,
    dir: std::path::PathBuf,
}

impl Redis {
    fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("bp-worker-{name}-{}", std::process::id()));
        let server = RedisServer::start(&dir).unwrap();
        Redis { server, dir }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.server.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config(consumer: &str) -> RedisStreamsConfig {
    RedisStreamsConfig::new("orders", "workers", consumer)
        .visibility_timeout(Duration::from_millis(300))
        .block(Duration::from_millis(50))
}

async fn source(redis: &Redis, config: RedisStreamsConfig) -> Arc<RedisStreamsSource> {
    let s = RedisStreamsSource::connect(&redis.server.url(), config)
        .await
        .unwrap();
    s.ensure_group("0").await.unwrap();
    s.ensure_group("0").await.unwrap();
    Arc::new(s)
}

async fn produce(s: &RedisStreamsSource, n: usize) {
    for i in 0..n {
        s.add(&[("body", format!("m{i}"))]).await.unwrap();
    }
}

fn gate(permits: u32) -> Gate {
    Gate::new(controller::build(fixed(permits), 1))
}

fn fixed(permits: u32) -> Settings {
    Settings {
        algorithm: Algorithm::Fixed,
        max_permits: permits,
        initial_permits: 0,
        ..Settings::default()
    }
}

async fn raw(redis: &Redis) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Pending entries of `consumer` (or of the whole group).
async fn pending(redis: &Redis, consumer: Option<&str>) -> usize {
    let mut c = raw(redis).await;
    let mut cmd = redis::cmd("XPENDING");
    cmd.arg("orders")
        .arg("workers")
        .arg("-")
        .arg("+")
        .arg(10_000);
    if let Some(consumer) = consumer {
        cmd.arg(consumer);
    }
    let v: Vec<Value> = cmd.query_async(&mut c).await.unwrap();
    v.len()
}

async fn wait_until<F: AsyncFn() -> bool>(what: &str, timeout: Duration, f: F) {
    let deadline = Instant::now() + timeout;
    while !f().await {
        assert!(Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Records every delivery; fails the first delivery of every 10th message, and is slower than
/// the visibility timeout on the first delivery of every 25th (so another consumer reclaims it
/// and both process it).
#[derive(Default)]
struct Recorder {
    seen: Mutex<BTreeMap<String, Vec<u32>>>,
}

impl Handler<StreamMessage> for Recorder {
    async fn handle(&self, message: &StreamMessage) -> Outcome {
        let body = message.field_str("body").unwrap_or_default().to_owned();
        let n: usize = body.trim_start_matches('m').parse().unwrap_or(0);
        let first = {
            let mut seen = self.seen.lock().unwrap();
            let deliveries = seen.entry(body).or_default();
            deliveries.push(message.deliveries);
            deliveries.len() == 1
        };
        if first && n % 25 == 3 {
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        if first && n % 10 == 7 {
            Outcome::MessageFailure
        } else {
            Outcome::Success
        }
    }
}

/// At-least-once with exactly-once completion accounting: two consumers, failures nacked and
/// redelivered, slow messages reclaimed by the other consumer and processed twice; every
/// message is processed, each is counted completed once, nothing is left pending.
#[tokio::test]
async fn at_least_once_with_each_completion_counted_once() {
    let redis = Redis::start("alo");
    let a = source(&redis, config("a")).await;
    let b = source(&redis, config("b")).await;
    let total = 200;
    produce(&a, total).await;
    let handler = Arc::new(Recorder::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut runs = Vec::new();
    for s in [a.clone(), b.clone()] {
        let worker = WorkerLoop::new(s, handler.clone(), gate(8)).no_redelivery_backoff();
        let mut stop = stop_rx.clone();
        runs.push(tokio::spawn(worker.run(async move {
            let _ = stop.wait_for(|s| *s).await;
        })));
    }
    wait_until(
        "every message completed",
        Duration::from_secs(30),
        async || a.stats().await.unwrap().completions == total as u64,
    )
    .await;
    // Reclaimed duplicates still being processed finish and are acked too (counted nothing).
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop_tx.send(true).unwrap();
    let mut received = 0;
    for r in runs {
        let stats = r.await.unwrap();
        assert_eq!(stats.settle_errors, 0, "{stats:?}");
        received += stats.received;
    }
    let seen = handler.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), total, "every message processed");
    let s = a.stats().await.unwrap();
    assert_eq!(s.completions, total as u64, "each completion counted once");
    assert_eq!((s.pending, s.depth(), s.dead_letters), (0, 0, 0), "{s:?}");
    assert_eq!(s.arrivals, total as u64);
    let twice: Vec<_> = seen.iter().filter(|(_, d)| d.len() > 1).collect();
    // Failed (every 10th) and slow (every 25th) messages are delivered more than once...
    assert!(twice.len() >= total / 10 + total / 25 - 1, "{twice:?}");
    assert_eq!(
        received as usize,
        seen.values().map(Vec::len).sum::<usize>()
    );
    // ... with a growing delivery count.
    for (body, deliveries) in &twice {
        let mut sorted = (*deliveries).clone();
        sorted.sort_unstable();
        assert_eq!(sorted[0], 1, "{body}: {deliveries:?}");
        assert!(sorted[1] >= 2, "{body}: {deliveries:?}");
    }
    assert_eq!(pending(&redis, None).await, 0);
}

/// A held worker (brake at full backoff: no permits) fetches nothing: the backlog stays in the
/// stream, undelivered; the polls of a worker with permits never exceed them.
#[tokio::test]
async fn a_held_gate_fetches_nothing_and_a_poll_never_exceeds_its_permits() {
    let redis = Redis::start("held");
    let s = source(&redis, config("held")).await;
    produce(&s, 50).await;
    let g = gate(4);
    let brake = BrakeConfig {
        min_backoff: 1.0,
        expires_at_unix: None,
    };
    g.apply(fixed(4), Some(&brake), 0);
    let handler = Arc::new(Recorder::default());
    let stats = WorkerLoop::new(s.clone(), handler.clone(), g)
        .run(tokio::time::sleep(Duration::from_millis(700)))
        .await;
    assert_eq!(stats.received, 0, "{stats:?}");
    assert_eq!(pending(&redis, None).await, 0);
    let st = s.stats().await.unwrap();
    assert_eq!((st.undelivered, st.depth(), st.completions), (50, 50, 0));

    // Fetching directly: never more than asked, reclaimed and new together.
    assert!(s.fetch(0).await.unwrap().is_empty());
    let three = s.fetch(3).await.unwrap();
    assert_eq!(three.len(), 3);
    assert_eq!(pending(&redis, Some("held")).await, 3);
    for m in &three {
        assert_eq!(
            s.nack_id(&m.id, Duration::ZERO).await.unwrap(),
            Nacked::Retry
        );
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let two = s.fetch(2).await.unwrap();
    assert_eq!(two.len(), 2, "{two:?}");
    assert!(two.iter().all(|m| m.deliveries == 2), "{two:?}");
    let five = s.fetch(5).await.unwrap();
    assert_eq!(five.len(), 5, "{five:?}");
    assert_eq!(five.iter().filter(|m| m.deliveries == 2).count(), 1);
    assert_eq!(pending(&redis, Some("held")).await, 7);
    assert_eq!(s.stats().await.unwrap().undelivered, 43);
}

/// Always fails.
#[derive(Default)]
struct AlwaysFails {
    seen: Mutex<Vec<(u32, Instant)>>,
}

impl Handler<StreamMessage> for AlwaysFails {
    async fn handle(&self, message: &StreamMessage) -> Outcome {
        self.seen
            .lock()
            .unwrap()
            .push((message.deliveries, Instant::now()));
        Outcome::DependencyFailure
    }
}

/// A message failing every delivery is delivered `max_deliveries` times with a growing
/// receive count, then moved to the dead-letter stream with its fields.
#[tokio::test]
async fn a_message_is_dead_lettered_after_max_deliveries() {
    let redis = Redis::start("dlq");
    let s = source(
        &redis,
        config("d")
            .visibility_timeout(Duration::from_millis(100))
            .max_deliveries(3),
    )
    .await;
    let id = s
        .add(&[("body", "poison"), ("tenant", "t1")])
        .await
        .unwrap();
    let handler = Arc::new(AlwaysFails::default());
    let worker = WorkerLoop::new(s.clone(), handler.clone(), gate(2)).no_redelivery_backoff();
    let run = tokio::spawn(worker.run(tokio::time::sleep(Duration::from_secs(3))));
    wait_until("dead-lettered", Duration::from_secs(10), async || {
        s.stats().await.unwrap().dead_letters == 1
    })
    .await;
    run.await.unwrap();
    let counts: Vec<u32> = handler
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(counts, [1, 2, 3]);
    let st = s.stats().await.unwrap();
    assert_eq!(
        (st.pending, st.completions, st.depth()),
        (0, 0, 0),
        "{st:?}"
    );
    let mut c = raw(&redis).await;
    let dlq: Vec<(String, Vec<(String, String)>)> = {
        let v: Vec<Value> = redis::cmd("XRANGE")
            .arg("orders:dlq")
            .arg("-")
            .arg("+")
            .query_async(&mut c)
            .await
            .unwrap();
        v.into_iter()
            .map(|e| redis::from_redis_value(e).unwrap())
            .collect()
    };
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    let fields: BTreeMap<_, _> = dlq[0].1.iter().cloned().collect();
    assert_eq!(fields.get("source_id"), Some(&id));
    assert_eq!(fields.get("deliveries").map(String::as_str), Some("3"));
    assert_eq!(fields.get("body").map(String::as_str), Some("poison"));
    assert_eq!(fields.get("tenant").map(String::as_str), Some("t1"));
}

/// Messages in flight at a consumer that dies are reclaimed by another after the visibility
/// timeout (not before), with their receive count grown; the dead consumer's late ack counts
/// nothing twice.
#[tokio::test]
async fn messages_of_a_dead_consumer_are_reclaimed_after_the_visibility_timeout() {
    let redis = Redis::start("reclaim");
    let a = source(&redis, config("a")).await;
    let b = source(&redis, config("b").block(Duration::ZERO)).await;
    produce(&a, 8).await;
    let held = a.fetch(5).await.unwrap();
    assert_eq!(held.len(), 5);
    let late_id = held[0].id.clone();
    drop(a);
    // Before the timeout: b gets the three new ones only.
    let early = b.fetch(10).await.unwrap();
    assert_eq!(early.len(), 3, "{early:?}");
    assert!(early.iter().all(|m| m.deliveries == 1));
    for m in &early {
        assert!(b.ack_id(&m.id).await.unwrap());
    }
    assert!(b.fetch(10).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(350)).await;
    let reclaimed = b.fetch(10).await.unwrap();
    let ids = |v: &[StreamMessage]| v.iter().map(|m| m.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&reclaimed), ids(&held));
    assert!(reclaimed.iter().all(|m| m.deliveries == 2), "{reclaimed:?}");
    assert_eq!(
        reclaimed[0].field_str("body"),
        held[0].field_str("body"),
        "the fields come with a reclaimed entry"
    );
    assert_eq!(pending(&redis, Some("a")).await, 0);
    assert_eq!(pending(&redis, Some("b")).await, 5);
    // The dead consumer was only paused: its late nack leaves the message to b...
    let a_again = source(&redis, config("a")).await;
    assert_eq!(
        a_again.nack_id(&held[1].id, Duration::ZERO).await.unwrap(),
        Nacked::NotHeld
    );
    assert_eq!(pending(&redis, Some("b")).await, 5);
    for m in &reclaimed {
        assert!(b.ack_id(&m.id).await.unwrap());
    }
    // ... and its late ack of what b completed is not counted again.
    assert!(!a_again.ack_id(&late_id).await.unwrap());
    let st = b.stats().await.unwrap();
    assert_eq!(
        (st.completions, st.pending, st.depth()),
        (8, 0, 0),
        "{st:?}"
    );
}

/// The loop's redelivery backoff applies: the receive count comes from the pending entry and
/// each failed delivery comes back after `base · 2^(k-1)`, also for delays longer than the
/// visibility timeout (restored by the retry-due set), and not much later.
#[tokio::test]
async fn the_redelivery_backoff_delays_each_retry() {
    let redis = Redis::start("backoff");
    let s = source(
        &redis,
        config("r")
            .visibility_timeout(Duration::from_millis(300))
            .max_deliveries(4)
            .block(Duration::from_millis(20)),
    )
    .await;
    s.add(&[("body", "flaky")]).await.unwrap();
    let handler = Arc::new(AlwaysFails::default());
    let backoff = RedeliveryBackoff {
        base: Duration::from_millis(200),
        max: Duration::from_millis(1000),
    };
    let worker = WorkerLoop::new(s.clone(), handler.clone(), gate(2)).redelivery_backoff(backoff);
    let run = tokio::spawn(worker.run(tokio::time::sleep(Duration::from_secs(4))));
    wait_until("dead-lettered", Duration::from_secs(10), async || {
        s.stats().await.unwrap().dead_letters == 1
    })
    .await;
    let dead_at = Instant::now();
    run.await.unwrap();
    let seen = handler.seen.lock().unwrap().clone();
    assert_eq!(
        seen.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    // The last failure dead-letters at once, not after another (1 s) delay.
    assert!(
        dead_at - seen[3].1 < Duration::from_millis(500),
        "{:?}",
        dead_at - seen[3].1
    );
    // 200 ms (within the 300 ms timeout), then 400 and 800 ms (beyond it). Redis keeps the
    // delay in whole milliseconds of its own clock: a gap up to 5 ms short is that rounding.
    for (i, want) in [200u64, 400, 800].into_iter().enumerate() {
        let gap = seen[i + 1].1 - seen[i].1;
        assert!(
            gap + Duration::from_millis(5) >= Duration::from_millis(want)
                && gap < Duration::from_millis(want + 250),
            "gap {i}: {gap:?}, want {want} ms"
        );
    }
    let st = s.stats().await.unwrap();
    assert_eq!((st.pending, st.awaiting_retry), (0, 0), "{st:?}");
    let mut c = raw(&redis).await;
    let due: u64 = redis::cmd("ZCARD")
        .arg("orders:workers:retry-due")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(due, 0, "the retry-due set is cleaned up");
}

/// A failed message waits under the retry consumer (not in flight, counted in the depth) and
/// the queue series are exported with the wire contract's names.
#[tokio::test]
async fn nacked_messages_wait_under_the_retry_consumer_and_the_stats_export() {
    let redis = Redis::start("stats");
    let s = source(&redis, config("s").delete_on_ack(true)).await;
    produce(&s, 4).await;
    let got = s.fetch(2).await.unwrap();
    assert!(s.ack_id(&got[0].id).await.unwrap());
    assert_eq!(
        s.nack_id(&got[1].id, Duration::from_secs(5)).await.unwrap(),
        Nacked::Retry
    );
    assert_eq!(pending(&redis, Some(RETRY_CONSUMER)).await, 1);
    let st = s.stats().await.unwrap();
    assert_eq!(
        (
            st.arrivals,
            st.completions,
            st.in_stream,
            st.pending,
            st.awaiting_retry,
            st.undelivered,
            st.depth()
        ),
        (4, 1, 3, 1, 1, 2, 3),
        "acked entries deleted: {st:?}"
    );
    // Not due for 5 s: a poll after the visibility timeout does not deliver it.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let next = s.fetch(10).await.unwrap();
    assert_eq!(next.len(), 2, "{next:?}");
    assert!(next.iter().all(|m| m.id != got[1].id));
    assert_eq!(pending(&redis, Some(RETRY_CONSUMER)).await, 1);
    let text = st.exposition("shop", "export");
    assert!(
        text.contains("backpressure_queue_depth{namespace=\"shop\",workload=\"export\"} 3\n"),
        "{text}"
    );
}

/// The source's connections are made again after Redis dropped them (a failover, a restart
/// behind the same address, `CLIENT KILL`): at most the first call after fails.
#[tokio::test]
async fn the_source_reconnects_after_its_connections_are_dropped() {
    let redis = Redis::start("reconnect");
    let s = source(&redis, config("c")).await;
    produce(&s, 2).await;
    let first = s.fetch(1).await.unwrap();
    assert_eq!(first.len(), 1);
    let mut c = raw(&redis).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(killed >= 1, "{killed}");
    let mut failures = 0;
    let second = loop {
        match s.fetch(1).await {
            Ok(m) => break m,
            Err(e) => {
                failures += 1;
                assert!(failures < 2, "not reconnected: {e}");
            }
        }
    };
    assert_eq!(second.len(), 1);
    assert!(s.ack_id(&first[0].id).await.unwrap());
    assert!(s.ack_id(&second[0].id).await.unwrap());
    assert_eq!(s.stats().await.unwrap().completions, 2);
}
