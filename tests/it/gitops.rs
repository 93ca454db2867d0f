//! GitOps correctness: what kstatus (Flux, kpt, cli-utils appliers) and Argo CD's health check
//! (`config/argocd/health.lua`) make of a WorkerBackpressure in each state, and that the operator
//! writes only the fields `config/argocd/README.md` says it writes.
//!
//! - kstatus and health.lua run for real (`common::kstatus`: the cli-utils kstatus library built
//!   by `tools/kstatus/build.sh`, and `lua5.1` in a sandbox like Argo CD's); a missing checker
//!   or interpreter fails the tests, nothing is skipped.
//! - The objects are real: statuses written by the real operator binary (as its ServiceAccount)
//!   read back from the real API server, and statuses computed by the operator's pure `decide`.
//!
//! The live tests hold [`serial`], like every test on the control plane.

use std::time::Duration;

use backpressure_api::FIELD_MANAGER;
use backpressure_api::WorkerBackpressure;
use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{Regime, WorkerBackpressureSpec, WorkerBackpressureStatus};
use backpressure_core::decide::{self, FleetMetrics, Observation};
use backpressure_core::resolve::{self, FieldError, ResolveError};
use backpressure_envtest::repo_root;
use backpressure_operator::act::guard;
use backpressure_operator::annotations;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use k8s_openapi::jiff::Timestamp;
use kube::Resource as _;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use crate::common::fleet::{backlog, failing};
use crate::common::kstatus::{argocd_health, kstatus};
use crate::common::operator::{OPERATOR_NAMESPACE, OPERATOR_SA, operator_user};
use crate::common::scene::{self, has_condition, merge};
use crate::common::serial;
use crate::common::world::World;

// ---------------------------------------------------------------------------------------------
// Samples computed by the operator's own pure decision core

/// The test spec with no Prometheus (the samples are decided offline).
fn base_spec() -> Value {
    base_spec_at("http://127.0.0.1:9")
}

/// The test spec reading from `prometheus`, with a two-stage ramp and a long dwell.
fn base_spec_at(prometheus: &str) -> Value {
    let ramp = json!({"scaling": {"rampUp": {"stages": [50, 100], "dwell": "30s"}}});
    scene::spec("w", "w", prometheus, ramp)
}

fn object(generation: i64, spec: &Value, status: Option<&WorkerBackpressureStatus>) -> Value {
    let mut o = json!({
        "apiVersion": "backpressure.dev/v1alpha1",
        "kind": "WorkerBackpressure",
        "metadata": {"name": "w", "namespace": "shop", "generation": generation, "uid": "u"},
        "spec": spec,
    });
    if let Some(s) = status {
        o["status"] = serde_json::to_value(s).unwrap();
    }
    o
}

fn healthy_fleet() -> FleetMetrics {
    FleetMetrics {
        backoff: Some(0.0),
        failure_rate: Some(0.0),
        queue_age: Some(100.0),
        queue_depth: Some(1000.0),
        arrival_rate: Some(100.0),
        completion_rate: Some(20.0),
        failure_floor: None,
        partitions: None,
    }
}

fn failing_fleet() -> FleetMetrics {
    FleetMetrics {
        backoff: Some(0.6),
        failure_rate: Some(0.4),
        ..healthy_fleet()
    }
}

/// Runs `decide` once a second like the operator does, feeding back status and replicas,
/// until `until` holds for the status (at most 10 minutes of simulated time).
struct Drive {
    spec: WorkerBackpressureSpec,
    now: Timestamp,
    replicas: i32,
    status: Option<WorkerBackpressureStatus>,
}

impl Drive {
    fn new(spec: &Value) -> Drive {
        Drive {
            spec: serde_json::from_value(spec.clone()).unwrap(),
            now: "2026-11-30T10:00:00Z".parse().unwrap(),
            replicas: 4,
            status: None,
        }
    }

    fn step(&mut self, fleet: FleetMetrics) {
        let eff = resolve::resolve(&self.spec, &[], self.now).unwrap();
        let obs = Observation {
            now: self.now,
            generation: Some(1),
            current_replicas: self.replicas,
            ready_pods: self.replicas,
            fleet,
            metrics_error: None,
            config: None,
        };
        let d = decide::decide(&eff, self.status.as_ref(), &obs);
        if let Some(to) = d.scale_to() {
            self.replicas = to;
        }
        self.status = Some(d.status);
        self.now = Timestamp::from_second(self.now.as_second() + 1).unwrap();
    }

