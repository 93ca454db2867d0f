//! `watchNamespaces` (issue 15): an operator limited to some namespaces runs with the chart's
//! Roles in those namespaces and no cluster-wide rights on namespaced resources, acts there, and
//! never sees an object elsewhere.

use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject};
use serde_json::json;

use crate::common::fleet::backlog;
use crate::common::operator::{
    Operator, apply_chart_objects, operator_kubeconfig, render_release, service_account_kubeconfig,
};
use crate::common::serial;
use crate::common::world::World;

/// The release whose RBAC the scoped operator runs with (its own ServiceAccount and
/// ClusterRole, beside the shared test operator's).
const RELEASE: &str = "scoped";
const SA: &str = "scoped-backpressure-operator";

/// With `--watch-namespaces=<a>` and the chart rendered with `watchNamespaces={<a>}` (a Role
/// and RoleBinding in `<a>`, a ClusterRole on policies and namespaces only), the operator
/// scales the backlogged target in `<a>`; the same object and backlog in `<b>` gets no status
/// and keeps its replicas, and no request of the operator is forbidden. Run cluster-wide with
/// these rights, the operator could not list anything and would scale nothing.
#[tokio::test]
async fn an_operator_watching_one_namespace_acts_there_with_its_roles_and_sees_nothing_else() {
    let _serial = serial().await;
    let mut a = World::builder("watched").replicas(2).pods(2).start().await;
    let b = World::builder("unwatched")
        .replicas(2)
        .pods(2)
        .start()
        .await;
    a.fleet.set(backlog);
    b.fleet.set(backlog);
    a.apply(json!({})).await;
    b.apply(json!({})).await;

    let client = a.scene.client.clone();
    // Creates the operator namespace (and the shared test operator's RBAC) if no test did.
    operator_kubeconfig(a.scene.env).await;
    let objects = render_release(
        RELEASE,
        &[
            "templates/serviceaccount.yaml",
            "templates/clusterrole.yaml",
            "templates/clusterrolebinding.yaml",
            "templates/role.yaml",
            "templates/rolebinding.yaml",
            "templates/watch-roles.yaml",
        ],
        &[&format!("watchNamespaces={{{}}}", a.scene.ns)],
    );
    // The chart's ClusterRole keeps no rule on a namespaced resource.
    let cluster_role = objects
        .iter()
        .find(|o| o.types.as_ref().is_some_and(|t| t.kind == "ClusterRole"))
        .unwrap();
    let resources: Vec<&str> = cluster_role.data["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["resources"].as_array().unwrap())
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(
        resources,
        [
            "backpressurepolicies",
            "backpressurepolicies/status",
            "namespaces"
        ],
        "{resources:?}"
    );
    let installed = apply_chart_objects(&client, objects).await;

    let kubeconfig = service_account_kubeconfig(a.scene.env, &client, SA, RELEASE).await;
    let flag = format!("--watch-namespaces={}", a.scene.ns);
    let op = Operator::start_as(a.scene.env, &kubeconfig, SA, &a.prom.url(), &[&flag]);
    a.operators.push(op);

    a.wait_for(
        Duration::from_secs(60),
        "the watched target scales out",
        || async { (a.replicas().await > 2).then_some(()) },
    )
    .await;
    assert!(a.status().await.regime.is_some());
    // A few more reconcile intervals (1 s each) for the other namespace's object.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let other = b.wbps().get(crate::common::world::W).await.unwrap();
    assert!(
        other.status.is_none(),
        "an object outside --watch-namespaces got a status: {:?}\n{}",
        other.status,
        a.operator().log()
    );
    assert_eq!(b.replicas().await, 2);
    assert!(b.events().await.is_empty(), "{:?}", b.events().await);
    let log = a.operator().log();
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "a request was forbidden:\n{log}"
    );

    a.stop_operators();
    for (ar, name) in installed {
        if ar.kind == "ClusterRole" || ar.kind == "ClusterRoleBinding" {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }
}
