//! The conformance suite (`backpressure-conformance check`) against real workers: each
//! implementation's example worker started as a process that reviews push tokens with the test
//! control plane, with its conformance hook on. And against deliberately broken workers (the
//! Rust worker behind a proxy that breaks one behaviour of the contract): the suite must fail
//! exactly the checks of that behaviour, or the passes above mean nothing.
//!
//! Every run gets a fresh worker: the suite spends three failed authentications per run, and a
//! worker throttles a source after ten (the contract's failure limit).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use backpressure_conformance::suite::{
    self, KubeTokens, Options, Report, ServiceAccountRef, Target,
};
use backpressure_envtest::{Supervised, TestEnv, repo_root, unique};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::common::operator::{OPERATOR_NAMESPACE, OPERATOR_SA};
use crate::common::pods;
use crate::common::serial;
use crate::common::world::{W, World};

/// The identities of one test: the worker's namespace, the operator it accepts, another
/// identity it must refuse, and the worker's own credentials for TokenReview.
struct Identities {
    namespace: String,
    operator: ServiceAccountRef,
    other: ServiceAccountRef,
    reviewer_token_file: PathBuf,
}

async fn service_account(client: &kube::Client, ns: &str, name: &str) -> ServiceAccountRef {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &sa).await.unwrap();
    ServiceAccountRef {
        namespace: ns.to_owned(),
        name: name.to_owned(),
    }
}

/// The worker's own ServiceAccount in `namespace`, allowed to create TokenReviews (as a pod's
/// would be through the chart's worker-tokenreview ClusterRole; system:auth-delegator here):
/// a file with its token, as a pod has one mounted.
async fn reviewer_token(env: &'static TestEnv, namespace: &str) -> PathBuf {
    let client = env.client().unwrap();
    let reviewer = service_account(&client, namespace, "worker").await;
    let crb: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{namespace}-worker-reviews")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:auth-delegator"},
        "subjects": [{"kind": "ServiceAccount", "name": reviewer.name, "namespace": namespace}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &crb)
        .await
        .unwrap();
    let request = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client, namespace)
        .create_token_request(&reviewer.name, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let file = env.dir().join(format!("{namespace}-worker.token"));
    std::fs::write(&file, token).unwrap();
    file
}

async fn identities(env: &'static TestEnv) -> Identities {
    let client = env.client().unwrap();
    let namespace = env.namespace("conformance").await.unwrap();
    let operator = service_account(&client, &namespace, "operator").await;
    let other = service_account(&client, &namespace, "intruder").await;
    let reviewer_token_file = reviewer_token(env, &namespace).await;
    Identities {
        namespace,
        operator,
        other,
        reviewer_token_file,
    }
}

/// An implementation of the worker side whose example worker the suite checks.
#[derive(Debug, Clone, Copy)]
enum Implementation {
    /// `crates/worker/examples/example-worker.rs`.
    Rust,
    /// `sdk/go/examples/worker`.
    Go,
    /// `sdk/typescript/examples/worker.ts`.
    TypeScript,
    /// `sdk/python/examples/example_worker.py`.
    Python,
}

/// The Rust example worker's binary, built now: `cargo test -p backpressure-operator` does not
/// rebuild another package's example, and a stale one would test old code. Built by the
/// workspace's test build, as `make test` builds it first (a no-op there): any other selection
/// (`cargo build -p backpressure-worker --example ...`) unifies features differently, rebuilds
/// the worker and its dependencies (about 90 s in cold CI) and leaves the next workspace build
/// to rebuild them back.
fn rust_example_worker() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    // target/<profile>/deps/it-<hash> → target/<profile>/examples/example-worker
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap().to_owned();
    BUILT.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(repo_root())
            .args(["test", "--workspace", "--locked", "--no-run", "--quiet"])
            .status()
            .unwrap();
        assert!(status.success(), "building the example worker failed");
    });
    profile_dir.join("examples").join("example-worker")
}

