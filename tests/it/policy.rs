//! BackpressurePolicy end to end against a real kube-apiserver + etcd, with the real operator
//! binary running as its own ServiceAccount under the chart's RBAC: defaults and priority,
//! limits (reconcile-time clamps with condition and event), the policy's own status, the
//! emergency brake reaching the pods of every matched workload and lifting at its expiry, and
//! the chart's ValidatingAdmissionPolicies rejecting out-of-bounds objects before they are
//! stored.
//!
//! No Prometheus is needed: policies act on the configuration, which the operator resolves and
//! pushes whatever the metrics say. The tests share cluster-scoped objects (policies, admission
//! policies), so they hold [`serial`] and select namespaces by a label unique to each test.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use backpressure_api::v1alpha1::{BackpressurePolicy, WorkerBackpressure};
use backpressure_api::wire::BrakeConfig;
use backpressure_envtest::TestEnv;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::common::crds::install_crds;
use crate::common::operator::{Operator, apply_chart_objects, render_chart};
use crate::common::pods::{self, FakePod};
use crate::common::scene::{
    self, condition_in, events_in, merge, status_of, wait_for_every, wbp_object,
};
use crate::common::serial;

/// No Prometheus: metrics are unavailable, which policies do not need.
const NO_PROMETHEUS: &str = "http://127.0.0.1:9";

/// Polls `f` every 200 ms until it returns `Some`, or panics with `what` and `diag()`.
async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, diag: impl Fn() -> String, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let diag = || std::future::ready(diag());
    wait_for_every(Duration::from_millis(200), timeout, what, diag, f).await
}

/// Creates a namespace with `labels`.
async fn namespace(env: &TestEnv, prefix: &str, labels: &[(&str, &str)]) -> String {
    let client = env.client().unwrap();
    let ns = env.namespace(prefix).await.unwrap();
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let api: Api<Namespace> = Api::all(client);
    api.patch(
        &ns,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": labels}})),
    )
    .await
    .unwrap();
    ns
}

/// A workload `name` in `ns`: a Deployment and `pod_count` fake pods running the worker
/// library's admin server.
async fn workload(env: &'static TestEnv, ns: &str, name: &str, pod_count: usize) -> Vec<FakePod> {
    let client = env.client().unwrap();
    pods::deployment(&client, ns, name, pod_count as i32).await;
    pods::start_many(env, ns, name, pod_count).await
}

