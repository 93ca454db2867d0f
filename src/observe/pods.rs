//! The cluster's pods as the operator keeps them: a compact cache fed by one pod watch.
//!
//! At 50,000 pods a cache of `k8s_openapi` Pods costs ~3.5 KiB per pod even with every field
//! the operator does not read removed (the struct has hundreds of optional fields, and each
//! kept string is its own allocation), which put the operator at 344 MiB at 10,000 objects
//! (docs/scale.md). Here the watch deserializes [`WorkerPod`], which names only the fields the
//! operator reads (serde skips the rest of each object while parsing, so a list page never
//! holds whole pods either), and the cache keeps one [`Entry`] per pod, grouped by namespace,
//! with the label sets interned: the pods of one ReplicaSet share a single copy of their labels.
//!
//! A reconcile asks for the pods of one namespace matching the target's selector
//! ([`PodCache::pods_of`]): one pass over that namespace's pods, never over the cluster's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use backpressure_api::wire;
use backpressure_core::selector::Selector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::watcher;
use serde::{Deserialize, Serialize};

/// A Pod as the operator reads it: metadata, the ports of each container, the Ready condition
/// and the IP. Deserializing the API server's Pod JSON into it skips everything else.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct WorkerPod {
    /// The pod's metadata (its managed fields are dropped with the object after [`Entry::new`]).
    pub metadata: ObjectMeta,
    /// The containers' ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<WorkerPodSpec>,
    /// Conditions and IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<WorkerPodStatus>,
}

/// `spec` of a [`WorkerPod`].
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct WorkerPodSpec {
    /// `spec.containers`.
    #[serde(default)]
    pub containers: Vec<WorkerContainer>,
}

/// A container of a [`WorkerPod`]: its ports.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct WorkerContainer {
    /// `ports`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<WorkerPort>>,
}

/// A container port: its name and number.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPort {
    /// `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `containerPort`.
    #[serde(default)]
    pub container_port: i32,
}

/// `status` of a [`WorkerPod`].
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerPodStatus {
    /// `conditions`: only `type` and `status` are read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<WorkerPodCondition>>,
    /// `podIP`.
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
}

/// A pod condition's type and status.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct WorkerPodCondition {
    /// `type`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `status`.
    #[serde(default)]
    pub status: String,
}

impl k8s_openapi::Resource for WorkerPod {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Pod";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "pods";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for WorkerPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A pod of the target as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// Ready condition is True and the pod is not being deleted.
    pub ready: bool,
    /// Pod IP.
    pub ip: Option<String>,
    /// Admin port: the annotation, the container port named `bp-admin`, or the default.
    pub admin_port: u16,
    /// The admin port speaks HTTPS (annotation `backpressure.dev/admin-scheme: https`).
    pub tls: bool,
}

type Labels = BTreeMap<String, String>;

/// What the cache keeps of one pod (its name and namespace are the keys it is stored under).
#[derive(Debug, Clone)]
struct Entry {
    uid: Box<str>,
    labels: Arc<Labels>,
    ip: Option<Box<str>>,
    admin_port: u16,
    ready: bool,
    tls: bool,
}

impl Entry {
    /// The entry of `pod` (its labels not yet interned), or `None` without a name.
    fn new(pod: WorkerPod) -> Option<(Box<str>, Box<str>, Entry)> {
        let WorkerPod {
            metadata: m,
            spec,
            status,
        } = pod;
        let name = m.name?.into_boxed_str();
        let namespace = m.namespace.unwrap_or_default().into_boxed_str();
        let ready = m.deletion_timestamp.is_none()
            && status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let ip = status
            .and_then(|s| s.pod_ip)
            .filter(|ip| !ip.is_empty())
            .map(String::into_boxed_str);
        let named = spec.and_then(|s| {
            s.containers
                .into_iter()
                .flat_map(|c| c.ports.into_iter().flatten())
                .find_map(|p| {
                    (p.name.as_deref() == Some(wire::ADMIN_PORT_NAME)).then_some(p.container_port)
                })
        });
        let annotations = m.annotations.unwrap_or_default();
        let annotated = annotations
            .get(wire::ADMIN_PORT_ANNOTATION)
            .and_then(|v| v.parse::<u16>().ok());
        let admin_port = annotated
            .or_else(|| named.and_then(|p| u16::try_from(p).ok()))
            .unwrap_or(wire::DEFAULT_ADMIN_PORT);
        let tls = annotations
            .get(wire::ADMIN_SCHEME_ANNOTATION)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
        let entry = Entry {
            uid: m.uid.unwrap_or_default().into_boxed_str(),
            labels: Arc::new(m.labels.unwrap_or_default()),
            ip,
            admin_port,
            ready,
            tls,
        };
        Some((namespace, name, entry))
    }

