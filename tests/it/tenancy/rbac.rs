//! Least privilege, measured: the operator is driven through every feature in one run, and each
//! (apiGroup, resource[/subresource], verb) its shipped RBAC grants (`config/rbac/role.yaml`,
//! the ClusterRole, and `config/rbac/namespace_role.yaml`, the Role in its own namespace) must
//! show up in the API server's audit log as a request the operator made, unless a comment
//! below says why it cannot. The audit policy of the test control plane records every request
//! of a ServiceAccount, reads included (`TestEnv::audit_requests_by`).

use std::collections::BTreeSet;
use std::time::Duration;

use backpressure_api::v1alpha1::BackpressurePolicy;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::common::crds::install_keda_scaledobject_crd;
use crate::common::fleet::backlog;
use crate::common::operator::{OPERATOR_NAMESPACE, operator_user, render_chart_with};
use crate::common::scene::{merge, spec};
use crate::common::serial;
use crate::common::world::World;

/// (apiGroup, resource or resource/subresource, verb).
type Grant = (String, String, String);

/// Grants the shipped RBAC gives that no request can show, and why. Anything else granted and
/// not used fails the test: trim the role (charts/backpressure-operator/templates, then
/// config/generate.sh).
const JUSTIFIED: &[(&str, &str, &str, &str)] = &[(
    "backpressure.dev",
    "workerbackpressures/finalizers",
    "update",
    "not a request: the OwnerReferencesPermissionEnforcement admission plugin (on in most \
     clusters, not in the test control plane) checks this permission when the operator \
     creates a ConfigMap whose ownerReference sets blockOwnerDeletion",
)];

/// Every (group, resource, verb) granted by the rules of the RBAC object in `file`.
fn grants(file: &str) -> BTreeSet<Grant> {
    let path = backpressure_envtest::repo_root().join(file);
    let role: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    rules_grants(&role, file)
}