    fn until(
        &mut self,
        fleet: FleetMetrics,
        what: &str,
        done: impl Fn(&WorkerBackpressureStatus) -> bool,
    ) -> WorkerBackpressureStatus {
        for _ in 0..600 {
            self.step(fleet.clone());
            if done(self.status.as_ref().unwrap()) {
                return self.status.clone().unwrap();
            }
        }
        panic!("decide never reached {what}: {:?}", self.status);
    }
}

/// Each state of a WorkerBackpressure: what kstatus and the Argo CD health check make of it.
/// This table is the contract documented in config/argocd/README.md.
#[test]
fn kstatus_and_argocd_health_of_every_state_decide_produces() {
    let spec = base_spec();
    let now: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
    let mut d = Drive::new(&spec);
    let reconciled = d.until(healthy_fleet(), "Ready=True", |s| {
        has_condition(s, cond::READY, "True")
    });
    let held = d.until(failing_fleet(), "the hold", |s| {
        s.regime == Some(Regime::DependencyFailing)
    });
    let ramping = d.until(healthy_fleet(), "a ramp", |s| {
        has_condition(s, cond::RAMPING, "True")
    });
    let unavailable = Drive::new(&spec).until(FleetMetrics::default(), "no metrics", |s| {
        s.regime == Some(Regime::MetricsUnavailable)
    });
    let mut suspended_spec = spec.clone();
    suspended_spec["suspend"] = json!(true);
    let suspended = Drive::new(&suspended_spec).until(healthy_fleet(), "Suspended", |s| {
        s.regime == Some(Regime::Suspended)
    });
    let error = ResolveError {
        errors: vec![FieldError {
            field: "spec.scaling.rampUp.abortAbove".into(),
            message: "rampUp.abortAbove 0.04 must be above release.backoffBelow 0.05".into(),
        }],
    };
    let (invalid, _) = decide::invalid_spec(Some(&reconciled), Some(1), &error, now);
    let (missing_target, _) = decide::target_unavailable(
        Some(&reconciled),
        Some(1),
        "TargetNotFound",
        "deployments.apps \"w\" not found",
        now,
    );
    let mut guard_failed = reconciled.clone();
    decide::set_condition(
        &mut guard_failed,
        Some(&reconciled),
        cond::GUARD_APPLIED,
        false,
        "GuardTargetNotFound",
        "HorizontalPodAutoscaler w not found".into(),
        now,
    );
    let mut configmap_taken = reconciled.clone();
    for t in [cond::READY, cond::CONFIG_IN_SYNC] {
        decide::set_condition(
            &mut configmap_taken,
            Some(&reconciled),
            t,
            false,
            "ConfigMapNotOwned",
            "ConfigMap w-worker-config exists and is not this object's".into(),
            now,
        );
    }
    let mut no_conditions = WorkerBackpressureStatus {
        observed_generation: Some(1),
        ..Default::default()
    };
    no_conditions.conditions = None;

    struct Case {
        name: &'static str,
        object: Value,
        kstatus: &'static str,
        argocd: &'static str,
        argocd_message: &'static str,
    }
    let cases = [
        Case {
            name: "created, not reconciled yet (no status)",
            object: object(1, &spec, None),
            // kstatus cannot tell a CR without status from a reconciled one.
            kstatus: "Current",
            argocd: "Progressing",
            argocd_message: "Waiting for the operator",
        },
        Case {
            name: "status without conditions",
            object: object(1, &spec, Some(&no_conditions)),
            kstatus: "Current",
            argocd: "Progressing",
            argocd_message: "Waiting for condition Ready",
        },
        Case {
            name: "reconciled",
            object: object(1, &spec, Some(&reconciled)),
            kstatus: "Current",
            argocd: "Healthy",
            argocd_message: "regime Backlogged",
        },
        Case {
            name: "spec changed, not observed yet",
            object: object(2, &spec, Some(&reconciled)),
            kstatus: "InProgress",
            argocd: "Progressing",
            argocd_message: "observe generation 2",
        },
        Case {
            name: "scale-out held (the operator doing its job)",
            object: object(1, &spec, Some(&held)),
            kstatus: "Current",
            argocd: "Healthy",
            argocd_message: "regime DependencyFailing",
        },
        Case {
            name: "staged ramp in progress",
            object: object(1, &spec, Some(&ramping)),
            // decide writes Ready=True and no Reconciling condition during a ramp.
            kstatus: "Current",
            argocd: "Progressing",
            argocd_message: "Ramp stage 1 of 2",
        },
        Case {
            name: "metrics unavailable",
            object: object(1, &spec, Some(&unavailable)),
            kstatus: "InProgress",
            argocd: "Degraded",
            argocd_message: "MetricsUnavailable",
        },
        Case {
            name: "invalid spec",
            object: object(1, &spec, Some(&invalid)),
            kstatus: "Failed",
            argocd: "Degraded",
            argocd_message: "InvalidSpec: invalid configuration: spec.scaling.rampUp.abortAbove",
        },
        Case {
            name: "target missing",
            object: object(1, &spec, Some(&missing_target)),
            kstatus: "InProgress",
            argocd: "Degraded",
            argocd_message: "TargetNotFound",
        },
        Case {
            name: "Guard mode cannot clamp its autoscaler",
            object: object(1, &spec, Some(&guard_failed)),
            // Ready stays True: kstatus sees nothing wrong (reported to the lead).
            kstatus: "Current",
            argocd: "Degraded",
            argocd_message: "GuardTargetNotFound: HorizontalPodAutoscaler w not found",
        },
        Case {
            name: "the worker ConfigMap's name is taken by a ConfigMap the object does not own",
            object: object(1, &spec, Some(&configmap_taken)),
            // Only a person can resolve it (delete or rename one of the two).
            kstatus: "InProgress",
            argocd: "Degraded",
            argocd_message: "ConfigMapNotOwned: ConfigMap w-worker-config",
        },
        Case {
            name: "suspended",
            object: object(1, &suspended_spec, Some(&suspended)),
            kstatus: "Current",
            argocd: "Suspended",
            argocd_message: "spec.suspend",
        },
    ];
    let objects: Vec<Value> = cases.iter().map(|c| c.object.clone()).collect();
    let computed = kstatus(&objects);
    let mut wrong = Vec::new();
    for (c, (ks, ks_msg)) in cases.iter().zip(&computed) {
        let (argo, argo_msg) = argocd_health(&c.object);
        if ks != c.kstatus {
            wrong.push(format!(
                "{}: kstatus {ks} ({ks_msg}), expected {}",
                c.name, c.kstatus
            ));
        }
        if argo != c.argocd || !argo_msg.contains(c.argocd_message) {
            wrong.push(format!(
                "{}: Argo CD {argo} ({argo_msg}), expected {} containing {:?}",
                c.name, c.argocd, c.argocd_message
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The fixed spec removes Stalled: decide never carries it over.
    let mut d = Drive::new(&spec);
    d.status = Some(invalid);
    let fixed = d.until(healthy_fleet(), "recovery from the invalid spec", |s| {
        has_condition(s, cond::READY, "True")
    });
    assert!(
        !fixed
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == cond::STALLED),
        "Stalled survived a valid reconcile: {fixed:?}"
    );
    assert_eq!(kstatus(&[object(1, &spec, Some(&fixed))])[0].0, "Current");
}

// ---------------------------------------------------------------------------------------------
// A live world: the Deployment `w` as Git holds it, fake pods, a fake fleet scraped by
// Prometheus, the operator binary.

/// The field manager of the GitOps tool applying the manifests.
const GIT: &str = "kustomize-controller";

/// A world whose Deployment `w` Git applied (no `spec.replicas`), with `pods` fake pods.
async fn world(prefix: &str, pods: usize) -> World {
    World::builder(prefix)
        .pods(pods)
        .deployment_applied_by(GIT)
        .start()
        .await
}

/// Applies WorkerBackpressure `name` = [`base_spec_at`] the world's Prometheus merged with
/// `patch`, as Git does (without force: a conflict with the operator's fields is an error).
async fn apply(w: &World, name: &str, patch: Value) -> Result<(), kube::Error> {
    let mut spec = base_spec_at(&w.prom.url());
    merge(&mut spec, patch);
    w.git_apply(name, GIT, spec).await
}

/// The object exactly as the API server returns it (no typed round trip).
async fn raw(w: &World, name: &str) -> Value {
    let ar = ApiResource::erase::<WorkerBackpressure>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(w.scene.client.clone(), &w.scene.ns, &ar);
    serde_json::to_value(api.get(name).await.unwrap()).unwrap()
}

/// Waits until the status of `name` satisfies `f`, observed at the current generation, and
/// returns the raw object.
async fn wait_observed(
    w: &World,
    name: &str,
    what: &str,
    f: impl Fn(&WorkerBackpressureStatus) -> bool,
) -> Value {
    w.wait_for(Duration::from_secs(60), what, || async {
        let raw = raw(w, name).await;
        let o: WorkerBackpressure = serde_json::from_value(raw.clone()).unwrap();
        let s = o.status.clone().unwrap_or_default();
        (s.observed_generation == o.metadata.generation && f(&s)).then_some(raw)
    })
    .await
}

/// Asserts kstatus and Argo CD's verdicts on a real object.
fn expect(state: &str, obj: &Value, want_kstatus: &str, want_argocd: &str) {
    let (ks, ks_msg) = kstatus(std::slice::from_ref(obj)).remove(0);
    let (argo, argo_msg) = argocd_health(obj);
    assert!(
        ks == want_kstatus && argo == want_argocd,
        "{state}: kstatus {ks} ({ks_msg}), Argo CD {argo} ({argo_msg}); expected {want_kstatus} \
         and {want_argocd}\nobject: {}",
        serde_json::to_string_pretty(obj).unwrap()
    );
}

#[tokio::test]
async fn real_objects_compute_as_current_in_progress_and_failed() {
    let _serial = serial().await;
    let mut w = world("kstatus", 2).await;
    apply(&w, "w", json!({})).await.unwrap();

    // Before the operator has seen it: no status.
    let obj = raw(&w, "w").await;
    assert!(obj.get("status").is_none_or(Value::is_null), "{obj}");
    expect("created", &obj, "Current", "Progressing");

    // Reconciled.
    w.start_operator().await;
    let obj = wait_observed(&w, "w", "Ready=True", |s| {
        has_condition(s, cond::READY, "True")
    })
    .await;
    expect("reconciled", &obj, "Current", "Healthy");

    // A spec change the operator has not observed (operator stopped).
    w.stop_operators();
    apply(&w, "w", json!({"scaling": {"maxReplicas": 19}}))
        .await
        .unwrap();
    let obj = raw(&w, "w").await;
    assert_eq!(obj["metadata"]["generation"], 2, "{obj}");
    assert_eq!(obj["status"]["observedGeneration"], 1, "{obj}");
    expect("generation not observed", &obj, "InProgress", "Progressing");

    // An invalid spec (passes the CRD's schema and rules, fails resolution: the ramp's abort
    // threshold below the release threshold): Stalled → Failed.
    apply(
        &w,
        "w",
        json!({"scaling": {"rampUp": {"abortAbove": 0.04}}}),
    )
    .await
    .unwrap();
    w.start_operator().await;
    let obj = wait_observed(&w, "w", "Stalled=True", |s| {
        has_condition(s, cond::STALLED, "True")
    })
    .await;
    expect("invalid spec", &obj, "Failed", "Degraded");

    // Fixed: Stalled disappears from the list (server-side apply of the whole list).
    apply(&w, "w", json!({})).await.unwrap();
    let obj = wait_observed(&w, "w", "Ready=True after the fix", |s| {
        has_condition(s, cond::READY, "True")
    })
    .await;
    assert!(
        !obj["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == cond::STALLED),
        "Stalled left behind: {obj}"
    );
    expect("fixed", &obj, "Current", "Healthy");

    // Prometheus down: MetricsUnavailable, Ready=False.
    w.prom.stop();
    let obj = wait_observed(&w, "w", "MetricsUnavailable", |s| {
        s.regime == Some(Regime::MetricsUnavailable)
    })
    .await;
    expect("metrics unavailable", &obj, "InProgress", "Degraded");
    w.prom.start_again().unwrap();

    // The dependency fails: scale-out held. Healthy and Current: the operator does its job.
    w.fleet.set(failing);
    let obj = wait_observed(&w, "w", "the hold", |s| {
        s.regime == Some(Regime::DependencyFailing)
    })
    .await;
    expect("held", &obj, "Current", "Healthy");

    // Recovery: a staged ramp (stage 1 of 2 dwells 30s).
    w.fleet.set(backlog);
    let obj = wait_observed(&w, "w", "Ramping=True", |s| {
        has_condition(s, cond::RAMPING, "True")
    })
    .await;
    expect("ramping", &obj, "Current", "Progressing");

    // Suspended.
    apply(&w, "w", json!({"suspend": true})).await.unwrap();
    let obj = wait_observed(&w, "w", "Suspended", |s| {
        s.regime == Some(Regime::Suspended)
    })
    .await;
    expect("suspended", &obj, "Current", "Suspended");

    // A second object whose target does not exist.
    apply(&w, "ghost", json!({"targetRef": {"name": "nothing-here"}}))
        .await
        .unwrap();
    let obj = wait_observed(&w, "ghost", "TargetNotFound", |s| {
        s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == cond::READY && c.reason == "TargetNotFound")
    })
    .await;
    expect("target missing", &obj, "InProgress", "Degraded");
    let _ = w.wbps().delete("ghost", &DeleteParams::default()).await;
}

// ---------------------------------------------------------------------------------------------
// What the operator writes

/// The managed-fields entries of `manager` (all of them, with their field sets as JSON).
fn entries_of<'a>(mf: &'a [ManagedFieldsEntry], manager: &str) -> Vec<&'a ManagedFieldsEntry> {
    mf.iter()
        .filter(|e| e.manager.as_deref() == Some(manager))
        .collect()
}

fn owns(e: &ManagedFieldsEntry, path: &[&str]) -> bool {
    let mut v = e.fields_v1.as_ref().map(|f| &f.0).unwrap_or(&Value::Null);
    for p in path {
        match v.get(*p) {
            Some(next) => v = next,
            None => return false,
        }
    }
    true
}

/// Leaf paths of a fieldsV1 set, for messages.
fn leaves(v: &Value, prefix: &str, out: &mut Vec<String>) {
    match v.as_object() {
        Some(m) if !m.is_empty() => {
            for (k, v) in m {
                if k == "." {
                    continue;
                }
                leaves(v, &format!("{prefix}/{k}"), out);
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

/// Leaf paths of the fields a managedFields entry owns.
fn owned_leaves(e: &ManagedFieldsEntry) -> Vec<String> {
    let mut fields = Vec::new();
    let set = e.fields_v1.as_ref().map(|f| f.0.clone());
    leaves(&set.unwrap_or_default(), "", &mut fields);
    fields
}

#[tokio::test]
async fn the_operator_writes_only_its_own_fields_and_git_reapplies_without_conflict() {
    let _serial = serial().await;
    let mut w = world("ownership", 2).await;
    w.fleet.set(backlog);
    apply(
        &w,
        "w",
        json!({"scaling": {"rampUp": {"stages": [100], "dwell": "1s"}}}),
    )
    .await
    .unwrap();
    let user = operator_user();
    // The control plane is shared with the earlier tests of the run: their operators' writes
    // are in the audit log too, and are not this test's.
    let earlier = w.scene.env.audit_writes_by(&user).len();
    let deployments: Api<Deployment> = Api::namespaced(w.scene.client.clone(), &w.scene.ns);
    // Someone set the replicas by hand once (a plain update: Kubernetes records an owner of
    // spec.replicas only for writes to the main resource, or for /scale writes when the field
    // already has an owner, whose ownership they then take over).
    deployments
        .patch(
            "w",
            &PatchParams {
                field_manager: Some("kubectl-edit".into()),
                ..Default::default()
            },
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    w.start_operator().await;

    // It scales out (Deployment defaulted to 1 replica, Git sets none).
    w.wait_for(Duration::from_secs(60), "a scale-out", || async {
        let r = w.scene.replicas("w").await;
        (r >= 3).then_some(())
    })
    .await;

    // spec.replicas of the target: now owned by the operator's field manager, through /scale.
    let d = deployments.get("w").await.unwrap();
    let mf = d.metadata.managed_fields.clone().unwrap_or_default();
    let replica_owners: Vec<String> = mf
        .iter()
        .filter(|e| owns(e, &["f:spec", "f:replicas"]))
        .map(|e| {
            format!(
                "{} ({} {})",
                e.manager.clone().unwrap_or_default(),
                e.operation.clone().unwrap_or_default(),
                e.subresource.clone().unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        replica_owners,
        vec![format!("{FIELD_MANAGER} (Update scale)")],
        "spec.replicas must be owned by field manager {FIELD_MANAGER:?} through /scale; managedFields: {}",
        serde_json::to_string_pretty(&mf).unwrap()
    );
    for e in entries_of(&mf, FIELD_MANAGER) {
        let fields = owned_leaves(e);
        assert_eq!(
            fields,
            vec!["/f:spec/f:replicas"],
            "the operator owns more of the Deployment than spec.replicas"
        );
    }

    // Git re-applies the Deployment (without force): no conflict, replicas stay.
    let before = w.scene.replicas("w").await;
    w.apply_deployment(GIT)
        .await
        .expect("Git's re-apply of the Deployment conflicts with the operator");
    assert_eq!(w.scene.replicas("w").await, before);

    // The WorkerBackpressure: the operator owns status only (no spec, labels or annotations,
    // in particular never the kubectl-wbp annotations); Git re-applies without conflict.
    apply(
        &w,
        "w",
        json!({"scaling": {"rampUp": {"stages": [100], "dwell": "1s"}}}),
    )
    .await
    .expect("Git's re-apply of the WorkerBackpressure conflicts with the operator");
    let wbp = w.wbps().get("w").await.unwrap();
    let mf = wbp.metadata.managed_fields.clone().unwrap_or_default();
    let ours = entries_of(&mf, FIELD_MANAGER);
    assert!(!ours.is_empty(), "no status written by {FIELD_MANAGER}");
    for e in &ours {
        let main_resource = e.subresource.as_deref().unwrap_or_default().is_empty();
        if main_resource {
            // Only a finalizer may be written on the main resource (Guard mode's cleanup).
            let fields = owned_leaves(e);
            assert!(
                fields
                    .iter()
                    .all(|f| f.starts_with("/f:metadata/f:finalizers")),
                "the operator owns {fields:?} of the WorkerBackpressure"
            );
        } else {
            assert_eq!(e.subresource.as_deref(), Some("status"));
            assert_eq!(e.operation.as_deref(), Some("Apply"), "status by SSA");
        }
        for key in [annotations::HOLD_UNTIL, annotations::DRY_RUN] {
            assert!(
                !owns(e, &["f:metadata", "f:annotations", &format!("f:{key}")]),
                "the operator wrote annotation {key}"
            );
        }
    }

    // The owned ConfigMap: created by the operator (POST, so that an existing ConfigMap of
    // that name is never taken over: operation Update) and server-side applied afterwards,
    // owner reference to the object; no other manager.
    let cms: Api<ConfigMap> = Api::namespaced(w.scene.client.clone(), &w.scene.ns);
    let cm = cms.get("w-worker-config").await.unwrap();
    let owner = &cm.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(owner.uid, wbp.metadata.uid.clone().unwrap());
    assert_eq!(owner.kind, WorkerBackpressure::kind(&()));
    let cm_mf = cm.metadata.managed_fields.clone().unwrap_or_default();
    assert!(
        cm_mf
            .iter()
            .all(|e| e.manager.as_deref() == Some(FIELD_MANAGER)
                && matches!(e.operation.as_deref(), Some("Apply" | "Update"))),
        "{cm_mf:?}"
    );

    // Every write the operator made, by resource: exactly the README's list.
    let writes = w.scene.env.audit_writes_by(&user).split_off(earlier);
    assert!(!writes.is_empty());
    let mut unexpected = Vec::new();
    for e in &writes {
        let r = &e["objectRef"];
        let key = (
            r["resource"].as_str().unwrap_or_default(),
            r["subresource"].as_str().unwrap_or_default(),
        );
        let ok = match key {
            ("workerbackpressures", "status") => true,
            // Only metadata.finalizers (checked above through managedFields).
            ("workerbackpressures", "") => e["verb"] == "patch" || e["verb"] == "update",
            ("deployments", "scale") => true,
            ("configmaps", "") => r["name"] == "w-worker-config" || r["namespace"] != w.scene.ns,
            ("events", "") => true,
            // Tokens of its own ServiceAccount for config pushes.
            ("serviceaccounts", "token") => {
                r["namespace"] == OPERATOR_NAMESPACE && r["name"] == OPERATOR_SA
            }
            _ => false,
        };
        if !ok {
            unexpected.push(format!("{} {}", e["verb"], e["requestURI"]));
        }
    }
    assert!(
        unexpected.is_empty(),
        "writes the README does not list: {unexpected:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// The GitOps README

fn readme() -> String {
    std::fs::read_to_string(repo_root().join("config/argocd/README.md")).unwrap()
}

/// The ```yaml blocks of a Markdown text.
fn yaml_blocks(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in md.lines() {
        match (&mut current, line.trim_start()) {
            (None, l) if l.starts_with("```yaml") => current = Some(String::new()),
            (Some(_), l) if l.starts_with("```") => out.push(current.take().unwrap()),
            (Some(buf), _) => {
                buf.push_str(line);
                buf.push('\n');
            }
            _ => {}
        }
    }
    out
}

#[test]
fn the_readme_documents_the_fields_the_operator_writes_with_valid_snippets() {
    let md = readme();
    let blocks = yaml_blocks(&md);
    assert!(blocks.len() >= 3, "{blocks:?}");
    for b in &blocks {
        let _: serde_yaml::Value = serde_yaml::from_str(b)
            .unwrap_or_else(|e| panic!("README snippet is not YAML ({e}):\n{b}"));
    }
    // The Argo CD health key matches the CRD's group and kind.
    let key = format!(
        "resource.customizations.health.{}_{}",
        WorkerBackpressure::group(&()),
        WorkerBackpressure::kind(&())
    );
    assert!(md.contains(&key), "README does not name {key}");

    // The ignoreDifferences snippet: an Application ignoring exactly the fields Git and the
    // operator both write: the target's replicas and Guard mode's clamp fields.
    let app: Value = blocks
        .iter()
        .filter_map(|b| serde_yaml::from_str::<Value>(b).ok())
        .find(|v| v["kind"] == "Application")
        .expect("an Argo CD Application snippet");
    let ignore = app["spec"]["ignoreDifferences"].as_array().unwrap();
    let pointers = |group: &str, kind: &str| {
        ignore
            .iter()
            .find(|e| e["group"] == group && e["kind"] == kind)
            .unwrap_or_else(|| panic!("no ignoreDifferences entry for {group}/{kind}"))
            ["jsonPointers"]
            .clone()
    };
    assert_eq!(pointers("apps", "Deployment"), json!(["/spec/replicas"]));
    assert_eq!(pointers("apps", "StatefulSet"), json!(["/spec/replicas"]));
    assert_eq!(
        pointers("autoscaling", "HorizontalPodAutoscaler"),
        json!([
            "/spec/maxReplicas",
            "/spec/behavior/scaleUp/selectPolicy",
            "/spec/behavior/scaleDown/selectPolicy"
        ])
    );
    assert_eq!(
        pointers("keda.sh", "ScaledObject"),
        json!(["/spec/maxReplicaCount"])
    );
    let opts = app["spec"]["syncPolicy"]["syncOptions"].to_string();
    assert!(opts.contains("RespectIgnoreDifferences=true"), "{opts}");

    // The prose names the field manager, the annotations the operator never writes, Flux,
    // and what kstatus computes.
    for needle in [
        format!("`{FIELD_MANAGER}`"),
        "`kubectl-wbp`".to_owned(),
        format!("`{}`", guard::FINALIZER),
        format!("`{}`", guard::ORIGINAL_ANNOTATION),
        format!("`{}: \"true\"`", guard::KEDA_PAUSED_SCALE_OUT),
        format!("`{}: \"true\"`", guard::KEDA_PAUSED_SCALE_IN),
        "`spec.behavior.scaleDown.selectPolicy: Disabled`".to_owned(),
        "`spec.behavior.scaleUp.selectPolicy: Disabled`".to_owned(),
        "`spec.maxReplicas`".to_owned(),
        "`spec.maxReplicaCount`".to_owned(),
        "`<name>-worker-config`".to_owned(),
        format!("`{}`", annotations::HOLD_UNTIL),
        format!("`{}`", annotations::DRY_RUN),
        "## Flux".to_owned(),
        "kstatus".to_owned(),
        "/scale".to_owned(),
        "status subresource".to_owned(),
    ] {
        assert!(md.contains(&needle), "README does not mention {needle}");
    }
}
