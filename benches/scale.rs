//! `make bench-scale`: the operator at fleet scale against real components.
//!
//! N WorkerBackpressure objects (default 10,000) across M namespaces (default 100), each with a
//! Deployment to scale through `/scale` (no pods), on a real kube-apiserver + etcd
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
#[path = "../tests/it/common/crds.rs"]
mod crds;
#[allow(dead_code)]
#[path = "../tests/it/common/operator.rs"]
mod operator;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use backpressure_api::wire::metrics as m;
use backpressure_envtest::{Prometheus, Supervised, TestEnv};
use clap::Parser;
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::Deployment;
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

// ---------------------------------------------------------------------------------------------
// The generated exposition: every workload's backoff, outcomes and queue metrics.

/// (namespace, workload, queue age) of the workloads of one endpoint, with a version that
/// grows on every change.
type Part = (u64, Vec<(String, String, f64)>);

struct Exposition {
    endpoints: Vec<RwLock<Part>>,
    rendered: Vec<RwLock<(u64, Arc<String>)>>,
    scrapes: AtomicU64,
}

impl Exposition {
    fn new(workloads: &[(String, String)], endpoints: usize) -> Arc<Self> {
        let mut parts: Vec<Vec<(String, String, f64)>> = vec![Vec::new(); endpoints];
        for (i, (ns, w)) in workloads.iter().enumerate() {
            parts[i % endpoints].push((ns.clone(), w.clone(), TARGET_AGE));
        }
        Arc::new(Exposition {
            endpoints: parts.into_iter().map(|p| RwLock::new((1, p))).collect(),
            rendered: (0..endpoints)
                .map(|_| RwLock::new((0, Arc::new(String::new()))))
                .collect(),
            scrapes: AtomicU64::new(0),
        })
    }

    /// Sets the queue age of the given workloads; returns when the change is visible.
    fn set_age(&self, which: &HashSet<(String, String)>, age: f64) {
        for e in &self.endpoints {
            let mut g = e.write().unwrap();
            let mut changed = false;
            for (ns, w, a) in g.1.iter_mut() {
                if which.contains(&(ns.clone(), w.clone())) {
                    *a = age;
                    changed = true;
                }
            }
            if changed {
                g.0 += 1;
            }
        }
    }

    fn render(&self, i: usize) -> Arc<String> {
        let (version, parts) = {
            let g = self.endpoints[i].read().unwrap();
            (g.0, g.1.clone())
        };
        if let Some(hit) = {
            let r = self.rendered[i].read().unwrap();
            (r.0 == version).then(|| r.1.clone())
        } {
            return hit;
        }
        let mut out = String::with_capacity(parts.len() * 700);
        let _ = writeln!(out, "# TYPE {} gauge", m::BACKOFF);
        let labels = |ns: &str, w: &str| {
            format!(
                "{}=\"{ns}\",{}=\"{w}\"",
                m::LABEL_NAMESPACE,
                m::LABEL_WORKLOAD
            )
        };
        for (ns, w, _) in &parts {
            let _ = writeln!(out, "{}{{{}}} 0", m::BACKOFF, labels(ns, w));
        }
        let _ = writeln!(out, "# TYPE {} counter", m::OUTCOMES_TOTAL);
        for (ns, w, _) in &parts {
            let l = labels(ns, w);
            let _ = writeln!(
                out,
                "{o}{{{l},{c}=\"{s}\"}} 1000\n{o}{{{l},{c}=\"{f}\"}} 0",
                o = m::OUTCOMES_TOTAL,
                c = m::LABEL_CLASS,
                s = m::CLASS_SUCCESS,
                f = m::CLASS_DEPENDENCY_FAILURE
            );
        }
        for (name, kind) in [
            (m::QUEUE_AGE, "gauge"),
            (m::QUEUE_DEPTH, "gauge"),
            (m::QUEUE_ARRIVALS_TOTAL, "counter"),
            (m::QUEUE_COMPLETIONS_TOTAL, "counter"),
        ] {
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (ns, w, age) in &parts {
                let v = if name == m::QUEUE_AGE { *age } else { 0.0 };
                let _ = writeln!(out, "{name}{{{}}} {v}", labels(ns, w));
            }
        }
        let out = Arc::new(out);
        *self.rendered[i].write().unwrap() = (version, out.clone());
        out
    }

    /// Serves endpoint `i` on a loopback port; returns `127.0.0.1:<port>`.
    fn serve(self: &Arc<Self>, i: usize) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let me = self.clone();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                let body = me.render(i);
                me.scrapes.fetch_add(1, Ordering::Relaxed);
                let _ = write!(
                    conn,
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(body.as_bytes());
            }
        });
        addr
    }
}

// ---------------------------------------------------------------------------------------------
// Processes.

