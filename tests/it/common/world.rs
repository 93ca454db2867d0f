//! One test's world: a namespace with the worker Deployment `w`, the fake fleet of `w` scraped
//! by its own real Prometheus, fake pods of `w` running the worker library's admin server, and
//! the operator processes the test starts. Built with [`World::builder`]; the areas add what is
//! theirs (the guarded autoscaler, the GitOps view of the object) around it.
//!
//! Dropping the world stops its operators and Prometheus; what it created in the cluster is
//! deleted by the next test's [`serial`](super::serial).

use std::future::Future;
use std::time::Duration;

use backpressure_api::WorkerBackpressure;
use backpressure_api::v1alpha1::{Regime, WorkerBackpressureStatus};
use backpressure_envtest::{Prometheus, TestEnv};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::fleet::FakeFleet;
use super::operator::{Operator, operator_user};
use super::pods::{self, FakePod};
use super::scene::{self, Scene, tail, wbp_object};

/// The name of the Deployment, the workload label and the test's WorkerBackpressure.
pub const W: &str = "w";

/// How to build a [`World`].
#[derive(Debug)]
pub struct WorldBuilder {
    prefix: String,
    replicas: i32,
    pods: usize,
    applied_by: Option<String>,
    env: Option<&'static TestEnv>,
}

impl WorldBuilder {
    /// `spec.replicas` of the Deployment (1 unless set).
    pub fn replicas(mut self, replicas: i32) -> Self {
        self.replicas = replicas;
        self
    }

    /// Fake pods of `w` (none unless set). The fleet reports a backoff for as many workers, and
    /// for one when there are no pods.
    pub fn pods(mut self, count: usize) -> Self {
        self.pods = count;
        self
    }

    /// The Deployment as Git holds it, server-side applied by `manager` without
    /// `spec.replicas` (instead of created with [`replicas`](Self::replicas)).
    pub fn deployment_applied_by(mut self, manager: &str) -> Self {
        self.applied_by = Some(manager.to_owned());
        self
    }

    /// Builds the world on control plane `env` instead of the shared one.
    pub fn env(mut self, env: &'static TestEnv) -> Self {
        self.env = Some(env);
        self
    }

    /// Creates the namespace (installing the CRDs if needed), the Deployment and the pods, and
    /// starts the fleet and its Prometheus.
    pub async fn start(self) -> World {
        let scene = match self.env {
            Some(env) => Scene::new_in(env, &self.prefix).await,
            None => Scene::new(&self.prefix).await,
        };
        match &self.applied_by {
            Some(manager) => apply_deployment(&scene, manager).await.unwrap(),
            None => scene.deployment(W, self.replicas).await,
        }
        let pods = pods::start_many(scene.env, &scene.ns, W, self.pods).await;
        let fleet = FakeFleet::start(&scene.ns, W, self.pods.max(1));
        let prom = fleet.prometheus();
        World {
            scene,
            fleet,
            prom,
            pods,
            operators: Vec::new(),
        }
    }
}

/// See the [module](self).
pub struct World {
    /// The namespace and an admin client.
    pub scene: Scene,
    /// The metrics of `w`'s workers and queue.
    pub fleet: FakeFleet,
    /// The Prometheus scraping [`fleet`](Self::fleet).
    pub prom: Prometheus,
    /// The fake pods of `w`.
    pub pods: Vec<FakePod>,
    /// The operators started so far (the failover test runs two).
    pub operators: Vec<Operator>,
}

impl World {
    /// A world in namespace `<prefix>-<unique>`; see [`WorldBuilder`].
    pub fn builder(prefix: &str) -> WorldBuilder {
        WorldBuilder {
            prefix: prefix.to_owned(),
            replicas: 1,
            pods: 0,
            applied_by: None,
            env: None,
        }
    }

    /// Starts an operator reading this world's Prometheus.
    pub async fn start_operator(&mut self) {
        let url = self.prom.url();
        self.start_operator_with(&url, &[]).await;
    }

    /// Starts an operator with `--prometheus-url=<prometheus>` and `flags`.
    pub async fn start_operator_with(&mut self, prometheus: &str, flags: &[&str]) {
        let op = Operator::start(self.scene.env, prometheus, flags).await;
        self.operators.push(op);
    }

    /// The operator started last.
    pub fn operator(&self) -> &Operator {
        self.operators.last().expect("no operator started")
    }

    /// The operator started last.
    pub fn operator_mut(&mut self) -> &mut Operator {
        self.operators.last_mut().expect("no operator started")
    }

    /// Stops every operator (SIGTERM, waiting for it).
    pub fn stop_operators(&mut self) {
        for mut op in self.operators.drain(..) {
            op.process.stop();
        }
    }

    /// Server-side applies WorkerBackpressure `w` for Deployment `w` with the test
    /// [`spec`](scene::spec) reading this world's Prometheus, patched by `patch`.
    pub async fn apply(&self, patch: Value) {
        self.scene.apply_w(W, &self.prom.url(), patch).await;
    }

