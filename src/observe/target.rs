//! The target through its `/scale` subresource, whatever its kind, and its pods.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use backpressure_api::v1alpha1::TargetRef;
use backpressure_api::wire;
use backpressure_core::selector::Selector;
use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodStatus};
use kube::api::{Api, DynamicObject};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};

/// Why the target could not be read. Each is reported as a condition, not a crash.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// `apiVersion`/`kind` unknown to the API server.
    #[error("target kind {kind} in {api_version} is not served by the API server")]
    UnknownKind {
        /// apiVersion.
        api_version: String,
        /// kind.
        kind: String,
    },
    /// The kind is cluster-scoped; a target must live in the object's namespace.
    #[error(
        "target kind {0} is cluster-scoped; the target must be namespaced, in the object's namespace"
    )]
    ClusterScoped(String),
    /// The kind has no `/scale` subresource.
    #[error("target kind {0} has no /scale subresource")]
    NoScale(String),
    /// The target does not exist.
    #[error("target {kind}/{name} not found in namespace {namespace}")]
    NotFound {
        /// kind.
        kind: String,
        /// name.
        name: String,
        /// namespace.
        namespace: String,
    },
    /// `status.selector` of the scale subresource is missing or malformed.
    #[error("target {0} reports no usable label selector in its /scale status: {1}")]
    Selector(String, String),
    /// Any other API error.
    #[error("reading target {0}")]
    Api(String, #[source] kube::Error),
}

impl TargetError {
    /// The condition and event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            TargetError::UnknownKind { .. } => "TargetKindUnknown",
            TargetError::ClusterScoped(_) => "TargetNotNamespaced",
            TargetError::NoScale(_) => "TargetHasNoScale",
            TargetError::NotFound { .. } => "TargetNotFound",
            TargetError::Selector(..) => "TargetSelectorInvalid",
            TargetError::Api(..) => "TargetUnreadable",
        }
    }
}

/// The target as observed.
#[derive(Debug, Clone)]
pub struct TargetState {
    /// The resource, for writing `/scale` back.
    pub resource: ApiResource,
    /// `spec.replicas` of the scale subresource.
    pub spec_replicas: i32,
    /// `status.replicas` of the scale subresource.
    pub status_replicas: i32,
    /// The parsed pod selector.
    pub selector: Selector,
}

/// Resolves kinds through discovery, caching each answer.
#[derive(Debug, Default)]
pub struct KindCache {
    cache: Mutex<HashMap<(String, String), (ApiResource, ApiCapabilities)>>,
}

impl KindCache {
    /// The resource of `apiVersion`/`kind`.
    pub async fn resolve(
        &self,
        client: &kube::Client,
        api_version: &str,
        kind: &str,
    ) -> Result<(ApiResource, ApiCapabilities), TargetError> {
        let key = (api_version.to_owned(), kind.to_owned());
        if let Some(hit) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(hit);
        }
        let (group, version) = match api_version.split_once('/') {
            Some((g, v)) => (g.to_owned(), v.to_owned()),
            None => (String::new(), api_version.to_owned()),
        };
        let gvk = GroupVersionKind {
            group,
            version,
            kind: kind.to_owned(),
        };
        let found = kube::discovery::pinned_kind(client, &gvk)
            .await
            .map_err(|e| match e {
                kube::Error::Discovery(_) => TargetError::UnknownKind {
                    api_version: api_version.to_owned(),
                    kind: kind.to_owned(),
                },
                kube::Error::Api(ref s) if s.code == 404 => TargetError::UnknownKind {
                    api_version: api_version.to_owned(),
                    kind: kind.to_owned(),
                },
                other => TargetError::Api(format!("{api_version}/{kind}"), other),
            })?;
        if let Ok(mut c) = self.cache.lock() {
            c.insert(key, found.clone());
        }
        Ok(found)
    }
}

