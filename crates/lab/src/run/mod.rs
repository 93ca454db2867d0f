//! Runs a scenario: the operator run and the comparison run side by side, in two namespaces of
//! one control plane, with the same workers, the same producer schedule and the same seed.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use backpressure_api::v1alpha1::WorkerSpec;
use backpressure_api::wire::WorkerConfig;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cluster::{Cluster, ClusterError, NodeChoice, OPERATOR_NAMESPACE};
use crate::dependency::Dependency;
use crate::kubelet::{Kubelet, Launch, Launcher};
use crate::pods::Images;
use crate::polyglot::{GoWorkerArgs, TokenReviewAccess};
use crate::prom::{self, ApiAccess, LabPrometheus};
use crate::queue::{Queue, RedisServer};
use crate::record::{self, Check, KEDA_RUN, OPERATOR, POLYGLOT, Recording, RunRecord};
use crate::scenario::Scenario;
use crate::serve::{response, serve};

mod comparator;
mod sampling;

use sampling::{fleet_gauges, queue_exposition, sample, timeline};

/// Namespace of the operator run.
pub const OPERATOR_RUN_NS: &str = "lab-operator";
/// The ServiceAccount the operator run's worker pods run as.
const WORKER_SERVICE_ACCOUNT: &str = "default";
/// Namespace of the comparison run.
pub const KEDA_RUN_NS: &str = "lab-keda";
/// Namespace of the polyglot run (the scenario's `polyglot` section): the operator run's
/// workload, its pods running the lab's worker in another language.
pub const POLYGLOT_RUN_NS: &str = "lab-operator-go";