    /// Applies WorkerBackpressure `name` with `spec` as Git does: labelled `team=shop`,
    /// server-side applied by `manager` without force (a conflict with the operator's fields
    /// is an error).
    pub async fn git_apply(&self, name: &str, manager: &str, spec: Value) -> kube::Result<()> {
        let mut obj = wbp_object(name, spec);
        obj["metadata"]["labels"] = json!({"team": "shop"});
        self.wbps()
            .patch(name, &PatchParams::apply(manager), &Patch::Apply(&obj))
            .await
            .map(drop)
    }

    /// Re-applies the Deployment as Git holds it (see
    /// [`deployment_applied_by`](WorldBuilder::deployment_applied_by)).
    pub async fn apply_deployment(&self, manager: &str) -> kube::Result<()> {
        apply_deployment(&self.scene, manager).await
    }

    /// The WorkerBackpressure API of the namespace.
    pub fn wbps(&self) -> Api<WorkerBackpressure> {
        self.scene.wbps()
    }

    /// The status of `w` (default when not yet written).
    pub async fn status(&self) -> WorkerBackpressureStatus {
        self.scene.status(W).await
    }

    /// `spec.replicas` of Deployment `w`.
    pub async fn replicas(&self) -> i32 {
        self.scene.replicas(W).await
    }

    /// Events in the namespace.
    pub async fn events(&self) -> Vec<Event> {
        self.scene.events().await
    }

    /// The first event in the namespace with `reason`.
    pub async fn event(&self, reason: &str) -> Option<Event> {
        self.events()
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason))
    }

    /// Waits for the first event in the namespace with `reason`: the operator publishes its
    /// events after the status write a test may have seen.
    pub async fn wait_event(&self, reason: &str, timeout: Duration) -> Event {
        self.wait_for(timeout, &format!("a {reason} event"), || self.event(reason))
            .await
    }

    /// The operator's writes to any `/scale` subresource in the namespace so far (verb and
    /// request URI).
    pub fn scale_writes(&self) -> Vec<String> {
        self.scene
            .env
            .audit_writes_by(&operator_user())
            .iter()
            .filter(|e| {
                e["objectRef"]["namespace"] == self.scene.ns.as_str()
                    && e["objectRef"]["subresource"] == "scale"
            })
            .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
            .collect()
    }

    /// The replicas and status of `w` and the last lines of every operator's log, for a
    /// failure message.
    pub async fn diag(&self) -> String {
        let replicas = Api::<Deployment>::namespaced(self.scene.client.clone(), &self.scene.ns)
            .get_opt(W)
            .await
            .ok()
            .flatten()
            .and_then(|d| d.spec?.replicas);
        let status = self
            .wbps()
            .get_opt(W)
            .await
            .ok()
            .flatten()
            .and_then(|w| w.status);
        let logs: Vec<String> = self.operators.iter().map(|o| tail(&o.log(), 40)).collect();
        format!(
            "replicas: {replicas:?}\nstatus: {}\noperator logs (last lines):\n{}",
            serde_json::to_string_pretty(&status).unwrap_or_default(),
            logs.join("\n----\n")
        )
    }

    /// Polls `f` every 250 ms until it returns `Some`, or panics with `what` and
    /// [`diag`](Self::diag) after `timeout`.
    pub async fn wait_for<T, F, Fut>(&self, timeout: Duration, what: &str, f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        scene::wait_for(timeout, what, || self.diag(), f).await
    }

    /// Waits until the status of `w` satisfies `pred` and returns it.
    pub async fn wait_status(
        &self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&WorkerBackpressureStatus) -> bool,
    ) -> WorkerBackpressureStatus {
        self.wait_for(timeout, what, || async {
            let s = self.status().await;
            pred(&s).then_some(s)
        })
        .await
    }

    /// Waits until `w` is in `regime`.
    pub async fn wait_regime(&self, regime: Regime, timeout: Duration) -> WorkerBackpressureStatus {
        self.wait_status(timeout, &format!("regime {regime:?}"), |s| {
            s.regime == Some(regime)
        })
        .await
    }
}

/// What Git holds for the worker Deployment: everything but `spec.replicas`, applied by
/// `manager` without force.
async fn apply_deployment(scene: &Scene, manager: &str) -> kube::Result<()> {
    let d = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": W, "labels": {"team": "shop"}},
        "spec": {
            "selector": {"matchLabels": {"app": W}},
            "template": {
                "metadata": {"labels": {"app": W}},
                "spec": {"containers": [{"name": "worker", "image": "worker:test"}]}
            }
        }
    });
    let api: Api<Deployment> = Api::namespaced(scene.client.clone(), &scene.ns);
    api.patch(W, &PatchParams::apply(manager), &Patch::Apply(&d))
        .await
        .map(drop)
}