/// Every (group, resource, verb) granted by the rules of `role`.
fn rules_grants(role: &Value, file: &str) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().into_iter().flatten() {
        let strings = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect()
        };
        for g in strings("apiGroups") {
            for r in strings("resources") {
                for v in strings("verbs") {
                    assert_ne!(v, "*", "{file}: wildcard verb");
                    assert_ne!(r, "*", "{file}: wildcard resource");
                    out.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}

/// The (group, resource, verb) of an audit event.
fn used(e: &Value) -> Option<Grant> {
    let o = &e["objectRef"];
    let resource = o["resource"].as_str()?;
    let resource = match o["subresource"].as_str() {
        Some(sub) if !sub.is_empty() => format!("{resource}/{sub}"),
        _ => resource.to_owned(),
    };
    Some((
        o["apiGroup"].as_str().unwrap_or_default().to_owned(),
        resource,
        e["verb"].as_str()?.to_owned(),
    ))
}

#[tokio::test]
async fn every_verb_the_operator_is_granted_is_one_it_uses() {
    let _serial = serial().await;
    let mut w = World::builder("rbac").replicas(2).pods(2).start().await;
    let (client, ns) = (w.scene.client.clone(), w.scene.ns.clone());
    install_keda_scaledobject_crd(&client).await;
    w.fleet.set(backlog);
    let prom = w.prom.url();

    // A StatefulSet target, and two guarded Deployments: one under an HPA, one under a
    // ScaledObject.
    let statefulsets: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &kube::discovery::ApiResource::erase::<k8s_openapi::api::apps::v1::StatefulSet>(&()),
    );
    let sts: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "s"},
        "spec": {
            "replicas": 1, "serviceName": "s",
            "selector": {"matchLabels": {"app": "s"}},
            "template": {"metadata": {"labels": {"app": "s"}},
                         "spec": {"containers": [{"name": "worker", "image": "worker:test"}]}},
        },
    }))
    .unwrap();
    statefulsets
        .create(&PostParams::default(), &sts)
        .await
        .unwrap();
    w.scene.deployment("g", 2).await;
    w.scene.deployment("k", 2).await;
    let hpas: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &backpressure_operator::act::guard::api_resource(
            backpressure_api::v1alpha1::GuardKind::HorizontalPodAutoscaler,
        ),
    );
    let hpa: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "g"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "g"},
                 "minReplicas": 1, "maxReplicas": 10},
    }))
    .unwrap();
    hpas.create(&PostParams::default(), &hpa).await.unwrap();
    let scaledobjects: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &backpressure_operator::act::guard::api_resource(
            backpressure_api::v1alpha1::GuardKind::ScaledObject,
        ),
    );
    let so: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": {"name": "k"},
        "spec": {"scaleTargetRef": {"name": "k"}, "maxReplicaCount": 10,
                 "triggers": [{"type": "prometheus", "metadata": {
                     "serverAddress": "http://prometheus:9090",
                     "query": "sum(backpressure_queue_depth)", "threshold": "100"}}]},
    }))
    .unwrap();
    scaledobjects
        .create(&PostParams::default(), &so)
        .await
        .unwrap();

    // Prometheus credentials from a Secret; a policy selecting the namespace.
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "prom-auth"},
        "stringData": {"token": "not-checked-by-this-prometheus"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let policy: BackpressurePolicy = serde_json::from_value(json!({
        "apiVersion": "backpressure.dev/v1alpha1", "kind": "BackpressurePolicy",
        "metadata": {"name": format!("rbac-{ns}")},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "defaults": {"worker": {"maxPermits": 16}},
        },
    }))
    .unwrap();
    let policies: Api<BackpressurePolicy> = Api::all(client.clone());
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();

    let start = w.scene.env.audit_requests_by(&operator_user()).len();
    // The chart's Lease, fresh (an earlier test of the run may have left it): created, then
    // renewed.
    let lease = "backpressure-operator-leader";
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let _ = leases.delete(lease, &Default::default()).await;
    w.start_operator_with(
        &prom,
        &[
            "--leader-elect=true",
            &format!("--lease-name={lease}"),
            "--lease-duration=4s",
        ],
    )
    .await;

    // Active on a Deployment with pods (config pushes, scale-out), with the Secret.
    let mut active = spec("w", "w", &prom, json!({}));
    merge(
        &mut active,
        json!({"metrics": {"prometheus": {"secretRef": {"name": "prom-auth"}}}}),
    );
    w.scene.apply("w", active.clone()).await;
    // Active on a StatefulSet (same fleet metrics).
    w.scene
        .apply("s", spec_for("StatefulSet", "s", &prom))
        .await;
    // Guard over the HPA and over the ScaledObject, held by hand (`kubectl wbp hold`).
    for (name, kind) in [("g", "HorizontalPodAutoscaler"), ("k", "ScaledObject")] {
        let mut g = spec(name, "w", &prom, json!({}));
        merge(
            &mut g,
            json!({"mode": "Guard", "guard": {"kind": kind, "name": name}}),
        );
        let scaling = g["scaling"].as_object_mut().unwrap();
        scaling.remove("scaleUp");
        scaling.remove("scaleDown");
        w.scene.apply(name, g).await;
        let until = (k8s_openapi::jiff::Timestamp::now()
            + k8s_openapi::jiff::SignedDuration::from_mins(30))
        .to_string();
        w.scene
            .wbps()
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    backpressure_operator::annotations::HOLD_UNTIL: until}}})),
            )
            .await
            .unwrap();
    }

    let diag = || async { crate::common::scene::tail(&w.operator().log(), 40) };
    crate::common::scene::wait_for(
        Duration::from_secs(60),
        "scale-outs, both guards clamped, the ConfigMap",
        diag,
        || async {
            let guard_clamped = |o: Option<DynamicObject>| {
                o.and_then(|o| o.metadata.annotations)
                    .is_some_and(|a| a.contains_key("backpressure.dev/original"))
            };
            let hpa = guard_clamped(hpas.get_opt("g").await.unwrap());
            let so = guard_clamped(scaledobjects.get_opt("k").await.unwrap());
            let scaled = w.scene.replicas("w").await > 2;
            let sts = statefulsets.get("s").await.unwrap().data["spec"]["replicas"]
                .as_i64()
                .unwrap_or(0)
                > 1;
            let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
                .get_opt("w-worker-config")
                .await
                .unwrap()
                .is_some();
            (hpa && so && scaled && sts && cm).then_some(())
        },
    )
    .await;
    // A change of the worker configuration: the existing, owned ConfigMap is updated.
    merge(&mut active, json!({"worker": {"maxPermits": 12}}));
    w.scene.apply("w", active).await;
    crate::common::scene::wait_for(
        Duration::from_secs(30),
        "the ConfigMap updated",
        diag,
        || async {
            let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
                .get("w-worker-config")
                .await
                .unwrap();
            cm.data
                .unwrap_or_default()
                .values()
                .any(|v| v.contains("\"maxPermits\": 12"))
                .then_some(())
        },
    )
    .await;
    // Leaving Guard mode restores the autoscalers and drops the finalizers.
    w.scene
        .wbps()
        .delete("g", &Default::default())
        .await
        .unwrap();
    // The policy status (written every few seconds) and repeated events (series patches).
    tokio::time::sleep(Duration::from_secs(8)).await;
    w.stop_operators();

    let requests = w.scene.env.audit_requests_by(&operator_user());
    let requests = &requests[start..];
    let used: BTreeSet<Grant> = requests.iter().filter_map(used).collect();
    let denied: Vec<String> = requests
        .iter()
        .filter(|e| e["responseStatus"]["code"] == 403)
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect();
    assert!(
        denied.is_empty(),
        "the operator was denied (its RBAC lacks what it uses): {denied:#?}"
    );

    let mut granted = grants("config/rbac/role.yaml");
    // The Role in its own namespace: only there, so its grants are compared in that namespace.
    granted.extend(grants("config/rbac/namespace_role.yaml"));
    let justified: BTreeSet<Grant> = JUSTIFIED
        .iter()
        .map(|(g, r, v, _)| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
        .collect();
    let unused: Vec<&Grant> = granted
        .iter()
        .filter(|g| !used.contains(*g) && !justified.contains(*g))
        .collect();
    assert!(
        unused.is_empty(),
        "granted but never used by the operator (trim the ClusterRole/Role, or justify it in \
         JUSTIFIED): {unused:#?}\nused: {used:#?}"
    );
    // What the test harness installs beyond the default: Secrets cluster-wide
    // (rbac.secrets.clusterWide), used for the secretRef.
    let harness = render_chart_with(
        &["templates/clusterrole.yaml"],
        &["rbac.secrets.clusterWide=true"],
    );
    let harness = rules_grants(&serde_json::to_value(&harness[0]).unwrap(), "clusterWide");
    let secrets = ("".to_owned(), "secrets".to_owned(), "get".to_owned());
    let extra: Vec<&Grant> = harness.difference(&granted).collect();
    assert_eq!(
        extra,
        [&secrets],
        "rbac.secrets.clusterWide adds exactly Secret get"
    );
    assert!(used.contains(&secrets), "the secretRef was not read");
    let stale: Vec<&Grant> = justified.iter().filter(|g| !granted.contains(*g)).collect();
    assert!(
        stale.is_empty(),
        "JUSTIFIED names grants the role no longer has: {stale:?}"
    );
    // The Lease and the token are the operator's own, in its namespace.
    for e in requests {
        let r = e["objectRef"]["resource"].as_str().unwrap_or_default();
        if r == "leases" || r == "serviceaccounts" {
            assert_eq!(e["objectRef"]["namespace"], OPERATOR_NAMESPACE, "{e}");
        }
    }
}