/// Reads the target's `/scale`.
pub async fn read_target(
    client: &kube::Client,
    kinds: &KindCache,
    namespace: &str,
    target: &TargetRef,
) -> Result<TargetState, TargetError> {
    let (resource, caps) = kinds
        .resolve(client, &target.api_version, &target.kind)
        .await?;
    if caps.scope == Scope::Cluster {
        return Err(TargetError::ClusterScoped(target.kind.clone()));
    }
    if !caps
        .subresources
        .iter()
        .any(|(sub, _)| sub.plural == "scale" || sub.plural == format!("{}/scale", resource.plural))
    {
        return Err(TargetError::NoScale(target.kind.clone()));
    }
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let scale: Scale = api.get_scale(&target.name).await.map_err(|e| match e {
        kube::Error::Api(ref s) if s.code == 404 => TargetError::NotFound {
            kind: target.kind.clone(),
            name: target.name.clone(),
            namespace: namespace.to_owned(),
        },
        other => TargetError::Api(format!("{}/{}", target.kind, target.name), other),
    })?;
    let id = format!("{}/{}", target.kind, target.name);
    let spec_replicas = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    let status = scale.status.unwrap_or_default();
    let selector_text = status.selector.unwrap_or_default();
    if selector_text.is_empty() {
        return Err(TargetError::Selector(id, "empty selector".into()));
    }
    let selector =
        Selector::parse(&selector_text).map_err(|e| TargetError::Selector(id, e.to_string()))?;
    Ok(TargetState {
        resource,
        spec_replicas,
        status_replicas: status.replicas,
        selector,
    })
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
    /// Admin port: the container port named `bp-admin`, the annotation, or the default.
    pub admin_port: u16,
    /// The admin port speaks HTTPS (annotation `backpressure.dev/admin-scheme: https`).
    pub tls: bool,
}

impl PodInfo {
    /// Reads the fields the operator needs from a Pod.
    pub fn from_pod(pod: &Pod) -> Option<PodInfo> {
        let name = pod.metadata.name.clone()?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let status = pod.status.as_ref();
        let ready = pod.metadata.deletion_timestamp.is_none()
            && status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let ip = status
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty());
        let named = pod.spec.as_ref().and_then(|s| {
            s.containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find_map(|p| {
                    (p.name.as_deref() == Some(wire::ADMIN_PORT_NAME)).then_some(p.container_port)
                })
        });
        let annotated = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(wire::ADMIN_PORT_ANNOTATION))
            .and_then(|v| v.parse::<u16>().ok());
        let admin_port = annotated
            .or_else(|| named.and_then(|p| u16::try_from(p).ok()))
            .unwrap_or(wire::DEFAULT_ADMIN_PORT);
        let tls = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(wire::ADMIN_SCHEME_ANNOTATION))
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"));
        Some(PodInfo {
            name,
            uid,
            ready,
            ip,
            admin_port,
            tls,
        })
    }
}

/// Shrinks a pod to what [`PodInfo::from_pod`] and [`pods_of`] read, for the cluster-wide pod
/// cache: name, namespace, UID, labels, deletion time, the two admin annotations, the ports
/// named [`wire::ADMIN_PORT_NAME`], the Ready condition and the pod IP. At 50,000 pods most of a
/// pod's bytes (the rest of the spec, container statuses, other annotations, owner references,
/// managed fields) would otherwise stay in memory for nothing.
pub fn for_cache(pod: &mut Pod) {
    let m = &mut pod.metadata;
    m.managed_fields = None;
    m.owner_references = None;
    m.generate_name = None;
    m.finalizers = None;
    if let Some(a) = m.annotations.as_mut() {
        a.retain(|k, _| k == wire::ADMIN_PORT_ANNOTATION || k == wire::ADMIN_SCHEME_ANNOTATION);
        if a.is_empty() {
            m.annotations = None;
        }
    }
    if let Some(spec) = pod.spec.take() {
        let containers = spec
            .containers
            .into_iter()
            .filter_map(|c| {
                let ports: Vec<_> = c
                    .ports
                    .into_iter()
                    .flatten()
                    .filter(|p| p.name.as_deref() == Some(wire::ADMIN_PORT_NAME))
                    .collect();
                (!ports.is_empty()).then(|| Container {
                    name: c.name,
                    ports: Some(ports),
                    ..Container::default()
                })
            })
            .collect();
        pod.spec = Some(PodSpec {
            containers,
            ..PodSpec::default()
        });
    }
    if let Some(status) = pod.status.take() {
        pod.status = Some(PodStatus {
            conditions: status
                .conditions
                .map(|cs| cs.into_iter().filter(|c| c.type_ == "Ready").collect()),
            pod_ip: status.pod_ip,
            ..PodStatus::default()
        });
    }
}

