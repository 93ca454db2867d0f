//! The producer: adds messages to the queue at the scenario's rate schedule.
//!
//! Two forms:
//!
//! - [`run`], in the lab's own process, writes the schedule straight into the queue (the
//!   scenarios without `producer.pods`).
//! - [`run_pod`], `backpressure-lab producer`: one pod of the producer Deployment (started by
//!   the kubelet stand-in), a real producer process honouring the operator's gate. Its clients'
//!   demand (its share of the schedule) goes into its own list, which nothing bounds; a sender
//!   takes the list in order and, before every write, waits for the worker library's
//!   [`ProducerGate`] (`admit().await`: while the operator keeps the producers `Paused` the
//!   message waits in the list, it is never dropped). A write the broker refuses (Redis at its
//!   `maxmemory`: `OOM`) is kept at the head of the list and written again after
//!   `--broker-retry-after`, the broker's own "retry later", which the producer honours. The
//!   admin endpoint (`PUT /v1/producer`) accepts the operator's pushes only with a token for
//!   this producer workload's audience, checked by a real TokenReview, as the workers do for
//!   theirs. The counters ([`ProducerStats`]: demand, written, refused by the broker, waiting)
//!   go to a JSON file the lab reads; every message produced is written or still waiting.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use backpressure_api::wire::GateState;
use backpressure_worker::config::admin::Admin;
use backpressure_worker::metrics::Metrics;
use backpressure_worker::producer::ProducerGate;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::queue::Queue;
use crate::scenario::Schedule;

/// How many messages are due in a tick: the integral of the rate plus the fraction carried
/// from earlier ticks. Pure; returns (messages, new carry).
pub fn due(rate: f64, dt_secs: f64, carry: f64) -> (u64, f64) {
    let total = carry + (rate.max(0.0) * dt_secs.max(0.0));
    let n = total.floor();
    (n as u64, total - n)
}

/// Produces until `until` (time since `start`), ticking every 50 ms. Returns the number of
/// messages produced. Errors are logged and retried on the next tick (the count stays exact:
/// a failed batch is not counted and its messages are due again).
pub async fn run(queue: Queue, rate: Schedule, start: Instant, until: Duration) -> u64 {
    let tick = Duration::from_millis(50);
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut carry = 0.0;
    let mut last = start;
    let mut produced = 0u64;
    let mut seq = 0u64;
    let mut owed = 0u64;
    loop {
        interval.tick().await;
        let now = Instant::now();
        let t = now.duration_since(start);
        if t >= until {
            break;
        }
        let (n, c) = due(rate.value_at(t), (now - last).as_secs_f64(), carry);
        carry = c;
        last = now;
        owed += n;
        if owed == 0 {
            continue;
        }
        let bodies: Vec<String> = (seq..seq + owed).map(|i| format!("msg-{i}")).collect();
        match queue.produce(&bodies).await {
            Ok(()) => {
                seq += owed;
                produced += owed;
                owed = 0;
            }
            Err(e) => tracing::warn!(error = %e, "producer: batch failed, retrying"),
        }
    }
    produced
}

/// What a producer pod has done so far (the JSON file of `--stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProducerStats {
    /// Messages its clients handed it (its share of the schedule).
    pub demand: u64,
    /// Messages the broker accepted.
    pub written: u64,
    /// Writes the broker refused (`OOM`); each refused message stays at the head of the list
    /// and is written again after the retry delay.
    pub refused_by_broker: u64,
    /// Writes that failed otherwise (connection errors), retried the same way.
    pub write_errors: u64,
    /// Messages in the producer's own list, not yet written: `demand - written`.
    pub waiting: u64,
    /// The gate's state (`Open`, `Throttled`, `Paused`).
    pub gate: String,
    /// True in the last file, written after the producer stopped sending.
    pub stopped: bool,
}

impl ProducerStats {
    /// The sum over pods (the gate of the first pod that is not `Open`, else `Open`).
    pub fn sum<'a>(all: impl IntoIterator<Item = &'a ProducerStats>) -> ProducerStats {
        let mut out = ProducerStats {
            gate: GateState::Open.as_str().to_owned(),
            stopped: true,
            ..ProducerStats::default()
        };
        for s in all {
            out.demand += s.demand;
            out.written += s.written;
            out.refused_by_broker += s.refused_by_broker;
            out.write_errors += s.write_errors;
            out.waiting += s.waiting;
            out.stopped &= s.stopped;
            if s.gate != GateState::Open.as_str() {
                out.gate.clone_from(&s.gate);
            }
        }
        out
    }
}

