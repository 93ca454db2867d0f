//! A kubelet stand-in: it registers a Node, binds the lab's pods (workers, and producers in the
//! scenarios that run them as pods) to it, runs one real process per pod on its own loopback
//! address 127.0.0.N, reports the pod Running and
//! Ready (with its podIP) through the API after a startup delay, and stops the process when the
//! pod is deleted.
//!
//! Deletion is graceful as in a cluster: the ReplicaSet controller sets `deletionTimestamp`;
//! the stand-in stops the process (SIGTERM, then SIGKILL) and then deletes the pod object with
//! grace period 0.

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backpressure_envtest::Supervised;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Binding, Node, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use tokio::task::JoinHandle;

/// Label that marks the pods this stand-in runs; its value is the pod's role.
pub const POD_LABEL: &str = "backpressure.dev/lab";
/// Value of [`POD_LABEL`] on worker pods (the only ones Prometheus scrapes).
pub const POD_LABEL_VALUE: &str = "worker";
/// Value of [`POD_LABEL`] on producer pods.
pub const PRODUCER_LABEL_VALUE: &str = "producer";

/// Addresses 127.0.0.2 ..= 127.0.0.254, lowest free first, reused after release.
#[derive(Debug, Default)]
pub struct IpPool {
    used: BTreeSet<u8>,
}

impl IpPool {
    /// Takes the lowest free address.
    pub fn allocate(&mut self) -> Option<Ipv4Addr> {
        self.allocate_where(|_| true)
    }

    /// Takes the lowest free address on which `port` can be bound right now (another lab or
    /// test on the same machine may hold some of 127.0.0.N).
    pub fn allocate_bindable(&mut self, port: u16) -> Option<Ipv4Addr> {
        self.allocate_where(|ip| std::net::TcpListener::bind((ip, port)).is_ok())
    }

    fn allocate_where(&mut self, ok: impl Fn(Ipv4Addr) -> bool) -> Option<Ipv4Addr> {
        let n = (2u8..=254).find(|n| !self.used.contains(n) && ok(Ipv4Addr::new(127, 0, 0, *n)))?;
        self.used.insert(n);
        Some(Ipv4Addr::new(127, 0, 0, n))
    }

    /// Gives an address back.
    pub fn release(&mut self, ip: Ipv4Addr) {
        self.used.remove(&ip.octets()[3]);
    }

    /// Addresses in use.
    pub fn in_use(&self) -> usize {
        self.used.len()
    }
}

/// What to run for a pod.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its log file.
    pub log: PathBuf,
    /// Port on the pod's address that must accept connections before the pod is Ready.
    pub ready_port: u16,
}

/// Decides what to run for a pod: (namespace, pod name, role (the [`POD_LABEL`] value),
/// address) → launch, or None to leave the pod pending. On a real node the lab calls it once
/// per Deployment with the downward API's placeholders ([`crate::pods::POD_NAME`],
/// [`crate::pods::POD_IP`]) for the pod's name and address.
pub type Launcher = Arc<dyn Fn(&str, &str, &str, &str) -> Option<Launch> + Send + Sync>;

struct Running {
    ip: Ipv4Addr,
    process: Option<Supervised>,
    stopping: bool,
    launch: Launch,
    restarts: u32,
}

struct State {
    client: kube::Client,
    node: String,
    startup_delay: Duration,
    launcher: Launcher,
    ips: Mutex<IpPool>,
    pods: Mutex<HashMap<String, Running>>,
}

/// The running stand-in.
pub struct Kubelet {
    state: Arc<State>,
    task: JoinHandle<()>,
    restarter: JoinHandle<()>,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("node", &self.state.node)
            .finish()
    }
}

/// A kubelet error.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The API server refused something.
    #[error("kube: {0}")]
    Kube(#[from] kube::Error),
}

impl Kubelet {
    /// Registers the node `node` and starts watching pods labelled [`POD_LABEL`] in every
    /// namespace.
    pub async fn start(
        client: kube::Client,
        node: &str,
        startup_delay: Duration,
        launcher: Launcher,
    ) -> Result<Self, KubeletError> {
        register_node(&client, node).await?;
        let state = Arc::new(State {
            client,
            node: node.to_owned(),
            startup_delay,
            launcher,
            ips: Mutex::new(IpPool::default()),
            pods: Mutex::new(HashMap::new()),
        });
        let s = state.clone();
        let task = tokio::spawn(async move { watch_pods(s).await });
        let s = state.clone();
        let restarter = tokio::spawn(async move { restart_crashed(s).await });
        Ok(Self {
            state,
            task,
            restarter,
        })
    }

    /// Worker processes restarted after they exited on their own.
    pub fn restarts(&self) -> u32 {
        self.state
            .pods
            .lock()
            .map(|p| p.values().map(|r| r.restarts).sum())
            .unwrap_or(0)
    }

