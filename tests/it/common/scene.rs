//! A namespace of a test with its Deployments and WorkerBackpressures, and the spec, condition
//! and polling helpers every area uses.

use std::future::Future;
use std::time::{Duration, Instant};

use backpressure_api::WorkerBackpressure;
use backpressure_api::v1alpha1::WorkerBackpressureStatus;
use backpressure_envtest::TestEnv;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use super::operator::operator_user;

/// One namespace of a test.
#[derive(Clone)]
pub struct Scene {
    /// The control plane.
    pub env: &'static TestEnv,
    /// An admin client.
    pub client: kube::Client,
    /// The namespace.
    pub ns: String,
}

impl Scene {
    /// Installs the CRDs (idempotent) and creates a namespace `<prefix>-<unique>`.
    pub async fn new(prefix: &str) -> Scene {
        Scene::new_in(TestEnv::shared(), prefix).await
    }

    /// [`Scene::new`] on the control plane `env` (e.g. the one running KEDA).
    pub async fn new_in(env: &'static TestEnv, prefix: &str) -> Scene {
        let client = env.client().unwrap();
        super::crds::install_crds(&client).await;
        let ns = env.namespace(prefix).await.unwrap();
        Scene { env, client, ns }
    }

    /// Creates Deployment `name` with `replicas` (nothing runs it).
    pub async fn deployment(&self, name: &str, replicas: i32) {
        super::pods::deployment(&self.client, &self.ns, name, replicas).await;
    }

    /// `spec.replicas` of Deployment `name`.
    pub async fn replicas(&self, name: &str) -> i32 {
        super::pods::replicas(&self.client, &self.ns, name).await
    }

    /// `metadata.generation` of Deployment `name` (grows by one per spec change).
    pub async fn deployment_generation(&self, name: &str) -> i64 {
        let api: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(self.client.clone(), &self.ns);
        api.get(name)
            .await
            .unwrap()
            .metadata
            .generation
            .unwrap_or(0)
    }

    /// Sets Deployment `name`'s replicas through `/scale`, as `kubectl scale` does.
    pub async fn kubectl_scale(&self, name: &str, replicas: i32) {
        let api: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(self.client.clone(), &self.ns);
        api.patch_scale(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": replicas}})),
        )
        .await
        .unwrap();
    }

    /// The WorkerBackpressure API of the namespace.
    pub fn wbps(&self) -> Api<WorkerBackpressure> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Server-side applies WorkerBackpressure `name` with `spec` (field manager `test`, forced).
    pub async fn apply(&self, name: &str, spec: Value) {
        apply_wbp(&self.client, &self.ns, name, spec).await;
    }

    /// Server-side applies WorkerBackpressure `name` for Deployment `w` (workload `w`) with the
    /// test [`spec`] reading `prometheus`, patched by `patch`.
    pub async fn apply_w(&self, name: &str, prometheus: &str, patch: Value) {
        self.apply(name, spec("w", "w", prometheus, patch)).await;
    }

    /// The status of WorkerBackpressure `name` (default when not yet written).
    pub async fn status(&self, name: &str) -> WorkerBackpressureStatus {
        status_of(&self.client, &self.ns, name).await
    }

    /// Events in the namespace.
    pub async fn events(&self) -> Vec<Event> {
        events_in(&self.client, &self.ns).await
    }

    /// Events about WorkerBackpressure `name` with `reason`.
    pub async fn events_of(&self, name: &str, reason: &str) -> Vec<Event> {
        self.events()
            .await
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect()
    }

    /// Scale writes (`/scale` patches and updates) by the operator to Deployment `name` so far.
    pub fn operator_scale_writes(&self, name: &str) -> usize {
        self.env
            .audit_writes_by(&operator_user())
            .iter()
            .filter(|e| {
                let o = &e["objectRef"];
                o["namespace"] == self.ns.as_str()
                    && o["resource"] == "deployments"
                    && o["name"] == name
                    && o["subresource"] == "scale"
                    && e["verb"] != "get"
            })
            .count()
    }
}