    fn info(&self, name: &str) -> PodInfo {
        PodInfo {
            name: name.to_owned(),
            uid: self.uid.to_string(),
            ready: self.ready,
            ip: self.ip.as_deref().map(str::to_owned),
            admin_port: self.admin_port,
            tls: self.tls,
        }
    }
}

/// Pods by namespace, then by name.
type Pods = HashMap<Box<str>, HashMap<Box<str>, Entry>>;

#[derive(Debug, Default)]
struct State {
    live: Pods,
    /// The objects of a relist in progress (between `Init` and `InitDone`).
    relist: Option<Pods>,
    /// Every label set in use, shared by the entries that carry it.
    labels: HashSet<Arc<Labels>>,
    /// Whether a first list completed.
    ready: bool,
}

impl State {
    fn intern(&mut self, labels: Arc<Labels>) -> Arc<Labels> {
        if let Some(known) = self.labels.get(&labels) {
            return known.clone();
        }
        self.labels.insert(labels.clone());
        labels
    }

    fn insert(&mut self, into_relist: bool, pod: WorkerPod) {
        let Some((ns, name, mut entry)) = Entry::new(pod) else {
            return;
        };
        entry.labels = self.intern(entry.labels);
        let pods = match (into_relist, self.relist.as_mut()) {
            (true, Some(relist)) => relist,
            _ => &mut self.live,
        };
        let old = pods.entry(ns).or_default().insert(name, entry);
        if let Some(old) = old {
            self.release(old.labels);
        }
    }

