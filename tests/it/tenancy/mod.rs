//! Multi-tenancy: what a namespace owner who may only create WorkerBackpressures in their own
//! namespace can reach through the operator. Each attack of `docs/security.md` is one test,
//! acting as a [`Tenant`]; each fails when the protection it names is removed.

mod deputy;
mod metrics;
mod push;
mod rbac;
mod scope;
mod watch;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::common::scene::{Scene, spec};
use crate::common::serial;
use crate::common::tenant::Tenant;

/// The tenant of the attack tests has exactly the rights they assume: WorkerBackpressures in
/// its namespace, and no Secrets, no `/scale`, no other namespace.
#[tokio::test]
async fn the_tenant_has_only_namespaced_worker_backpressure_rights() {
    let _serial = serial().await;
    let a = Scene::new("tenant-a").await;
    let b = Scene::new("tenant-b").await;
    a.deployment("w", 1).await;
    let tenant = Tenant::of(&a).await;

    tenant
        .apply("w", spec("w", "w", "http://127.0.0.1:1", json!({})))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{} may apply a WorkerBackpressure in {}: {e}",
                tenant.user, a.ns
            )
        });

    let forbidden = |r: kube::Result<_>| matches!(r, Err(kube::Error::Api(e)) if e.code == 403);
    let secrets: Api<Secret> = Api::namespaced(tenant.client.clone(), &a.ns);
    assert!(forbidden(secrets.list(&Default::default()).await.map(drop)));
    let deployments: Api<Deployment> = Api::namespaced(tenant.client.clone(), &a.ns);
    let scale = deployments
        .patch_scale(
            "w",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 5}})),
        )
        .await;
    assert!(forbidden(scale.map(drop)));
    let other: Api<backpressure_api::WorkerBackpressure> =
        Api::namespaced(tenant.client.clone(), &b.ns);
    assert!(forbidden(other.list(&Default::default()).await.map(drop)));
}
