//! `make bench-scale`: the operator at fleet scale against real components.
//!
//! N WorkerBackpressure objects (default 10,000) across M namespaces (default 100), each with a
//! Deployment to scale through `/scale` and its pods (default 5 per workload: 50,000, shaped like
//! worker pods and left Pending: no kubelet runs, so the operator's pod cache holds what a real
//! cluster's would), on a real kube-apiserver + etcd
//! (`backpressure-envtest`, audit log on); a real Prometheus scraping a generated exposition of
//! the wire-contract metrics of every workload; the operator binary built in release mode,
//! running as its ServiceAccount under the chart's RBAC with `--requeue-interval=15s`.
//!
//! It measures and prints:
//! - the time to reconcile every object once from a cold start (every object's status written);
//! - per steady-state interval: reconciles (and whether every object was reconciled), operator
//!   CPU and resident memory (`/proc/<pid>`), Prometheus queries (Prometheus' own
//!   `prometheus_http_requests_total{handler="/api/v1/query"}`) and API writes by the operator
//!   (audit log) while nothing changes;
//! - the decision latency: the queue age of a sample of workloads is raised at the exporter
//!   (in steps spread over one interval),
//!   and the time to the operator's first `/scale` write to each (audit log timestamps) gives
//!   p50 / p90 / p99 / max.
//!
//! Run: `cargo bench -p backpressure-operator --bench scale -- [--objects N] [--namespaces M]`
//! (`BP_K8S_BIN` as for the tests). Results are printed as Markdown and written to
//! `target/bench-scale.md`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The parts of the integration tests' harness (tests/it/common) the benchmark uses: the CRD
// install and the operator's chart RBAC and identity. It runs the operator its own way and
// installs no fixture CRD, so `Operator` and `install_fixture` of those files are unused here:
// hence the allows, on these includes only.
#[allow(dead_code)]
#[path = "../../tests/it/common/crds.rs"]
mod crds;
#[allow(dead_code)]
#[path = "../../tests/it/common/operator.rs"]
mod operator;

mod audit;
mod exposition;
mod processes;

use audit::Audit;
use exposition::Exposition;
use processes::{http_get, metric_sum, proc_stats, start_operator, start_prometheus};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use backpressure_api::wire::metrics as m;
use backpressure_envtest::TestEnv;
use clap::Parser;
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;