/// A WorkerBackpressure spec for the Deployment `name`, with `spec` merged in.
fn targeting(name: &str, spec: Value) -> Value {
    let mut s = json!({"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}});
    merge(&mut s, spec);
    s
}

/// Applies WorkerBackpressure `name` for the Deployment `name`, with `spec` merged in.
async fn apply_wbp(client: &kube::Client, ns: &str, name: &str, spec: Value) {
    scene::apply_wbp(client, ns, name, targeting(name, spec)).await;
}

async fn apply_policy(client: &kube::Client, name: &str, spec: Value) {
    let api: Api<BackpressurePolicy> = Api::all(client.clone());
    let obj = json!({
        "apiVersion": "backpressure.dev/v1alpha1",
        "kind": "BackpressurePolicy",
        "metadata": {"name": name},
        "spec": spec,
    });
    api.patch(
        name,
        &PatchParams::apply("test").force(),
        &Patch::Apply(&obj),
    )
    .await
    .unwrap();
}

async fn delete_policies(client: &kube::Client, names: &[&str]) {
    let api: Api<BackpressurePolicy> = Api::all(client.clone());
    for n in names {
        let _ = api.delete(n, &DeleteParams::default()).await;
    }
}

async fn policy(client: &kube::Client, name: &str) -> BackpressurePolicy {
    Api::<BackpressurePolicy>::all(client.clone())
        .get(name)
        .await
        .unwrap()
}

fn all_run(pods: &[FakePod], pred: impl Fn(&backpressure_api::wire::WorkerConfig) -> bool) -> bool {
    pods.iter().all(|p| pred(&p.running()))
}

#[tokio::test]
async fn defaults_fill_unset_fields_by_priority_and_limits_clamp_with_condition_and_event() {
    let _serial = serial().await;
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    install_crds(&client).await;
    let u = backpressure_envtest::unique();
    let fleet = format!("defaults-{u}");
    let gold = namespace(env, "gold", &[("bp-fleet", &fleet), ("tier", "gold")]).await;
    let plain = namespace(env, "plain", &[("bp-fleet", &fleet)]).await;
    let other = namespace(env, "other", &[]).await;
    let w_pods = workload(env, &gold, "w", 2).await;
    let v_pods = workload(env, &plain, "v", 1).await;
    let u_pods = workload(env, &other, "u", 1).await;

    let (high, low, limit) = (
        format!("high-{u}"),
        format!("low-{u}"),
        format!("gold-limit-{u}"),
    );
    let selector = json!({"matchLabels": {"bp-fleet": fleet}});
    apply_policy(
        &client,
        &high,
        json!({"namespaceSelector": selector, "priority": 10,
               "defaults": {"worker": {"maxPermits": 7}}}),
    )
    .await;
    apply_policy(
        &client,
        &low,
        json!({"namespaceSelector": selector, "priority": 5,
               "defaults": {"worker": {"maxPermits": 9, "setPoint": 0.07},
                            "scaling": {"maxReplicas": 40}}}),
    )
    .await;
    apply_policy(
        &client,
        &limit,
        json!({"namespaceSelector": {"matchLabels": {"tier": "gold", "bp-fleet": fleet}},
               "limits": {"maxReplicas": 8}}),
    )
    .await;
    // w sets nothing the policies default; v sets its own maxPermits; u is selected by none.
    apply_wbp(&client, &gold, "w", json!({})).await;
    apply_wbp(&client, &plain, "v", json!({"worker": {"maxPermits": 5}})).await;
    apply_wbp(&client, &other, "u", json!({})).await;

    let op = Operator::start(env, NO_PROMETHEUS, &[]).await;
    let diag = || op_diag(&op);

    // The effective configuration reaches the pods: the object's own value, then the policies
    // by priority, then the built-in defaults.
    wait_for(
        Duration::from_secs(40),
        "policy defaults on every pod",
        &diag,
        || async {
            (all_run(&w_pods, |c| {
                c.max_permits == 7 && (c.set_point - 0.07).abs() < 1e-9
            }) && all_run(&v_pods, |c| {
                c.max_permits == 5 && (c.set_point - 0.07).abs() < 1e-9
            }) && all_run(&u_pods, |c| {
                c.max_permits == 16 && (c.set_point - 0.05).abs() < 1e-9
            }))
            .then_some(())
        },
    )
    .await;

    // Status names the policies in precedence order and what a limit overrode.
    let s = wait_for(
        Duration::from_secs(20),
        "w status with policies",
        &diag,
        || async {
            let s = status_of(&client, &gold, "w").await;
            s.policies.is_some().then_some(s)
        },
    )
    .await;
    assert_eq!(
        s.policies.as_deref(),
        Some(&[high.clone(), low.clone(), limit.clone()][..])
    );
    let overrides = s.overrides.clone().expect("overrides");
    let clamp = &overrides["spec.scaling.maxReplicas"];
    assert!(
        clamp.contains("40 lowered to 8") && clamp.contains(&limit),
        "{clamp}"
    );
    let c = condition_in(s.conditions.as_ref(), "PolicyLimited").expect("PolicyLimited");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "LimitsApplied")
    );
    assert!(
        c.message.contains("spec.scaling.maxReplicas"),
        "{}",
        c.message
    );
    let ev = wait_for(
        Duration::from_secs(10),
        "PolicyOverride event",
        &diag,
        || async {
            events_in(&client, &gold)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("PolicyOverride"))
        },
    )
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    let note = ev.note.unwrap_or_default();
    assert!(
        note.contains("spec.scaling.maxReplicas: 40 lowered to 8 by policy")
            && note.contains(&limit),
        "{note}"
    );

    let s = status_of(&client, &plain, "v").await;
    assert_eq!(
        s.policies.as_deref(),
        Some(&[high.clone(), low.clone()][..])
    );
    assert_eq!(s.overrides, None);
    assert_eq!(
        condition_in(s.conditions.as_ref(), "PolicyLimited").map(|c| c.status.as_str()),
        Some("False")
    );
    assert_eq!(status_of(&client, &other, "u").await.policies, None);

    // Each policy's status counts the objects it applies to.
    for (name, matched) in [(&high, 2), (&low, 2), (&limit, 1)] {
        let p = wait_for(
            Duration::from_secs(20),
            &format!("{name} status"),
            &diag,
            || async {
                let p = policy(&client, name).await;
                p.status
                    .as_ref()
                    .is_some_and(|s| s.matched_objects == Some(matched))
                    .then_some(p)
            },
        )
        .await;
        let st = p.status.unwrap();
        assert_eq!(st.observed_generation, p.metadata.generation);
        assert_eq!(st.brake_active, Some(false));
        let ready = condition_in(st.conditions.as_ref(), "Ready").unwrap();
        assert_eq!(ready.status, "True");
        assert!(
            ready.message.contains(&format!("applies to {matched} ")),
            "{}",
            ready.message
        );
    }

    // Overlaps resolve by priority: lowering `high` below `low` hands maxPermits to `low`.
    apply_policy(
        &client,
        &high,
        json!({"namespaceSelector": selector, "priority": 1,
               "defaults": {"worker": {"maxPermits": 7}}}),
    )
    .await;
    wait_for(
        Duration::from_secs(30),
        "maxPermits 9 from the now higher policy",
        &diag,
        || async { all_run(&w_pods, |c| c.max_permits == 9).then_some(()) },
    )
    .await;
    assert!(
        all_run(&v_pods, |c| c.max_permits == 5),
        "the object's own value still wins"
    );
    let p = wait_for(
        Duration::from_secs(20),
        "observedGeneration follows",
        &diag,
        || async {
            let p = policy(&client, &high).await;
            (p.status.as_ref().and_then(|s| s.observed_generation) == p.metadata.generation)
                .then_some(p)
        },
    )
    .await;
    assert_eq!(p.metadata.generation, Some(2));
    let s = status_of(&client, &gold, "w").await;
    assert_eq!(
        s.policies.as_deref(),
        Some(&[low.clone(), high.clone(), limit.clone()][..])
    );

    delete_policies(&client, &[&high, &low, &limit]).await;
    // Without the policies the built-in defaults come back and the limit is gone.
    wait_for(
        Duration::from_secs(30),
        "built-in defaults again",
        &diag,
        || async {
            let s = status_of(&client, &gold, "w").await;
            (all_run(&w_pods, |c| {
                c.max_permits == 16 && (c.set_point - 0.05).abs() < 1e-9
            }) && s.overrides.is_none()
                && s.policies.is_none())
            .then_some(())
        },
    )
    .await;
    drop(op);
}

