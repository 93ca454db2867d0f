//! What a reconcile needs from the runtime: the client, the shared caches and clients, the
//! metrics and the command-line settings. The controller builds one [`Context`] and shares it
//! with every reconcile.

use std::sync::Arc;
use std::time::Duration;

use backpressure_api::{BackpressurePolicy, WorkerBackpressure};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Store;

use crate::act::events::Recorder;
use crate::act::push::{Pusher, TokenSource};
use crate::metrics::Metrics;
use crate::observe::access::PrometheusAccess;
use crate::observe::autoscalers::AutoscalerIndex;
use crate::observe::owners::OwnersIndex;
use crate::observe::prometheus::MetricsHub;
use crate::observe::target::KindCache;

/// Settings the reconciler needs from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The operator's Prometheus (for objects that name none), its credentials and the
    /// addresses objects may name.
    pub prometheus: Arc<PrometheusAccess>,
    /// Interval between reconciles of one object.
    pub requeue_interval: Duration,
}

/// Everything a reconcile shares with the others.
pub struct Context {
    /// The API client.
    pub client: kube::Client,
    /// Consecutive reconcile failures per object (UID), for the error backoff.
    pub failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// Operator metrics.
    pub metrics: Arc<Metrics>,
    /// Batched Prometheus reads.
    pub hub: MetricsHub,
    /// Discovery cache for target kinds.
    pub kinds: KindCache,
    /// Config pushes.
    pub pusher: Pusher,
    /// The push token.
    pub tokens: TokenSource,
    /// Event recorder.
    pub recorder: Recorder,
    /// All pods, compact ([`crate::observe::pods::PodCache::pods_of`]).
    pub pods: std::sync::Arc<crate::observe::pods::PodCache>,
    /// The operator's ConfigMaps.
    pub configmaps: Store<ConfigMap>,
    /// All BackpressurePolicy objects.
    pub policies: Store<BackpressurePolicy>,
    /// Namespace labels, for policy selectors.
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    /// Every WorkerBackpressure (the controller's own store).
    pub wbps: Store<WorkerBackpressure>,
    /// Which object acts on a target that several name.
    pub owners: OwnersIndex,
    /// The HPAs and ScaledObjects of the cluster by the workload they scale.
    pub autoscalers: AutoscalerIndex,
    /// Command-line settings.
    pub settings: Settings,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}
