//! The runtime around [`crate::reconcile`]: the watches and caches, the triggers
//! (target changes, policy changes, changed metrics), leader gating, the background tasks
//! (policy statuses, fleet gauges, push-state sweeping, readiness) and the run loop. What one
//! reconcile does is in [`crate::reconcile`], which imports nothing from here.

use std::sync::Arc;
use std::time::Duration;

use backpressure_api::{BackpressurePolicy, WorkerBackpressure};
use futures::StreamExt as _;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::ResourceExt as _;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{Config as WatcherConfig, watcher};
use tokio::sync::watch;

use crate::act::configmap::{self, MANAGED_BY, MANAGED_BY_LABEL};
use crate::act::events::Recorder;
use crate::act::push::{Identity, Pusher, TokenSource};
use crate::admin::Health;
use crate::errors::Chain;
use crate::metrics::{FleetGauges, Metrics};
use crate::observe::autoscalers::AutoscalerIndex;
use crate::observe::owners::OwnersIndex;
use crate::observe::pods::PodCache;
use crate::observe::prometheus::{Changed, MetricsHub};
use crate::observe::scope::{self, Known, WatchScope};
use crate::observe::target::KindCache;
use crate::reconcile::{self, Context, ReconcileError, Settings};

/// How often BackpressurePolicy statuses are recomputed (and a brake's expiry noticed).
pub const POLICY_STATUS_INTERVAL: Duration = Duration::from_secs(2);

/// How stale the grouping of objects by target may be: a conflict between two objects naming
/// one target is noticed at most this much after the second appears.
const OWNERS_MAX_AGE: Duration = Duration::from_secs(1);

/// The objects to reconcile when the hub announces changed workloads: those in the workload's
/// namespace whose `metrics.workload` (or, unset, target name) is the workload's. Policies do
/// not set the workload, so the spec alone decides; an object matched wrongly is reconciled
/// once more and writes nothing, one missed is reconciled at its requeue.
fn metric_triggers(
    changes: tokio::sync::broadcast::Receiver<Changed>,
    store: Store<WorkerBackpressure>,
) -> impl futures::Stream<Item = ObjectRef<WorkerBackpressure>> + Send + 'static {
    use tokio::sync::broadcast::error::RecvError;
    futures::stream::unfold(changes, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(changed) => return Some((changed, rx)),
                // Missed announcements: those objects wait for their requeue.
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return None,
            }
        }
    })
    .flat_map(move |changed| {
        let wanted: std::collections::HashSet<(&str, &str)> = changed
            .iter()
            .map(|(ns, wl)| (ns.as_str(), wl.as_str()))
            .collect();
        let refs: Vec<ObjectRef<WorkerBackpressure>> = store
            .state()
            .iter()
            .filter(|w| {
                let workload = w
                    .spec
                    .metrics
                    .as_ref()
                    .and_then(|m| m.workload.as_deref())
                    .unwrap_or(&w.spec.target_ref.name);
                w.metadata
                    .namespace
                    .as_deref()
                    .is_some_and(|ns| wanted.contains(&(ns, workload)))
            })
            .map(|w| ObjectRef::from_obj(&**w))
            .collect();
        futures::stream::iter(refs)
    })
}

/// For watches that only trigger reconciles.
fn nothing_known<K>() -> Known<K> {
    Arc::new(|_: &str| Vec::new())
}

/// What [`run`] needs besides the client.
#[derive(Debug)]
pub struct RunOptions {
    /// Command-line settings.
    pub settings: Settings,
    /// The operator's ServiceAccount, for push tokens.
    pub identity: Option<Identity>,
    /// Age at which a push token is replaced.
    pub push_token_renew: Duration,
    /// TLS client configuration for pods whose admin port is HTTPS (`--push-ca-file`).
    pub push_tls: Option<Arc<rustls::ClientConfig>>,
    /// This replica's name in events.
    pub reporter_instance: String,
    /// Operator metrics.
    pub metrics: Arc<Metrics>,
    /// Readiness.
    pub health: Arc<Health>,
    /// Reconciles at once.
    pub concurrency: u16,
    /// Leadership, when leader election is on.
    pub leader: Option<watch::Receiver<bool>>,
    /// The namespaces watched (`--watch-namespaces`).
    pub scope: WatchScope,
}