/// The pods of `namespace` matching `selector`, from the shared pod store.
pub fn pods_of(
    store: &kube::runtime::reflector::Store<Pod>,
    namespace: &str,
    selector: &Selector,
) -> Vec<PodInfo> {
    matching(
        store
            .state()
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace)),
        selector,
    )
}

/// The [`PodInfo`] of the pods among `pods` that `selector` matches, by name.
fn matching<'a>(pods: impl Iterator<Item = &'a Arc<Pod>>, selector: &Selector) -> Vec<PodInfo> {
    let mut out: Vec<PodInfo> = pods
        .filter(|p| selector.matches(p.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())))
        .filter_map(|p| PodInfo::from_pod(p))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The pod cache grouped by namespace, rebuilt from the store after it changed.
///
/// [`pods_of`] walks every pod of the cluster: at 50,000 pods and 10,000 objects reconciled
/// every 15 s that is 500 million pod visits per interval. The index walks them once after the
/// pod watch reported a change ([`PodIndex::invalidate`]), at most once per `min_age` (one
/// O(pods) pass shared by every reconcile in between), and answers from the pods of one
/// namespace. A pod change is seen at most `min_age` late.
#[derive(Debug)]
pub struct PodIndex {
    min_age: std::time::Duration,
    changed: std::sync::atomic::AtomicBool,
    built: Mutex<Option<(std::time::Instant, Arc<ByNamespace>)>>,
}

type ByNamespace = HashMap<String, Vec<Arc<Pod>>>;

impl PodIndex {
    /// An index rebuilt on the first use after a change, at most once per `min_age`.
    pub fn new(min_age: std::time::Duration) -> Self {
        Self {
            min_age,
            changed: std::sync::atomic::AtomicBool::new(true),
            built: Mutex::new(None),
        }
    }

    /// The store changed (called for every event of the pod watch, after the store applied it).
    pub fn invalidate(&self) {
        self.changed
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// The pods of `namespace` matching `selector`, as [`pods_of`] finds them in `store`.
    pub fn pods_of(
        &self,
        store: &kube::runtime::reflector::Store<Pod>,
        namespace: &str,
        selector: &Selector,
    ) -> Vec<PodInfo> {
        let index = {
            let mut built = match self.built.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            let fresh = |at: &std::time::Instant| {
                at.elapsed() < self.min_age
                    || !self.changed.load(std::sync::atomic::Ordering::Acquire)
            };
            match built.as_ref() {
                Some((at, index)) if fresh(at) => index.clone(),
                _ => {
                    self.changed
                        .store(false, std::sync::atomic::Ordering::Release);
                    let mut index = ByNamespace::new();
                    for p in store.state() {
                        let ns = p.metadata.namespace.clone().unwrap_or_default();
                        index.entry(ns).or_default().push(p);
                    }
                    let index = Arc::new(index);
                    *built = Some((std::time::Instant::now(), index.clone()));
                    index
                }
            }
        };
        match index.get(namespace) {
            Some(pods) => matching(pods.iter(), selector),
            None => Vec::new(),
        }
    }
}

/// Shared handle type for the pod store.
pub type PodStore = Arc<kube::runtime::reflector::Store<Pod>>;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    /// A running worker pod as the API server returns it, with `admin` naming its admin port.
    fn running_pod(annotations: serde_json::Value, ports: serde_json::Value, ready: &str) -> Pod {
        serde_json::from_value(json!({
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
        }))
        .unwrap()
    }