/// The Go SDK's example worker, built now (a no-op from Go's cache when it is up to date).
fn go_example_worker() -> PathBuf {
    let dir = repo_root().join("sdk/go");
    let bin = dir.join("build/example-worker");
    {
        let path = format!(
            "{}:/usr/local/go/bin",
            std::env::var("PATH").unwrap_or_default()
        );
        let status = Command::new("go")
            .current_dir(&dir)
            .env("PATH", path)
            .env("GOTOOLCHAIN", "local")
            .args(["build", "-o", "build/example-worker", "./examples/worker"])
            .status()
            .unwrap();
        assert!(status.success(), "building the Go example worker failed");
    }
    bin
}

/// The TypeScript SDK's example worker, compiled now (its packages installed first if
/// `sdk/typescript/test.sh` has not run), and the node that runs it.
fn typescript_example_worker() -> (PathBuf, Vec<String>) {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let dir = repo_root().join("sdk/typescript");
    BUILT.call_once(|| {
        let mut steps = vec![&["run", "build"][..]];
        if !dir.join("node_modules").exists() {
            steps.insert(0, &["ci", "--no-audit", "--no-fund"][..]);
        }
        for args in steps {
            let status = Command::new("npm")
                .current_dir(&dir)
                .args(args)
                .status()
                .unwrap();
            assert!(status.success(), "npm {args:?} in sdk/typescript failed");
        }
    });
    let script = dir.join("build/examples/worker.js");
    (PathBuf::from("node"), vec![script.display().to_string()])
}

/// The Python SDK's example worker and the interpreter of the venv `sdk/python/test.sh` makes
/// (linked as `sdk/python/.venv`).
fn python_example_worker() -> (PathBuf, Vec<String>) {
    let dir = repo_root().join("sdk/python");
    let python = dir.join(".venv/bin/python");
    if !python.exists() {
        let status = Command::new(dir.join("test.sh")).status().unwrap();
        assert!(status.success(), "sdk/python/test.sh failed");
    }
    let script = dir.join("examples/example_worker.py");
    (python, vec![script.display().to_string()])
}

/// A free port on loopback (bound and released: the worker binds it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A worker process serving its admin port on loopback.
struct Worker {
    process: Supervised,
    url: String,
    workload: String,
    port: u16,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.process.stop();
    }
}

async fn start_worker(env: &'static TestEnv, ids: &Identities, what: Implementation) -> Worker {
    start_worker_as(env, ids, &format!("orders-{}", unique()), what).await
}

