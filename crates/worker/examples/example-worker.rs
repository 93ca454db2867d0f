//! An example worker built on `backpressure-worker`: an in-memory queue, a simulated dependency
//! with an optional outage and capacity limit, the worker loop, the admin server (`/metrics`,
//! `/healthz`, `GET`/`PUT /v1/config`) and an optional hot-reloaded config file.
//!
//! ```text
//! cargo run -p backpressure-worker --example example-worker -- --messages 5000 --outage-at 5 --outage-for 20
//! curl -s 127.0.0.1:9464/metrics
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::Context;
use backpressure_api::wire::WorkerConfig;
use backpressure_worker::config::admin::Admin;
use backpressure_worker::config::{ConfigState, DEFAULT_FILE_POLL, FileWatcher};
use backpressure_worker::controller::{self, Outcome};
use backpressure_worker::metrics::Metrics;
use backpressure_worker::permits::Gate;
use backpressure_worker::worker_loop::{Delivery, Handler, MemorySource, WorkerLoop};
use clap::Parser;
use tokio::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Example queue worker with worker-side backpressure")]
struct Args {
    /// Workload name (the `workload` label of every metric).
    #[arg(long, env = "BP_WORKLOAD", default_value = "example-worker")]
    workload: String,
    /// Admin server address (metrics, health, config).
    #[arg(long, env = "BP_ADMIN_ADDR", default_value = "127.0.0.1:9464")]
    admin_addr: SocketAddr,
    /// Mounted WorkerConfig JSON file to watch and hot-reload.
    #[arg(long, env = "BP_CONFIG_FILE")]
    config_file: Option<PathBuf>,
    /// The pod's namespace (the downward API's `metadata.namespace`): with the workload, it
    /// names the only token audience accepted, `backpressure.dev/<namespace>/<workload>`.
    /// Defaults to the namespace of the in-cluster ServiceAccount (or the kubeconfig's).
    #[arg(long, env = "BP_NAMESPACE")]
    namespace: Option<String>,
    /// Usernames allowed to push configuration (e.g.
    /// system:serviceaccount:bp-system:backpressure-operator); enables pushes, checked with a
    /// TokenReview through the in-cluster or kubeconfig credentials.
    #[arg(
        long = "allowed-identity",
        env = "BP_ALLOWED_IDENTITIES",
        value_delimiter = ','
    )]
    allowed_identities: Vec<String>,
    /// The API server for TokenReview, outside a pod (with `--kube-ca-file` and
    /// `--kube-token-file`); otherwise the in-cluster or kubeconfig credentials are used.
    #[arg(long, env = "BP_KUBE_API_URL", requires_all = ["kube_ca_file", "kube_token_file"])]
    kube_api_url: Option<String>,
    /// The API server's CA bundle (PEM).
    #[arg(long, env = "BP_KUBE_CA_FILE")]
    kube_ca_file: Option<PathBuf>,
    /// A file holding the bearer token to call the API server with (re-read as it rotates).
    #[arg(long, env = "BP_KUBE_TOKEN_FILE")]
    kube_token_file: Option<PathBuf>,
    /// PEM certificate (chain) of the admin port: serve HTTPS (with `--tls-key`).
    #[arg(long, env = "BP_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of the admin port's certificate.
    #[arg(long, env = "BP_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// Messages put on the queue at start.
    #[arg(long, env = "BP_MESSAGES", default_value_t = 1000)]
    messages: u32,
    /// Further messages per second while running (0: none).
    #[arg(long, env = "BP_RATE", default_value_t = 0.0)]
    rate: f64,
    /// Delivery attempts before a message is dead-lettered.
    #[arg(long, env = "BP_MAX_ATTEMPTS", default_value_t = 5)]
    max_attempts: u32,
    /// Processing time of one message, in milliseconds.
    #[arg(long, env = "BP_WORK_MS", default_value_t = 50)]
    work_ms: u64,
    /// Concurrent requests the dependency serves; the excess fails (0: unlimited).
    #[arg(long, env = "BP_CAPACITY", default_value_t = 0)]
    capacity: u32,
    /// Start of a full dependency outage, seconds after start.
    #[arg(long, env = "BP_OUTAGE_AT")]
    outage_at: Option<u64>,
    /// Length of the outage in seconds.
    #[arg(long, env = "BP_OUTAGE_FOR", default_value_t = 0)]
    outage_for: u64,
    /// Stop after this many seconds; 0 serves until SIGTERM or SIGINT (a conformance run, a
    /// pod). Unset: stop when the queue is drained and no producer runs.
    #[arg(long, env = "BP_DURATION")]
    duration: Option<u64>,
    /// Serve the conformance hook (`POST /v1/conformance/controller`) for a conformance run
    /// (`backpressure-conformance check`); never in production.
    #[arg(long, env = "BP_CONFORMANCE_HOOK")]
    conformance_hook: bool,
    /// Seed of the controller's probe jitter.
    #[arg(long, env = "BP_SEED", default_value_t = 1)]
    seed: u64,
}

/// A simulated dependency: a capacity limit and a scheduled outage.
struct Dependency {
    started: Instant,
    work: Duration,
    capacity: u32,
    outage: Option<(Duration, Duration)>,
    busy: AtomicU32,
}