/// Command-line arguments of `backpressure-lab producer`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProducerArgs {
    /// Address of the admin endpoint (`<pod ip>:9464`).
    #[arg(long)]
    pub listen: SocketAddr,
    /// Redis URL.
    #[arg(long)]
    pub redis: String,
    /// Queue key prefix.
    #[arg(long)]
    pub queue: String,
    /// The pod's name (in the message bodies).
    #[arg(long)]
    pub pod: String,
    /// The producer workload (Deployment) name: pushes must carry a token for audience
    /// `backpressure.dev/<namespace>/<workload>`.
    #[arg(long)]
    pub workload: String,
    /// The pod's namespace.
    #[arg(long)]
    pub namespace: String,
    /// The scenario's rate schedule (JSON, as in the scenario file).
    #[arg(long, value_parser = parse_schedule)]
    pub rate: Schedule,
    /// This pod's share of the rate (1 / replicas).
    #[arg(long)]
    pub share: f64,
    /// The scenario's time zero, in Unix milliseconds: the schedule is followed from there
    /// (the demand since then is produced at once when the pod starts late).
    #[arg(long)]
    pub start_unix_ms: u64,
    /// No new demand after this long since the start.
    #[arg(long, value_parser = parse_dur)]
    pub until: Duration,
    /// Size of each message body.
    #[arg(long)]
    pub message_bytes: usize,
    /// Wait before writing again a message the broker refused.
    #[arg(long, value_parser = parse_dur)]
    pub broker_retry_after: Duration,
    /// Where to write the counters ([`ProducerStats`], JSON).
    #[arg(long)]
    pub stats: PathBuf,
    /// Kubeconfig for the TokenReview that authenticates pushes.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Identity allowed to push the producer state (the operator's ServiceAccount username).
    #[arg(long = "allowed-identity")]
    pub allowed_identities: Vec<String>,
}

fn parse_dur(s: &str) -> Result<Duration, String> {
    backpressure_api::duration::parse_duration(s).map_err(|e| e.to_string())
}

fn parse_schedule(s: &str) -> Result<Schedule, String> {
    serde_json::from_str(s).map_err(|e| e.to_string())
}

/// The body of message `seq` of `pod`, padded to `bytes`.
pub fn body(pod: &str, seq: u64, bytes: usize) -> String {
    let mut b = format!("{pod}-{seq}-");
    if b.len() < bytes {
        b.extend(std::iter::repeat_n('x', bytes - b.len()));
    }
    b
}

#[derive(Default)]
struct Counters {
    demand: AtomicU64,
    written: AtomicU64,
    refused: AtomicU64,
    errors: AtomicU64,
}

impl Counters {
    fn snapshot(&self, gate: &ProducerGate, stopped: bool) -> ProducerStats {
        // Written before demand: a message is counted in demand before it can be written, so
        // reading in this order never finds more written than produced.
        let written = self.written.load(Ordering::SeqCst);
        let demand = self.demand.load(Ordering::SeqCst);
        ProducerStats {
            demand,
            written,
            refused_by_broker: self.refused.load(Ordering::SeqCst),
            write_errors: self.errors.load(Ordering::SeqCst),
            waiting: demand.saturating_sub(written),
            gate: gate.state().as_str().to_owned(),
            stopped,
        }
    }
}