#[tokio::test]
async fn the_brake_reaches_every_matched_workload_and_lifts_at_its_expiry() {
    let _serial = serial().await;
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    install_crds(&client).await;
    let u = backpressure_envtest::unique();
    let fleet = format!("brake-{u}");
    let a = namespace(env, "brake-a", &[("bp-fleet", &fleet)]).await;
    let b = namespace(env, "brake-b", &[("bp-fleet", &fleet)]).await;
    let c = namespace(env, "brake-c", &[]).await;
    let a_pods = workload(env, &a, "wa", 2).await;
    let b_pods = workload(env, &b, "wb", 2).await;
    let c_pods = workload(env, &c, "wc", 1).await;
    apply_wbp(&client, &a, "wa", json!({})).await;
    apply_wbp(&client, &b, "wb", json!({})).await;
    apply_wbp(&client, &c, "wc", json!({})).await;
    let op = Operator::start(env, NO_PROMETHEUS, &[]).await;
    let diag = || op_diag(&op);
    let synced = |pods: &[FakePod]| pods.iter().all(|p| p.running().generation > 0);
    wait_for(
        Duration::from_secs(40),
        "first config on every pod",
        &diag,
        || async { (synced(&a_pods) && synced(&b_pods) && synced(&c_pods)).then_some(()) },
    )
    .await;

    // Brake on, lifting itself 12 s from now.
    let expiry = Timestamp::now().as_second() + 12;
    let expires_at = Timestamp::from_second(expiry).unwrap().to_string();
    let name = format!("brake-{u}");
    apply_policy(
        &client,
        &name,
        json!({"namespaceSelector": {"matchLabels": {"bp-fleet": fleet}},
               "brake": {"minBackoff": 0.8, "expiresAt": expires_at, "reason": "incident 42"}}),
    )
    .await;
    let on = Instant::now();
    let want = BrakeConfig {
        min_backoff: 0.8,
        expires_at_unix: Some(expiry),
    };
    let braked = |pods: &[FakePod]| {
        pods.iter()
            .all(|p| p.running().brake.as_ref() == Some(&want))
    };
    wait_for(
        Duration::from_secs(8),
        "the brake on every matched pod",
        &diag,
        || async { (braked(&a_pods) && braked(&b_pods)).then_some(()) },
    )
    .await;
    let reach = on.elapsed();
    assert!(
        c_pods.iter().all(|p| p.running().brake.is_none()),
        "an unmatched namespace got the brake"
    );
    let p = wait_for(
        Duration::from_secs(8),
        "policy status: brake active",
        &diag,
        || async {
            let p = policy(&client, &name).await;
            p.status
                .as_ref()
                .is_some_and(|s| s.brake_active == Some(true) && s.matched_objects == Some(2))
                .then_some(p)
        },
    )
    .await;
    let ready = condition_in(p.status.as_ref().unwrap().conditions.as_ref(), "Ready").unwrap();
    assert!(
        ready
            .message
            .contains("emergency brake minBackoff 0.8 in force until"),
        "{}",
        ready.message
    );
    // The WorkerBackpressure status names the policy.
    assert_eq!(
        status_of(&client, &a, "wa").await.policies.as_deref(),
        Some(&[name.clone()][..])
    );

    // Still on shortly before the expiry...
    let before = Timestamp::now().as_second();
    if before < expiry - 1 {
        assert!(braked(&a_pods) && braked(&b_pods), "the brake lifted early");
    }
    // ...and off on every pod soon after it.
    wait_for(
        Duration::from_secs(30),
        "the brake lifted on every pod",
        &diag,
        || async {
            (a_pods
                .iter()
                .chain(&b_pods)
                .all(|p| p.running().brake.is_none()))
            .then_some(())
        },
    )
    .await;
    let lifted_at = Timestamp::now();
    let late = lifted_at.as_millisecond() - expiry * 1000;
    assert!(late >= 0, "lifted {}ms before expiresAt", -late);
    assert!(late <= 5000, "lifted {late}ms after expiresAt");
    eprintln!(
        "brake reached 4 pods in 2 namespaces {reach:?} after the policy was applied; lifted {late} ms after expiresAt"
    );
    let p = wait_for(
        Duration::from_secs(10),
        "policy status: brake expired",
        &diag,
        || async {
            let p = policy(&client, &name).await;
            p.status
                .as_ref()
                .is_some_and(|s| s.brake_active == Some(false))
                .then_some(p)
        },
    )
    .await;
    let ready = condition_in(p.status.as_ref().unwrap().conditions.as_ref(), "Ready").unwrap();
    assert!(ready.message.contains("expired at"), "{}", ready.message);
    delete_policies(&client, &[&name]).await;
    drop(op);
}

