//! Guard mode end to end against a real kube-apiserver + etcd and a real Prometheus, with the
//! real operator binary running as its own ServiceAccount under the chart's RBAC.
//!
//! The guarded autoscalers are real API objects: an autoscaling/v2 HorizontalPodAutoscaler
//! (served by kube-apiserver itself) and a KEDA ScaledObject (KEDA's real CRD, from the KEDA
//! build). No HPA or KEDA controller runs here (`keda.rs` runs both): the tests check
//! what the operator writes to them: scale-out and scale-in disabled while held and while a hold
//! is pending, scale-out alone while the failure rate is above the set point (or with
//! `hold.allowScaleIn`), the ceiling raised stage by stage during the ramp, and the original
//! spec and annotations restored exactly on release, on leaving Guard mode (also after an
//! operator restart), when the guard moves to another autoscaler, and when the
//! WorkerBackpressure is deleted.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use backpressure_api::v1alpha1::{GuardClamp, GuardKind, Regime, WorkerBackpressureStatus};
use backpressure_operator::act::guard::{
    FINALIZER, KEDA_PAUSED_SCALE_IN, KEDA_PAUSED_SCALE_OUT, ORIGINAL_ANNOTATION, api_resource,
};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::{Value, json};

use crate::common::crds::install_keda_scaledobject_crd;
use crate::common::fleet::{FleetKnobs, failing, recovered};
use crate::common::scene::{condition, merge, spec, wait_for_every};
use crate::common::serial;
use crate::common::world::World;

/// A [`World`] (Deployment `w` with 4 replicas and 2 fake pods) whose autoscaler `w` of
/// `kind` the WorkerBackpressure guards.
struct Guarded {
    world: World,
    kind: GuardKind,
}

impl Deref for Guarded {
    type Target = World;

    fn deref(&self) -> &World {
        &self.world
    }
}

impl DerefMut for Guarded {
    fn deref_mut(&mut self) -> &mut World {
        &mut self.world
    }
}

impl Guarded {
    async fn new(prefix: &str, kind: GuardKind) -> Guarded {
        let world = World::builder(prefix).replicas(4).pods(2).start().await;
        if kind == GuardKind::ScaledObject {
            install_keda_scaledobject_crd(&world.scene.client).await;
        }
        Guarded { world, kind }
    }

    /// The Guard-mode WorkerBackpressure for `w` guarding the autoscaler `w`, with fast time
    /// constants; `patch` is merged into the spec. Unlike the Scale-mode spec it sets no
    /// `scaleUp`/`scaleDown` step limits (the guarded autoscaler scales).
    async fn apply_guard(&self, patch: Value) {
        let mode = json!({"mode": "Guard", "guard": {"kind": kind_name(self.kind), "name": "w"}});
        let mut spec = spec("w", "w", &self.prom.url(), mode);
        let scaling = spec["scaling"].as_object_mut().unwrap();
        scaling.remove("scaleUp");
        scaling.remove("scaleDown");
        merge(&mut spec, patch);
        self.scene.apply("w", spec).await;
    }

