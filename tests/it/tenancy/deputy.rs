//! The operator as a confused deputy in the tenant's own namespace: what the tenant may not do
//! itself (touch a ConfigMap), it must not get done by naming a WorkerBackpressure after it.

use std::collections::BTreeMap;
use std::time::Duration;

use backpressure_api::conditions as cond;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use crate::common::operator::{Operator, operator_user};
use crate::common::scene::{Scene, condition, spec, wait_for};
use crate::common::serial;
use crate::common::tenant::Tenant;

/// A tenant names its object `w` so that the operator's ConfigMap `w-worker-config` is the
/// name of a ConfigMap an admin created. The operator must not force-apply onto it, add its
/// ownerRef (the garbage collector would delete it with the object) or re-patch it: it leaves
/// it untouched and reports it (Ready and ConfigInSync False, reason ConfigMapNotOwned, and a
/// Warning event naming it). A second object `v` whose ConfigMap name is free shows that the
/// operator still creates its own ConfigMap and that the garbage collector runs: `v`'s
/// ConfigMap goes with `v`, the admin's stays.
///
/// Protection: `act::configmap::sync` (creates, or updates only a ConfigMap carrying the
/// object's controller ownerRef).
#[tokio::test]
async fn a_tenant_cannot_make_the_operator_adopt_a_configmap_it_does_not_own() {
    let _serial = serial().await;
    let scene = Scene::new("deputy-cm").await;
    scene.env.start_garbage_collector().unwrap();
    scene.deployment("w", 1).await;
    scene.deployment("v", 1).await;
    let cms: Api<ConfigMap> = Api::namespaced(scene.client.clone(), &scene.ns);
    let admins: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "w-worker-config", "labels": {"team": "platform"}},
        "data": {"settings.yaml": "keep: me\n"},
    }))
    .unwrap();
    let before = cms.create(&PostParams::default(), &admins).await.unwrap();

    let tenant = Tenant::of(&scene).await;
    let op = Operator::start(scene.env, "http://127.0.0.1:1", &[]).await;
    let dead = "http://127.0.0.1:1";
    tenant
        .apply("w", spec("w", "w", dead, json!({})))
        .await
        .unwrap();
    tenant
        .apply("v", spec("v", "v", dead, json!({})))
        .await
        .unwrap();

    let diag = || async { crate::common::scene::tail(&op.log(), 40) };
    // The operator has reconciled both: v's own ConfigMap exists and w has a status.
    wait_for(
        Duration::from_secs(30),
        "v's own ConfigMap and w's status",
        diag,
        || async {
            let v = cms.get_opt("v-worker-config").await.unwrap();
            let w = scene.status("w").await;
            (v.is_some() && w.conditions.is_some()).then_some(())
        },
    )
    .await;
    // Several reconciles later (1 s interval): the admin's ConfigMap is exactly as it was, and
    // the operator never wrote to it (not even a failed create).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = cms.get("w-worker-config").await.unwrap();
    assert_eq!(after.data, before.data);
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert_eq!(after.metadata.owner_references, None);
    assert_eq!(after.metadata.labels, before.metadata.labels);
    let writes: Vec<_> = scene
        .env
        .audit_writes_by(&operator_user())
        .into_iter()
        .filter(|e| {
            e["objectRef"]["namespace"] == scene.ns.as_str()
                && e["objectRef"]["resource"] == "configmaps"
                && e["objectRef"]["name"] == "w-worker-config"
        })
        .collect();
    assert!(
        writes.is_empty(),
        "the operator wrote the admin's ConfigMap: {writes:?}"
    );
    let status = wait_for(
        Duration::from_secs(30),
        "w reports ConfigInSync=False ConfigMapNotOwned",
        diag,
        || async {
            let s = scene.status("w").await;
            condition(&s, cond::CONFIG_IN_SYNC)
                .is_some_and(|c| c.status == "False" && c.reason == "ConfigMapNotOwned")
                .then_some(s)
        },
    )
    .await;
    let ready = condition(&status, cond::READY).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "ConfigMapNotOwned"),
        "{ready:?}"
    );
    assert!(
        condition(&status, cond::CONFIG_IN_SYNC)
            .unwrap()
            .message
            .contains("ConfigMap w-worker-config"),
        "{status:?}"
    );
    let events = wait_for(
        Duration::from_secs(15),
        "a ConfigMapNotOwned Warning event about w",
        diag,
        || async {
            let e = scene.events_of("w", "ConfigMapNotOwned").await;
            (!e.is_empty()).then_some(e)
        },
    )
    .await;
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert!(
        events[0]
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("w-worker-config"),
        "{events:?}"
    );

    // Reported, not retried as an error (no backoff storm).
    let metrics = op.scrape();
    let errors: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("backpressure_operator_reconcile_errors_total")
                && l.contains("configmap")
                && !l.ends_with(" 0")
        })
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    // Only one event, however many reconciles.
    assert_eq!(
        scene.events_of("w", "ConfigMapNotOwned").await[0]
            .series
            .as_ref()
            .map_or(1, |s| s.count),
        1
    );

    // The tenant deletes both objects: the garbage collector removes v's ConfigMap, never the
    // admin's.
    for name in ["w", "v"] {
        tenant
            .wbps()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    wait_for(
        Duration::from_secs(60),
        "the garbage collector to delete v-worker-config",
        diag,
        || async {
            cms.get_opt("v-worker-config")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    let kept = cms.get("w-worker-config").await.unwrap();
    assert_eq!(
        kept.data,
        Some(BTreeMap::from([(
            "settings.yaml".into(),
            "keep: me\n".into()
        )]))
    );
    assert_eq!(
        kept.metadata.resource_version,
        before.metadata.resource_version
    );
}