/// A Prometheus with its own scrape interval, scraping `targets`.
fn start_prometheus(dir: &Path, targets: &[String], scrape: u64) -> (Supervised, String) {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let port = backpressure_envtest::process::free_port().unwrap();
    let list = targets
        .iter()
        .map(|t| format!("'{t}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let config = format!(
        "global:\n  scrape_interval: {scrape}s\n  scrape_timeout: {}s\n  evaluation_interval: {scrape}s\nscrape_configs:\n- job_name: fleet\n  static_configs:\n  - targets: [{list}]\n",
        scrape.max(2) - 1
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let args = vec![
        format!("--config.file={}", dir.join("prometheus.yml").display()),
        format!("--storage.tsdb.path={}", dir.join("data").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
        "--storage.tsdb.retention.time=2h".into(),
        "--log.level=warn".into(),
    ];
    let p = Supervised::spawn(
        "prometheus",
        &Prometheus::binary().unwrap(),
        &args,
        &dir.join("prometheus.log"),
    )
    .unwrap();
    assert!(
        backpressure_envtest::process::wait_for_port(port, Duration::from_secs(60)),
        "prometheus did not start: {}",
        p.log_tail(20)
    );
    (p, format!("http://127.0.0.1:{port}"))
}

/// The operator binary (release when run by `cargo bench`), as its ServiceAccount.
fn start_operator(
    env: &'static TestEnv,
    kubeconfig: &Path,
    prometheus: &str,
    interval: u64,
    extra_env: &[String],
    prefix: &str,
) -> (Supervised, String, u32) {
    let port = backpressure_envtest::process::free_port().unwrap();
    let metrics = format!("127.0.0.1:{port}");
    let bin = env!("CARGO_BIN_EXE_backpressure-operator");
    let mut args: Vec<String> = vec![
        format!("KUBECONFIG={}", kubeconfig.display()),
        "RUST_LOG=info".into(),
    ];
    args.extend(extra_env.iter().cloned());
    args.extend(prefix.split_whitespace().map(str::to_owned));
    args.extend([
        bin.into(),
        "run".into(),
        format!("--prometheus-url={prometheus}"),
        format!("--metrics-bind-address={metrics}"),
        format!("--requeue-interval={interval}s"),
        format!("--namespace={}", operator::OPERATOR_NAMESPACE),
        format!("--service-account={}", operator::OPERATOR_SA),
    ]);
    let log = env.dir().join("operator-bench.log");
    let p = Supervised::spawn("operator", Path::new("/usr/bin/env"), &args, &log).unwrap();
    assert!(
        backpressure_envtest::process::wait_for_port(port, Duration::from_secs(60)),
        "operator did not start: {}",
        p.log_tail(20)
    );
    let pid = find_pid(bin, &metrics).expect("the operator's pid");
    (p, metrics, pid)
}

fn find_pid(bin: &str, marker: &str) -> Option<u32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.starts_with(bin) && cmd.contains(marker) {
            return Some(pid);
        }
    }
    None
}

/// (RSS bytes, peak RSS bytes, CPU seconds) of `pid`.
fn proc_stats(pid: u32) -> (u64, u64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces) start after ") ".
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the full line: 12 and 13 after the name.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let cpu = (ticks(11) + ticks(12)) as f64 / clock_ticks();
    (kb("VmRSS:"), kb("VmHWM:"), cpu)
}

fn clock_ticks() -> f64 {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok());
    out.unwrap_or(100.0)
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::Read as _;
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
    let _ = write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Sum of the samples of `name` whose labels contain every `must` fragment.
fn metric_sum(text: &str, name: &str, must: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{' | b' '))
        })
        .filter(|l| must.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---------------------------------------------------------------------------------------------
// The audit log, read incrementally.

#[derive(Debug, Clone)]
struct AuditWrite {
    at: f64,
    resource: String,
    subresource: String,
    namespace: String,
    name: String,
}

impl AuditWrite {
    /// `resource` or `resource/subresource`, for counting writes by kind.
    fn kind(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

struct Audit {
    file: std::fs::File,
    partial: String,
    user: String,
}

impl Audit {
    fn open(env: &TestEnv) -> Audit {
        let file = std::fs::File::open(env.dir().join("audit.log")).unwrap();
        Audit {
            file,
            partial: String::new(),
            user: operator::operator_user(),
        }
    }

    /// Skips everything written so far.
    fn skip_to_end(&mut self) {
        let _ = self.file.seek(SeekFrom::End(0));
        self.partial.clear();
    }

    /// The operator's writes since the last call.
    fn new_writes(&mut self) -> Vec<AuditWrite> {
        let mut buf = String::new();
        let _ = self.file.read_to_string(&mut buf);
        self.partial.push_str(&buf);
        let mut out = Vec::new();
        let complete = match self.partial.rfind('\n') {
            Some(i) => i + 1,
            None => return out,
        };
        let lines: String = self.partial.drain(..complete).collect();
        for line in lines.lines() {
            if !line.contains(&self.user) {
                continue;
            }
            let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if e["stage"] != "ResponseComplete" || e["user"]["username"] != self.user.as_str() {
                continue;
            }
            let at = e["stageTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .map(|t| t.as_microsecond() as f64 / 1e6)
                .unwrap_or(0.0);
            let o = &e["objectRef"];
            let s = |v: &serde_json::Value| v.as_str().unwrap_or("").to_owned();
            out.push(AuditWrite {
                at,
                resource: s(&o["resource"]),
                subresource: s(&o["subresource"]),
                namespace: s(&o["namespace"]),
                name: s(&o["name"]),
            });
        }
        out
    }
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