/// Runs the operator until `shutdown` resolves. With `leader` set, reconciles only while this
/// replica holds the Lease and returns an error when leadership is lost after being gained.
pub async fn run(
    client: kube::Client,
    options: RunOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), RunError> {
    let RunOptions {
        settings,
        identity,
        push_token_renew,
        push_tls,
        reporter_instance,
        metrics,
        health,
        concurrency,
        mut leader,
        scope,
    } = options;
    metrics.export_reconcile_error_categories(&ReconcileError::CATEGORIES);
    let wbps: Api<WorkerBackpressure> = match &scope {
        WatchScope::All => Api::all(client.clone()),
        WatchScope::Namespaces(ns) => scope::api(&client, ns.first().map(String::as_str)),
    };
    // Fail early and clearly when the CRDs are missing.
    if let Err(e) = wbps.list(&kube::api::ListParams::default().limit(1)).await {
        return Err(RunError::Crd(e));
    }

    // Wait for the Lease before watching anything. A standby is ready: it is up, reaches the
    // API server, finds the CRDs and can take over (a Deployment of two replicas rolls out and
    // its PodDisruptionBudget allows an eviction). Once leading it is ready again when its
    // caches have their first list.
    if let Some(rx) = leader.as_mut() {
        tracing::info!("waiting for leadership");
        health.set_ready(true);
        while !*rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                return Err(RunError::LeaderLost);
            }
        }
        health.set_ready(false);
        metrics.set_leader(true);
    }

    // Every pod, compact: only what the operator reads is parsed and kept (observe::pods).
    let pods = Arc::new(PodCache::default());
    let pod_stream = {
        let (known, pods) = (pods.clone(), pods.clone());
        scope::watch(
            &scope,
            |ns| scope::api(&client, ns),
            WatcherConfig::default().any_semantic(),
            Arc::new(move |ns: &str| known.tombstones(ns)),
        )
        .map(move |event| {
            if let Ok(event) = event {
                pods.apply(event);
            }
        })
    };
    let (configmaps, cm_writer) = reflector::store();
    let managed = WatcherConfig::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let cm_stream = reflector::reflector(
        cm_writer,
        scope::watch(
            &scope,
            |ns| scope::api(&client, ns),
            managed.clone(),
            scope::known_in(&configmaps),
        )
        // Only what `configmap::up_to_date` compares: the data becomes a digest.
        .modify(configmap::for_cache),
    );
    let (policies, policy_writer) = reflector::store();
    let policy_stream = reflector::reflector(
        policy_writer,
        watcher(
            Api::<BackpressurePolicy>::all(client.clone()),
            WatcherConfig::default(),
        )
        .default_backoff(),
    );
    let (namespaces, ns_writer) = reflector::store();
    let ns_stream = reflector::reflector(
        ns_writer,
        watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
            WatcherConfig::default(),
        )
        .default_backoff(),
    );

    // The controller's own cache, without managedFields: at fleet scale they are most of each
    // object's bytes, and the operator never reads them.
    let (store, wbp_writer) = reflector::store();
    let wbp_stream = scope::watch(
        &scope,
        |ns| scope::api(&client, ns),
        WatcherConfig::default().any_semantic(),
        scope::known_in(&store),
    )
    .modify(|o: &mut WorkerBackpressure| o.metadata.managed_fields = None)
    .reflect(wbp_writer)
    .applied_objects();
    let controller = Controller::for_stream(wbp_stream, store.clone())
        .with_config(
            ControllerConfig::default()
                .concurrency(concurrency)
                .debounce(Duration::from_millis(200)),
        )
        .trigger_backoff(WatchBackoff::default());
    // Every HPA and ScaledObject by the workload it scales: an Active object whose target
    // another autoscaler scales does not write /scale (no fight over replicas).
    let autoscalers = AutoscalerIndex::default();
    let autoscaler_stream = autoscalers.watch(&client, &scope);
    let hub = MetricsHub::new(metrics.clone()).map_err(RunError::Http)?;
    // Objects whose metrics changed are reconciled at once, not at their next requeue.
    let metric_changes = metric_triggers(hub.subscribe(), store.clone());
    let ctx = Arc::new(Context {
        failures: std::sync::Mutex::new(std::collections::HashMap::new()),
        hub,
        pusher: Pusher::new().map_err(RunError::Http)?.with_tls(push_tls),
        tokens: TokenSource::new(identity, push_token_renew),
        recorder: Recorder::new(
            client.clone(),
            backpressure_api::FIELD_MANAGER.into(),
            reporter_instance,
        ),
        kinds: KindCache::default(),
        client: client.clone(),
        metrics: metrics.clone(),
        pods: pods.clone(),
        configmaps: configmaps.clone(),
        policies: policies.clone(),
        namespaces: namespaces.clone(),
        wbps: store.clone(),
        owners: OwnersIndex::new(OWNERS_MAX_AGE),
        autoscalers: autoscalers.clone(),
        settings,
    });

    // A change to a target (replicas edited by someone else) reconciles its
    // WorkerBackpressure at once.
    fn target_mapper<K: kube::Resource>(
        kind: &'static str,
        store: Store<WorkerBackpressure>,
    ) -> impl Fn(PartialObjectMeta<K>) -> Vec<ObjectRef<WorkerBackpressure>> + Send + Sync + 'static
    {
        move |obj: PartialObjectMeta<K>| {
            let ns = obj.metadata.namespace.clone();
            let name = obj.metadata.name.clone().unwrap_or_default();
            store
                .state()
                .iter()
                .filter(|w| {
                    w.namespace() == ns
                        && w.spec.target_ref.kind == kind
                        && w.spec.target_ref.name == name
                })
                .map(|w| ObjectRef::from_obj(&**w))
                .collect()
        }
    }
    let policy_changes = policy_stream
        .touched_objects()
        .filter_map(|r| async move { r.ok().map(|_| ()) });

    // Forget the push state of pods that are gone, once per interval (not per reconcile: one
    // pass over every pod of the cluster is O(pods), and reconciles are O(objects) per interval).
    let sweep_ctx = ctx.clone();
    tokio::spawn(async move {
        loop {
            let every = sweep_ctx
                .settings
                .requeue_interval
                .max(Duration::from_secs(1));
            tokio::time::sleep(every).await;
            let alive = sweep_ctx.pods.uids();
            sweep_ctx.pusher.retain_pods(&|uid| alive.contains(uid));
        }
    });

    // Fleet gauges from the objects' statuses, every few seconds.
    let gauge_store = store.clone();
    let gauge_metrics = metrics.clone();
    tokio::spawn(async move {
        loop {
            let objects = gauge_store.state();
            gauge_metrics.set_fleet(&FleetGauges::from_objects(objects.iter().map(|o| &**o)));
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    });

    // Signalled once the side caches have their first list. Only one task may wait on a
    // store's readiness (kube's `wait_until_ready` wakes a single waiter, and the controller
    // itself waits on its own store), so others wait on this.
    let (caches_tx, caches_rx) = watch::channel(false);

    // Each BackpressurePolicy's status: matched objects, brake, Ready (written on change).
    let policy_status = tokio::spawn(crate::policy_status::run(
        client.clone(),
        scope.clone(),
        policies.clone(),
        namespaces.clone(),
        caches_rx,
        POLICY_STATUS_INTERVAL,
    ));

    // Keep the side reflectors running.
    let side = futures::stream::select_all(vec![
        pod_stream.boxed(),
        cm_stream.map(|_| ()).boxed(),
        ns_stream.map(|_| ()).boxed(),
        autoscaler_stream.boxed(),
    ]);
    tokio::spawn(side.for_each(|()| async {}));

    // Ready once the side caches have their first list.
    let ready_health = health.clone();
    let waits = (
        pods.clone(),
        configmaps.clone(),
        policies.clone(),
        namespaces.clone(),
    );
    tokio::spawn(async move {
        let (p, c, po, n) = waits;
        let _ = tokio::join!(
            p.wait_until_ready(),
            c.wait_until_ready(),
            po.wait_until_ready(),
            n.wait_until_ready()
        );
        ready_health.set_ready(true);
        let _ = caches_tx.send(true);
    });

    // Stop on SIGTERM/Ctrl-C, or when the Lease is lost (another replica may act now).
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let lost_flag = lost.clone();
    let stop = async move {
        let leader_lost = async move {
            match leader {
                Some(mut rx) => {
                    while *rx.borrow_and_update() {
                        if rx.changed().await.is_err() {
                            break;
                        }
                    }
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = shutdown => {},
            () = leader_lost => {
                tracing::error!("lost the leader lease; stopping");
                lost_flag.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
    };

    // Triggers only: a relist needs no deletes (`nothing_known`).
    controller
        .owns_stream(
            scope::watch(
                &scope,
                |ns| scope::api::<ConfigMap>(&client, ns),
                managed,
                nothing_known(),
            )
            .touched_objects(),
        )
        .watches_stream(
            scope::watch(
                &scope,
                |ns| scope::api::<PartialObjectMeta<Deployment>>(&client, ns),
                WatcherConfig::default(),
                nothing_known(),
            )
            .touched_objects(),
            target_mapper::<Deployment>("Deployment", store.clone()),
        )
        .watches_stream(
            scope::watch(
                &scope,
                |ns| scope::api::<PartialObjectMeta<StatefulSet>>(&client, ns),
                WatcherConfig::default(),
                nothing_known(),
            )
            .touched_objects(),
            target_mapper::<StatefulSet>("StatefulSet", store.clone()),
        )
        .reconcile_all_on(policy_changes)
        .reconcile_on(metric_changes)
        .graceful_shutdown_on(stop)
        .run(reconcile::reconcile, reconcile::error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %Chain(&e), "reconcile failed");
            }
        })
        .await;
    policy_status.abort();
    metrics.set_leader(false);
    if lost.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(RunError::LeaderLost);
    }
    Ok(())
}

