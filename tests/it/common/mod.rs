//! The harness shared by the integration tests: the one lock on the control plane
//! ([`serial`]), the operator process and its RBAC (`operator`), CRDs (`crds`), a test's
//! namespace and world (`scene`, `world`), fakes of what surrounds the operator (`fleet`,
//! `fakeprom`, `pods`, `badpods`), the GitOps status checkers (`kstatus`), and a tenant with only namespaced
//! WorkerBackpressure rights (`tenant`).

pub mod badpods;
pub mod crds;
pub mod fakeprom;
pub mod fleet;
pub mod kstatus;
pub mod operator;
pub mod pods;
pub mod scene;
pub mod tenant;
pub mod world;

use backpressure_api::WorkerBackpressure;
use backpressure_api::v1alpha1::BackpressurePolicy;
use backpressure_envtest::TestEnv;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
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