    fn autoscalers(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.scene.client.clone(),
            &self.scene.ns,
            &api_resource(self.kind),
        )
    }

    /// Creates the guarded autoscaler `w` from `obj` and returns it as stored.
    async fn create_autoscaler(&self, obj: Value) -> Value {
        let o: DynamicObject = serde_json::from_value(obj).unwrap();
        let created = self
            .autoscalers()
            .create(&PostParams::default(), &o)
            .await
            .unwrap();
        serde_json::to_value(created).unwrap()
    }

    async fn autoscaler(&self) -> Value {
        serde_json::to_value(self.autoscalers().get("w").await.unwrap()).unwrap()
    }

    /// Polls `f` every 200 ms until it returns `Some`, or panics with `what`, the world's
    /// state and the autoscaler.
    async fn wait_guarded<T, F, Fut>(&self, timeout: Duration, what: &str, f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let diag = || async {
            format!(
                "autoscaler: {}\n{}",
                serde_json::to_string_pretty(&self.autoscaler().await).unwrap_or_default(),
                self.diag().await
            )
        };
        wait_for_every(Duration::from_millis(200), timeout, what, diag, f).await
    }

    /// Waits until `w` is in `regime`.
    async fn wait_guarded_regime(&self, regime: Regime) -> WorkerBackpressureStatus {
        self.wait_guarded(
            Duration::from_secs(40),
            &format!("regime {regime:?}"),
            || async {
                let s = self.status().await;
                (s.regime == Some(regime)).then_some(s)
            },
        )
        .await
    }

    /// Waits (10 s) until `GuardApplied` has `reason` and returns the status.
    async fn wait_guard_applied(&self, reason: &str) -> WorkerBackpressureStatus {
        self.wait_guarded(
            Duration::from_secs(10),
            &format!("GuardApplied {reason}"),
            || async {
                let s = self.status().await;
                condition(&s, "GuardApplied")
                    .is_some_and(|c| c.reason == reason)
                    .then_some(s)
            },
        )
        .await
    }

    /// Waits until the autoscaler satisfies `pred` and returns it.
    async fn wait_autoscaler(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_guarded(Duration::from_secs(40), what, || async {
            let a = self.autoscaler().await;
            pred(&a).then_some(a)
        })
        .await
    }

    /// Deletes the WorkerBackpressure and waits until it is gone (its finalizer removed).
    async fn delete_wbp_and_wait(&self) {
        self.wbps()
            .delete("w", &DeleteParams::default())
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.wbps().get_opt("w").await.unwrap() {
                None => return,
                Some(_) if Instant::now() >= deadline => {
                    panic!(
                        "WorkerBackpressure still there 30s after delete\n{}",
                        self.diag().await
                    )
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

fn kind_name(kind: GuardKind) -> &'static str {
    match kind {
        GuardKind::HorizontalPodAutoscaler => "HorizontalPodAutoscaler",
        GuardKind::ScaledObject => "ScaledObject",
    }
}

/// The dependency is back and a large backlog waits: the backlog-sized target stays at the
/// object's maxReplicas (20) through the ramp, so every stage raises the ceiling.
fn recovered_behind_a_large_backlog(k: &mut FleetKnobs) {
    recovered(k);
    k.queue_age = 2000.0;
    k.queue_depth = 50000.0;
    k.arrival_rate = 200.0;
}

/// What Guard mode may change, and what must come back exactly: the spec and the annotations.
fn guarded_view(obj: &Value) -> Value {
    json!({
        "spec": obj["spec"],
        "annotations": obj["metadata"].get("annotations").cloned().unwrap_or(json!({})),
    })
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj["metadata"]["annotations"]
        .get(key)
        .and_then(Value::as_str)
}

/// The replicas of ramp stage `stage` (1-based) of `stages`, as the operator computes them.
fn stage_replicas(from: i32, to: i32, stages: &[i32], stage: i32) -> i32 {
    let pct = stages[(stage - 1) as usize];
    from + ((to - from).max(0) * pct + 99) / 100
}

fn hpa(behavior: Option<Value>) -> Value {
    let mut spec = json!({
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "w"},
        "minReplicas": 2,
        "maxReplicas": 30,
        "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                     "target": {"type": "Utilization", "averageUtilization": 70}}}],
    });
    if let Some(b) = behavior {
        spec["behavior"] = b;
    }
    json!({
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "w", "annotations": {"team": "payments"}},
        "spec": spec,
    })
}

