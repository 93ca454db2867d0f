//! The other autoscalers of the cluster: every HorizontalPodAutoscaler and KEDA ScaledObject,
//! indexed by the workload it scales, so that an `Active` WorkerBackpressure whose target is
//! also scaled by one of them is found with one map lookup (no list call per reconcile: at
//! 10,000 objects that would be 10,000 lists per interval).
//!
//! The index is fed by two watches ([`AutoscalerIndex::watch`]) and keeps only (kind,
//! namespace, name) → target, a few dozen bytes per autoscaler. A watch restart replaces that
//! kind's entries atomically once its list is complete. A ScaledObject watch without the KEDA
//! CRD installed fails and retries with backoff, finding ScaledObjects once KEDA is installed.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use backpressure_api::v1alpha1::{GuardKind, TargetRef};
use futures::{Stream, StreamExt as _};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};

use super::scope::{self, Known, WatchScope};

/// A workload as an autoscaler names it: namespace, API group (not the version: `apps/v1` and
/// `apps/v1beta2` name the same Deployment), kind and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TargetKey {
    namespace: String,
    group: String,
    kind: String,
    name: String,
}

impl TargetKey {
    /// The key of `target` in `namespace`.
    pub fn of(namespace: &str, target: &TargetRef) -> Self {
        Self::new(namespace, &target.api_version, &target.kind, &target.name)
    }