#[derive(Debug, Parser)]
#[command(about = "Scale benchmark of the backpressure operator")]
struct Args {
    /// WorkerBackpressure objects (each with its Deployment).
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Namespaces they are spread over.
    #[arg(long, default_value_t = 100)]
    namespaces: usize,
    /// The operator's --requeue-interval, in seconds.
    #[arg(long, default_value_t = 15)]
    interval: u64,
    /// Steady-state intervals to measure.
    #[arg(long, default_value_t = 4)]
    steady_intervals: u32,
    /// Workloads whose metrics change in the latency experiment.
    #[arg(long, default_value_t = 100)]
    latency_samples: usize,
    /// Pods per workload, labelled as the Deployment's selector picks them, so that the
    /// operator's pod cache holds what a real cluster's would (0: none).
    #[arg(long, default_value_t = 5)]
    pods_per_object: usize,
    /// Creates in flight while setting up.
    #[arg(long, default_value_t = 32)]
    create_concurrency: usize,
    /// Prometheus scrape interval, in seconds.
    #[arg(long, default_value_t = 5)]
    scrape_interval: u64,
    /// Exposition endpoints the workloads are spread over (Prometheus scrapes them in
    /// parallel).
    #[arg(long, default_value_t = 10)]
    endpoints: usize,
    /// Extra environment of the operator process (`KEY=VALUE`, repeatable), e.g.
    /// `MALLOC_ARENA_MAX=2`.
    #[arg(long = "operator-env")]
    operator_env: Vec<String>,
    /// A command that runs the operator (split on whitespace), for profiling, e.g.
    /// `heaptrack -o /tmp/operator`.
    #[arg(long = "operator-prefix", default_value = "")]
    operator_prefix: String,
    /// Where to write the Markdown results.
    #[arg(long, default_value = "target/bench-scale.md")]
    output: PathBuf,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// Target queue age of every object; the exporter reports exactly this in steady state, so
/// the sizing keeps the current replicas.
const TARGET_AGE: f64 = 60.0;
/// The latency sample changes in this many steps spread over one interval.
const LATENCY_GROUPS: usize = 10;
const INITIAL_REPLICAS: i32 = 2;

/// Pod `k` of workload `name`, shaped like a worker pod of a Deployment: the selector's label
/// and a pod-template hash, an owner reference, the worker library's environment, the admin
/// port, probes, resources and a projected ServiceAccount token (about 2.5 KiB of JSON).
fn bench_pod(name: &str, k: usize) -> Pod {
    let env: Vec<_> = [
        ("BACKPRESSURE_ADMIN_ADDR", "0.0.0.0:9090"),
        ("BACKPRESSURE_CONFIG_AUDIENCE", "backpressure.dev/config"),
        ("QUEUE_URL", "redis://queue.bench.svc:6379/0"),
        ("QUEUE_NAME", "jobs"),
        ("DEPENDENCY_URL", "https://dependency.bench.svc"),
        ("RUST_LOG", "info"),
    ]
    .iter()
    .map(|(k, v)| json!({"name": k, "value": v}))
    .collect();
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("{name}-7d9f8c6b5-{k:05}"),
            "labels": {"app": name, "pod-template-hash": "7d9f8c6b5"},
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090",
                "kubectl.kubernetes.io/default-container": "worker",
            },
            "ownerReferences": [{
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": format!("{name}-7d9f8c6b5"),
                "uid": "00000000-0000-0000-0000-000000000000",
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 60,
            "containers": [{
                "name": "worker",
                "image": "registry.example/backpressure/worker:0.2.0",
                "args": ["--queue", "jobs"],
                "env": env,
                "ports": [{"name": "admin", "containerPort": 9090, "protocol": "TCP"}],
                "resources": {
                    "requests": {"cpu": "250m", "memory": "128Mi"},
                    "limits": {"memory": "256Mi"},
                },
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": "admin"}, "periodSeconds": 5},
                "livenessProbe": {"httpGet": {"path": "/livez", "port": "admin"}, "periodSeconds": 10},
                "volumeMounts": [{"name": "config-token", "mountPath": "/var/run/secrets/backpressure", "readOnly": true}],
                "securityContext": {"runAsNonRoot": true, "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false},
            }],
            "volumes": [{
                "name": "config-token",
                "projected": {"sources": [{"serviceAccountToken": {"audience": "backpressure.dev/config", "expirationSeconds": 3600, "path": "token"}}]},
            }],
        },
    }))
    .unwrap()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

// ---------------------------------------------------------------------------------------------

fn main() {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let report = rt.block_on(run(&args));
    println!("\n{report}");
    if let Some(dir) = args.output.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(&args.output, &report).unwrap();
    eprintln!("written to {}", args.output.display());
}