fn write_stats(path: &Path, stats: &ProducerStats) {
    let tmp = path.with_extension("tmp");
    let ok = serde_json::to_vec(stats)
        .map_err(std::io::Error::other)
        .and_then(|bytes| std::fs::write(&tmp, bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = ok {
        tracing::warn!(error = %e, path = %path.display(), "producer: cannot write its counters");
    }
}

/// Runs one producer pod until SIGTERM/SIGINT (see the module docs); the last counters are
/// written after the sender stopped, a write in progress included.
pub async fn run_pod(args: ProducerArgs) -> anyhow::Result<()> {
    let metrics = Metrics::producer(&args.workload);
    let gate = ProducerGate::new(Some(metrics.clone()));
    let admin = crate::worker::authenticated(
        Admin::for_producer(gate.clone(), Some(metrics)),
        args.kubeconfig.as_deref(),
        &args.namespace,
        &args.workload,
        &args.allowed_identities,
    )
    .await?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let admin_task = tokio::spawn(Arc::new(admin).serve(listener, stopped(stop_rx.clone())));
    let queue = Queue::connect(&args.redis, &args.queue, Duration::from_secs(60), 1).await?;

    let counters = Arc::new(Counters::default());
    let (tx, rx) = mpsc::unbounded_channel::<u64>();
    let start = UNIX_EPOCH + Duration::from_millis(args.start_unix_ms);
    let generator = tokio::spawn(generate(
        args.rate.clone(),
        args.share,
        start,
        args.until,
        tx,
        counters.clone(),
        stopped(stop_rx.clone()),
    ));
    let sender = tokio::spawn(send(
        queue,
        gate.clone(),
        rx,
        SendOptions {
            pod: args.pod.clone(),
            bytes: args.message_bytes,
            retry_after: args.broker_retry_after,
        },
        counters.clone(),
        stop_rx.clone(),
    ));
    let reporter = {
        let (counters, gate, path) = (counters.clone(), gate.clone(), args.stats.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                write_stats(&path, &counters.snapshot(&gate, false));
            }
        })
    };

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    let _ = stop_tx.send(true);
    let _ = generator.await;
    let _ = sender.await;
    reporter.abort();
    let last = counters.snapshot(&gate, true);
    write_stats(&args.stats, &last);
    tracing::info!(?last, "producer stopped");
    let _ = admin_task.await;
    Ok(())
}

/// The clients' demand: every 50 ms the messages due since the last tick (the schedule's
/// integral from the scenario's start, so a late start catches up) join the list.
async fn generate(
    rate: Schedule,
    share: f64,
    start: SystemTime,
    until: Duration,
    list: mpsc::UnboundedSender<u64>,
    counters: Arc<Counters>,
    stop: impl std::future::Future<Output = ()>,
) {
    let since_start = || SystemTime::now().duration_since(start).unwrap_or_default();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut carry = 0.0;
    let mut last = Duration::ZERO;
    let mut seq = 0u64;
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut stop => return,
        }
        let now = since_start().min(until);
        if now <= last {
            if now >= until {
                return;
            }
            continue;
        }
        let (n, c) = due(
            rate.value_at(now) * share,
            (now - last).as_secs_f64(),
            carry,
        );
        carry = c;
        last = now;
        for _ in 0..n {
            counters.demand.fetch_add(1, Ordering::SeqCst);
            if list.send(seq).is_err() {
                return;
            }
            seq += 1;
        }
    }
}

struct SendOptions {
    pod: String,
    bytes: usize,
    retry_after: Duration,
}