    fn new(namespace: &str, api_version: &str, kind: &str, name: &str) -> Self {
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        TargetKey {
            namespace: namespace.to_owned(),
            group: group.to_owned(),
            kind: kind.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// (kind, namespace, name) of an autoscaler.
type AutoscalerId = (GuardKind, String, String);

#[derive(Debug, Default)]
struct Index {
    by_autoscaler: HashMap<AutoscalerId, TargetKey>,
    by_target: HashMap<TargetKey, BTreeSet<(GuardKind, String)>>,
    /// A restarted watch's objects until its list is complete, per kind.
    pending: HashMap<GuardKind, Vec<(AutoscalerId, TargetKey)>>,
}

impl Index {
    fn remove(&mut self, id: &AutoscalerId) {
        if let Some(key) = self.by_autoscaler.remove(id)
            && let Some(set) = self.by_target.get_mut(&key)
        {
            set.remove(&(id.0, id.2.clone()));
            if set.is_empty() {
                self.by_target.remove(&key);
            }
        }
    }

    fn insert(&mut self, id: AutoscalerId, key: Option<TargetKey>) {
        self.remove(&id);
        if let Some(key) = key {
            self.by_target
                .entry(key.clone())
                .or_default()
                .insert((id.0, id.2.clone()));
            self.by_autoscaler.insert(id, key);
        }
    }
}

/// See the [module](self).
#[derive(Debug, Default, Clone)]
pub struct AutoscalerIndex {
    inner: Arc<Mutex<Index>>,
}

impl AutoscalerIndex {
    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The autoscalers that scale `target` in `namespace`, as `Kind/name`, sorted.
    pub fn of(&self, namespace: &str, target: &TargetRef) -> Vec<String> {
        let idx = self.lock();
        idx.by_target
            .get(&TargetKey::of(namespace, target))
            .into_iter()
            .flatten()
            .map(|(kind, name)| format!("{}/{name}", kind_name(*kind)))
            .collect()
    }

    /// Applies one watch event of `kind` (`target` extracts what the autoscaler scales).
    pub fn apply<K: kube::Resource>(
        &self,
        kind: GuardKind,
        event: Event<K>,
        target: impl Fn(&K) -> Option<(String, String, TargetKey)>,
    ) {
        let mut idx = self.lock();
        match event {
            Event::Apply(obj) => {
                if let Some((ns, name, key)) = target(&obj) {
                    idx.insert((kind, ns, name), Some(key));
                }
            }
            Event::Delete(obj) => {
                // By metadata alone: a scoped watch's relist deletes with a name-only object.
                let m = obj.meta();
                if let (Some(ns), Some(name)) = (m.namespace.clone(), m.name.clone()) {
                    idx.remove(&(kind, ns, name));
                }
            }
            Event::Init => {
                idx.pending.insert(kind, Vec::new());
            }
            Event::InitApply(obj) => {
                if let Some((ns, name, key)) = target(&obj) {
                    idx.pending
                        .entry(kind)
                        .or_default()
                        .push(((kind, ns, name), key));
                }
            }
            Event::InitDone => {
                let fresh = idx.pending.remove(&kind).unwrap_or_default();
                let stale: Vec<AutoscalerId> = idx
                    .by_autoscaler
                    .keys()
                    .filter(|id| id.0 == kind)
                    .cloned()
                    .collect();
                for id in &stale {
                    idx.remove(id);
                }
                for (id, key) in fresh {
                    idx.insert(id, Some(key));
                }
            }
        }
    }

    /// The names of the autoscalers of `kind` in `namespace` the index has.
    fn names_in(&self, kind: GuardKind, namespace: &str) -> Vec<String> {
        self.lock()
            .by_autoscaler
            .keys()
            .filter(|(k, ns, _)| *k == kind && ns == namespace)
            .map(|(_, _, name)| name.clone())
            .collect()
    }

    /// Feeds the index from watches of every HorizontalPodAutoscaler and every ScaledObject in
    /// `scope`; the returned stream must be polled (it yields nothing of interest).
    pub fn watch(
        &self,
        client: &kube::Client,
        scope: &WatchScope,
    ) -> impl Stream<Item = ()> + Send + 'static {
        let known_hpas: Known<HorizontalPodAutoscaler> = {
            let index = self.clone();
            Arc::new(move |ns: &str| {
                index
                    .names_in(GuardKind::HorizontalPodAutoscaler, ns)
                    .into_iter()
                    .map(|name| HorizontalPodAutoscaler {
                        metadata: ObjectMeta {
                            name: Some(name),
                            namespace: Some(ns.to_owned()),
                            ..ObjectMeta::default()
                        },
                        ..HorizontalPodAutoscaler::default()
                    })
                    .collect()
            })
        };
        let hpas = scope::watch(
            scope,
            |ns| match ns {
                Some(ns) => Api::<HorizontalPodAutoscaler>::namespaced(client.clone(), ns),
                None => Api::all(client.clone()),
            },
            watcher::Config::default().any_semantic(),
            known_hpas,
        );
        let so_resource = api_resource(GuardKind::ScaledObject);
        let known_scaled_objects: Known<DynamicObject> = {
            let (index, ar) = (self.clone(), so_resource.clone());
            Arc::new(move |ns: &str| {
                index
                    .names_in(GuardKind::ScaledObject, ns)
                    .into_iter()
                    .map(|name| DynamicObject::new(&name, &ar).within(ns))
                    .collect()
            })
        };
        let scaled_objects = scope::watch(
            scope,
            |ns| match ns {
                Some(ns) => Api::<DynamicObject>::namespaced_with(client.clone(), ns, &so_resource),
                None => Api::all_with(client.clone(), &so_resource),
            },
            watcher::Config::default().any_semantic(),
            known_scaled_objects,
        );
        let (a, b) = (self.clone(), self.clone());
        futures::stream::select(
            hpas.map(move |e| {
                if let Ok(e) = e {
                    a.apply(GuardKind::HorizontalPodAutoscaler, e, hpa_target);
                }
            })
            .boxed(),
            scaled_objects
                .map(move |e| {
                    if let Ok(e) = e {
                        b.apply(GuardKind::ScaledObject, e, scaled_object_target);
                    }
                })
                .boxed(),
        )
    }
}

/// The API resource of an autoscaler kind (Guard mode clamps these, too).
pub fn api_resource(kind: GuardKind) -> ApiResource {
    match kind {
        GuardKind::HorizontalPodAutoscaler => ApiResource {
            group: "autoscaling".into(),
            version: "v2".into(),
            api_version: "autoscaling/v2".into(),
            kind: "HorizontalPodAutoscaler".into(),
            plural: "horizontalpodautoscalers".into(),
        },
        GuardKind::ScaledObject => ApiResource {
            group: "keda.sh".into(),
            version: "v1alpha1".into(),
            api_version: "keda.sh/v1alpha1".into(),
            kind: "ScaledObject".into(),
            plural: "scaledobjects".into(),
        },
    }
}

fn kind_name(kind: GuardKind) -> &'static str {
    match kind {
        GuardKind::HorizontalPodAutoscaler => "HorizontalPodAutoscaler",
        GuardKind::ScaledObject => "ScaledObject",
    }
}

/// An HPA's namespace, name and `spec.scaleTargetRef`.
pub fn hpa_target(hpa: &HorizontalPodAutoscaler) -> Option<(String, String, TargetKey)> {
    let ns = hpa.metadata.namespace.clone()?;
    let name = hpa.metadata.name.clone()?;
    let r = &hpa.spec.as_ref()?.scale_target_ref;
    let key = TargetKey::new(
        &ns,
        r.api_version.as_deref().unwrap_or_default(),
        &r.kind,
        &r.name,
    );
    Some((ns, name, key))
}

/// A ScaledObject's namespace, name and `spec.scaleTargetRef` (KEDA's defaults: `apps/v1`,
/// `Deployment`).
pub fn scaled_object_target(so: &DynamicObject) -> Option<(String, String, TargetKey)> {
    let ns = so.metadata.namespace.clone()?;
    let name = so.metadata.name.clone()?;
    let r = so.data.get("spec")?.get("scaleTargetRef")?;
    let field = |k: &str, default: &'static str| {
        r.get(k)
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .unwrap_or(default)
            .to_owned()
    };
    let key = TargetKey::new(
        &ns,
        &field("apiVersion", "apps/v1"),
        &field("kind", "Deployment"),
        &field("name", ""),
    );
    Some((ns, name, key))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn hpa(
        ns: &str,
        name: &str,
        api_version: &str,
        kind: &str,
        target: &str,
    ) -> HorizontalPodAutoscaler {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": {"scaleTargetRef": {"apiVersion": api_version, "kind": kind, "name": target},
                     "maxReplicas": 5},
        }))
        .unwrap()
    }

    fn so(ns: &str, name: &str, target: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"namespace": ns, "name": name},
            "spec": {"scaleTargetRef": target},
        }))
        .unwrap()
    }

    fn target(kind: &str, name: &str) -> TargetRef {
        TargetRef {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            name: name.into(),
        }
    }

    #[test]
    fn autoscalers_are_found_by_the_workload_they_scale() {
        let idx = AutoscalerIndex::default();
        let h = GuardKind::HorizontalPodAutoscaler;
        idx.apply(
            h,
            Event::Apply(hpa("a", "w-hpa", "apps/v1", "Deployment", "w")),
            hpa_target,
        );
        // Another namespace, another kind, another group: not the same workload.
        idx.apply(
            h,
            Event::Apply(hpa("b", "x", "apps/v1", "Deployment", "w")),
            hpa_target,
        );
        idx.apply(
            h,
            Event::Apply(hpa("a", "y", "apps/v1", "StatefulSet", "w")),
            hpa_target,
        );
        idx.apply(
            h,
            Event::Apply(hpa("a", "z", "example.com/v1", "Deployment", "w")),
            hpa_target,
        );
        // KEDA's defaults: apps/v1 Deployment.
        idx.apply(
            GuardKind::ScaledObject,
            Event::Apply(so("a", "w-keda", json!({"name": "w"}))),
            scaled_object_target,
        );
        assert_eq!(
            idx.of("a", &target("Deployment", "w")),
            ["HorizontalPodAutoscaler/w-hpa", "ScaledObject/w-keda"]
        );
        // The version does not matter, the group does.
        let beta = TargetRef {
            api_version: "apps/v1beta2".into(),
            ..target("Deployment", "w")
        };
        assert_eq!(idx.of("a", &beta).len(), 2);
        assert!(idx.of("a", &target("Deployment", "other")).is_empty());

        // Retargeted, then deleted.
        idx.apply(
            h,
            Event::Apply(hpa("a", "w-hpa", "apps/v1", "Deployment", "v")),
            hpa_target,
        );
        assert_eq!(
            idx.of("a", &target("Deployment", "w")),
            ["ScaledObject/w-keda"]
        );
        assert_eq!(
            idx.of("a", &target("Deployment", "v")),
            ["HorizontalPodAutoscaler/w-hpa"]
        );
        idx.apply(
            h,
            Event::Delete(hpa("a", "w-hpa", "apps/v1", "Deployment", "v")),
            hpa_target,
        );
        assert!(idx.of("a", &target("Deployment", "v")).is_empty());
    }

    #[test]
    fn a_restarted_watch_replaces_its_kind_once_listed() {
        let idx = AutoscalerIndex::default();
        let h = GuardKind::HorizontalPodAutoscaler;
        idx.apply(
            h,
            Event::Apply(hpa("a", "gone", "apps/v1", "Deployment", "w")),
            hpa_target,
        );
        idx.apply(
            GuardKind::ScaledObject,
            Event::Apply(so("a", "k", json!({"name": "w"}))),
            scaled_object_target,
        );
        idx.apply(h, Event::Init, hpa_target);
        idx.apply(
            h,
            Event::InitApply(hpa("a", "new", "apps/v1", "Deployment", "w")),
            hpa_target,
        );
        // Until the list is complete the old entries stand.
        assert_eq!(
            idx.of("a", &target("Deployment", "w")),
            ["HorizontalPodAutoscaler/gone", "ScaledObject/k"]
        );
        idx.apply(h, Event::InitDone, hpa_target);
        // The HPAs are replaced; the ScaledObjects are another watch's.
        assert_eq!(
            idx.of("a", &target("Deployment", "w")),
            ["HorizontalPodAutoscaler/new", "ScaledObject/k"]
        );
    }
}