async fn run(args: &Args) -> String {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let n = args.objects;
    let interval = Duration::from_secs(args.interval);
    let mut out = String::new();
    let t_setup = Instant::now();
    eprintln!("starting etcd and kube-apiserver");
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    crds::install_crds(&client).await;
    let kubeconfig = operator::operator_kubeconfig(env).await;

    // Namespaces, then N Deployments and N WorkerBackpressures, `create_concurrency` at once.
    let mut namespaces = Vec::new();
    for _ in 0..args.namespaces {
        namespaces.push(env.namespace("bench").await.unwrap());
    }
    let workloads: Vec<(String, String)> = (0..n)
        .map(|i| {
            (
                namespaces[i % namespaces.len()].clone(),
                format!("w-{}", i / namespaces.len()),
            )
        })
        .collect();
    let exposition = Exposition::new(&workloads, args.endpoints.max(1));
    let targets: Vec<String> = (0..args.endpoints.max(1))
        .map(|i| exposition.serve(i))
        .collect();
    let prom_dir = env.dir().join("bench-prometheus");
    let (_prom, prom_url) = start_prometheus(&prom_dir, &targets, args.scrape_interval);
    let prom_addr = prom_url.trim_start_matches("http://").to_owned();

    eprintln!(
        "creating {n} Deployments and {n} WorkerBackpressures in {} namespaces",
        namespaces.len()
    );
    let created = Instant::now();
    let errors = AtomicU64::new(0);
    futures::stream::iter(workloads.iter())
        .for_each_concurrent(args.create_concurrency, |(ns, name)| {
            let client = client.clone();
            let prom_url = prom_url.clone();
            let errors = &errors;
            async move {
                let d: Deployment = serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {
                        "replicas": INITIAL_REPLICAS,
                        "selector": {"matchLabels": {"app": name}},
                        "template": {
                            "metadata": {"labels": {"app": name}},
                            "spec": {"containers": [{"name": "worker", "image": "worker:bench"}]}
                        }
                    }
                }))
                .unwrap();
                let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
                if deployments
                    .create(&PostParams::default(), &d)
                    .await
                    .is_err()
                {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                let wbp = json!({
                    "apiVersion": "backpressure.dev/v1alpha1",
                    "kind": "WorkerBackpressure",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {
                        "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                        "metrics": {
                            "prometheus": {"address": prom_url, "timeout": "10s"},
                            "workload": name,
                            "rateWindow": "1m",
                            "staleAfter": "2m",
                        },
                        "scaling": {
                            "minReplicas": 1,
                            "maxReplicas": 20,
                            "targetQueueAge": "60s",
                            "scaleUp": {"maxPods": 4, "maxPercent": 100, "period": "15s"},
                        },
                    },
                });
                let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
                    client,
                    ns,
                    &kube::api::ApiResource::erase::<backpressure_api::WorkerBackpressure>(&()),
                );
                let obj: kube::api::DynamicObject = serde_json::from_value(wbp).unwrap();
                if api.create(&PostParams::default(), &obj).await.is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .await;
    let create_secs = created.elapsed().as_secs_f64();
    assert_eq!(errors.load(Ordering::Relaxed), 0, "some creates failed");
    eprintln!(
        "created {} objects in {create_secs:.1}s ({:.0}/s)",
        2 * n,
        2.0 * n as f64 / create_secs
    );

    // The pods of every workload, as its ReplicaSet would create them (no kubelet runs here,
    // so they stay Pending).
    let pod_count = n * args.pods_per_object;
    eprintln!("creating {pod_count} pods");
    let pods_created = Instant::now();
    let pod_specs = workloads
        .iter()
        .flat_map(|w| (0..args.pods_per_object).map(move |k| (w, k)));
    futures::stream::iter(pod_specs)
        .for_each_concurrent(args.create_concurrency, |((ns, name), k)| {
            let client = client.clone();
            let errors = &errors;
            async move {
                let api: Api<Pod> = Api::namespaced(client, ns);
                if api
                    .create(&PostParams::default(), &bench_pod(name, k))
                    .await
                    .is_err()
                {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
        .await;
    let pods_secs = pods_created.elapsed().as_secs_f64();
    assert_eq!(errors.load(Ordering::Relaxed), 0, "some pod creates failed");
    eprintln!(
        "created {pod_count} pods in {pods_secs:.1}s ({:.0}/s)",
        pod_count as f64 / pods_secs.max(1e-9)
    );

    // Every workload's series is in Prometheus before the operator starts.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let q = format!("count({})", m::QUEUE_AGE);
        let body = http_get(
            &prom_addr,
            &format!(
                "/api/v1/query?query={}",
                backpressure_envtest::urlencode(&q)
            ),
        );
        let count = body
            .split("\"value\":[")
            .nth(1)
            .and_then(|v| v.split('"').nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if count as usize >= n {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus has {count} of {n} workloads"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let setup_secs = t_setup.elapsed().as_secs_f64();

    // Cold start: until every object's status has been written once.
    let mut audit = Audit::open(env);
    audit.skip_to_end();
    eprintln!(
        "starting the operator (requeue interval {}s)",
        args.interval
    );
    let started_unix = unix_now();
    let (mut operator, op_metrics, pid) = start_operator(
        env,
        &kubeconfig,
        &prom_url,
        args.interval,
        &args.operator_env,
        &args.operator_prefix,
    );
    let mut statused: HashSet<(String, String)> = HashSet::new();
    let mut cold_writes: BTreeMap<String, usize> = BTreeMap::new();
    let mut last_status_at = started_unix;
    let cold_deadline = Instant::now() + Duration::from_secs(1800);
    let mut last_print = Instant::now();
    while statused.len() < n {
        tokio::time::sleep(Duration::from_millis(500)).await;
        for w in audit.new_writes() {
            *cold_writes.entry(w.kind()).or_default() += 1;
            if w.resource == "workerbackpressures" && w.subresource == "status" {
                statused.insert((w.namespace, w.name));
                last_status_at = last_status_at.max(w.at);
            }
        }
        if Instant::now() > cold_deadline {
            panic!(
                "only {} of {n} objects reconciled after 30 minutes",
                statused.len()
            );
        }
        if last_print.elapsed() >= Duration::from_secs(10) {
            last_print = Instant::now();
            eprintln!("  {} of {n} objects reconciled", statused.len());
        }
    }
    let cold_secs = last_status_at - started_unix;
    let (cold_rss, _, cold_cpu) = proc_stats(pid);
    eprintln!("every object reconciled once {cold_secs:.1}s after the operator started");

    // Settle: let the first-reconcile writes (ConfigMaps, events, status) and the first
    // follow-up reconciles pass, then measure whole intervals.
    tokio::time::sleep(interval * 2).await;
    let _ = audit.new_writes();
    let scrape_op = || http_get(&op_metrics, "/metrics");
    let scrape_prom = || http_get(&prom_addr, "/metrics");
    let mut rows = Vec::new();
    for i in 0..args.steady_intervals {
        let (_, _, cpu0) = proc_stats(pid);
        let op0 = scrape_op();
        let q0 = metric_sum(
            &scrape_prom(),
            "prometheus_http_requests_total",
            &["handler=\"/api/v1/query\""],
        );
        let t0 = Instant::now();
        tokio::time::sleep(interval).await;
        let took = t0.elapsed().as_secs_f64();
        let (rss, hwm, cpu1) = proc_stats(pid);
        let op1 = scrape_op();
        let q1 = metric_sum(
            &scrape_prom(),
            "prometheus_http_requests_total",
            &["handler=\"/api/v1/query\""],
        );
        let writes = audit.new_writes();
        let rec = |t: &str| {
            metric_sum(
                t,
                "backpressure_operator_reconciles_total",
                &["result=\"success\""],
            )
        };
        let rec_err = |t: &str| {
            metric_sum(
                t,
                "backpressure_operator_reconciles_total",
                &["result=\"error\""],
            )
        };
        let dur_sum = |t: &str| {
            metric_sum(
                t,
                "backpressure_operator_reconcile_duration_seconds_sum",
                &[],
            )
        };
        let dur_cnt = |t: &str| {
            metric_sum(
                t,
                "backpressure_operator_reconcile_duration_seconds_count",
                &[],
            )
        };
        let reconciles = rec(&op1) - rec(&op0);
        let mean_ms =
            1000.0 * (dur_sum(&op1) - dur_sum(&op0)) / (dur_cnt(&op1) - dur_cnt(&op0)).max(1.0);
        let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
        for w in &writes {
            *by_kind.entry(w.kind()).or_default() += 1;
        }
        let row = SteadyRow {
            seconds: took,
            reconciles,
            errors: rec_err(&op1) - rec_err(&op0),
            mean_reconcile_ms: mean_ms,
            cpu_seconds: cpu1 - cpu0,
            rss,
            hwm,
            queries: q1 - q0,
            writes: writes.len(),
            writes_by_kind: by_kind,
        };
        eprintln!("  steady interval {}: {row:?}", i + 1);
        rows.push(row);
    }

    // Decision latency: raise the queue age of a sample of workloads, spread over namespaces.
    let step = (n / args.latency_samples.max(1)).max(1);
    let sample: Vec<(String, String)> = workloads
        .iter()
        .step_by(step)
        .take(args.latency_samples)
        .cloned()
        .collect();
    let sample_set: HashSet<(String, String)> = sample.iter().cloned().collect();
    let _ = audit.new_writes();
    // The changes are spread over one interval in LATENCY_GROUPS steps, so that the latency
    // samples the phase of the operator's fetch cycle rather than measuring one phase.
    let groups: Vec<HashSet<(String, String)>> = (0..LATENCY_GROUPS)
        .map(|g| {
            sample
                .iter()
                .skip(g)
                .step_by(LATENCY_GROUPS)
                .cloned()
                .collect()
        })
        .collect();
    let mut changed_at: HashMap<(String, String), f64> = HashMap::new();
    let mut first_write: HashMap<(String, String), f64> = HashMap::new();
    let mut other_writes = 0usize;
    let gap = interval / LATENCY_GROUPS as u32;
    let mut next_group = 0usize;
    let mut next_change = Instant::now();
    let latency_deadline = Instant::now() + interval * 5;
    while first_write.len() < sample.len() && Instant::now() < latency_deadline {
        if next_group < groups.len() && Instant::now() >= next_change {
            let at = unix_now();
            exposition.set_age(&groups[next_group], TARGET_AGE * 10.0);
            for k in &groups[next_group] {
                changed_at.insert(k.clone(), at);
            }
            next_group += 1;
            next_change += gap;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        for w in audit.new_writes() {
            let key = (w.namespace.clone(), w.name.clone());
            if w.resource == "deployments" && w.subresource == "scale" {
                if sample_set.contains(&key) {
                    first_write.entry(key).or_insert(w.at);
                } else {
                    other_writes += 1;
                }
            }
        }
    }
    let mut latencies: Vec<f64> = first_write
        .iter()
        .filter_map(|(k, t)| Some(t - changed_at.get(k)?))
        .collect();
    latencies.sort_by(|a, b| a.total_cmp(b));
    let missing = sample.len() - latencies.len();
    // The sample really was scaled (not just written to): check a few Deployments.
    let mut scaled_ok = 0;
    for (ns, name) in sample.iter().take(10) {
        let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
        if api
            .get(name)
            .await
            .ok()
            .and_then(|d| d.spec?.replicas)
            .unwrap_or(0)
            > INITIAL_REPLICAS
        {
            scaled_ok += 1;
        }
    }
    let (end_rss, end_hwm, end_cpu) = proc_stats(pid);
    let anon = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Anonymous:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024;
    // What the operator caches per object: a WorkerBackpressure with status, and its ConfigMap.
    let (ns0, name0) = &workloads[0];
    let sizes = {
        let wbps: Api<backpressure_api::WorkerBackpressure> = Api::namespaced(client.clone(), ns0);
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), ns0);
        let w = wbps.get(name0).await.ok();
        let cm = cms.get(&format!("{name0}-worker-config")).await.ok();
        let json_len = |v: &serde_json::Value| serde_json::to_vec(v).map(|b| b.len()).unwrap_or(0);
        let mut out = Vec::new();
        for (what, v) in [
            (
                "WorkerBackpressure",
                w.map(|o| serde_json::to_value(o).unwrap()),
            ),
            ("ConfigMap", cm.map(|o| serde_json::to_value(o).unwrap())),
        ] {
            if let Some(v) = v {
                let all = json_len(&v);
                let managed = json_len(&v["metadata"]["managedFields"]);
                out.push(format!(
                    "{what} {all} B of JSON ({managed} B of it managedFields)"
                ));
            }
        }
        out.join(", ")
    };
    let op_end = scrape_op();
    let op_log_size = std::fs::metadata(operator.log())
        .map(|m| m.len())
        .unwrap_or(0);
    operator.stop();
    // A profiler in --operator-prefix may not pass SIGTERM on: stop the operator itself.
    for signal in ["-TERM", "-KILL"] {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            break;
        }
        let _ = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status();
        tokio::time::sleep(Duration::from_secs(5)).await;
    }

    // -----------------------------------------------------------------------------------------
    let cores = std::thread::available_parallelism()
        .map(|c| c.get())
        .unwrap_or(0);
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let mem_total = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    let _ = writeln!(
        out,
        "## Scale benchmark: {n} WorkerBackpressures in {} namespaces",
        namespaces.len()
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Run {} on {cores} cores ({cpu_model}), {mem_total}; kube-apiserver {} with etcd, Prometheus scraping {} endpoints every {}s ({} series), operator in release mode, `--requeue-interval={}s`, concurrency 16.",
        k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M UTC"),
        backpressure_envtest::KUBERNETES_VERSION,
        args.endpoints,
        args.scrape_interval,
        7 * n,
        args.interval
    );
    let _ = writeln!(out);
    let _ = writeln!(out, "| setup | value |\n|---|---|");
    let _ = writeln!(
        out,
        "| objects created (Deployments + WorkerBackpressures) | {} in {create_secs:.0} s ({:.0}/s, {} in flight) |",
        2 * n,
        2.0 * n as f64 / create_secs,
        args.create_concurrency
    );
    let _ = writeln!(
        out,
        "| pods created ({} per workload, Pending: no kubelet runs) | {pod_count} in {pods_secs:.0} s |",
        args.pods_per_object
    );
    let _ = writeln!(
        out,
        "| setup until Prometheus had every workload | {setup_secs:.0} s |"
    );
    let _ = writeln!(out);
    let _ = writeln!(out, "| cold start | value |\n|---|---|");
    let _ = writeln!(
        out,
        "| every object reconciled once (status written) | {cold_secs:.1} s after the operator started |"
    );
    let _ = writeln!(
        out,
        "| operator CPU during the cold start | {cold_cpu:.1} s |"
    );
    let _ = writeln!(
        out,
        "| operator RSS after the cold start | {:.0} MiB |",
        mib(cold_rss)
    );
    let writes_total: usize = cold_writes.values().sum();
    let _ = writeln!(
        out,
        "| operator writes until then | {writes_total} ({}) |",
        cold_writes
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Steady state (nothing changes), per interval of {}s. Each object is requeued {}s plus up to 10% (a jitter derived from its UID) after its reconcile, so an operator that keeps up reconciles each object every {}-{:.1} s (mean period = objects x window / reconciles):",
        args.interval,
        args.interval,
        args.interval,
        args.interval as f64 * 1.1
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| interval | reconciles | errors | mean period per object | mean reconcile | operator CPU | CPU share | RSS | Prometheus queries | API writes |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    for (i, r) in rows.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} ({:.1} s) | {:.0} | {:.0} | {:.1} s | {:.1} ms | {:.2} s | {:.0}% of a core | {:.0} MiB (peak {:.0}) | {:.0} | {}{} |",
            i + 1,
            r.seconds,
            r.reconciles,
            r.errors,
            n as f64 * r.seconds / r.reconciles.max(1.0),
            r.mean_reconcile_ms,
            r.cpu_seconds,
            100.0 * r.cpu_seconds / r.seconds,
            mib(r.rss),
            mib(r.hwm),
            r.queries,
            r.writes,
            if r.writes_by_kind.is_empty() {
                String::new()
            } else {
                format!(
                    " ({})",
                    r.writes_by_kind
                        .iter()
                        .map(|(k, v)| format!("{k}: {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Decision latency: queue age of {} workloads raised from {TARGET_AGE:.0}s to {:.0}s at the exporter, in {LATENCY_GROUPS} steps spread over one interval ({:.1} s apart); time from each change to the operator's first `/scale` write to that workload (audit log):",
        sample.len(),
        TARGET_AGE * 10.0,
        gap.as_secs_f64()
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| p50 | p90 | p99 | max | not scaled within {} s | other scale writes meanwhile |",
        (interval * 4).as_secs()
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    let _ = writeln!(
        out,
        "| {:.1} s | {:.1} s | {:.1} s | {:.1} s | {missing} | {other_writes} |",
        percentile(&latencies, 50.0),
        percentile(&latencies, 90.0),
        percentile(&latencies, 99.0),
        latencies.last().copied().unwrap_or(f64::NAN),
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Cached per object: {sizes}; operator anonymous memory at the end {:.0} MiB.",
        mib(anon)
    );
    let _ = writeln!(
        out,
        "At the end: RSS {:.0} MiB (peak {:.0} MiB), operator CPU {end_cpu:.0} s in total, {scaled_ok} of the first 10 sampled Deployments above {INITIAL_REPLICAS} replicas, operator log {} KiB, exposition scraped {} times.",
        mib(end_rss),
        mib(end_hwm),
        op_log_size / 1024,
        exposition.scrapes.load(Ordering::Relaxed)
    );
    let q = metric_sum(
        &op_end,
        "backpressure_operator_prometheus_query_duration_seconds_sum",
        &[],
    );
    let qc = metric_sum(
        &op_end,
        "backpressure_operator_prometheus_query_duration_seconds_count",
        &[],
    );
    let _ = writeln!(
        out,
        "Operator-side Prometheus queries: {qc:.0} in total, mean {:.0} ms.",
        1000.0 * q / qc.max(1.0)
    );
    out
}

#[derive(Debug)]
struct SteadyRow {
    seconds: f64,
    reconciles: f64,
    errors: f64,
    mean_reconcile_ms: f64,
    cpu_seconds: f64,
    rss: u64,
    hwm: u64,
    queries: f64,
    writes: usize,
    writes_by_kind: BTreeMap<String, usize>,
}