#[tokio::test]
async fn hpa_scale_out_is_disabled_while_held_raised_by_stage_and_restored_exactly() {
    let _serial = serial().await;
    let mut w = Guarded::new("guard-hpa", GuardKind::HorizontalPodAutoscaler).await;
    // No behavior at all: restoring must remove what the clamp added, defaults included.
    let original = w.create_autoscaler(hpa(None)).await;
    assert!(original["spec"].get("behavior").is_none(), "{original}");
    let original_view = guarded_view(&original);
    w.fleet.set(failing);
    w.apply_guard(json!({})).await;
    w.start_operator().await;

    // Held: the HPA may neither scale out nor in (as Active mode); nothing else changes.
    let held = w
        .wait_autoscaler("scaleUp and scaleDown selectPolicy Disabled", |a| {
            a["spec"]["behavior"]["scaleUp"]["selectPolicy"] == "Disabled"
                && a["spec"]["behavior"]["scaleDown"]["selectPolicy"] == "Disabled"
        })
        .await;
    assert_eq!(held["spec"]["maxReplicas"], 30);
    assert_eq!(held["spec"]["minReplicas"], 2);
    assert_eq!(held["spec"]["metrics"], original["spec"]["metrics"]);
    assert_eq!(annotation(&held, "team"), Some("payments"));
    let record: Value =
        serde_json::from_str(annotation(&held, ORIGINAL_ANNOTATION).unwrap()).unwrap();
    assert_eq!(record["owner"], "w");
    let s = w.wait_guarded_regime(Regime::DependencyFailing).await;
    let guard = w
        .wait_guarded(
            Duration::from_secs(10),
            "status.guard ScalingDisabled",
            || async {
                let s = w.status().await;
                s.guard.filter(|g| g.clamp == GuardClamp::ScalingDisabled)
            },
        )
        .await;
    assert_eq!(
        (guard.kind, guard.name.as_str()),
        (GuardKind::HorizontalPodAutoscaler, "w")
    );
    let s = if condition(&s, "GuardApplied").is_some() {
        s
    } else {
        w.status().await
    };
    let c = condition(&s, "GuardApplied").expect("GuardApplied");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "ScalingDisabled")
    );
    assert!(
        c.message
            .contains("behavior.scaleUp.selectPolicy and behavior.scaleDown.selectPolicy Disabled"),
        "{}",
        c.message
    );
    let wbp = w.wbps().get("w").await.unwrap();
    assert!(
        wbp.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    );
    assert!(
        w.events()
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some("GuardClamped")),
        "no GuardClamped event"
    );
    // Guard mode never scales the target itself.
    assert_eq!(w.scene.replicas("w").await, 4);

    // Recovery: the ceiling rises stage by stage; scale-out is allowed again up to it.
    w.fleet.set(recovered_behind_a_large_backlog);
    let stages = [34, 67, 100];
    let mut ceilings: Vec<(i32, i64)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let final_status = loop {
        let s = w.status().await;
        let a = w.autoscaler().await;
        if let (Some(r), Some(Regime::Recovering)) = (s.ramp.as_ref(), s.regime) {
            let max = a["spec"]["maxReplicas"].as_i64().unwrap();
            if a["spec"].get("behavior").is_none()
                && s.guard.as_ref().and_then(|g| g.max_replicas) == Some(max as i32)
                && ceilings.last().map(|(st, _)| *st) != Some(r.stage)
            {
                let expected = stage_replicas(r.from, r.to, &stages, r.stage)
                    .clamp(2, 30)
                    .max(4);
                assert_eq!(max, i64::from(expected), "stage {} of {r:?}", r.stage);
                ceilings.push((r.stage, max));
            }
        }
        if !ceilings.is_empty()
            && s.regime != Some(Regime::Recovering)
            && s.regime != Some(Regime::DependencyFailing)
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the ramp did not end; ceilings {ceilings:?}\nstatus: {s:?}\n{}",
            w.diag().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("HPA maxReplicas by ramp stage (original 30): {ceilings:?}");
    assert!(
        ceilings.len() >= 2,
        "saw the ceiling at stages {ceilings:?}"
    );
    for pair in ceilings.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "the ceiling must rise stage by stage: {ceilings:?}"
        );
    }
    assert!(
        ceilings[0].1 < 30,
        "stage 1 must clamp below the original maxReplicas: {ceilings:?}"
    );

    // Released: the HPA is exactly what it was.
    let restored = w
        .wait_autoscaler("the original HPA after release", |a| {
            guarded_view(a) == original_view
        })
        .await;
    assert!(annotation(&restored, ORIGINAL_ANNOTATION).is_none());
    let s = w
        .wait_guarded(Duration::from_secs(10), "status.guard None", || async {
            let s = w.status().await;
            s.guard
                .as_ref()
                .is_some_and(|g| g.clamp == GuardClamp::None)
                .then_some(s)
        })
        .await;
    assert_eq!(
        condition(&s, "GuardApplied").map(|c| c.reason.as_str()),
        Some("NotClamped"),
        "{final_status:?}"
    );
    assert!(
        w.events()
            .await
            .iter()
            .any(|e| e.reason.as_deref() == Some("GuardReleased"))
    );

    // Held again, then the WorkerBackpressure is deleted: the finalizer restores the HPA.
    w.fleet.set(failing);
    w.wait_autoscaler("held again", |a| {
        a["spec"]["behavior"]["scaleUp"]["selectPolicy"] == "Disabled"
    })
    .await;
    w.delete_wbp_and_wait().await;
    let after = w.autoscaler().await;
    assert_eq!(guarded_view(&after), original_view, "{after}");
    assert!(w.scale_writes().is_empty(), "Guard mode wrote /scale");
}

