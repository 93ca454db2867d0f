//! Helpers shared by the operator's integration tests.
#![allow(dead_code)]

use std::time::Duration;

use backpressure_api::WorkerBackpressure;
use backpressure_api::v1alpha1::BackpressurePolicy;
use backpressure_envtest::TestEnv;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;

/// One test at a time on the control plane: every test that talks to the API server holds the
/// returned guard for its whole duration (`let _serial = serial().await;`).
///
/// One lock for the run, not one per area: the operator binary watches every namespace (so it
/// would rewrite the statuses another test writes by hand, and push configs to another test's
/// pods), the no-op, ownership and fault tests count the operator's writes in the cluster-wide
/// audit log, the failover test races two operators for a Lease, and one test restarts the API
/// server under everyone. Before the lock is handed over, what earlier tests left in the
/// cluster for an operator to act on (WorkerBackpressures, BackpressurePolicies; a failed test
/// leaves them behind) is deleted, so each test starts as on a control plane of its own.
///
/// A tokio mutex, so the guard may be held across awaits; it is released when the test ends,
/// also by a panic.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let guard = LOCK.lock().await;
    sweep(&TestEnv::shared().client().unwrap()).await;
    guard
}

/// Deletes every WorkerBackpressure (finalizers first: no operator is running to remove Guard
/// mode's) and every BackpressurePolicy.
async fn sweep(client: &kube::Client) {
    let all: Api<WorkerBackpressure> = Api::all(client.clone());
    for w in list_or_none(&all).await {
        let api: Api<WorkerBackpressure> = Api::namespaced(client.clone(), &w.namespace().unwrap());
        let name = w.name_any();
        if !w.finalizers().is_empty() {
            let clear = json!({"metadata": {"finalizers": null}});
            gone_is_fine(
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&clear))
                    .await
                    .map(drop),
            );
        }
        gone_is_fine(api.delete(&name, &DeleteParams::default()).await.map(drop));
    }
    let policies: Api<BackpressurePolicy> = Api::all(client.clone());
    for p in list_or_none(&policies).await {
        gone_is_fine(
            policies
                .delete(&p.name_any(), &DeleteParams::default())
                .await
                .map(drop),
        );
    }
}

/// Every object of `api`; none when its CRD is not installed yet.
async fn list_or_none<K>(api: &Api<K>) -> Vec<K>
where
    K: Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(s)) if s.code == 404 => Vec::new(),
        Err(e) => panic!("listing what earlier tests left behind: {e}"),
    }
}

fn gone_is_fine(result: Result<(), kube::Error>) {
    match result {
        Ok(()) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("deleting what earlier tests left behind: {e}"),
    }
}

/// Applies the committed CRDs (crds/*.yaml) with server-side apply and waits until each is
/// Established. Safe to call from every test.
pub async fn install_crds(client: &kube::Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dir = backpressure_envtest::repo_root().join("crds");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let crd: CustomResourceDefinition =
                serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let name = crd.metadata.name.clone().unwrap();
            api.patch(
                &name,
                &PatchParams::apply("envtest").force(),
                &Patch::Apply(&crd),
            )
            .await
            .unwrap_or_else(|e| panic!("apply {}: {e}", path.display()));
            names.push(name);
        }
    }
    for name in names {
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap_or_else(|_| panic!("CRD {name} not Established within 30s"))
        .unwrap();
    }
    // Discovery of a new group can lag the Established condition by a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

pub mod badpods;
pub mod fakeprom;
pub mod fleet;
pub mod operator;
pub mod pods;
pub mod scene;
