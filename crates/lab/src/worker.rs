//! The lab's worker process: consumes the Redis queue, calls the dependency for every message,
//! and throttles itself with the backpressure controller of `backpressure-worker`. Metrics (the
//! wire contract's names) are served on `<pod ip>:9464/metrics`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backpressure_api::wire::{WorkerConfig, metrics as m};
use backpressure_worker::controller::{self, Controller, Nanos, Outcome};
use tokio::time::Instant;

use crate::queue::{Delivery, Queue};
use crate::serve::{Exposition, response, serve};

/// Command-line arguments of `backpressure-lab worker`.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Address for metrics and admin (`<pod ip>:9464`).
    #[arg(long)]
    pub listen: SocketAddr,
    /// Redis URL.
    #[arg(long)]
    pub redis: String,
    /// Queue key prefix.
    #[arg(long)]
    pub queue: String,
    /// Consumer name (the pod name).
    #[arg(long)]
    pub consumer: String,
    /// Dependency base URL.
    #[arg(long)]
    pub dependency: String,
    /// Workload label.
    #[arg(long)]
    pub workload: String,
    /// Local work per message, e.g. `150ms`.
    #[arg(long, value_parser = parse_dur)]
    pub processing: Duration,
    /// Visibility timeout of the queue.
    #[arg(long, value_parser = parse_dur)]
    pub visibility_timeout: Duration,
    /// Deliveries before dead-lettering.
    #[arg(long)]
    pub max_deliveries: u32,
    /// Initial worker configuration (JSON, the wire contract).
    #[arg(long)]
    pub config: PathBuf,
    /// Seed of the probe jitter.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

fn parse_dur(s: &str) -> Result<Duration, String> {
    backpressure_api::duration::parse_duration(s).map_err(|e| e.to_string())
}

struct Shared {
    controller: Mutex<Box<dyn Controller>>,
    config: Mutex<WorkerConfig>,
    epoch: Instant,
    in_flight: AtomicU32,
    outcomes: [AtomicU64; 3],
    workload: String,
}

impl Shared {
    fn now(&self) -> Nanos {
        Nanos::from_duration(self.epoch.elapsed())
    }

    fn metrics(&self) -> String {
        let now = self.now();
        let (backoff, limit) = match self.controller.lock() {
            Ok(c) => (c.backoff(now), c.limit(now)),
            Err(_) => (1.0, 0),
        };
        let w = self.workload.as_str();
        let mut e = Exposition::default();
        e.sample(
            m::BACKOFF,
            "gauge",
            "Backoff factor in [0,1].",
            &[(m::LABEL_WORKLOAD, w)],
            backoff,
        );
        e.sample(
            m::PERMITS,
            "gauge",
            "Permits now.",
            &[(m::LABEL_WORKLOAD, w)],
            f64::from(limit),
        );
        e.sample(
            m::IN_FLIGHT,
            "gauge",
            "Messages being processed.",
            &[(m::LABEL_WORKLOAD, w)],
            f64::from(self.in_flight.load(Ordering::Relaxed)),
        );
        for o in Outcome::ALL {
            e.sample(
                m::OUTCOMES_TOTAL,
                "counter",
                "Message outcomes by class.",
                &[(m::LABEL_WORKLOAD, w), (m::LABEL_CLASS, o.class())],
                self.outcomes[o.index()].load(Ordering::Relaxed) as f64,
            );
        }
        if let Ok(cfg) = self.config.lock() {
            let algorithm = format!("{:?}", cfg.algorithm);
            e.sample(
                m::CONFIG_INFO,
                "gauge",
                "The running configuration.",
                &[
                    (m::LABEL_WORKLOAD, w),
                    (m::LABEL_HASH, &cfg.hash),
                    (m::LABEL_ALGORITHM, &algorithm),
                ],
                1.0,
            );
        }
        e.finish()
    }
}

/// Classifies a dependency answer.
pub fn classify(status: Option<u16>) -> Outcome {
    match status {
        Some(200..=299) => Outcome::Success,
        Some(429) | Some(500..=599) | None => Outcome::DependencyFailure,
        Some(_) => Outcome::MessageFailure,
    }
}