/// Renders the chart's admission policies with helm and applies them.
async fn install_admission(client: &kube::Client) -> Vec<(kube::discovery::ApiResource, String)> {
    let objects = render_chart(&["templates/validatingadmissionpolicy.yaml"]);
    let installed = apply_chart_objects(client, objects).await;
    let mut kinds: Vec<&str> = installed.iter().map(|(ar, _)| ar.kind.as_str()).collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding"
        ],
        "the chart ships the static and the per-policy admission policy, each with its binding"
    );
    installed
}

/// Creates `name` in `ns` with `spec`: `Ok` when stored, the API error's message otherwise.
async fn create_wbp(
    client: &kube::Client,
    ns: &str,
    name: &str,
    spec: Value,
) -> Result<(), String> {
    let api: Api<WorkerBackpressure> = Api::namespaced(client.clone(), ns);
    let obj: WorkerBackpressure =
        serde_json::from_value(wbp_object(name, targeting(name, spec))).unwrap();
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => {
            let _ = api.delete(name, &DeleteParams::default()).await;
            Ok(())
        }
        Err(kube::Error::Api(s)) => Err(format!("{} ({})", s.message, s.code)),
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn admission_rejects_out_of_bounds_objects_naming_the_field_and_the_policy() {
    let _serial = serial().await;
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    install_crds(&client).await;
    let installed = install_admission(&client).await;
    let u = backpressure_envtest::unique();
    let fleet = format!("admission-{u}");
    let limited = namespace(env, "limited", &[("bp-fleet", &fleet)]).await;
    let free = namespace(env, "free", &[]).await;
    let name = format!("limits-{u}");
    apply_policy(
        &client,
        &name,
        json!({"namespaceSelector": {"matchLabels": {"bp-fleet": fleet}},
               "limits": {"maxReplicas": 8, "maxSetPoint": 0.1, "maxScaleUpPods": 3,
                          "requiredRampStages": [50, 100], "allowedModes": ["Active", "DryRun"],
                          "allowedQueueSystems": ["RedisStreams", "Custom"]}}),
    )
    .await;

    // The API server picks admission policies and their parameters up asynchronously.
    let started = Instant::now();
    let first = wait_for(
        Duration::from_secs(30),
        "the policy limit enforced",
        String::new,
        || async {
            create_wbp(
                &client,
                &limited,
                "x",
                json!({"scaling": {"maxReplicas": 20}}),
            )
            .await
            .err()
        },
    )
    .await;
    eprintln!(
        "admission policy in force {:?} after applying it",
        started.elapsed()
    );
    assert!(
        first.contains("spec.scaling.maxReplicas: 20 exceeds limits.maxReplicas 8")
            && first.contains(&format!("BackpressurePolicy {name}")),
        "{first}"
    );
    let cases = [
        (
            json!({"worker": {"setPoint": 0.2}}),
            "spec.worker.setPoint: 0.2 exceeds limits.maxSetPoint 0.1",
        ),
        (
            json!({"scaling": {"scaleUp": {"maxPods": 5}}}),
            "spec.scaling.scaleUp.maxPods: 5 exceeds limits.maxScaleUpPods 3",
        ),
        (
            json!({"scaling": {"rampUp": {"stages": [25, 50, 100]}}}),
            "spec.scaling.rampUp.stages: [25, 50, 100] differs from limits.requiredRampStages [50, 100]",
        ),
        (
            json!({"mode": "Guard", "guard": {"kind": "HorizontalPodAutoscaler", "name": "h"}}),
            "spec.mode: Guard is not one of Active, DryRun",
        ),
        (
            json!({"queue": {"system": "Kafka", "kafka": {"topic": "t", "consumerGroup": "g"}}}),
            "spec.queue.system: Kafka is not one of RedisStreams, Custom",
        ),
    ];
    for (spec, want) in cases {
        let err = create_wbp(&client, &limited, "x", spec.clone())
            .await
            .expect_err(want);
        assert!(
            err.contains(want) && err.contains(&format!("BackpressurePolicy {name}")),
            "{spec}: {err}"
        );
    }
    // Within the limits: stored. Unset fields are not checked at admission.
    create_wbp(
        &client,
        &limited,
        "x",
        json!({"scaling": {"maxReplicas": 8, "rampUp": {"stages": [50, 100]}}}),
    )
    .await
    .unwrap();
    create_wbp(&client, &limited, "x", json!({})).await.unwrap();
    // Another namespace is not selected by the policy.
    create_wbp(&client, &free, "x", json!({"scaling": {"maxReplicas": 20}}))
        .await
        .unwrap();

    // The chart's static limits apply everywhere and name the admission policy.
    let err = create_wbp(&client, &free, "x", json!({"worker": {"setPoint": 0.7}}))
        .await
        .unwrap_err();
    assert!(
        err.contains("spec.worker.setPoint: 0.7 exceeds the maximum 0.5")
            && err.contains("ValidatingAdmissionPolicy backpressure-operator-limits"),
        "{err}"
    );
    let err = create_wbp(
        &client,
        &free,
        "x",
        json!({"scaling": {"maxReplicas": 5000}}),
    )
    .await
    .unwrap_err();
    assert!(
        err.contains("spec.scaling.maxReplicas: 5000 exceeds the maximum 1000"),
        "{err}"
    );

    // An update that breaks a limit is rejected too; one that leaves spec alone is not.
    apply_wbp(
        &client,
        &limited,
        "y",
        json!({"scaling": {"maxReplicas": 6}}),
    )
    .await;
    let api: Api<WorkerBackpressure> = Api::namespaced(client.clone(), &limited);
    let err = api
        .patch(
            "y",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"scaling": {"maxReplicas": 9}}})),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("spec.scaling.maxReplicas: 9 exceeds limits.maxReplicas 8"),
        "{err}"
    );

    // A limit tightened after an object was stored cannot reject it any more: the operator
    // clamps at reconcile time and says so in a condition and an event.
    apply_policy(
        &client,
        &name,
        json!({"namespaceSelector": {"matchLabels": {"bp-fleet": fleet}},
               "limits": {"maxReplicas": 4}}),
    )
    .await;
    api.patch(
        "y",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await
    .expect("a change outside spec is not checked");
    pods::deployment(&client, &limited, "y", 1).await;
    let op = Operator::start(env, NO_PROMETHEUS, &[]).await;
    let diag = || op_diag(&op);
    let s = wait_for(
        Duration::from_secs(30),
        "the reconcile-time clamp",
        &diag,
        || async {
            let s = status_of(&client, &limited, "y").await;
            condition_in(s.conditions.as_ref(), "PolicyLimited")
                .is_some_and(|c| c.status == "True")
                .then_some(s)
        },
    )
    .await;
    let c = condition_in(s.conditions.as_ref(), "PolicyLimited").unwrap();
    assert!(
        c.message.contains(&format!(
            "spec.scaling.maxReplicas: 6 lowered to 4 by policy {name}"
        )),
        "{}",
        c.message
    );
    wait_for(
        Duration::from_secs(10),
        "the PolicyOverride event",
        &diag,
        || async {
            events_in(&client, &limited).await.into_iter().find(|e| {
                e.reason.as_deref() == Some("PolicyOverride")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("lowered to 4"))
            })
        },
    )
    .await;

    drop(op);
    delete_policies(&client, &[&name]).await;
    for (ar, n) in installed.iter().rev() {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
        api.delete(n, &DeleteParams::default()).await.unwrap();
    }
}

/// The operator's warnings and errors, and its last lines.
fn op_diag(op: &Operator) -> String {
    let log = op.log();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .take(20)
        .collect();
    let tail: Vec<&str> = log.lines().rev().take(15).collect();
    format!(
        "operator warnings:\n{}\noperator log tail:\n{}",
        warnings.join("\n"),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    )
}
