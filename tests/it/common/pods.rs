//! Pods of a test workload: real Pod objects (Ready, podIP 127.0.0.1) whose admin port is a
//! real `backpressure-worker` admin server that verifies pushes with a TokenReview against the
//! test control plane, accepting only the operator's ServiceAccount and only tokens for its own
//! target (audience `backpressure.dev/<namespace>/<app>`: the app is the workload name).

use std::sync::Arc;

use backpressure_api::wire::{self, WorkerConfig};
use backpressure_envtest::TestEnv;
use backpressure_worker::config::ConfigState;
use backpressure_worker::config::admin::Admin;
use backpressure_worker::config::tls::CertFiles;
use backpressure_worker::config::token::{TokenReviewVerifier, service_account_username};
use backpressure_worker::permits::Gate;
use backpressure_worker::producer::ProducerGate;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::operator::{OPERATOR_NAMESPACE, OPERATOR_SA};

/// A fake worker pod.
pub struct FakePod {
    /// Pod name.
    pub name: String,
    /// The worker library's configuration state (what the pod runs).
    pub state: ConfigState,
    /// The admin server's address (what the Pod's IP and admin port annotation say).
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for FakePod {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl FakePod {
    /// The running config.
    pub fn running(&self) -> WorkerConfig {
        self.state.running()
    }
}

/// Creates a Deployment `name` with `replicas` (nothing runs it: the test observes `/scale`).
pub async fn deployment(client: &kube::Client, ns: &str, name: &str, replicas: i32) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "worker", "image": "worker:test"}]}
            }
        }
    }))
    .unwrap();
    api.create(&PostParams::default(), &d).await.unwrap();
}

/// The replicas of Deployment `name` (`spec.replicas`).
pub async fn replicas(client: &kube::Client, ns: &str, name: &str) -> i32 {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    api.get(name)
        .await
        .unwrap()
        .spec
        .unwrap()
        .replicas
        .unwrap_or(0)
}

/// Starts a fake pod of `app` in `ns`: a worker admin server on loopback and a Ready Pod.
pub async fn start(env: &'static TestEnv, ns: &str, app: &str, index: usize) -> FakePod {
    start_with(env, ns, app, index, None).await
}

/// A certificate and key (PEM) for a pod's HTTPS admin port.
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: String,
    /// The private key.
    pub key: String,
}

/// Starts a fake pod of `app` in `ns` whose admin port serves HTTPS with `tls` and is
/// annotated `backpressure.dev/admin-scheme: https`.
pub async fn start_tls(
    env: &'static TestEnv,
    ns: &str,
    app: &str,
    index: usize,
    tls: &TlsFiles,
) -> FakePod {
    start_with(env, ns, app, index, Some(tls)).await
}

async fn start_with(
    env: &'static TestEnv,
    ns: &str,
    app: &str,
    index: usize,
    tls: Option<&TlsFiles>,
) -> FakePod {
    let client = env.client().unwrap();
    let initial = WorkerConfig::default();
    let gate = Gate::new(backpressure_worker::controller::from_config(
        &initial,
        index as u64,
    ));
    let state = ConfigState::new(gate, initial, None);
    let verifier = Arc::new(TokenReviewVerifier::new(client.clone(), ns, app));
    let admin = Arc::new(Admin::new(state.clone(), None).with_verifier(
        verifier,
        [service_account_username(OPERATOR_NAMESPACE, OPERATOR_SA)],
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let port = addr.port();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let stopped = async move {
        let _ = rx.await;
    };
    let name = format!("{app}-{index}");
    let mut annotations = vec![(wire::ADMIN_PORT_ANNOTATION, port.to_string())];
    match tls {
        None => {
            tokio::spawn(admin.serve(listener, stopped));
        }
        Some(files) => {
            let dir = env
                .dir()
                .join(format!("tls-{name}-{}", backpressure_envtest::unique()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("tls.crt"), &files.cert).unwrap();
            std::fs::write(dir.join("tls.key"), &files.key).unwrap();
            let certs = CertFiles::load(dir.join("tls.crt"), dir.join("tls.key")).unwrap();
            let config = backpressure_worker::config::tls::server_config(certs).unwrap();
            tokio::spawn(admin.serve_tls(listener, config, stopped));
            annotations.push((wire::ADMIN_SCHEME_ANNOTATION, "https".into()));
        }
    }
    create_ready_annotated(&client, ns, app, &name, &annotations).await;
    FakePod {
        name,
        state,
        addr,
        stop: Some(tx),
    }
}

/// Starts `count` fake pods of `app` in `ns` (named `<app>-<i>`), one after the other.
pub async fn start_many(env: &'static TestEnv, ns: &str, app: &str, count: usize) -> Vec<FakePod> {
    let mut out = Vec::new();
    for i in 0..count {
        out.push(start(env, ns, app, i).await);
    }
    out
}

/// Creates a Ready Pod `name` of `app` in `ns` (podIP 127.0.0.1) whose admin port annotation
/// says `port`.
pub async fn create_ready(client: &kube::Client, ns: &str, app: &str, name: &str, port: u16) {
    let annotations = [(wire::ADMIN_PORT_ANNOTATION, port.to_string())];
    create_ready_annotated(client, ns, app, name, &annotations).await;
}

/// Creates a Ready Pod `name` of `app` in `ns` (podIP 127.0.0.1) with `annotations`.
pub async fn create_ready_annotated(
    client: &kube::Client,
    ns: &str,
    app: &str,
    name: &str,
    annotations: &[(&str, String)],
) {
    let annotations: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"app": app},
            "annotations": annotations,
        },
        "spec": {"containers": [{"name": "worker", "image": "worker:test"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    set_ready(&pods, name, true).await;
}

/// Sets the pod's Ready condition (and podIP 127.0.0.1).
pub async fn set_ready(pods: &Api<Pod>, name: &str, ready: bool) {
    let status = json!({
        "status": {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        }
    });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// A fake producer pod: the worker library's producer admin endpoint (`/v1/producer` only) in
/// front of a real [`ProducerGate`], verifying pushes with a TokenReview for the producer
/// workload's own audience.
pub struct FakeProducer {
    /// Pod name.
    pub name: String,
    /// The gate the producer code would call `admit()` on.
    pub gate: ProducerGate,
    /// The admin server's address.
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for FakeProducer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

/// Starts `count` fake producer pods of `app` in `ns` (named `<app>-<i>`).
pub async fn start_producers(
    env: &'static TestEnv,
    ns: &str,
    app: &str,
    count: usize,
) -> Vec<FakeProducer> {
    let client = env.client().unwrap();
    let mut out = Vec::new();
    for index in 0..count {
        let gate = ProducerGate::new(None);
        let verifier = Arc::new(TokenReviewVerifier::new(client.clone(), ns, app));
        let admin = Arc::new(Admin::for_producer(gate.clone(), None).with_verifier(
            verifier,
            [service_account_username(OPERATOR_NAMESPACE, OPERATOR_SA)],
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(admin.serve(listener, async move {
            let _ = rx.await;
        }));
        let name = format!("{app}-{index}");
        create_ready(&client, ns, app, &name, addr.port()).await;
        out.push(FakeProducer {
            name,
            gate,
            addr,
            stop: Some(tx),
        });
    }
    out
}
