//! Guard and scaling scope, limited by the chart's optional admission policies
//! (`admission.scope`, templates/admission-scope.yaml): a tenant's WorkerBackpressure may name
//! only the targets its Namespace's annotation lists, and Guard mode clamps only HPAs labelled
//! for it. Installed for real into the API server (bound to this test's namespace only, by
//! `admission.scope.namespaceSelector`), and removed at the end.

use std::time::Duration;

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::GuardKind;
use backpressure_operator::act::guard::api_resource;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::fleet::steady;
use crate::common::operator::{apply_chart_objects, operator_user, render_chart_with};
use crate::common::scene::{condition, merge, spec, wait_for};
use crate::common::serial;
use crate::common::tenant::Tenant;
use crate::common::world::World;

/// Applies the scope policies bound to namespaces labelled `bp-scope-test: <ns>`; returns what
/// to delete afterwards.
async fn install_scope(
    client: &kube::Client,
    ns: &str,
) -> Vec<(kube::discovery::ApiResource, String)> {
    let selector = format!("admission.scope.namespaceSelector.matchLabels.bp-scope-test={ns}");
    let objects = render_chart_with(
        &["templates/admission-scope.yaml"],
        &["admission.scope.enabled=true", &selector],
    );
    let installed = apply_chart_objects(client, objects).await;
    assert_eq!(installed.len(), 4, "two policies, two bindings");
    installed
}

/// A tenant allowed to target only `Deployment/w` tries `other`: rejected at admission naming
/// `spec.targetRef`. Its Guard-mode object on the allowed target guards HPA `w`, which is not
/// labelled for Guard mode: the operator's clamp is refused by the API server, the HPA stays as
/// it was, and the object says why (GuardApplied and Ready False). Labelled, it is clamped.
///
/// Protection: the ValidatingAdmissionPolicies of `admission.scope`.
#[tokio::test]
async fn scope_policies_limit_targets_and_guarded_autoscalers() {
    let _serial = serial().await;
    let mut w = World::builder("scope").replicas(2).start().await;
    w.fleet.set(steady);
    let (client, ns) = (w.scene.client.clone(), w.scene.ns.clone());
    w.scene.deployment("other", 1).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "labels": {"bp-scope-test": ns},
                "annotations": {"backpressure.dev/allowed-targets": "Deployment/w"},
            }})),
        )
        .await
        .unwrap();
    let installed = install_scope(&client, &ns).await;
    let hpas: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &api_resource(GuardKind::HorizontalPodAutoscaler),
    );
    let hpa: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "w", "labels": {"team": "payments"}},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "w"},
                 "minReplicas": 1, "maxReplicas": 10},
    }))
    .unwrap();
    let before = hpas.create(&PostParams::default(), &hpa).await.unwrap();
    let tenant = Tenant::of(&w.scene).await;
    let prom = w.prom.url();

    // (a) A target the namespace's annotation does not list. The policy takes effect within a
    // second or two of its creation: retry until the API server enforces it.
    let forbidden = wait_for(
        Duration::from_secs(30),
        "the scope policy to reject a target that is not allowed",
        || async { String::new() },
        || async {
            match tenant
                .apply("x", spec("other", "w", &prom, json!({})))
                .await
            {
                Ok(_) => {
                    let _ = tenant.wbps().delete("x", &Default::default()).await;
                    None
                }
                Err(kube::Error::Api(s)) => Some(s),
                Err(e) => panic!("{e}"),
            }
        },
    )
    .await;
    assert!(
        forbidden.message.contains("spec.targetRef")
            && forbidden.message.contains("Deployment/other"),
        "{forbidden:?}"
    );
    // The same for a producer workload: pausing it is acting on it.
    let mut producing = spec("w", "w", &prom, json!({}));
    merge(
        &mut producing,
        json!({"producers": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "other"},
            "queueDepth": {"pauseAbove": 100, "resumeBelow": 10},
        }}),
    );
    let err = tenant.apply("p", producing).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.message.contains("spec.producers.targetRef")
            && s.message.contains("Deployment/other")),
        "{err:?}"
    );

    // (b) Guard mode on the allowed target, over an HPA without the label; held by hand.
    let mut guard = spec("w", "w", &prom, json!({}));
    merge(
        &mut guard,
        json!({"mode": "Guard", "guard": {"kind": "HorizontalPodAutoscaler", "name": "w"}}),
    );
    let scaling = guard["scaling"].as_object_mut().unwrap();
    scaling.remove("scaleUp");
    scaling.remove("scaleDown");
    tenant.apply("w", guard).await.unwrap();
    // Each policy takes effect on its own: before the operator starts, wait until the guard
    // policy refuses the operator's user a (dry-run) clamp record on the unlabelled HPA.
    let as_operator = w
        .scene
        .env
        .client_as(
            &operator_user(),
            &["system:masters", "system:authenticated"],
        )
        .unwrap();
    let probe: Api<DynamicObject> = Api::namespaced_with(
        as_operator,
        &ns,
        &api_resource(GuardKind::HorizontalPodAutoscaler),
    );
    wait_for(
        Duration::from_secs(30),
        "the guard policy to refuse the operator an unlabelled HPA",
        || async { String::new() },
        || async {
            match probe
                .patch(
                    "w",
                    &PatchParams {
                        dry_run: true,
                        ..PatchParams::default()
                    },
                    &Patch::Merge(json!({"metadata": {"annotations": {
                        "backpressure.dev/original": "{}"}}})),
                )
                .await
            {
                Ok(_) => None,
                Err(kube::Error::Api(s)) if s.message.contains("backpressure.dev/guard") => {
                    Some(())
                }
                Err(e) => panic!("{e}"),
            }
        },
    )
    .await;
    let until = (k8s_openapi::jiff::Timestamp::now()
        + k8s_openapi::jiff::SignedDuration::from_mins(30))
    .to_string();
    tenant
        .wbps()
        .patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                backpressure_operator::annotations::HOLD_UNTIL: until}}})),
        )
        .await
        .unwrap();
    w.start_operator().await;

    let diag = || async { crate::common::scene::tail(&w.operator().log(), 30) };
    let status = wait_for(
        Duration::from_secs(30),
        "GuardApplied=False naming the label",
        diag,
        || async {
            let s = w.scene.status("w").await;
            condition(&s, cond::GUARD_APPLIED)
                .is_some_and(|c| {
                    c.status == "False" && c.message.contains("backpressure.dev/guard")
                })
                .then_some(s)
        },
    )
    .await;
    assert_eq!(
        condition(&status, cond::READY).map(|c| c.status.as_str()),
        Some("False"),
        "{status:?}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = hpas.get("w").await.unwrap();
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "the operator changed an HPA it may not clamp: {after:?}"
    );
    assert!(after.data["spec"].get("behavior").is_none(), "{after:?}");

    // Labelled by its owner: now the operator clamps it.
    hpas.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"backpressure.dev/guard": "allowed"}}})),
    )
    .await
    .unwrap();
    wait_for(
        Duration::from_secs(30),
        "the labelled HPA clamped",
        diag,
        || async {
            let h = hpas.get("w").await.unwrap();
            (h.data["spec"]["behavior"]["scaleUp"]["selectPolicy"] == "Disabled").then_some(())
        },
    )
    .await;

    w.stop_operators();
    for (ar, name) in installed {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        api.delete(&name, &Default::default()).await.unwrap();
    }
}