/// Runs the worker until SIGTERM/SIGINT, then finishes the messages in flight.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let text = std::fs::read(&args.config)?;
    let config = WorkerConfig::parse(&text)?;
    let shared = Arc::new(Shared {
        controller: Mutex::new(controller::from_config(&config, args.seed)),
        config: Mutex::new(config),
        epoch: Instant::now(),
        in_flight: AtomicU32::new(0),
        outcomes: Default::default(),
        workload: args.workload.clone(),
    });
    let s = shared.clone();
    let (_addr, server) = serve(args.listen, move |req| {
        let s = s.clone();
        async move {
            if req.uri().path() == "/metrics" {
                response(200, "text/plain; version=0.0.4", s.metrics())
            } else {
                response(404, "text/plain", "not found")
            }
        }
    })
    .await?;
    let queue = Queue::connect(
        &args.redis,
        &args.queue,
        args.visibility_timeout,
        args.max_deliveries,
    )
    .await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(64)
        .build()?;
    let work_url = format!("{}/work", args.dependency);

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let now = shared.now();
        let in_flight = shared.in_flight.load(Ordering::Relaxed);
        let (permits, next) = match shared.controller.lock() {
            Ok(mut c) => (c.permits(now, in_flight), c.next_change(now)),
            Err(_) => (0, None),
        };
        let wait = if permits == 0 {
            let until = next
                .map(|t| t.saturating_sub(now).as_duration())
                .unwrap_or(Duration::from_millis(50));
            Some(until.clamp(Duration::from_millis(5), Duration::from_millis(50)))
        } else {
            match queue.fetch(&args.consumer, permits as usize).await {
                Ok(batch) => {
                    let unused = permits.saturating_sub(batch.len() as u32);
                    if unused > 0
                        && let Ok(mut c) = shared.controller.lock()
                    {
                        c.release_unused(shared.now(), unused);
                    }
                    let empty = batch.is_empty();
                    for d in batch {
                        shared.in_flight.fetch_add(1, Ordering::Relaxed);
                        tokio::spawn(process(
                            shared.clone(),
                            queue.clone(),
                            http.clone(),
                            work_url.clone(),
                            args.processing,
                            d,
                        ));
                    }
                    empty.then_some(Duration::from_millis(100))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "fetch failed");
                    if let Ok(mut c) = shared.controller.lock() {
                        c.release_unused(shared.now(), permits);
                    }
                    Some(Duration::from_millis(200))
                }
            }
        };
        let pause = wait.unwrap_or(Duration::from_millis(1));
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    // Graceful stop: let the messages in flight finish (bounded).
    let deadline = Instant::now() + Duration::from_secs(5);
    while shared.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.abort();
    Ok(())
}

async fn process(
    shared: Arc<Shared>,
    queue: Queue,
    http: reqwest::Client,
    url: String,
    processing: Duration,
    d: Delivery,
) {
    tokio::time::sleep(processing).await;
    let status = http
        .post(&url)
        .body(d.body.clone())
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16());
    let outcome = classify(status);
    shared.outcomes[outcome.index()].fetch_add(1, Ordering::Relaxed);
    if let Ok(mut c) = shared.controller.lock() {
        c.record(shared.now(), outcome);
    }
    let r = match outcome {
        Outcome::Success => queue.ack(&d.id).await.map(|_| ()),
        _ => queue.nack(&d.id).await,
    };
    if let Err(e) = r {
        tracing::warn!(error = %e, id = %d.id, "ack/nack failed; the message will be redelivered");
    }
    shared.in_flight.fetch_sub(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert_eq!(classify(Some(200)), Outcome::Success);
        assert_eq!(classify(Some(429)), Outcome::DependencyFailure);
        assert_eq!(classify(Some(503)), Outcome::DependencyFailure);
        assert_eq!(classify(None), Outcome::DependencyFailure);
        assert_eq!(classify(Some(400)), Outcome::MessageFailure);
    }
}