/// Backoff of the controller's watches after an error (an API server restart, a 410 relist):
/// 200 ms doubling to at most 3 s, reset after 30 s without errors. kube-runtime's default (up to
/// 30 s, applied to the merged trigger stream) left changes unseen for over a minute after a
/// restart; the watches are cheap to retry.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
    last: Option<std::time::Instant>,
}

impl WatchBackoff {
    const FIRST: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(3);
    const RESET_AFTER: Duration = Duration::from_secs(30);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff {
            next: Self::FIRST,
            last: None,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = std::time::Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) > Self::RESET_AFTER)
        {
            self.next = Self::FIRST;
        }
        self.last = Some(now);
        let d = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        Some(d)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_backoff_is_short_and_capped() {
        let b: Vec<Duration> = WatchBackoff::default().take(6).collect();
        assert_eq!(b[0], Duration::from_millis(200));
        assert_eq!(b[1], Duration::from_millis(400));
        assert!(b.iter().all(|d| *d <= Duration::from_secs(3)));
        assert_eq!(b[5], Duration::from_secs(3));
    }
}

/// Why the operator stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The CRDs are not installed or not readable.
    #[error(
        "cannot list WorkerBackpressure objects (are the CRDs installed and the RBAC applied?)"
    )]
    Crd(#[source] kube::Error),
    /// The HTTP client could not be built.
    #[error("building an HTTP client")]
    Http(#[source] reqwest::Error),
    /// Leadership was lost.
    #[error("leadership lost")]
    LeaderLost,
}