impl Handler<Delivery<u64>> for Dependency {
    async fn handle(&self, _message: &Delivery<u64>) -> Outcome {
        let busy = self.busy.fetch_add(1, Ordering::SeqCst) + 1;
        let elapsed = self.started.elapsed();
        let down = self
            .outage
            .is_some_and(|(from, until)| elapsed >= from && elapsed < until);
        let over = self.capacity > 0 && busy > self.capacity;
        let outcome = if down || over {
            tokio::time::sleep(self.work / 4).await;
            Outcome::DependencyFailure
        } else {
            tokio::time::sleep(self.work).await;
            Outcome::Success
        };
        self.busy.fetch_sub(1, Ordering::SeqCst);
        outcome
    }
}

/// The client for TokenReview: the explicit API server of `--kube-api-url`, or the in-cluster
/// or kubeconfig credentials.
async fn kube_client(args: &Args) -> anyhow::Result<kube::Client> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let (Some(url), Some(ca), Some(token)) = (
        &args.kube_api_url,
        &args.kube_ca_file,
        &args.kube_token_file,
    ) else {
        return Ok(kube::Client::try_default().await?);
    };
    // A kubeconfig of one cluster and one token file (JSON is YAML), so that kube reads the CA
    // and re-reads the token as it rotates, as it does for a kubeconfig on disk.
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": url, "certificate-authority": ca}}],
        "users": [{"name": "u", "user": {"tokenFile": token}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    });
    let kubeconfig = Kubeconfig::from_yaml(&doc.to_string())?;
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();

    let metrics = Metrics::new(&args.workload);
    let gate = Gate::builder(controller::from_config(&WorkerConfig::default(), args.seed))
        .metrics(metrics.clone())
        .seed(args.seed)
        .build();
    let state = ConfigState::new(gate.clone(), WorkerConfig::default(), Some(metrics.clone()));

    let mut admin = Admin::new(state.clone(), Some(metrics.clone()));
    if !args.allowed_identities.is_empty() {
        let client = kube_client(&args)
            .await
            .context("config pushes need Kubernetes credentials for TokenReview")?;
        let namespace = args
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        let verifier = backpressure_worker::config::token::TokenReviewVerifier::new(
            client,
            &namespace,
            &args.workload,
        );
        tracing::info!(audience = verifier.audience(), "config pushes enabled");
        admin = admin.with_verifier(Arc::new(verifier), args.allowed_identities.clone());
    }
    if args.conformance_hook {
        tracing::warn!("conformance hook enabled: for conformance runs only");
        admin = admin.with_conformance_hook();
    }
    let listener = tokio::net::TcpListener::bind(args.admin_addr)
        .await
        .with_context(|| format!("binding the admin port {}", args.admin_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "admin server listening");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            // HTTPS from the mounted Secret (cert-manager's tls.crt / tls.key), reloaded when
            // renewed; annotate the pod `backpressure.dev/admin-scheme: https`.
            let files = backpressure_worker::config::tls::CertFiles::load(cert, key)?;
            let config = backpressure_worker::config::tls::server_config(files)?;
            tokio::spawn(Arc::new(admin).serve_tls(listener, config, stopped(stop_rx.clone())));
        }
        (None, None) => {
            tokio::spawn(Arc::new(admin).serve(listener, stopped(stop_rx.clone())));
        }
        _ => anyhow::bail!("--tls-cert and --tls-key go together"),
    }
    if let Some(path) = &args.config_file {
        let watcher = FileWatcher::new(state.clone(), path);
        tokio::spawn(watcher.run(DEFAULT_FILE_POLL, stopped(stop_rx.clone())));
    }

    let source = Arc::new(MemorySource::new(
        args.max_attempts,
        Duration::from_millis(200),
    ));
    for i in 0..u64::from(args.messages) {
        source.push(i);
    }
    let started = Instant::now();
    let dependency = Arc::new(Dependency {
        started,
        work: Duration::from_millis(args.work_ms),
        capacity: args.capacity,
        outage: args.outage_at.map(|at| {
            (
                Duration::from_secs(at),
                Duration::from_secs(at + args.outage_for),
            )
        }),
        busy: AtomicU32::new(0),
    });
    if args.rate > 0.0 {
        let source = source.clone();
        let period = Duration::from_secs_f64(1.0 / args.rate);
        let mut rx = stop_rx.clone();
        tokio::spawn(async move {
            let mut next = u64::from(args.messages);
            let mut tick = tokio::time::interval(period);
            loop {
                tokio::select! {
                    _ = rx.wait_for(|s| *s) => return,
                    _ = tick.tick() => { source.push(next); next += 1; }
                }
            }
        });
    }

    let worker = WorkerLoop::new(source.clone(), dependency, gate.clone());
    let run = tokio::spawn(worker.run(stopped(stop_rx.clone())));
    let mut report = tokio::time::interval(Duration::from_secs(1));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = report.tick() => {}
        }
        let s = gate.snapshot();
        tracing::info!(
            backoff = format!("{:.3}", s.backoff),
            permits = s.limit,
            in_flight = s.in_flight,
            mode = %s.mode,
            depth = source.depth(),
            acked = source.acked(),
            dead_letters = source.dead_letter_count(),
            config = %state.ack().hash,
            "status"
        );
        let elapsed = started.elapsed().as_secs();
        let done = match args.duration {
            Some(0) => false,
            Some(d) => elapsed >= d,
            None => args.rate <= 0.0 && source.depth() == 0 && source.in_flight() == 0,
        };
        if done {
            break;
        }
    }
    let _ = stop_tx.send(true);
    let stats = run.await.context("worker loop task")?;
    tracing::info!(
        ?stats,
        acked = source.acked(),
        dead_letters = source.dead_letter_count(),
        "stopped"
    );
    Ok(())
}