    /// Worker processes running now.
    pub fn running(&self) -> usize {
        self.state.pods.lock().map(|p| p.len()).unwrap_or(0)
    }

    /// Stops watching and stops every worker process.
    pub async fn shutdown(self) {
        self.task.abort();
        self.restarter.abort();
        let procs: Vec<Supervised> = match self.state.pods.lock() {
            Ok(mut pods) => pods.drain().filter_map(|(_, r)| r.process).collect(),
            Err(_) => Vec::new(),
        };
        let stops: Vec<_> = procs
            .into_iter()
            .map(|mut p| tokio::task::spawn_blocking(move || p.stop()))
            .collect();
        for s in stops {
            let _ = s.await;
        }
    }
}

impl Drop for Kubelet {
    /// Without [`Kubelet::shutdown`] (an error path): the tasks end, and the worker processes
    /// stop when the last reference to them goes (each also stops when this process exits).
    fn drop(&mut self) {
        self.task.abort();
        self.restarter.abort();
    }
}

async fn register_node(client: &kube::Client, name: &str) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "backpressure.dev/lab": "node"}},
        "spec": {},
    }))
    .map_err(kube::Error::SerdeError)?;
    if nodes.get_opt(name).await?.is_none() {
        nodes.create(&PostParams::default(), &node).await?;
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let status = serde_json::json!({"status": {
        "capacity": {"cpu": "64", "memory": "256Gi", "pods": "250"},
        "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "250"},
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "backpressure-lab kubelet stand-in", "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "backpressure-lab",
                     "containerRuntimeVersion": "process://", "kubeletVersion": backpressure_envtest::KUBERNETES_VERSION,
                     "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

async fn watch_pods(state: Arc<State>) {
    let pods: Api<Pod> = Api::all(state.client.clone());
    let cfg = watcher::Config::default().labels(&format!(
        "{POD_LABEL} in ({POD_LABEL_VALUE},{PRODUCER_LABEL_VALUE})"
    ));
    let mut stream = watcher(pods, cfg).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                on_pod(&state, pod).await;
            }
            Ok(watcher::Event::Delete(pod)) => {
                let key = key(&pod);
                let running = state.pods.lock().ok().and_then(|mut p| p.remove(&key));
                if let Some(r) = running {
                    stop_process(&state, r).await;
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "kubelet: pod watch error");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

async fn on_pod(state: &Arc<State>, pod: Pod) {
    let (Some(ns), Some(name)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone()) else {
        return;
    };
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let k = key(&pod);
    if deleting {
        let running = state.pods.lock().ok().and_then(|mut p| {
            let r = p.get_mut(&k)?;
            if r.stopping {
                None
            } else {
                r.stopping = true;
                p.remove(&k)
            }
        });
        let st = state.clone();
        tokio::spawn(async move {
            if let Some(r) = running {
                stop_process(&st, r).await;
            }
            let api: Api<Pod> = Api::namespaced(st.client.clone(), &ns);
            let _ = api
                .delete(&name, &DeleteParams::default().grace_period(0))
                .await;
        });
        return;
    }
    match node {
        None => {
            let api: Api<Pod> = Api::namespaced(state.client.clone(), &ns);
            let binding = Binding {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(ns.clone()),
                    ..ObjectMeta::default()
                },
                target: ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(state.node.clone()),
                    ..ObjectReference::default()
                },
            };
            if let Err(e) = api
                .create_subresource::<Binding, serde_json::Value>(
                    "binding",
                    &name,
                    &PostParams::default(),
                    &binding,
                )
                .await
            {
                tracing::debug!(pod = %k, error = %e, "kubelet: bind failed (will see the pod again)");
            }
        }
        Some(n) if n == state.node => {
            let started = state
                .pods
                .lock()
                .map(|p| p.contains_key(&k))
                .unwrap_or(true);
            if !started {
                let role = pod
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(POD_LABEL))
                    .map(String::as_str)
                    .unwrap_or(POD_LABEL_VALUE);
                start_pod(state, &ns, &name, role, &k).await;
            }
        }
        Some(_) => {}
    }
}

async fn start_pod(state: &Arc<State>, ns: &str, name: &str, role: &str, k: &str) {
    let port = backpressure_api::wire::DEFAULT_ADMIN_PORT;
    let Some(ip) = state
        .ips
        .lock()
        .ok()
        .and_then(|mut p| p.allocate_bindable(port))
    else {
        tracing::warn!(pod = %k, "kubelet: no free loopback address");
        return;
    };
    let Some(launch) = (state.launcher)(ns, name, role, &ip.to_string()) else {
        if let Ok(mut p) = state.ips.lock() {
            p.release(ip);
        }
        return;
    };
    let process = match spawn(name, &launch) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(pod = %k, error = %e, "kubelet: cannot start the worker");
            if let Ok(mut p) = state.ips.lock() {
                p.release(ip);
            }
            return;
        }
    };
    if let Ok(mut pods) = state.pods.lock() {
        pods.insert(
            k.to_owned(),
            Running {
                ip,
                process: Some(process),
                stopping: false,
                launch: launch.clone(),
                restarts: 0,
            },
        );
    }
    let st = state.clone();
    let (ns, name, k) = (ns.to_owned(), name.to_owned(), k.to_owned());
    let started_at = Time(k8s_openapi::jiff::Timestamp::now());
    tokio::spawn(async move {
        tokio::time::sleep(st.startup_delay).await;
        let addr = std::net::SocketAddr::from((ip, launch.ready_port));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            let alive = st.pods.lock().map(|p| p.contains_key(&k)).unwrap_or(false);
            if !alive || tokio::time::Instant::now() > deadline {
                tracing::warn!(pod = %k, "kubelet: worker not listening; pod stays unready");
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let still_ours = st
            .pods
            .lock()
            .map(|p| p.get(&k).is_some_and(|r| !r.stopping))
            .unwrap_or(false);
        if !still_ours {
            return;
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let ready =
            |t: &str| serde_json::json!({"type": t, "status": "True", "lastTransitionTime": now});
        let status = serde_json::json!({"status": {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": ip.to_string(),
            "podIPs": [{"ip": ip.to_string()}],
            "startTime": started_at,
            "conditions": [ready("PodScheduled"), ready("Initialized"), ready("ContainersReady"), ready("Ready")],
            "containerStatuses": [{
                "name": "worker", "ready": true, "started": true, "restartCount": 0,
                "image": "backpressure-lab/worker", "imageID": "",
                "state": {"running": {"startedAt": started_at}}
            }]
        }});
        let api: Api<Pod> = Api::namespaced(st.client.clone(), &ns);
        if let Err(e) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            tracing::debug!(pod = %k, error = %e, "kubelet: status update failed");
        }
    });
}

fn spawn(name: &str, launch: &Launch) -> Result<Supervised, backpressure_envtest::Error> {
    Supervised::spawn(name, &launch.program, &launch.args, &launch.log)
}

/// Restarts worker processes that exited on their own (as a kubelet restarts a container) and
/// reports the restart count in the pod status.
async fn restart_crashed(state: Arc<State>) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut restarted = Vec::new();
        if let Ok(mut pods) = state.pods.lock() {
            for (key, r) in pods.iter_mut() {
                let dead = !r.stopping && r.process.as_mut().is_some_and(|p| !p.is_running());
                if !dead {
                    continue;
                }
                let name = key.rsplit('/').next().unwrap_or(key).to_owned();
                tracing::warn!(pod = %key, "kubelet: worker exited; restarting it");
                r.process = spawn(&name, &r.launch).ok();
                r.restarts += 1;
                restarted.push((key.clone(), r.restarts));
            }
        }
        for (key, restarts) in restarted {
            let Some((ns, name)) = key.split_once('/') else {
                continue;
            };
            let api: Api<Pod> = Api::namespaced(state.client.clone(), ns);
            let patch = serde_json::json!({"status": {"containerStatuses": [{
                "name": "worker", "ready": true, "started": true, "restartCount": restarts,
                "image": "backpressure-lab/worker", "imageID": "",
                "state": {"running": {"startedAt": Time(k8s_openapi::jiff::Timestamp::now())}}
            }]}});
            let _ = api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
        }
    }
}

async fn stop_process(state: &Arc<State>, mut running: Running) {
    if let Some(mut p) = running.process.take() {
        let _ = tokio::task::spawn_blocking(move || p.stop()).await;
    }
    if let Ok(mut ips) = state.ips.lock() {
        ips.release(running.ip);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn ip_pool_reuses_lowest_free() {
        let mut p = IpPool::default();
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        let c = p.allocate().unwrap();
        assert_eq!(
            (a, b, c),
            (
                Ipv4Addr::new(127, 0, 0, 2),
                Ipv4Addr::new(127, 0, 0, 3),
                Ipv4Addr::new(127, 0, 0, 4)
            )
        );
        p.release(b);
        assert_eq!(p.allocate().unwrap(), b);
        assert_eq!(p.in_use(), 3);
        // An address whose port is taken by someone else is skipped.
        let taken = std::net::TcpListener::bind((Ipv4Addr::new(127, 0, 0, 5), 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        assert_eq!(
            p.allocate_bindable(port).unwrap(),
            Ipv4Addr::new(127, 0, 0, 6)
        );
        for _ in 0..250 {
            p.allocate();
        }
        assert_eq!(p.in_use(), 253);
        assert!(p.allocate().is_none());
    }
}