#[tokio::test]
async fn a_restarted_operator_restores_the_recorded_original_when_guard_mode_ends() {
    let _serial = serial().await;
    let mut w = Guarded::new("guard-restart", GuardKind::HorizontalPodAutoscaler).await;
    // A full behavior: only scaleUp.selectPolicy may change, and it must come back as Min.
    let behavior = json!({
        "scaleUp": {"selectPolicy": "Min", "stabilizationWindowSeconds": 30,
                    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60},
                                 {"type": "Percent", "value": 50, "periodSeconds": 60}]},
        "scaleDown": {"selectPolicy": "Max", "stabilizationWindowSeconds": 120,
                      "policies": [{"type": "Percent", "value": 10, "periodSeconds": 60}]},
    });
    let original = w.create_autoscaler(hpa(Some(behavior))).await;
    let original_view = guarded_view(&original);
    w.fleet.set(failing);
    w.apply_guard(json!({})).await;
    w.start_operator().await;
    let held = w
        .wait_autoscaler("scaleUp.selectPolicy Disabled", |a| {
            a["spec"]["behavior"]["scaleUp"]["selectPolicy"] == "Disabled"
        })
        .await;
    assert_eq!(
        held["spec"]["behavior"]["scaleUp"]["policies"],
        original["spec"]["behavior"]["scaleUp"]["policies"]
    );
    // Scale-in is disabled too (held, no hold.allowScaleIn); only its select policy changed.
    let mut down = original["spec"]["behavior"]["scaleDown"].clone();
    down["selectPolicy"] = json!("Disabled");
    assert_eq!(held["spec"]["behavior"]["scaleDown"], down);
    let record = annotation(&held, ORIGINAL_ANNOTATION).unwrap().to_owned();

    // Crash while held; a new operator must not take the clamp for the original.
    w.operator_mut().kill();
    w.start_operator().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let still = w.autoscaler().await;
    assert_eq!(
        still["spec"]["behavior"]["scaleUp"]["selectPolicy"],
        "Disabled"
    );
    assert_eq!(
        annotation(&still, ORIGINAL_ANNOTATION),
        Some(record.as_str())
    );

    // The guard moves to another HPA: the first gets its settings back, the second is clamped.
    let mut second = hpa(None);
    second["metadata"]["name"] = json!("w2");
    let second: DynamicObject = serde_json::from_value(second).unwrap();
    let second = w
        .autoscalers()
        .create(&PostParams::default(), &second)
        .await
        .unwrap();
    let second_view = guarded_view(&serde_json::to_value(&second).unwrap());
    w.apply_guard(json!({"guard": {"name": "w2"}})).await;
    w.wait_autoscaler("the first HPA restored when the guard moves", |a| {
        guarded_view(a) == original_view
    })
    .await;
    let clamped = w
        .wait_guarded(
            Duration::from_secs(30),
            "the second HPA clamped",
            || async {
                let a = serde_json::to_value(w.autoscalers().get("w2").await.unwrap()).unwrap();
                (a["spec"]["behavior"]["scaleUp"]["selectPolicy"] == "Disabled").then_some(a)
            },
        )
        .await;
    assert_eq!(clamped["spec"]["maxReplicas"], 30);

    // Leaving Guard mode (to DryRun: nothing else writes) restores it and drops the finalizer.
    w.apply_guard(json!({"mode": "DryRun"})).await;
    w.wait_guarded(
        Duration::from_secs(30),
        "the second HPA restored after leaving Guard mode",
        || async {
            let a = serde_json::to_value(w.autoscalers().get("w2").await.unwrap()).unwrap();
            (guarded_view(&a) == second_view).then_some(())
        },
    )
    .await;
    assert_eq!(guarded_view(&w.autoscaler().await), original_view);
    w.wait_guarded(
        Duration::from_secs(20),
        "finalizer removed and status.guard gone",
        || async {
            let o = w.wbps().get("w").await.unwrap();
            let no_finalizer = !o
                .metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == FINALIZER);
            let s = o.status.unwrap_or_default();
            (no_finalizer && s.guard.is_none() && condition(&s, "GuardApplied").is_none())
                .then_some(())
        },
    )
    .await;
}