/// A worker of `workload` (several may share one: the pods of a workload).
async fn start_worker_as(
    env: &'static TestEnv,
    ids: &Identities,
    workload: &str,
    what: Implementation,
) -> Worker {
    let workload = workload.to_owned();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let allowed = format!(
        "system:serviceaccount:{}:{}",
        ids.operator.namespace, ids.operator.name
    );
    let ca = env.pki().ca_file.display().to_string();
    let token = ids.reviewer_token_file.display().to_string();
    let vars = [
        ("BP_WORKLOAD", workload.as_str()),
        ("BP_NAMESPACE", ids.namespace.as_str()),
        ("BP_ADMIN_ADDR", addr.as_str()),
        ("BP_ALLOWED_IDENTITIES", allowed.as_str()),
        ("BP_CONFORMANCE_HOOK", "true"),
        ("BP_KUBE_API_URL", env.server_url()),
        ("BP_KUBE_CA_FILE", ca.as_str()),
        ("BP_KUBE_TOKEN_FILE", token.as_str()),
        // The example's queue: a few messages, then idle until stopped.
        ("BP_MESSAGES", "20"),
        ("BP_DURATION", "0"),
        ("RUST_LOG", "info"),
    ];
    let log = env.dir().join(format!("{workload}-{what:?}-{port}.log"));
    let (program, args): (PathBuf, Vec<String>) = match what {
        Implementation::Rust => (rust_example_worker(), vec![]),
        Implementation::Go => (go_example_worker(), vec![]),
        Implementation::TypeScript => typescript_example_worker(),
        Implementation::Python => python_example_worker(),
    };
    let process = Supervised::spawn_with_env(&workload, &program, &args, &vars, &log).unwrap();
    let mut worker = Worker {
        process,
        url: format!("http://{addr}"),
        workload,
        port,
    };
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http.get(format!("{}/healthz", worker.url)).send().await
            && r.status().is_success()
        {
            return worker;
        }
        assert!(
            worker.process.is_running() && tokio::time::Instant::now() < deadline,
            "{what:?} worker did not come up:\n{}",
            worker.process.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn vectors() -> PathBuf {
    repo_root().join("conformance/vectors/controller.json")
}

/// Runs the suite against `url` (the worker, or a proxy in front of it).
async fn check(env: &'static TestEnv, ids: &Identities, worker: &Worker, url: &str) -> Report {
    let tokens = KubeTokens::new(
        env.client().unwrap(),
        ids.operator.clone(),
        ids.other.clone(),
    );
    let target = Target {
        base_url: url.to_owned(),
        namespace: ids.namespace.clone(),
        workload: worker.workload.clone(),
    };
    let options = Options {
        controller_vectors: Some(vectors()),
        ..Options::default()
    };
    suite::run(&target, &tokens, &options).await.unwrap()
}

async fn passes(what: Implementation) {
    let _serial = serial().await;
    let env = TestEnv::shared();
    let ids = identities(env).await;
    let worker = start_worker(env, &ids, what).await;
    let report = check(env, &ids, &worker, &worker.url).await;
    println!("{what:?} worker:\n{report}");
    assert!(
        report.passed(),
        "{what:?} worker:\n{report}\n{}",
        worker.process.log_tail(40)
    );
    let vectors = report
        .checks
        .iter()
        .filter(|c| c.name.starts_with("controller-vector/"))
        .count();
    assert!(
        vectors >= 25,
        "only {vectors} controller vectors ran:\n{report}"
    );
}

#[tokio::test]
async fn the_rust_worker_passes_the_conformance_suite() {
    passes(Implementation::Rust).await;
}

#[tokio::test]
async fn the_go_sdk_worker_passes_the_conformance_suite() {
    passes(Implementation::Go).await;
}

#[tokio::test]
async fn the_python_sdk_worker_passes_the_conformance_suite() {
    passes(Implementation::Python).await;
}

#[tokio::test]
async fn the_typescript_sdk_worker_passes_the_conformance_suite() {
    passes(Implementation::TypeScript).await;
}

/// One behaviour of the contract broken by a proxy in front of a correct worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Break {
    /// A push of an older generation is taken (200) instead of refused with 409.
    TakesStalePushes,
    /// The controller hook's first `permits` reading is one too many.
    PermitsOffByOne,
    /// The metrics carry another workload's label.
    WrongWorkloadLabel,
}

/// A proxy on loopback in front of `upstream` that breaks `what`; its base URL.
async fn broken_proxy(upstream: String, workload: String, what: Break) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    // A connection per request, as the suite itself does: the worker closes a connection after
    // refusing a body it did not read (413), and a pooled one would fail the next forward.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let ctx = Arc::new((http, upstream, workload));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let ctx = ctx.clone();
                    async move { Ok::<_, Infallible>(forward(&ctx.0, &ctx.1, &ctx.2, what, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

async fn forward(
    http: &reqwest::Client,
    upstream: &str,
    workload: &str,
    what: Break,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let headers = req.headers().clone();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let mut out = http
        .request(method.clone(), format!("{upstream}{path}"))
        .body(body);
    for name in [http::header::AUTHORIZATION, http::header::CONTENT_TYPE] {
        if let Some(v) = headers.get(&name) {
            out = out.header(name, v);
        }
    }
    // A failed forward is a 502 the suite reports, never a panic that hides which check it was.
    let (mut status, mut text) = match out.send().await {
        Ok(resp) => {
            let status = resp.status();
            match resp.text().await {
                Ok(text) => (status, text),
                Err(e) => (http::StatusCode::BAD_GATEWAY, e.to_string()),
            }
        }
        Err(e) => (http::StatusCode::BAD_GATEWAY, e.to_string()),
    };
    match what {
        Break::TakesStalePushes if method == http::Method::PUT && status == 409 => {
            status = http::StatusCode::OK;
            text = http
                .get(format!("{upstream}{path}"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
        }
        Break::PermitsOffByOne if path == suite::HOOK_PATH && status == 200 => {
            let mut v: Value = serde_json::from_str(&text).unwrap();
            if let Some(o) = v["observations"]
                .as_array_mut()
                .unwrap()
                .iter_mut()
                .find(|o| o.get("permits").is_some())
            {
                o["permits"] = json!(o["permits"].as_u64().unwrap() + 1);
            }
            text = v.to_string();
        }
        Break::WrongWorkloadLabel if path == "/metrics" => {
            text = text.replace(
                &format!("workload=\"{workload}\""),
                &format!("workload=\"{workload}-x\""),
            );
        }
        _ => {}
    }
    let mut r = hyper::Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = status;
    r
}

#[tokio::test]
async fn the_suite_fails_a_worker_on_exactly_the_behaviour_it_breaks() {
    let _serial = serial().await;
    let env = TestEnv::shared();
    let ids = identities(env).await;
    for what in [
        Break::TakesStalePushes,
        Break::PermitsOffByOne,
        Break::WrongWorkloadLabel,
    ] {
        let worker = start_worker(env, &ids, Implementation::Rust).await;
        let proxy = broken_proxy(worker.url.clone(), worker.workload.clone(), what).await;
        let report = check(env, &ids, &worker, &proxy).await;
        let failed: Vec<&str> = report.failures().map(|c| c.name.as_str()).collect();
        let expected = |name: &str| match what {
            Break::TakesStalePushes => name == "stale-generation-is-409",
            Break::PermitsOffByOne => name.starts_with("controller-vector/"),
            Break::WrongWorkloadLabel => name == "metrics-names-types-labels",
        };
        assert!(
            !failed.is_empty() && failed.iter().all(|n| expected(n)),
            "{what:?}: failed {failed:?}\n{report}"
        );
    }
}

/// The acceptance of the any-language contract: one workload whose pods run the worker of
/// every implementation, configured by the real operator (its own ServiceAccount, real push
/// tokens, the workers' TokenReviews): every pod takes the push and runs the hash the status
/// reports.
#[tokio::test]
async fn the_operator_configures_workers_of_every_language_with_one_hash() {
    let _serial = serial().await;
    let mut w = World::builder("polyglot").replicas(2).start().await;
    let env = w.scene.env;
    let ids = Identities {
        namespace: w.scene.ns.clone(),
        operator: ServiceAccountRef {
            namespace: OPERATOR_NAMESPACE.to_owned(),
            name: OPERATOR_SA.to_owned(),
        },
        other: ServiceAccountRef {
            namespace: w.scene.ns.clone(),
            name: "unused".to_owned(),
        },
        reviewer_token_file: reviewer_token(env, &w.scene.ns).await,
    };
    let all = [
        Implementation::Rust,
        Implementation::Go,
        Implementation::TypeScript,
        Implementation::Python,
    ];
    let mut workers = Vec::new();
    for (i, what) in all.into_iter().enumerate() {
        let worker = start_worker_as(env, &ids, W, what).await;
        pods::create_ready(
            &w.scene.client,
            &w.scene.ns,
            W,
            &format!("w-{i}"),
            worker.port,
        )
        .await;
        workers.push((what, worker));
    }
    w.apply(json!({"worker": {"setPoint": 0.08, "maxPermits": 6}}))
        .await;
    w.start_operator().await;
    let n = workers.len() as i32;
    let s = w
        .wait_for(Duration::from_secs(60), "every pod in sync", || async {
            let s = w.status().await;
            s.config
                .as_ref()
                .is_some_and(|c| c.pods_in_sync == n && c.pods_total == n)
                .then_some(s)
        })
        .await;
    let hash = s.config.unwrap().hash;
    let http = reqwest::Client::new();
    for (what, worker) in &workers {
        let ack: Value = http
            .get(format!("{}/v1/config", worker.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(ack["hash"], json!(hash), "{what:?} worker runs {ack}");
        let metrics = http
            .get(format!("{}/metrics", worker.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains(&format!("hash=\"{hash}\"")),
            "{what:?} worker does not report hash {hash}:\n{metrics}"
        );
    }
}