    #[test]
    fn the_cached_pod_reads_as_the_pod_does_and_is_much_smaller() {
        let cases = [
            running_pod(
                json!({"prometheus.io/scrape": "true"}),
                json!([{"name": "bp-admin", "containerPort": 9191}]),
                "True",
            ),
            running_pod(
                json!({wire::ADMIN_PORT_ANNOTATION.to_owned(): "9300", wire::ADMIN_SCHEME_ANNOTATION.to_owned(): "https", "other": "x"}),
                json!([]),
                "True",
            ),
            running_pod(
                json!({}),
                json!([{"name": "metrics", "containerPort": 8080}]),
                "False",
            ),
        ];
        for (i, pod) in cases.into_iter().enumerate() {
            let mut cached = pod.clone();
            for_cache(&mut cached);
            assert_eq!(
                PodInfo::from_pod(&cached),
                PodInfo::from_pod(&pod),
                "case {i}"
            );
            assert_eq!(cached.metadata.labels, pod.metadata.labels, "case {i}");
            assert_eq!(
                cached.metadata.namespace, pod.metadata.namespace,
                "case {i}"
            );
            let size = |p: &Pod| serde_json::to_vec(p).unwrap().len();
            assert!(
                size(&cached) * 3 < size(&pod),
                "case {i}: {} of {} bytes kept",
                size(&cached),
                size(&pod)
            );
        }
        // Being deleted, or without an IP, still reads the same.
        let mut deleting = running_pod(json!({}), json!([]), "True");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        deleting.status.as_mut().unwrap().pod_ip = None;
        let mut cached = deleting.clone();
        for_cache(&mut cached);
        let info = PodInfo::from_pod(&cached).unwrap();
        assert_eq!(Some(info.clone()), PodInfo::from_pod(&deleting));
        assert!(!info.ready && info.ip.is_none());
    }

    #[test]
    fn the_namespace_index_answers_as_the_scan_and_is_rebuilt_after_a_change() {
        let (store, mut writer) = kube::runtime::reflector::store::<Pod>();
        let pod = |ns: &str, name: &str, app: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
                "status": {"podIP": "10.0.0.1",
                    "conditions": [{"type": "Ready", "status": "True"}]},
            }))
            .unwrap()
        };
        for (ns, name, app) in [
            ("a", "w-1", "w"),
            ("a", "w-2", "w"),
            ("a", "x-1", "x"),
            ("b", "w-1", "w"),
        ] {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pod(ns, name, app)));
        }
        let index = PodIndex::new(std::time::Duration::from_millis(50));
        index.invalidate();
        for ns in ["a", "b", "c"] {
            for sel in ["app=w", "app=x", "app in (w,x)"] {
                let sel = Selector::parse(sel).unwrap();
                assert_eq!(
                    index.pods_of(&store, ns, &sel),
                    pods_of(&store, ns, &sel),
                    "{ns} {sel:?}"
                );
            }
        }
        let w = Selector::parse("app=w").unwrap();
        assert_eq!(index.pods_of(&store, "a", &w).len(), 2);
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pod("a", "w-3", "w")));
        std::thread::sleep(std::time::Duration::from_millis(60));
        // Without a report of the change, the index stands; with one, it is rebuilt.
        assert_eq!(index.pods_of(&store, "a", &w).len(), 2);
        index.invalidate();
        assert_eq!(index.pods_of(&store, "a", &w).len(), 3);
    }
}