/// An Active-mode spec for `kind` `name` reading workload `w`'s metrics.
fn spec_for(kind: &str, name: &str, prom: &str) -> Value {
    let mut s = spec(name, "w", prom, json!({}));
    s["targetRef"] = json!({"apiVersion": "apps/v1", "kind": kind, "name": name});
    s
}

/// The chart grants no Secret access by default; `rbac.secrets.namespaces` grants `get` in each
/// listed namespace only (a Role and RoleBinding there), `rbac.secrets.clusterWide` everywhere.
#[test]
fn secrets_are_not_readable_cluster_wide_unless_asked() {
    let reads_secrets = |objects: &[DynamicObject]| -> Vec<(String, String)> {
        objects
            .iter()
            .filter(|o| {
                let v = serde_json::to_value(o).unwrap();
                rules_grants(&v, "chart")
                    .iter()
                    .any(|(g, r, _)| g.is_empty() && r == "secrets")
            })
            .map(|o| {
                (
                    o.types.as_ref().unwrap().kind.clone(),
                    o.metadata.namespace.clone().unwrap_or_default(),
                )
            })
            .collect()
    };
    let rbac = [
        "templates/clusterrole.yaml",
        "templates/role.yaml",
        "templates/secrets-roles.yaml",
    ];
    // helm fails to render a template that renders to nothing with -s: render the ones that do.
    let default = render_chart_with(&rbac[..2], &[]);
    assert!(reads_secrets(&default).is_empty(), "{default:?}");
    let listed = render_chart_with(&rbac, &["rbac.secrets.namespaces={shop,billing}"]);
    assert_eq!(
        reads_secrets(&listed),
        [
            ("Role".to_owned(), "shop".to_owned()),
            ("Role".to_owned(), "billing".to_owned())
        ]
    );
    let bindings: Vec<String> = listed
        .iter()
        .filter(|o| o.types.as_ref().unwrap().kind == "RoleBinding")
        .map(|o| o.metadata.namespace.clone().unwrap_or_default())
        .collect();
    assert!(bindings.contains(&"shop".to_owned()) && bindings.contains(&"billing".to_owned()));
    let everywhere = render_chart_with(&rbac[..2], &["rbac.secrets.clusterWide=true"]);
    assert_eq!(
        reads_secrets(&everywhere),
        [("ClusterRole".to_owned(), String::new())]
    );
    // config/ is the chart with its defaults: no Secrets there either.
    let config = grants("config/rbac/role.yaml");
    assert!(!config.iter().any(|(_, r, _)| r == "secrets"), "{config:?}");
}