fn scaled_object() -> Value {
    json!({
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "w", "annotations": {"team": "payments",
                     "autoscaling.keda.sh/paused-scale-in": "true"}},
        "spec": {
            "scaleTargetRef": {"name": "w"},
            "minReplicaCount": 1,
            "maxReplicaCount": 30,
            "pollingInterval": 15,
            "triggers": [{"type": "prometheus", "metadata": {
                "serverAddress": "http://prometheus:9090",
                "query": "sum(backpressure_queue_depth{workload=\"w\"})",
                "threshold": "100"}}],
        },
    })
}

#[tokio::test]
async fn scaled_object_pause_annotation_and_ceiling_are_restored_exactly() {
    let _serial = serial().await;
    let mut w = Guarded::new("guard-keda", GuardKind::ScaledObject).await;
    let original = w.create_autoscaler(scaled_object()).await;
    let original_view = guarded_view(&original);
    w.fleet.set(failing);
    w.apply_guard(json!({})).await;
    w.start_operator().await;

    let held = w
        .wait_autoscaler("paused-scale-out", |a| {
            annotation(a, KEDA_PAUSED_SCALE_OUT) == Some("true")
        })
        .await;
    assert_eq!(
        held["spec"], original["spec"],
        "pausing changes no spec field"
    );
    assert_eq!(annotation(&held, "team"), Some("payments"));
    assert_eq!(
        annotation(&held, "autoscaling.keda.sh/paused-scale-in"),
        Some("true")
    );
    let s = w.wait_guard_applied("ScalingDisabled").await;
    assert!(
        condition(&s, "GuardApplied")
            .unwrap()
            .message
            .contains(KEDA_PAUSED_SCALE_OUT),
        "{s:?}"
    );

    // The pause starts while the hold is pending; the ramp needs the hold itself.
    w.wait_guarded_regime(Regime::DependencyFailing).await;
    // The ramp clamps maxReplicaCount instead, with the pause lifted.
    w.fleet.set(recovered_behind_a_large_backlog);
    let ramp = w
        .wait_autoscaler("maxReplicaCount clamped by the ramp", |a| {
            a["spec"]["maxReplicaCount"]
                .as_i64()
                .is_some_and(|m| m < 30)
                && annotation(a, KEDA_PAUSED_SCALE_OUT).is_none()
        })
        .await;
    assert!(ramp["spec"]["maxReplicaCount"].as_i64().unwrap() >= 4);
    assert_eq!(
        annotation(&ramp, "autoscaling.keda.sh/paused-scale-in"),
        Some("true")
    );

    // Released after the ramp: exactly the original.
    w.wait_autoscaler("the original ScaledObject after release", |a| {
        guarded_view(a) == original_view
    })
    .await;

    // Held again, then deleted: restored by the finalizer.
    w.fleet.set(failing);
    w.wait_autoscaler("paused again", |a| {
        annotation(a, KEDA_PAUSED_SCALE_OUT) == Some("true")
    })
    .await;
    w.delete_wbp_and_wait().await;
    assert_eq!(guarded_view(&w.autoscaler().await), original_view);
}

