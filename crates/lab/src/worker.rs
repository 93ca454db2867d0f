//! The lab's worker process, built on `backpressure-worker`: the worker loop polls the Redis
//! queue ([`RedisSource`]) with the permits the backpressure [`Gate`] allows, calls the
//! dependency for every message ([`DependencyHandler`]), acks or nacks; the admin server serves
//! `/metrics` (the wire contract's names), `/healthz` and `PUT /v1/config`, authenticated with a
//! TokenReview against the lab's API server so that only the operator can push configuration,
//! and only with a token minted for this workload (`--namespace`, `--workload`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use backpressure_api::wire::WorkerConfig;
use backpressure_worker::config::ConfigState;
use backpressure_worker::config::admin::Admin;
use backpressure_worker::controller::{self, Outcome};
use backpressure_worker::metrics::Metrics;
use backpressure_worker::permits::Gate;
use backpressure_worker::worker_loop::{Handler, Source, WorkerLoop};

use crate::queue::{Delivery, Queue, QueueError};

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
    /// The pod's namespace (what the downward API's `metadata.namespace` gives a real pod).
    /// Pushes must carry a token for audience `backpressure.dev/<namespace>/<workload>`.
    #[arg(long)]
    pub namespace: String,
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
    /// Seed of the run; the probe jitter's seed is this mixed with the consumer name
    /// ([`pod_seed`]), so the pods of one Deployment, which share their arguments, differ.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Kubeconfig for the TokenReview that authenticates config pushes (default: in a pod, the
    /// pod's in-cluster configuration).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Identity allowed to push configuration (the operator's ServiceAccount username).
    #[arg(long = "allowed-identity")]
    pub allowed_identities: Vec<String>,
}

fn parse_dur(s: &str) -> Result<Duration, String> {
    backpressure_api::duration::parse_duration(s).map_err(|e| e.to_string())
}

/// The Redis queue as a [`Source`] for one consumer (the pod).
#[derive(Debug)]
pub struct RedisSource {
    queue: Queue,
    consumer: String,
    empty_wait: Duration,
}

impl RedisSource {
    /// A source reading `queue` as `consumer`; an empty poll waits `empty_wait` before
    /// returning (a bounded wait, like a long poll).
    pub fn new(queue: Queue, consumer: &str, empty_wait: Duration) -> Self {
        Self {
            queue,
            consumer: consumer.to_owned(),
            empty_wait,
        }
    }
}

impl Source for RedisSource {
    type Message = Delivery;
    type Error = QueueError;

    async fn poll(&self, max: u32) -> Result<Vec<Delivery>, QueueError> {
        let got = self.queue.fetch(&self.consumer, max as usize).await?;
        if got.is_empty() {
            tokio::time::sleep(self.empty_wait).await;
        }
        Ok(got)
    }

    async fn ack(&self, message: Delivery) -> Result<(), QueueError> {
        self.queue.ack(&message.id).await.map(|_| ())
    }

    async fn nack(&self, message: Delivery) -> Result<(), QueueError> {
        self.queue.nack(&message.id).await
    }
}

/// Processes a message: local work, then one call to the dependency.
#[derive(Debug)]
pub struct DependencyHandler {
    http: reqwest::Client,
    url: String,
    processing: Duration,
}

impl DependencyHandler {
    /// Calls `POST <base>/work` after `processing` of local work.
    pub fn new(base: &str, processing: Duration) -> Result<Self, reqwest::Error> {
        Ok(Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .pool_max_idle_per_host(64)
                .build()?,
            url: format!("{base}/work"),
            processing,
        })
    }
}

impl Handler<Delivery> for DependencyHandler {
    async fn handle(&self, message: &Delivery) -> Outcome {
        tokio::time::sleep(self.processing).await;
        let status = self
            .http
            .post(&self.url)
            .body(message.body.clone())
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16());
        classify(status)
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

async fn kube_client(path: &std::path::Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await?;
    Ok(kube::Client::try_from(cfg)?)
}

/// A pod's admin endpoint accepting pushes only from `identities` with a token for the pod's own
/// audience (`namespace`, `workload`), checked by TokenReview through `kubeconfig`, or, without
/// one, through the pod's in-cluster configuration (its ServiceAccount token and the
/// `kubernetes` Service) when it runs in a pod; without identities, or with neither, it
/// accepts no push. The workers and the producer pods share it.
pub(crate) async fn authenticated(
    admin: Admin,
    kubeconfig: Option<&std::path::Path>,
    namespace: &str,
    workload: &str,
    identities: &[String],
) -> anyhow::Result<Admin> {
    if identities.is_empty() {
        return Ok(admin);
    }
    let client = match kubeconfig {
        Some(path) => kube_client(path).await?,
        None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
            kube::Client::try_from(kube::Config::incluster()?)?
        }
        None => return Ok(admin),
    };
    let verifier =
        backpressure_worker::config::token::TokenReviewVerifier::new(client, namespace, workload);
    Ok(admin.with_verifier(Arc::new(verifier), identities.to_vec()))
}

/// A pod's probe-jitter seed: the run's `seed` mixed with the pod's name (the Go lab worker
/// mixes them the same way).
pub fn pod_seed(seed: u64, consumer: &str) -> u64 {
    consumer
        .bytes()
        .fold(seed, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
}

/// Runs the worker until SIGTERM/SIGINT, then finishes the messages in flight.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let initial = WorkerConfig::parse(&std::fs::read(&args.config)?)?;
    let metrics = Metrics::new(&args.workload);
    let seed = pod_seed(args.seed, &args.consumer);
    let gate = Gate::builder(controller::from_config(&initial, seed))
        .metrics(metrics.clone())
        .seed(seed)
        .build();
    let state = ConfigState::new(gate.clone(), initial, Some(metrics.clone()));
    let admin = authenticated(
        Admin::new(state, Some(metrics)),
        args.kubeconfig.as_deref(),
        &args.namespace,
        &args.workload,
        &args.allowed_identities,
    )
    .await?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let admin_task = tokio::spawn(Arc::new(admin).serve(listener, stopped(stop_rx.clone())));

    let queue = Queue::connect(
        &args.redis,
        &args.queue,
        args.visibility_timeout,
        args.max_deliveries,
    )
    .await?;
    let source = Arc::new(RedisSource::new(
        queue,
        &args.consumer,
        Duration::from_millis(100),
    ));
    let handler = Arc::new(DependencyHandler::new(&args.dependency, args.processing)?);
    let worker = WorkerLoop::new(source, handler, gate).max_batch(16);
    let run = tokio::spawn(worker.run(stopped(stop_rx)));

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    let _ = stop_tx.send(true);
    let stats = run.await?;
    tracing::info!(?stats, "worker stopped");
    let _ = admin_task.await;
    Ok(())
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

    #[test]
    fn pods_of_one_run_get_seeds_of_their_own() {
        assert_eq!(pod_seed(7, "ab"), (7 * 31 + 97) * 31 + 98);
        assert_eq!(pod_seed(7, ""), 7);
        assert_ne!(pod_seed(7, "work-abc12"), pod_seed(7, "work-abc13"));
        // Wrapping, never a panic on long names.
        let _ = pod_seed(u64::MAX, &"x".repeat(300));
    }
}