    fn remove(&mut self, pod: &WorkerPod) {
        let (Some(name), ns) = (
            pod.metadata.name.as_deref(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
        ) else {
            return;
        };
        let Some(in_ns) = self.live.get_mut(ns) else {
            return;
        };
        let old = in_ns.remove(name);
        if in_ns.is_empty() {
            self.live.remove(ns);
        }
        if let Some(old) = old {
            self.release(old.labels);
        }
    }

    /// Forgets a label set no entry carries any more (the interner's copy and `labels` are
    /// the last two).
    fn release(&mut self, labels: Arc<Labels>) {
        if Arc::strong_count(&labels) <= 2 {
            self.labels.remove(&labels);
        }
    }
}

/// The cluster's pods, fed by [`PodCache::apply`] with the events of a watch of
/// [`WorkerPod`]s.
#[derive(Debug)]
pub struct PodCache {
    state: RwLock<State>,
    ready: tokio::sync::watch::Sender<bool>,
}

impl Default for PodCache {
    fn default() -> Self {
        Self {
            state: RwLock::default(),
            ready: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl PodCache {
    fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies one watch event. A relist (`Init` … `InitDone`) is collected aside and replaces
    /// the cache at once, so a reconcile never sees half a list.
    pub fn apply(&self, event: watcher::Event<WorkerPod>) {
        let mut s = self.write();
        match event {
            watcher::Event::Apply(pod) => s.insert(false, pod),
            watcher::Event::Delete(pod) => s.remove(&pod),
            watcher::Event::Init => s.relist = Some(Pods::new()),
            watcher::Event::InitApply(pod) => s.insert(true, pod),
            watcher::Event::InitDone => {
                if let Some(relist) = s.relist.take() {
                    s.live = relist;
                    s.labels.retain(|l| Arc::strong_count(l) > 1);
                }
                s.ready = true;
                drop(s);
                self.ready.send_replace(true);
            }
        }
    }

    /// Waits until a first list was applied.
    pub async fn wait_until_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|ready| *ready).await;
    }

    /// The pods of `namespace` that `selector` matches, by name.
    ///
    /// The selector is matched once per label set, not once per pod: the pods of a ReplicaSet
    /// share one (interned), and a namespace holds the pods of many workloads.
    pub fn pods_of(&self, namespace: &str, selector: &Selector) -> Vec<PodInfo> {
        let s = self.read();
        let mut matched: HashMap<*const Labels, bool> = HashMap::new();
        let mut out: Vec<PodInfo> = s
            .live
            .get(namespace)
            .into_iter()
            .flatten()
            .filter(|(_, e)| {
                *matched
                    .entry(Arc::as_ptr(&e.labels))
                    .or_insert_with(|| selector.matches(&e.labels))
            })
            .map(|(name, e)| e.info(name))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The UIDs of every cached pod.
    pub fn uids(&self) -> HashSet<String> {
        let s = self.read();
        s.live
            .values()
            .flat_map(HashMap::values)
            .map(|e| e.uid.to_string())
            .collect()
    }

    /// The pods of `namespace` as name-only objects (the deletes of a scoped watch's relist,
    /// [`super::scope::watch`]).
    pub fn tombstones(&self, namespace: &str) -> Vec<WorkerPod> {
        let s = self.read();
        s.live
            .get(namespace)
            .into_iter()
            .flat_map(HashMap::keys)
            .map(|name| WorkerPod {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    namespace: Some(namespace.to_owned()),
                    ..ObjectMeta::default()
                },
                ..WorkerPod::default()
            })
            .collect()
    }

    /// Number of pods and of distinct label sets cached.
    pub fn len(&self) -> (usize, usize) {
        let s = self.read();
        (s.live.values().map(HashMap::len).sum(), s.labels.len())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    /// A running worker pod as the API server returns it, with `ports` on its worker container.
    fn running_pod(
        annotations: serde_json::Value,
        ports: serde_json::Value,
        ready: &str,
    ) -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "w-7d9f8c6b5-x2x9k", "namespace": "team-a", "uid": "u-1",
                "generateName": "w-7d9f8c6b5-", "resourceVersion": "42",
                "labels": {"app": "w", "pod-template-hash": "7d9f8c6b5"},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "w-7d9f8c6b5", "uid": "rs-1", "controller": true}],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update"}],
            },
            "spec": {
                "containers": [
                    {"name": "worker", "image": "worker:1", "args": ["--queue", "jobs"],
                     "env": [{"name": "QUEUE", "value": "jobs"}], "ports": ports,
                     "resources": {"limits": {"memory": "256Mi"}}},
                    {"name": "sidecar", "image": "proxy:1",
                     "ports": [{"name": "http", "containerPort": 15001}]},
                ],
                "volumes": [{"name": "t", "projected": {"sources": []}}],
                "nodeName": "node-1",
            },
            "status": {
                "phase": "Running", "podIP": "10.0.0.7", "hostIP": "192.168.0.1",
                "podIPs": [{"ip": "10.0.0.7"}], "qosClass": "Burstable",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Initialized", "status": "True"},
                    {"type": "ContainersReady", "status": ready},
                    {"type": "Ready", "status": ready},
                ],
                "containerStatuses": [{"name": "worker", "ready": true, "restartCount": 0,
                    "image": "worker:1", "imageID": "sha256:0123", "containerID": "containerd://abc",
                    "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}}],
            },
        })
    }

    fn read(v: serde_json::Value) -> WorkerPod {
        serde_json::from_value(v).unwrap()
    }

    fn cache_of(pods: impl IntoIterator<Item = serde_json::Value>) -> PodCache {
        let cache = PodCache::default();
        cache.apply(watcher::Event::Init);
        for p in pods {
            cache.apply(watcher::Event::InitApply(read(p)));
        }
        cache.apply(watcher::Event::InitDone);
        cache
    }

    fn all() -> Selector {
        Selector::parse("app=w").unwrap()
    }

    #[test]
    fn a_whole_pod_reads_as_the_operator_needs_it() {
        let info = |annotations, ports, ready| {
            let c = cache_of([running_pod(annotations, ports, ready)]);
            let mut pods = c.pods_of("team-a", &all());
            assert_eq!(pods.len(), 1);
            pods.remove(0)
        };
        let named = info(
            json!({"prometheus.io/scrape": "true"}),
            json!([{"name": "bp-admin", "containerPort": 9191}]),
            "True",
        );
        assert_eq!(
            named,
            PodInfo {
                name: "w-7d9f8c6b5-x2x9k".into(),
                uid: "u-1".into(),
                ready: true,
                ip: Some("10.0.0.7".into()),
                admin_port: 9191,
                tls: false,
            }
        );
        // The annotation wins over the named port; the scheme annotation turns on TLS.
        let annotated = info(
            json!({wire::ADMIN_PORT_ANNOTATION.to_owned(): "9300",
                   wire::ADMIN_SCHEME_ANNOTATION.to_owned(): " HTTPS", "other": "x"}),
            json!([{"name": "bp-admin", "containerPort": 9191}]),
            "True",
        );
        assert_eq!((annotated.admin_port, annotated.tls), (9300, true));
        // No admin port anywhere: the default. Not Ready: not ready.
        let plain = info(
            json!({}),
            json!([{"name": "metrics", "containerPort": 8080}]),
            "False",
        );
        assert_eq!(
            (plain.admin_port, plain.ready),
            (wire::DEFAULT_ADMIN_PORT, false)
        );
        // Being deleted is not ready; an empty IP is no IP.
        let mut deleting = running_pod(json!({}), json!([]), "True");
        deleting["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
        deleting["status"]["podIP"] = json!("");
        let c = cache_of([deleting]);
        let p = &c.pods_of("team-a", &all())[0];
        assert!(!p.ready && p.ip.is_none());
        // A pod with neither spec nor status (as a fresh one may be) still counts.
        let c = cache_of([json!({"metadata": {"name": "p", "namespace": "team-a",
            "labels": {"app": "w"}}})]);
        assert_eq!(c.pods_of("team-a", &all()).len(), 1);
    }

    #[test]
    fn pods_are_found_by_namespace_and_selector_and_follow_the_watch() {
        let pod = |ns: &str, name: &str, app: &str| {
            json!({"metadata": {"name": name, "namespace": ns, "uid": format!("{ns}/{name}"),
                "labels": {"app": app, "pod-template-hash": "1"}},
                "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}})
        };
        let c = cache_of([
            pod("a", "w-2", "w"),
            pod("a", "w-1", "w"),
            pod("a", "x-1", "x"),
            pod("b", "w-1", "w"),
        ]);
        let names = |ns: &str, sel: &str| -> Vec<String> {
            c.pods_of(ns, &Selector::parse(sel).unwrap())
                .into_iter()
                .map(|p| p.name)
                .collect()
        };
        assert_eq!(names("a", "app=w"), ["w-1", "w-2"]);
        assert_eq!(names("a", "app in (w,x)"), ["w-1", "w-2", "x-1"]);
        assert_eq!(names("b", "app=w"), ["w-1"]);
        assert!(names("c", "app=w").is_empty());
        // Two label sets in use ({app: w}, {app: x}), shared by the four pods.
        assert_eq!(c.len(), (4, 2));

        c.apply(watcher::Event::Apply(read(pod("a", "w-3", "w"))));
        assert_eq!(names("a", "app=w"), ["w-1", "w-2", "w-3"]);
        // Relabelled: it moves from one selector to the other.
        c.apply(watcher::Event::Apply(read(pod("a", "w-3", "x"))));
        assert_eq!(names("a", "app=x"), ["w-3", "x-1"]);
        c.apply(watcher::Event::Delete(read(pod("a", "x-1", "x"))));
        c.apply(watcher::Event::Delete(read(pod("a", "w-3", "x"))));
        assert_eq!(names("a", "app=x"), Vec::<String>::new());
        // The label set no pod carries any more is forgotten.
        assert_eq!(c.len(), (3, 1));
        assert_eq!(
            c.uids(),
            ["a/w-1", "a/w-2", "b/w-1"].map(String::from).into()
        );

        // A relist replaces the cache only when it is complete.
        c.apply(watcher::Event::Init);
        c.apply(watcher::Event::InitApply(read(pod("b", "w-9", "w"))));
        assert_eq!(names("a", "app=w"), ["w-1", "w-2"]);
        c.apply(watcher::Event::InitDone);
        assert!(names("a", "app=w").is_empty());
        assert_eq!(names("b", "app=w"), ["w-9"]);
        assert_eq!(c.len(), (1, 1));
    }

    #[tokio::test]
    async fn ready_after_the_first_list() {
        let c = Arc::new(PodCache::default());
        let waiter = tokio::spawn({
            let c = c.clone();
            async move { c.wait_until_ready().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        c.apply(watcher::Event::Init);
        c.apply(watcher::Event::InitDone);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        // A second waiter returns at once.
        c.wait_until_ready().await;
    }
}