/// Takes the list in order: the gate, then the write; a refused write is kept and retried
/// after the delay. Stops between writes (never in the middle of one, so that the counters
/// match what the broker holds).
async fn send(
    queue: Queue,
    gate: ProducerGate,
    mut list: mpsc::UnboundedReceiver<u64>,
    opts: SendOptions,
    counters: Arc<Counters>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let seq = tokio::select! {
            next = list.recv() => match next {
                Some(seq) => seq,
                None => return,
            },
            _ = stop.wait_for(|s| *s) => return,
        };
        let body = body(&opts.pod, seq, opts.bytes);
        loop {
            tokio::select! {
                // Cancel-safe: a message not admitted when the pod stops is still waiting.
                _ = gate.admit() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            match queue.produce_one(&body).await {
                Ok(()) => {
                    counters.written.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                Err(e) => {
                    if e.is_oom() {
                        counters.refused.fetch_add(1, Ordering::SeqCst);
                    } else {
                        counters.errors.fetch_add(1, Ordering::SeqCst);
                        tracing::warn!(error = %e, "producer: write failed; retrying");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(opts.retry_after) => {}
                        _ = stop.wait_for(|s| *s) => return,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carries_fractions() {
        let mut carry = 0.0;
        let mut total = 0;
        for _ in 0..200 {
            let (n, c) = due(7.0, 0.05, carry);
            carry = c;
            total += n;
        }
        // 7/s for 10 s.
        assert!((69..=70).contains(&total), "{total}");
        assert_eq!(due(0.0, 1.0, 0.5), (0, 0.5));
        assert_eq!(due(-3.0, 1.0, 0.0).0, 0);
    }

    /// Against a real redis-server with a memory limit: the sender waits at a paused gate
    /// (nothing written, nothing dropped), writes everything once the gate opens, keeps a
    /// message the broker refuses (OOM) and writes it after the retry delay once there is room
    /// again, and stops between writes.
    #[tokio::test]
    async fn real_redis_semantics_producer_honours_the_gate_and_the_broker() {
        use backpressure_worker::config::Origin;
        let dir = std::env::temp_dir().join(format!("bp-lab-producer-{}", std::process::id()));
        let mut server = crate::queue::RedisServer::start(&dir).unwrap();
        let q = Queue::connect(&server.url(), "p", Duration::from_millis(100), 5)
            .await
            .unwrap();
        q.create().await.unwrap();
        let gate = ProducerGate::new(None);
        let doc = |generation: i64, state: GateState| {
            backpressure_api::wire::ProducerConfig {
                generation,
                state,
                ..backpressure_api::wire::ProducerConfig::default()
            }
            .with_hash()
        };
        gate.apply(doc(1, GateState::Paused), Origin::Push).unwrap();
        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = watch::channel(false);
        let sender = tokio::spawn(send(
            q.clone(),
            gate.clone(),
            rx,
            SendOptions {
                pod: "p-0".into(),
                bytes: 8000,
                retry_after: Duration::from_millis(200),
            },
            counters.clone(),
            stop_rx,
        ));
        let demand = |n: u64| {
            for _ in 0..n {
                let seq = counters.demand.fetch_add(1, Ordering::SeqCst);
                tx.send(seq).unwrap();
            }
        };
        let snapshot = || counters.snapshot(&gate, false);
        demand(5);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!((snapshot().written, snapshot().waiting), (0, 5), "paused");
        assert_eq!(q.stats().await.unwrap().produced, 0);
        gate.apply(doc(2, GateState::Open), Origin::Push).unwrap();
        let until = |want: u64| {
            let counters = counters.clone();
            async move {
                for _ in 0..100 {
                    if counters.written.load(Ordering::SeqCst) >= want {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                panic!("never wrote {want}");
            }
        };
        until(5).await;

        // The broker at its limit refuses the next ones; they stay at the producer.
        let used = q.memory().await.unwrap().used;
        q.limit_memory(used + 200_000).await.unwrap();
        let mut filler = 0;
        while q.produce_one(&"f".repeat(8000)).await.is_ok() {
            filler += 1;
        }
        demand(3);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let s = snapshot();
        assert_eq!((s.written, s.waiting), (5, 3), "{s:?}");
        assert!(s.refused_by_broker >= 2, "{s:?}");
        // Room again: the consumers take everything; the refused messages are written.
        for d in q.fetch("c", 1000).await.unwrap() {
            q.ack(&d.id).await.unwrap();
        }
        until(8).await;
        let st = q.stats().await.unwrap();
        assert_eq!(st.produced, 5 + filler + 3);
        assert_eq!(snapshot().waiting, 0);
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), sender)
            .await
            .unwrap()
            .unwrap();
        server.stop();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn bodies_are_unique_and_padded() {
        let a = body("orders-api-1", 7, 64);
        assert_eq!(a.len(), 64);
        assert!(a.starts_with("orders-api-1-7-x"));
        assert_ne!(a, body("orders-api-1", 8, 64));
        assert_eq!(body("p", 12345, 4), "p-12345-");
    }

    #[test]
    fn stats_sum_over_pods() {
        let a = ProducerStats {
            demand: 10,
            written: 7,
            refused_by_broker: 2,
            waiting: 3,
            gate: "Open".into(),
            stopped: true,
            ..ProducerStats::default()
        };
        let b = ProducerStats {
            demand: 5,
            written: 5,
            gate: "Paused".into(),
            ..ProducerStats::default()
        };
        let s = ProducerStats::sum([&a, &b]);
        assert_eq!(
            (s.demand, s.written, s.refused_by_broker, s.waiting),
            (15, 12, 2, 3)
        );
        assert_eq!(s.gate, "Paused");
        assert!(!s.stopped);
        assert_eq!(ProducerStats::sum([]).gate, "Open");
    }
}