/// A WorkerBackpressure object `name` with `spec`, as a server-side apply body.
pub fn wbp_object(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "backpressure.dev/v1alpha1",
        "kind": "WorkerBackpressure",
        "metadata": {"name": name},
        "spec": spec,
    })
}

/// Server-side applies WorkerBackpressure `name` in `ns` with `spec` (field manager `test`,
/// forced).
pub async fn apply_wbp(client: &kube::Client, ns: &str, name: &str, spec: Value) {
    Api::<WorkerBackpressure>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::apply("test").force(),
            &Patch::Apply(&wbp_object(name, spec)),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {name}: {e}"));
}

/// The status of WorkerBackpressure `name` in `ns` (default when not yet written).
pub async fn status_of(client: &kube::Client, ns: &str, name: &str) -> WorkerBackpressureStatus {
    Api::<WorkerBackpressure>::namespaced(client.clone(), ns)
        .get_status(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

/// Events in namespace `ns`.
pub async fn events_in(client: &kube::Client, ns: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// A WorkerBackpressure spec for Deployment `target` reading workload `workload` from
/// `prometheus`, with the fast time constants of the integration tests, patched by `patch`.
pub fn spec(target: &str, workload: &str, prometheus: &str, patch: Value) -> Value {
    let mut spec = json!({
        "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
        "metrics": {
            "prometheus": {"address": prometheus, "timeout": "2s"},
            "workload": workload,
            "rateWindow": "5s",
            "staleAfter": "10s",
        },
        "scaling": {
            "minReplicas": 1,
            "maxReplicas": 20,
            "targetQueueAge": "10s",
            "hold": {"backoffAbove": 0.2, "for": "2s"},
            "release": {"backoffBelow": 0.05, "for": "2s"},
            "scaleUp": {"maxPods": 2, "maxPercent": 50, "period": "3s"},
            "scaleDown": {"maxPercent": 10, "period": "60s", "stabilization": "60s"},
            "rampUp": {"stages": [34, 67, 100], "dwell": "4s", "abortAbove": 0.3},
        },
    });
    merge(&mut spec, patch);
    spec
}

/// A spec patch with minReplicas 0 and an immediate scale-down: a missing metric misread as
/// zero (age 0) would take the fleet to zero within seconds.
pub fn zero_trap() -> Value {
    json!({"scaling": {
        "minReplicas": 0,
        "scaleDown": {"maxPercent": 100, "period": "1s", "stabilization": "0s"},
    }})
}

/// Deep-merges `patch` into `base` (objects merge, anything else replaces).
pub fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p,
    }
}

/// Condition `t` of a status.
pub fn condition<'a>(s: &'a WorkerBackpressureStatus, t: &str) -> Option<&'a Condition> {
    condition_in(s.conditions.as_ref(), t)
}

/// Condition `t` among `conditions` (of any object's status).
pub fn condition_in<'a>(conditions: Option<&'a Vec<Condition>>, t: &str) -> Option<&'a Condition> {
    conditions.into_iter().flatten().find(|c| c.type_ == t)
}

/// Whether condition `t` has `status` (`"True"`, `"False"`).
pub fn has_condition(s: &WorkerBackpressureStatus, t: &str, status: &str) -> bool {
    condition(s, t).is_some_and(|c| c.status == status)
}

/// Polls `f` every 250 ms until it returns `Some`, or panics with `what` and `diag()`.
pub async fn wait_for<T, D, DFut, F, Fut>(timeout: Duration, what: &str, diag: D, f: F) -> T
where
    D: FnOnce() -> DFut,
    DFut: Future<Output = String>,
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for_every(Duration::from_millis(250), timeout, what, diag, f).await
}

/// Polls `f` every `every` until it returns `Some`, or panics with `what` and `diag()` after
/// `timeout`.
pub async fn wait_for_every<T, D, DFut, F, Fut>(
    every: Duration,
    timeout: Duration,
    what: &str,
    diag: D,
    mut f: F,
) -> T
where
    D: FnOnce() -> DFut,
    DFut: Future<Output = String>,
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                diag().await
            );
        }
        tokio::time::sleep(every).await;
    }
}

/// The last `n` lines of a log.
pub fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