/// The failure rate is above the workers' set point (5 %) while the backoff stays under the
/// hold threshold: Active mode defers scale-out (not scale-in).
fn failing_below_the_hold_threshold(k: &mut FleetKnobs) {
    k.backoff = 0.1;
    k.failure_rate = 0.3;
}

/// The backoff is above the hold threshold, not yet for `hold.for`.
fn hold_pending(k: &mut FleetKnobs) {
    k.backoff = 0.4;
    k.failure_rate = 0.0;
}

fn healthy(k: &mut FleetKnobs) {
    k.backoff = 0.0;
    k.failure_rate = 0.0;
}

fn select_policies(a: &Value) -> (Value, Value) {
    (
        a["spec"]["behavior"]["scaleUp"]["selectPolicy"].clone(),
        a["spec"]["behavior"]["scaleDown"]["selectPolicy"].clone(),
    )
}

#[tokio::test]
async fn hpa_is_clamped_while_the_hold_is_pending_and_while_failures_exceed_the_set_point() {
    let _serial = serial().await;
    let mut w = Guarded::new("guard-defer", GuardKind::HorizontalPodAutoscaler).await;
    let behavior = json!({
        "scaleUp": {"selectPolicy": "Max", "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}]},
        "scaleDown": {"selectPolicy": "Min", "stabilizationWindowSeconds": 300,
                      "policies": [{"type": "Percent", "value": 10, "periodSeconds": 60}]},
    });
    let original = w.create_autoscaler(hpa(Some(behavior))).await;
    let original_view = guarded_view(&original);
    // The queue is fine (the backlog sizing wants no scale-out): the clamp follows the
    // dependency, since the HPA sizes from its own metric (CPU here).
    w.fleet.set(hold_pending);
    // A hold that stays pending for the whole test.
    w.apply_guard(json!({"scaling": {"hold": {"for": "10m"}}}))
        .await;
    w.start_operator().await;

    // Pending hold: no scale-out and no scale-in.
    w.wait_autoscaler("both select policies Disabled (hold pending)", |a| {
        select_policies(a) == (json!("Disabled"), json!("Disabled"))
    })
    .await;
    let s = w.wait_guard_applied("ScalingDisabled").await;
    assert_ne!(s.regime, Some(Regime::DependencyFailing), "{s:?}");
    assert_eq!(
        condition(&s, "ScaleOutHeld").map(|c| (c.status.as_str(), c.reason.as_str())),
        Some(("False", "HoldPending"))
    );
    assert!(
        condition(&s, "GuardApplied")
            .unwrap()
            .message
            .contains("hold pending"),
        "{s:?}"
    );

    // Failures above the set point, backoff under the threshold: scale-out only, scale-in back
    // to the original policy.
    w.fleet.set(failing_below_the_hold_threshold);
    let a = w
        .wait_autoscaler("scale-out Disabled, scale-in Min (failure rate)", |a| {
            select_policies(a) == (json!("Disabled"), json!("Min"))
        })
        .await;
    assert_eq!(
        a["spec"]["behavior"]["scaleDown"],
        original["spec"]["behavior"]["scaleDown"]
    );
    let s = w
        .wait_guarded(
            Duration::from_secs(10),
            "status.guard ScaleOutDisabled",
            || async {
                let s = w.status().await;
                s.guard
                    .as_ref()
                    .is_some_and(|g| g.clamp == GuardClamp::ScaleOutDisabled)
                    .then_some(s)
            },
        )
        .await;
    let c = condition(&s, "GuardApplied").unwrap();
    assert!(c.message.contains("failure rate"), "{}", c.message);

    // Healthy: the original, exactly.
    w.fleet.set(healthy);
    w.wait_autoscaler("the original HPA", |a| guarded_view(a) == original_view)
        .await;
    assert!(w.scale_writes().is_empty(), "Guard mode wrote /scale");
}

#[tokio::test]
async fn scaled_object_pauses_scale_in_while_held_unless_allowed() {
    let _serial = serial().await;
    let mut w = Guarded::new("guard-keda-in", GuardKind::ScaledObject).await;
    let mut so = scaled_object();
    so["metadata"]["annotations"] = json!({"team": "payments"});
    let original = w.create_autoscaler(so).await;
    let original_view = guarded_view(&original);
    w.fleet.set(failing);
    w.apply_guard(json!({})).await;
    w.start_operator().await;

    let held = w
        .wait_autoscaler("paused-scale-out and paused-scale-in", |a| {
            annotation(a, KEDA_PAUSED_SCALE_OUT) == Some("true")
                && annotation(a, KEDA_PAUSED_SCALE_IN) == Some("true")
        })
        .await;
    assert_eq!(held["spec"], original["spec"]);
    w.wait_guarded_regime(Regime::DependencyFailing).await;

    // hold.allowScaleIn: the held ScaledObject may scale in again.
    w.apply_guard(json!({"scaling": {"hold": {"allowScaleIn": true}}}))
        .await;
    w.wait_autoscaler("paused-scale-in lifted (allowScaleIn)", |a| {
        annotation(a, KEDA_PAUSED_SCALE_OUT) == Some("true")
            && annotation(a, KEDA_PAUSED_SCALE_IN).is_none()
    })
    .await;
    let s = w.wait_guard_applied("ScaleOutDisabled").await;
    assert_eq!(s.regime, Some(Regime::DependencyFailing));

    // Deleted while held: exactly the original.
    w.delete_wbp_and_wait().await;
    assert_eq!(guarded_view(&w.autoscaler().await), original_view);
}

#[tokio::test]
async fn a_missing_autoscaler_is_reported_and_does_not_block_deletion() {
    let _serial = serial().await;
    let mut w = Guarded::new("guard-missing", GuardKind::HorizontalPodAutoscaler).await;
    w.fleet.set(failing);
    w.apply_guard(json!({})).await;
    w.start_operator().await;
    let s = w
        .wait_guarded(Duration::from_secs(40), "GuardApplied False", || async {
            let s = w.status().await;
            condition(&s, "GuardApplied")
                .is_some_and(|c| c.status == "False")
                .then_some(s)
        })
        .await;
    let c = condition(&s, "GuardApplied").unwrap();
    assert_eq!(c.reason, "GuardTargetNotFound");
    assert!(
        c.message.contains("HorizontalPodAutoscaler w not found"),
        "{}",
        c.message
    );
    let ready = condition(&s, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "GuardTargetNotFound"),
        "Guard mode without its autoscaler is not Ready: {}",
        ready.message
    );
    let ev = w
        .wait_guarded(
            Duration::from_secs(10),
            "a GuardTargetNotFound event",
            || async {
                w.events()
                    .await
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some("GuardTargetNotFound"))
            },
        )
        .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    w.delete_wbp_and_wait().await;
}