/// A lab error.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// Control plane.
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    /// Queue.
    #[error(transparent)]
    Queue(#[from] crate::queue::QueueError),
    /// Kubelet.
    #[error(transparent)]
    Kubelet(#[from] crate::kubelet::KubeletError),
    /// Prometheus.
    #[error(transparent)]
    Prometheus(#[from] crate::prom::PromError),
    /// Kube.
    #[error("kube: {0}")]
    Kube(#[from] kube::Error),
    /// Files and sockets.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The scenario.
    pub scenario: Scenario,
    /// Output folder (created).
    pub out_dir: PathBuf,
    /// The worker executable (`backpressure-lab`, run as `backpressure-lab worker ...`).
    pub worker_exe: PathBuf,
    /// Try to run the operator (false: comparison run only).
    pub with_operator: bool,
    /// Build the operator with `$CARGO` first (when running under cargo).
    pub build_operator: bool,
    /// Print the live timeline.
    pub timeline: bool,
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct Report {
    /// The recorded data.
    pub recording: Recording,
    /// The end-to-end checks.
    pub checks: Vec<Check>,
    /// Why the operator run did not run, if it did not.
    pub operator_skipped: Option<String>,
    /// True when stopped early by Ctrl-C.
    pub interrupted: bool,
    /// Seconds spent building the operator binary (part of the wall time).
    pub build_secs: f64,
}

struct RunCtx {
    label: &'static str,
    namespace: &'static str,
    /// This run's own broker (one Redis server per run, so that one run's backlog never counts
    /// against the other's memory limit).
    redis: RedisServer,
    /// The broker's URL as the pods reach it.
    pod_redis_url: String,
    queue: Queue,
    dependency: Dependency,
    last_requests: u64,
    last_served: u64,
    /// Where this run's producer pods write their counters (scenarios with producer pods).
    producer_stats: Option<PathBuf>,
    /// Record the broker's memory (scenarios with producer pods or a memory limit).
    broker: bool,
    record: RunRecord,
}

/// The worker configuration a WorkerBackpressure's `spec.worker` stands for (API defaults for
/// unset fields).
pub fn worker_config(spec: Option<&WorkerSpec>) -> WorkerConfig {
    use backpressure_api::defaults as d;
    let base = WorkerConfig::default();
    let Some(w) = spec else {
        return base;
    };
    let max_permits = w.max_permits.unwrap_or(d::MAX_PERMITS);
    let probe = w.probe.as_ref();
    let ms = |v: Option<&backpressure_api::Duration>, default: Duration| {
        v.and_then(|d| d.get().ok()).unwrap_or(default).as_millis() as u64
    };
    WorkerConfig {
        algorithm: w.algorithm.unwrap_or_default(),
        set_point: w.set_point.unwrap_or(d::SET_POINT),
        reaction: w.reaction.unwrap_or(d::reaction(max_permits)),
        max_permits,
        probe_initial_ms: ms(
            probe.and_then(|p| p.initial_interval.as_ref()),
            d::PROBE_INITIAL,
        ),
        probe_max_ms: ms(probe.and_then(|p| p.max_interval.as_ref()), d::PROBE_MAX),
        initial_permits: w.initial_permits,
        floor_max: w.floor_max,
        hash: String::new(),
        ..base
    }
    .with_hash()
}

fn say(enabled: bool, line: &str) {
    if enabled {
        println!("{line}");
        let _ = std::io::stdout().flush();
    }
}

/// Runs the scenario; `cancel` turning true (Ctrl-C) ends it early with the same teardown.
pub async fn run(opts: Options, mut cancel: watch::Receiver<bool>) -> Result<Report, LabError> {
    let wall = Instant::now();
    let sc = opts.scenario.clone();
    let out = opts.out_dir.clone();
    let logs = out.join("logs");
    std::fs::create_dir_all(logs.join("workers"))?;
    let show = opts.timeline;

    say(
        show,
        "lab: starting etcd, kube-apiserver, kube-controller-manager, KEDA ...",
    );
    let hpa = backpressure_envtest::HpaControllerFlags {
        sync_period: sc.keda.sync_period.0,
        downscale_stabilization: sc.keda.downscale_stabilization.0,
        tolerance: sc.keda.tolerance,
    };
    let go_images = opts.with_operator && sc.polyglot.is_some();
    let (mut cluster, images) =
        start_cluster(&hpa, NodeChoice::from_env(), go_images, show).await?;
    let client = cluster.client()?;
    // Where the pods reach the host's servers (Redis, the dependency, Prometheus).
    let host_ip = match cluster.node() {
        Some(_) => backpressure_envtest::node::NODE_IP,
        None => std::net::Ipv4Addr::LOCALHOST,
    };
    // The directory the pods share with the lab on a real node.
    let share = match cluster.node() {
        Some(node) => Some(crate::pods::create_share(node.dir())?),
        None => None,
    };
    say(
        show,
        &format!(
            "lab: control plane ready in {:.1}s; kubectl: KUBECONFIG={} {}/kubectl get wbp -A -w",
            wall.elapsed().as_secs_f64(),
            cluster.kubeconfig().display(),
            cluster.bin_dir().display()
        ),
    );

    let (vis, max_deliveries) = (sc.queue.visibility_timeout.0, sc.queue.max_deliveries);

    // The operator, if it can run.
    let mut operator_skipped = None;
    let mut operator_bin = None;
    let build_started = Instant::now();
    if opts.with_operator {
        if opts.build_operator
            && std::env::var_os("CARGO").is_some()
            && std::env::var_os("BP_OPERATOR_BIN").is_none()
        {
            say(
                show,
                "lab: building the operator (cargo build -p backpressure-operator) ...",
            );
        }
        // Asked for the operator and it cannot run: stop here, before minutes of a run that
        // could only fail its operator checks.
        let bin = crate::operator::find_binary(opts.build_operator)
            .await
            .map_err(|e| LabError::Other(format!("the operator cannot run: {e}")))?;
        crate::operator::check_run_subcommand(&bin)
            .await
            .map_err(|e| LabError::Other(format!("the operator cannot run: {e}")))?;
        operator_bin = Some(bin);
    } else {
        operator_skipped = Some("disabled with --no-operator".into());
    }
    // The polyglot fleet's program (built by tools/lab-worker-go/build.sh unless given).
    let mut polyglot_program = None;
    if let (Some(_), Some(p)) = (&operator_bin, &sc.polyglot) {
        say(
            show,
            &format!("lab: the {:?} lab worker (polyglot run) ...", p.language),
        );
        polyglot_program = Some(
            crate::polyglot::worker_program(p.language)
                .await
                .map_err(|e| LabError::Other(format!("the polyglot worker cannot run: {e}")))?,
        );
    }
    let build_secs = build_started.elapsed().as_secs_f64();
    let mut namespaces: Vec<(&'static str, &'static str)> = Vec::new();
    if operator_bin.is_some() {
        namespaces.push((OPERATOR, OPERATOR_RUN_NS));
    }
    if polyglot_program.is_some() {
        namespaces.push((POLYGLOT, POLYGLOT_RUN_NS));
    }
    // The namespaces whose workload the operator manages.
    let managed: Vec<&'static str> = namespaces
        .iter()
        .filter(|(label, _)| *label != KEDA_RUN)
        .map(|(_, ns)| *ns)
        .collect();
    namespaces.push((KEDA_RUN, KEDA_RUN_NS));

    // Per run: namespace, queue, dependency.
    // The dependencies' schedules start for real at time zero (`set_start` below).
    let setup_start = Instant::now();
    let mut runs: Vec<RunCtx> = Vec::new();
    for (label, ns) in &namespaces {
        cluster.namespace(ns).await?;
        let redis = RedisServer::start_on(
            &out.join(format!("redis-{label}")),
            cluster.node().map(|_| host_ip),
        )?;
        let queue = Queue::connect(&redis.url(), ns, vis, max_deliveries).await?;
        queue.create().await?;
        if let Some(limit) = sc.queue.max_memory {
            queue.limit_memory(limit.0).await?;
        }
        let producer_stats = match (&sc.producer.pods, &share) {
            (Some(_), Some(share)) => {
                let dir = share.join("producers").join(ns);
                crate::pods::create_writable(&dir)?;
                Some(dir)
            }
            (Some(_), None) => {
                let dir = out.join("producers").join(ns);
                std::fs::create_dir_all(&dir)?;
                Some(dir)
            }
            (None, _) => None,
        };
        let dependency =
            Dependency::start(sc.dependency.clone(), sc.seed, setup_start, ns, host_ip).await?;
        runs.push(RunCtx {
            label,
            namespace: ns,
            pod_redis_url: redis.url_at(host_ip),
            redis,
            queue,
            dependency,
            last_requests: 0,
            last_served: 0,
            broker: producer_stats.is_some() || sc.queue.max_memory.is_some(),
            producer_stats,
            record: RunRecord {
                config_end: None,
                label: (*label).to_owned(),
                namespace: (*ns).to_owned(),
                samples: Vec::new(),
            },
        });
    }

    // Queue exporter.
    let exporter_queues: Arc<Vec<(String, Queue)>> = Arc::new(
        runs.iter()
            .map(|r| (r.namespace.to_owned(), r.queue.clone()))
            .collect(),
    );
    let workload = sc.workload.name.clone();
    let (qaddr, qtask) = {
        let (queues, workload) = (exporter_queues.clone(), workload.clone());
        serve(SocketAddr::from(([127, 0, 0, 1], 0)), move |_req| {
            let (queues, workload) = (queues.clone(), workload.clone());
            async move {
                response(
                    200,
                    "text/plain; version=0.0.4",
                    queue_exposition(&queues, &workload).await,
                )
            }
        })
        .await?
    };

    // Prometheus.
    let pki = cluster.env().pki();
    let api = ApiAccess {
        server: cluster.env().server_url(),
        ca_file: &pki.ca_file,
        cert_file: &pki.admin_cert_file,
        key_file: &pki.admin_key_file,
    };
    let mut static_targets = vec![qaddr.to_string()];
    static_targets.extend(runs.iter().map(|r| r.dependency.addr().to_string()));
    let ns_names: Vec<&str> = runs.iter().map(|r| r.namespace).collect();
    std::fs::create_dir_all(out.join("prometheus"))?;
    let mut sd_task = None;
    // Kubernetes discovery first; a Prometheus built without it (Debian's) refuses the
    // configuration at once, and then the lab serves the same targets over http_sd.
    let prom_dir = out.join("prometheus");
    let mut discovery = prom::Discovery::Kubernetes(api.clone());
    let mut prometheus = match LabPrometheus::start(
        &prom_dir,
        &prom::config(&discovery, &ns_names, &static_targets),
        host_ip,
    )
    .await
    {
        Ok(p) => p,
        Err(e) if e.to_string().contains("kubernetes_sd_configs") => {
            let pods: Api<Pod> = Api::all(client.clone());
            let (addr, task) = serve(SocketAddr::from(([127, 0, 0, 1], 0)), move |_req| {
                let pods = pods.clone();
                async move {
                    let lp = kube::api::ListParams::default().labels(&format!(
                        "{}={}",
                        crate::kubelet::POD_LABEL,
                        crate::kubelet::POD_LABEL_VALUE
                    ));
                    match pods.list(&lp).await {
                        Ok(list) => response(
                            200,
                            "application/json",
                            prom::http_sd_targets(&list.items).to_string(),
                        ),
                        Err(e) => response(503, "text/plain", e.to_string()),
                    }
                }
            })
            .await?;
            sd_task = Some(task);
            discovery = prom::Discovery::Http(format!("http://{addr}/sd"));
            LabPrometheus::start(
                &prom_dir,
                &prom::config(&discovery, &ns_names, &static_targets),
                host_ip,
            )
            .await?
        }
        Err(e) => return Err(e.into()),
    };
    say(
        show,
        &format!(
            "lab: prometheus {} (pod discovery: {})",
            prometheus.url(),
            match discovery {
                prom::Discovery::Kubernetes(_) => "kubernetes_sd_configs",
                prom::Discovery::Http(_) =>
                    "http_sd from the API server's pod list; this Prometheus build has no kubernetes_sd",
            }
        ),
    );

    // Operator: chart RBAC, its own ServiceAccount token, the process, the WorkerBackpressure.
    let mut operator_proc = None;
    let mut operator_identity = None;
    if let (Some(_), Some(images)) = (&operator_bin, &images) {
        // A real node: the chart, with the operator image, as a platform team installs it.
        let subjects: Vec<(&str, &str)> = managed
            .iter()
            .map(|ns| (*ns, WORKER_SERVICE_ACCOUNT))
            .collect();
        say(
            show,
            &format!(
                "lab: helm install {} (image tag {}) ...",
                crate::cluster::RELEASE,
                images.tag
            ),
        );
        let id = cluster
            .helm_install_operator(
                &images.tag,
                &prometheus.url(),
                &subjects,
                &["--requeue-interval=2s"],
            )
            .await?;
        create_worker_backpressures(&cluster, &sc, &managed, &workload, &prometheus.url()).await?;
        say(
            show,
            &format!(
                "lab: operator pods Ready, running as {id} (logs: kubectl logs -n {OPERATOR_NAMESPACE})"
            ),
        );
        operator_identity = Some(id);
    } else if let Some(bin) = &operator_bin {
        let subjects: Vec<(&str, &str)> = managed
            .iter()
            .map(|ns| (*ns, WORKER_SERVICE_ACCOUNT))
            .collect();
        let sa = cluster.install_operator_rbac(&subjects).await?;
        let kubeconfig = cluster
            .service_account_kubeconfig(OPERATOR_NAMESPACE, &sa, "operator")
            .await?;
        operator_identity = Some(format!("system:serviceaccount:{OPERATOR_NAMESPACE}:{sa}"));
        let port = backpressure_envtest::process::free_port()
            .map_err(|e| LabError::Other(e.to_string()))?;
        create_worker_backpressures(&cluster, &sc, &managed, &workload, &prometheus.url()).await?;
        operator_proc = Some(
            crate::operator::start(
                bin,
                &kubeconfig,
                &prometheus.url(),
                port,
                "2s",
                &logs.join("operator.log"),
            )
            .map_err(LabError::Other)?,
        );
        say(
            show,
            &format!(
                "lab: operator running as system:serviceaccount:{OPERATOR_NAMESPACE}:{sa} (log {})",
                logs.join("operator.log").display()
            ),
        );
    }
    if let Some(why) = &operator_skipped {
        say(
            show,
            &format!("lab: no operator run ({why}): the comparison (KEDA) only."),
        );
    }

    // Worker config files (one per run: the comparison's workers may run another algorithm)
    // and the kubelet.
    let cfg = worker_config(sc.worker_backpressure.worker.as_ref());
    let mut cfg_paths = BTreeMap::new();
    for r in &runs {
        let cfg = match sc.keda.workers {
            Some(algorithm) if r.label == KEDA_RUN => WorkerConfig {
                algorithm,
                hash: String::new(),
                ..cfg.clone()
            }
            .with_hash(),
            _ => cfg.clone(),
        };
        let json = serde_json::to_vec_pretty(&cfg).map_err(|e| LabError::Other(e.to_string()))?;
        let name = format!("worker-config-{}.json", r.label);
        let mut path = out.join(&name);
        std::fs::write(&path, &json)?;
        if let Some(share) = &share {
            // What the pods read, at the same path inside them.
            path = share.join(&name);
            std::fs::write(&path, &json)?;
        }
        cfg_paths.insert(r.namespace.to_owned(), path);
    }
    // The workers verify the operator's push token with a TokenReview, as the ServiceAccount
    // their pods run as (the chart binds its TokenReview role to it): never the admin's.
    // On a real node they use their pod's in-cluster configuration (no kubeconfig).
    let auth = match &operator_identity {
        Some(id) if cluster.node().is_some() => Some((None, id.clone())),
        Some(id) => {
            cluster
                .service_account(OPERATOR_RUN_NS, WORKER_SERVICE_ACCOUNT)
                .await?;
            let kubeconfig = cluster
                .service_account_kubeconfig(OPERATOR_RUN_NS, WORKER_SERVICE_ACCOUNT, "worker")
                .await?;
            Some((Some(kubeconfig), id.clone()))
        }
        None => None,
    };
    // The polyglot workers review push tokens as the Go SDK does: API server URL, CA file and
    // their ServiceAccount's token file (what a pod has mounted).
    let polyglot_auth = match (&operator_identity, &polyglot_program) {
        (Some(id), Some(_)) if cluster.node().is_some() => {
            // A pod's own: its projected token and the cluster's CA, as the kubelet mounts them.
            let sa = Path::new(crate::pods::SERVICE_ACCOUNT_DIR);
            Some(TokenReviewAccess {
                api_url: cluster.env().server_url().to_owned(),
                ca_file: sa.join("ca.crt"),
                token_file: sa.join("token"),
                allowed_identity: id.clone(),
            })
        }
        (Some(id), Some(_)) => {
            cluster
                .service_account(POLYGLOT_RUN_NS, WORKER_SERVICE_ACCOUNT)
                .await?;
            // In the control plane's directory, removed with it (as the kubeconfigs).
            let token_file = cluster.env().dir().join("worker-go.token");
            cluster
                .service_account_token_file(POLYGLOT_RUN_NS, WORKER_SERVICE_ACCOUNT, &token_file)
                .await?;
            Some(TokenReviewAccess {
                api_url: cluster.env().server_url().to_owned(),
                ca_file: pki.ca_file.clone(),
                token_file,
                allowed_identity: id.clone(),
            })
        }
        _ => None,
    };
    let scripts = match cluster.node() {
        Some(_) => PathBuf::from(crate::pods::GO_SCRIPTS_DIR),
        None => crate::polyglot::scripts_dir(),
    };
    let polyglot = polyglot_program.map(|p| (p, polyglot_auth, scripts));
    // The scenario's time zero on the wall clock, for the producer pods (separate processes
    // follow the schedule from it); set below, before any pod exists.
    let start_unix_ms = Arc::new(std::sync::OnceLock::new());
    let launcher = make_launcher(
        &opts,
        &runs,
        &cfg_paths,
        &logs,
        auth,
        polyglot,
        start_unix_ms.clone(),
    );
    // The pods: containers on the real node, or processes of the stand-in.
    let kubelet = match &share {
        Some(_) => None,
        None => Some(
            Kubelet::start(
                client.clone(),
                "lab-node",
                sc.workload.pod_startup_delay.0,
                launcher.clone(),
            )
            .await?,
        ),
    };
    // On the node: the pod spec of a role's Deployment in a namespace.
    let node_pods = |ns: &str, role: &str| -> Result<Option<serde_json::Value>, LabError> {
        let (Some(share), Some(images)) = (&share, &images) else {
            return Ok(None);
        };
        let launch = launcher(ns, crate::pods::POD_NAME, role, crate::pods::POD_IP)
            .ok_or_else(|| LabError::Other(format!("no {role} to run in {ns}")))?;
        let image = match ns {
            POLYGLOT_RUN_NS => images.reference("backpressure-lab-worker-go"),
            _ => images.reference("backpressure-lab-worker"),
        };
        Ok(Some(crate::pods::pod_spec(
            role,
            &launch,
            &image,
            share,
            sc.workload.pod_startup_delay.0,
        )))
    };

    // Time zero: the workloads, the producers, the autoscaler of the comparison.
    let t0 = Instant::now();
    let _ = start_unix_ms.set(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
    );
    for r in &runs {
        r.dependency.set_start(t0);
    }
    // On the node, every pod's log from its start (the stand-in writes its processes' own).
    let log_followers: Vec<_> = match &share {
        Some(_) => runs
            .iter()
            .map(|r| crate::pods::follow_logs(client.clone(), r.namespace, &logs.join("workers")))
            .collect(),
        None => Vec::new(),
    };
    for r in &runs {
        let spec = node_pods(r.namespace, crate::kubelet::POD_LABEL_VALUE)?;
        cluster
            .create_deployment(
                r.namespace,
                &workload,
                sc.workload.initial_replicas,
                crate::kubelet::POD_LABEL_VALUE,
                spec,
            )
            .await?;
    }
    let mut producers = Vec::new();
    for r in &runs {
        match &sc.producer.pods {
            Some(pods) => {
                let spec = node_pods(r.namespace, crate::kubelet::PRODUCER_LABEL_VALUE)?;
                cluster
                    .create_deployment(
                        r.namespace,
                        &pods.name,
                        i32::try_from(pods.replicas).unwrap_or(1),
                        crate::kubelet::PRODUCER_LABEL_VALUE,
                        spec,
                    )
                    .await?;
            }
            None => producers.push(tokio::spawn(crate::producer::run(
                r.queue.clone(),
                sc.producer.rate.clone(),
                t0,
                sc.duration.0,
            ))),
        }
    }
    let http = reqwest::Client::new();
    if let Some(r) = runs.iter().find(|r| r.label == KEDA_RUN) {
        let redis_url = r.redis.url();
        let stream = r.queue.stream_key();
        let prom_url = prometheus.url();
        let src = comparator::Sources {
            prometheus: &prom_url,
            redis_url: &redis_url,
            stream: &stream,
        };
        comparator::start(&client, &sc, &workload, &src)
            .await
            .map_err(|e| LabError::Other(format!("the comparison's ScaledObject: {e}")))?;
    }
    let (observed, watch_tasks) =
        crate::hpa_trace::Observed::watch(client.clone(), KEDA_RUN_NS, &workload);

    // Record until the end (or Ctrl-C).
    let total = sc.duration.0;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_line = -10.0;
    let mut interrupted = false;
    let mut prev_t = 0.0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = cancel.changed() => { interrupted = true; }
        }
        if interrupted || *cancel.borrow() {
            interrupted = true;
            break;
        }
        let t = t0.elapsed().as_secs_f64();
        let dt = (t - prev_t).max(1e-3);
        prev_t = t;
        let (backoff, floor) = fleet_gauges(&http, &prometheus.url(), &workload).await;
        for r in runs.iter_mut() {
            let s = sample(
                &client,
                r,
                t,
                dt,
                &workload,
                backoff.get(r.namespace).copied(),
                floor.get(r.namespace).copied(),
            )
            .await;
            r.record.samples.push(s);
        }
        if t - last_line >= 5.0 {
            last_line = t;
            say(show, &timeline(&sc, t, &runs));
        }
        if t >= total.as_secs_f64() {
            break;
        }
    }

    // The configuration rollout as the operator and the pods report it, before anything stops.
    for r in runs.iter_mut().filter(|r| r.label != KEDA_RUN) {
        r.record.config_end = Some(config_end(&client, &http, r.namespace, &workload).await);
    }

    // Teardown, in reverse: stop producing, stop scaling, then a final sample.
    for p in &producers {
        p.abort();
    }
    if let Some(mut p) = operator_proc.take() {
        let _ = tokio::task::spawn_blocking(move || p.stop()).await;
    }
    say(show, "lab: stopping workers ...");
    match kubelet {
        Some(kubelet) => kubelet.shutdown().await,
        None => {
            let ns: Vec<&str> = runs.iter().map(|r| r.namespace).collect();
            stop_node_pods(&cluster, &client, &ns, &logs).await;
        }
    }
    for t in log_followers {
        t.abort();
    }
    for t in watch_tasks {
        t.abort();
    }
    // The comparison's control plane logs go with the run (the control plane's directory is
    // removed when the lab exits).
    for (from, name) in [
        (cluster.env().hpa_controller_log(), "hpa-controller.log"),
        (cluster.env().keda_adapter_log(), "keda-adapter.log"),
        (
            cluster.env().dir().join("keda-operator.log"),
            "keda-operator.log",
        ),
    ] {
        let _ = std::fs::copy(from, logs.join(name));
    }
    let t0_unix = start_unix_ms.get().map_or(0.0, |ms| *ms as f64 / 1000.0);
    let trace = comparator::trace(&sc, cluster.env(), &observed, t0_unix);
    std::fs::write(
        out.join("hpa-trace.json"),
        serde_json::to_vec_pretty(&trace).map_err(|e| LabError::Other(e.to_string()))?,
    )?;
    for r in runs.iter_mut() {
        let producers = r.producer_stats.as_deref().map(sampling::producer_stats);
        if let (Some(from), Some(_)) = (&r.producer_stats, &share) {
            // The counters the pods wrote on the node, kept with the run.
            let to = out.join("producers").join(r.namespace);
            copy_files(from, &to);
        }
        if let Ok(st) = r.queue.stats().await
            && let Some(last) = r.record.samples.last_mut()
        {
            // Final counters after the last in-flight messages settled (and the producer pods
            // wrote their last counters, after their last write).
            last.produced = st.produced;
            last.completed = st.completed;
            last.dead_lettered = st.dead_lettered;
            last.in_stream = st.in_stream;
            last.queue_depth = st.depth();
            if producers.is_some() {
                last.producers = producers;
            }
        }
    }
    qtask.abort();
    if let Some(t) = sd_task {
        t.abort();
    }
    prometheus.stop();
    for r in runs.iter_mut() {
        r.redis.stop();
    }
    cluster.stop();

    let recording = Recording {
        scenario: sc.name.clone(),
        wall_secs: wall.elapsed().as_secs_f64(),
        runs: runs.into_iter().map(|r| r.record).collect(),
    };
    let checks = record::checks(&sc, &recording);
    Ok(Report {
        recording,
        checks,
        operator_skipped,
        interrupted,
        build_secs,
    })
}

fn make_launcher(
    opts: &Options,
    runs: &[RunCtx],
    cfg_paths: &BTreeMap<String, PathBuf>,
    logs: &Path,
    auth: Option<(Option<PathBuf>, String)>,
    polyglot: Option<(PathBuf, Option<TokenReviewAccess>, PathBuf)>,
    start_unix_ms: Arc<std::sync::OnceLock<u64>>,
) -> Launcher {
    let sc = &opts.scenario;
    let per_ns: BTreeMap<String, String> = runs
        .iter()
        .map(|r| (r.namespace.to_owned(), r.dependency.url()))
        .collect();
    let redis_urls: BTreeMap<String, String> = runs
        .iter()
        .map(|r| (r.namespace.to_owned(), r.pod_redis_url.clone()))
        .collect();
    let stats_dirs: BTreeMap<String, PathBuf> = runs
        .iter()
        .filter_map(|r| Some((r.namespace.to_owned(), r.producer_stats.clone()?)))
        .collect();
    let producer = sc.producer.pods.clone().map(|pods| {
        (
            pods,
            serde_json::to_string(&sc.producer.rate).unwrap_or_default(),
        )
    });
    let until = backpressure_api::duration::format_duration(sc.duration.0);
    let exe = opts.worker_exe.clone();
    let cfg_paths = cfg_paths.clone();
    let logs = logs.join("workers");
    let workload = sc.workload.name.clone();
    let processing = backpressure_api::duration::format_duration(sc.workload.processing.0);
    let vis = backpressure_api::duration::format_duration(sc.queue.visibility_timeout.0);
    let max_deliveries = sc.queue.max_deliveries.to_string();
    let seed = sc.seed;
    Arc::new(move |ns: &str, pod: &str, role: &str, ip| {
        let redis_url = redis_urls.get(ns)?;
        let port = backpressure_api::wire::DEFAULT_ADMIN_PORT;
        if role == crate::kubelet::PRODUCER_LABEL_VALUE {
            let (pods, rate) = producer.as_ref()?;
            let mut args: Vec<String> = vec![
                "producer".into(),
                "--listen".into(),
                format!("{ip}:{port}"),
                "--redis".into(),
                redis_url.clone(),
                "--queue".into(),
                ns.to_owned(),
                "--pod".into(),
                pod.to_owned(),
                // With the namespace, the only push token audience the producer accepts.
                "--workload".into(),
                pods.name.clone(),
                "--namespace".into(),
                ns.to_owned(),
                "--rate".into(),
                rate.clone(),
                "--share".into(),
                (1.0 / f64::from(pods.replicas.max(1))).to_string(),
                "--start-unix-ms".into(),
                start_unix_ms.get()?.to_string(),
                "--until".into(),
                until.clone(),
                "--message-bytes".into(),
                pods.message_bytes.to_string(),
                "--broker-retry-after".into(),
                backpressure_api::duration::format_duration(pods.broker_retry_after.0),
                "--stats".into(),
                stats_dirs
                    .get(ns)?
                    .join(format!("{pod}.json"))
                    .display()
                    .to_string(),
            ];
            push_auth(&mut args, auth.as_ref());
            return Some(Launch {
                program: exe.clone(),
                args,
                log: logs.join(format!("{ns}-{pod}.log")),
                ready_port: port,
            });
        }
        let dep = per_ns.get(ns)?;
        let cfg_path = cfg_paths.get(ns)?;
        if ns == POLYGLOT_RUN_NS {
            let (program, go_auth, scripts) = polyglot.as_ref()?;
            let args = GoWorkerArgs {
                listen: format!("{ip}:{port}"),
                redis: redis_url,
                queue: ns,
                consumer: pod,
                dependency: dep,
                workload: &workload,
                namespace: ns,
                processing: &processing,
                visibility_timeout: &vis,
                max_deliveries: &max_deliveries,
                config: cfg_path,
                seed,
                scripts,
                auth: go_auth.as_ref(),
            };
            return Some(Launch {
                program: program.clone(),
                args: args.to_args(),
                log: logs.join(format!("{ns}-{pod}.log")),
                ready_port: port,
            });
        }
        let mut args: Vec<String> = vec![
            "worker".into(),
            "--listen".into(),
            format!("{ip}:{port}"),
            "--redis".into(),
            redis_url.clone(),
            "--queue".into(),
            ns.to_owned(),
            "--consumer".into(),
            pod.to_owned(),
            "--dependency".into(),
            dep.clone(),
            "--workload".into(),
            workload.clone(),
            // The pod's namespace, as the downward API would give it: with the workload, the
            // only push token audience the worker accepts.
            "--namespace".into(),
            ns.to_owned(),
            "--processing".into(),
            processing.clone(),
            "--visibility-timeout".into(),
            vis.clone(),
            "--max-deliveries".into(),
            max_deliveries.clone(),
            "--config".into(),
            cfg_path.display().to_string(),
            // Each worker mixes in its pod's name (`worker::pod_seed`).
            "--seed".into(),
            seed.to_string(),
        ];
        push_auth(&mut args, auth.as_ref());
        Some(Launch {
            program: exe.clone(),
            args,
            log: logs.join(format!("{ns}-{pod}.log")),
            ready_port: port,
        })
    })
}

/// The operator run's WorkerBackpressure in each managed namespace: the scenario's, reading the
/// lab's Prometheus.
async fn create_worker_backpressures(
    cluster: &Cluster,
    sc: &Scenario,
    namespaces: &[&str],
    workload: &str,
    prometheus_url: &str,
) -> Result<(), LabError> {
    let mut spec = sc.worker_backpressure_spec();
    let metrics = spec.metrics.get_or_insert_with(Default::default);
    metrics
        .prometheus
        .get_or_insert_with(Default::default)
        .address = Some(prometheus_url.to_owned());
    for ns in namespaces {
        cluster
            .create_worker_backpressure(ns, workload, &spec)
            .await?;
    }
    Ok(())
}

/// `--kubeconfig` (when not in-cluster) and `--allowed-identity` for a pod that accepts pushes.
fn push_auth(args: &mut Vec<String>, auth: Option<&(Option<PathBuf>, String)>) {
    let Some((kubeconfig, identity)) = auth else {
        return;
    };
    if let Some(k) = kubeconfig {
        args.extend(["--kubeconfig".into(), k.display().to_string()]);
    }
    args.extend(["--allowed-identity".into(), identity.clone()]);
}

/// Starts the control plane, with a real node when `choice` allows and one can start (and
/// the images are there); says which the pods run on and, for the stand-in, why.
async fn start_cluster(
    hpa: &backpressure_envtest::HpaControllerFlags,
    choice: NodeChoice,
    go_worker: bool,
    show: bool,
) -> Result<(Cluster, Option<Images>), LabError> {
    let why_not = match choice {
        NodeChoice::Never => "BP_LAB_NODE=0".to_owned(),
        NodeChoice::WhenAvailable | NodeChoice::Required => {
            let attempt = match Images::find(go_worker) {
                Err(why) => Err(why),
                Ok(images) => match Cluster::start_node_with_keda(hpa).await {
                    Ok(cluster) => Ok((cluster, images)),
                    Err(ClusterError::Env(backpressure_envtest::Error::NodeUnavailable(why))) => {
                        Err(why)
                    }
                    Err(e) => return Err(e.into()),
                },
            };
            match attempt {
                Ok((cluster, images)) => {
                    if let Some(node) = cluster.node() {
                        for archive in &images.archives {
                            node.import_image(archive).map_err(ClusterError::from)?;
                        }
                        say(
                            show,
                            &format!(
                                "lab: pods run on a real node ({} on {}: containerd, kubelet, kube-proxy), images {}",
                                backpressure_envtest::node::NODE_NAME,
                                backpressure_envtest::node::NODE_IP,
                                images.tag
                            ),
                        );
                    }
                    return Ok((cluster, Some(images)));
                }
                Err(why) if choice == NodeChoice::Required => {
                    return Err(LabError::Other(format!(
                        "a real node is required (BP_LAB_NODE=1 or BP_REQUIRE_NODE=1): {why}"
                    )));
                }
                Err(why) => why,
            }
        }
    };
    // Printed whatever `show` says: which the run used is part of its result.
    println!("lab: no real node ({why_not}); running on the kubelet stand-in");
    Ok((Cluster::start_with_keda(hpa).await?, None))
}

/// Stops the pods of a real node the way the stand-in does at the end of a run: the
/// operator's, keeping their logs first (the kubelet drops a deleted pod's), scaled to 0 so
/// that it changes nothing more; then the runs' Deployments are deleted and the lab waits until
/// their pods have terminated (SIGTERM, the grace period), so that the producers' last
/// counters are written and [`crate::pods::follow_logs`] has the workers' last lines.
async fn stop_node_pods(
    cluster: &Cluster,
    client: &kube::Client,
    namespaces: &[&str],
    logs: &Path,
) {
    let operator_pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let mut operator_log = String::new();
    for p in operator_pods
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let name = p.metadata.name.unwrap_or_default();
        let text = operator_pods
            .logs(&name, &Default::default())
            .await
            .unwrap_or_else(|e| format!("(no log: {e})\n"));
        operator_log.push_str(&format!("==> pod {name}\n{text}"));
    }
    let _ = std::fs::write(logs.join("operator.log"), operator_log);
    let _ = cluster
        .kubectl(
            &[
                "scale",
                "deployments",
                "--all",
                "--replicas=0",
                "-n",
                OPERATOR_NAMESPACE,
            ],
            None,
        )
        .await;
    for ns in namespaces {
        if let Err(e) = cluster
            .kubectl(
                &[
                    "delete",
                    "deployments",
                    "--all",
                    "-n",
                    ns,
                    "--cascade=foreground",
                    "--wait=true",
                    "--timeout=60s",
                ],
                None,
            )
            .await
        {
            tracing::warn!(namespace = %ns, error = %e, "lab: the pods did not stop");
        }
    }
}

/// Copies the files of `from` into `to` (created), best effort.
fn copy_files(from: &Path, to: &Path) {
    let _ = std::fs::create_dir_all(to);
    for entry in std::fs::read_dir(from).into_iter().flatten().flatten() {
        let _ = std::fs::copy(entry.path(), to.join(entry.file_name()));
    }
}

/// The WorkerBackpressure's `ConfigInSync` condition and pushed hash, and the hash every running
/// pod of the workload answers on `GET /v1/config` (no authentication, the wire contract).
async fn config_end(
    client: &kube::Client,
    http: &reqwest::Client,
    namespace: &str,
    workload: &str,
) -> record::ConfigEnd {
    use backpressure_api::v1alpha1::WorkerBackpressure;
    let wbps: Api<WorkerBackpressure> = Api::namespaced(client.clone(), namespace);
    let status = wbps
        .get_opt(workload)
        .await
        .ok()
        .flatten()
        .and_then(|w| w.status);
    let condition = status.as_ref().and_then(|s| {
        s.conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == backpressure_api::conditions::CONFIG_IN_SYNC)
            .cloned()
    });
    let config = status.and_then(|s| s.config);
    let pushed_generation = config.as_ref().and_then(|c| c.generation).unwrap_or(0);
    let pushed_hash = config.map(|c| c.hash).unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let lp = kube::api::ListParams::default().labels(&format!("app={workload}"));
    let mut pod_hashes = Vec::new();
    for p in pods.list(&lp).await.map(|l| l.items).unwrap_or_default() {
        // The pods the operator counts (`status.config.podsTotal`): Ready, not terminating.
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if p.metadata.deletion_timestamp.is_some() || !ready {
            continue;
        }
        let Some(ip) = p.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
            continue;
        };
        let url = format!(
            "http://{ip}:{}/v1/config",
            backpressure_api::wire::DEFAULT_ADMIN_PORT
        );
        let body = match http.get(&url).timeout(Duration::from_secs(2)).send().await {
            Ok(r) => r.bytes().await.ok(),
            Err(_) => None,
        };
        let ack = body.and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
        let hash = ack
            .as_ref()
            .and_then(|v| v.get("hash")?.as_str().map(str::to_owned))
            .unwrap_or_default();
        let generation = ack
            .as_ref()
            .and_then(|v| v.get("generation")?.as_i64())
            .unwrap_or(-1);
        pod_hashes.push((p.metadata.name.unwrap_or_default(), hash, generation));
    }
    record::ConfigEnd {
        condition: condition
            .as_ref()
            .map(|c| c.status.clone())
            .unwrap_or_default(),
        reason: condition.map(|c| c.reason).unwrap_or_default(),
        pushed_hash,
        pushed_generation,
        pod_hashes,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn worker_config_follows_the_spec_with_api_defaults() {
        let sc = Scenario::load("outage-and-recovery").unwrap();
        let cfg = worker_config(sc.worker_backpressure.worker.as_ref());
        assert_eq!(cfg.max_permits, 4);
        assert_eq!(cfg.reaction, 20);
        assert_eq!(cfg.probe_initial_ms, 500);
        assert_eq!(cfg.probe_max_ms, 10_000);
        assert!(cfg.validate().is_ok());
        assert_eq!(worker_config(None), WorkerConfig::default());
    }
}
