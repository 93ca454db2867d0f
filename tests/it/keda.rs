//! Guard mode against real KEDA and the real HPA controller (issue 14).
//!
//! A control plane of its own (`keda_env`): etcd + kube-apiserver with the aggregation layer,
//! KEDA's operator and metrics adapter (built from its Go module by `tools/k8s/build.sh keda`),
//! and kube-controller-manager running the HPA controller with a 1 s sync period. A
//! ScaledObject with a Prometheus trigger on the fleet's queue age drives Deployment `w`
//! through the HPA KEDA creates; nothing in the test writes replicas.
//!
//! During the outage (the workers fail first, the backlog builds after) the queue age asks KEDA
//! for 10 replicas. The operator in Guard mode sets
//! `autoscaling.keda.sh/paused-scale-out`, KEDA disables the HPA's scale-up, and the replicas
//! stay at 2 through many HPA syncs while the HPA reads the high metric. After the recovery the
//! operator lifts the pause (the ramp clamps `maxReplicaCount` instead), KEDA restores the HPA's
//! behaviour, and the HPA scales out to the ScaledObject's maximum. Without the pause the
//! replicas would grow during the outage; with the pause left in place they would never grow:
//! either fails the test.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use backpressure_api::v1alpha1::{GuardClamp, GuardKind, Regime};
use backpressure_envtest::{HpaControllerFlags, KEDA_VERSION, TestEnv};
use backpressure_operator::act::guard::{KEDA_PAUSED_SCALE_OUT, api_resource};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::common::fleet::{FleetKnobs, failing, recovered};
use crate::common::scene::{condition, merge, spec, wait_for_every};
use crate::common::serial;
use crate::common::world::World;

/// The HPA controller's sync period here (upstream 15 s).
const SYNC: Duration = Duration::from_secs(1);

/// The control plane with KEDA and the HPA controller, started on first use.
fn keda_env() -> &'static TestEnv {
    static ENV: OnceLock<TestEnv> = OnceLock::new();
    ENV.get_or_init(|| {
        std::thread::spawn(|| {
            let env = TestEnv::start().unwrap_or_else(|e| panic!("control plane: {e}"));
            env.start_keda()
                .unwrap_or_else(|e| panic!("KEDA {KEDA_VERSION}: {e}"));
            env.start_hpa_controller(&HpaControllerFlags {
                sync_period: SYNC,
                downscale_stabilization: Duration::from_secs(10),
                tolerance: 0.1,
            })
            .unwrap_or_else(|e| panic!("HPA controller: {e}"));
            env
        })
        .join()
        .expect("KEDA control plane start thread panicked")
    })
}

/// The queue age is 200 s at a 20 s per-replica target: KEDA's AverageValue asks for 10.
fn scaled_object(prometheus: &str, ns: &str) -> Value {
    json!({
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "w", "annotations": {"team": "payments"}},
        "spec": {
            "scaleTargetRef": {"name": "w"},
            "minReplicaCount": 2,
            "maxReplicaCount": 12,
            "pollingInterval": 1,
            "cooldownPeriod": 10,
            "triggers": [{"type": "prometheus", "metadata": {
                "serverAddress": prometheus,
                "query": format!(
                    "max(backpressure_queue_oldest_age_seconds{{namespace=\"{ns}\",workload=\"w\"}})"
                ),
                "threshold": "20"}}],
        },
    })
}

/// The dependency is back and a large backlog waits.
fn recovered_behind_a_backlog(k: &mut FleetKnobs) {
    recovered(k);
    k.queue_age = 2000.0;
    k.queue_depth = 50000.0;
    k.arrival_rate = 200.0;
}

/// A quantity such as `100` or `100500m` as a number (None for other suffixes).
fn milli(q: &str) -> Option<f64> {
    match q.strip_suffix('m') {
        Some(m) => m.parse::<f64>().ok().map(|v| v / 1000.0),
        None => q.parse().ok(),
    }
}

/// `spec.behavior.scaleUp.selectPolicy` of KEDA's HPA `keda-hpa-w` (`None` outside: the HPA
/// does not exist yet; `Some(None)`: no policy set).
async fn scale_up_policy(hpas: &Api<HorizontalPodAutoscaler>) -> Option<Option<String>> {
    let hpa = hpas.get("keda-hpa-w").await.ok()?;
    Some(
        hpa.spec?
            .behavior
            .and_then(|b| b.scale_up)
            .and_then(|u| u.select_policy),
    )
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj["metadata"]["annotations"]
        .get(key)
        .and_then(Value::as_str)
}

#[tokio::test]
async fn real_keda_is_paused_during_the_outage_and_scales_out_after_the_release() {
    let _serial = serial().await;
    let env = keda_env();
    let mut w = World::builder("keda-real")
        .env(env)
        .replicas(2)
        .pods(2)
        .start()
        .await;
    let ns = w.scene.ns.clone();
    let client = w.scene.client.clone();
    let sos: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &api_resource(GuardKind::ScaledObject));
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), &ns);

    // The outage starts as it does for real: the workers fail at once, the backlog builds
    // later. With the queue age still at the target KEDA wants nothing more than the minimum.
    w.fleet.set(|k| {
        failing(k);
        k.queue_age = 10.0;
    });
    // Nothing runs the Deployment here: give it the status its two pods would give it (the
    // HPA divides an AverageValue metric by status.replicas for its status).
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .patch_status(
            "w",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"replicas": 2, "readyReplicas": 2}})),
        )
        .await
        .unwrap();
    let so: DynamicObject = serde_json::from_value(scaled_object(&w.prom.url(), &ns)).unwrap();
    sos.create(&PostParams::default(), &so).await.unwrap();
    let mode = json!({"mode": "Guard", "guard": {"kind": "ScaledObject", "name": "w"}});
    let mut wbp = spec("w", "w", &w.prom.url(), mode);
    let scaling = wbp["scaling"].as_object_mut().unwrap();
    scaling.remove("scaleUp");
    scaling.remove("scaleDown");
    merge(&mut wbp, json!({"scaling": {"maxReplicas": 12}}));
    w.scene.apply("w", wbp).await;
    w.start_operator().await;

    let diag = || async {
        let so = sos.get("w").await.map(|o| serde_json::to_value(o).unwrap());
        let hpa = hpas
            .get("keda-hpa-w")
            .await
            .map(|o| serde_json::to_value(o).unwrap());
        let logs = env.keda_logs().map(|(op, ad)| {
            format!(
                "--- keda-operator ---\n{}\n--- keda-adapter ---\n{}",
                backpressure_envtest::process::tail(&op, 15),
                backpressure_envtest::process::tail(&ad, 15)
            )
        });
        format!(
            "ScaledObject: {so:#?}\nHPA: {hpa:#?}\n{}\n{}",
            logs.unwrap_or_default(),
            w.diag().await
        )
    };

    // KEDA's HPA exists and sees the outage's queue age; the operator pauses scale-out and
    // KEDA disables the HPA's scale-up.
    wait_for_every(
        Duration::from_millis(250),
        Duration::from_secs(60),
        "paused-scale-out on the ScaledObject and scale-up disabled on KEDA's HPA",
        diag,
        || async {
            let so = serde_json::to_value(sos.get("w").await.ok()?).unwrap();
            let up = scale_up_policy(&hpas).await?;
            (annotation(&so, KEDA_PAUSED_SCALE_OUT) == Some("true")
                && up.as_deref() == Some("Disabled"))
            .then_some(())
        },
    )
    .await;

    assert_eq!(w.scene.replicas("w").await, 2, "{}", diag().await);
    // The backlog builds: the queue age asks KEDA for 10 replicas.
    w.fleet.set(failing);

    // Many HPA syncs with the metric asking for 10: the replicas stay at 2.
    let held_until = Instant::now() + 12 * SYNC;
    let mut saw_metric = false;
    while Instant::now() < held_until {
        assert_eq!(
            w.scene.replicas("w").await,
            2,
            "KEDA scaled out while the operator held it\n{}",
            diag().await
        );
        let hpa = hpas.get("keda-hpa-w").await.unwrap();
        saw_metric |= hpa
            .status
            .and_then(|s| s.current_metrics)
            .into_iter()
            .flatten()
            .filter_map(|m| m.external?.current.average_value)
            .any(|q| milli(&q.0).is_some_and(|v| v > 40.0));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        saw_metric,
        "the HPA never read a queue age asking for more than 2 replicas: the hold proved \
         nothing\n{}",
        diag().await
    );
    let s = w.status().await;
    assert_eq!(s.regime, Some(Regime::DependencyFailing), "{s:?}");

    // Recovery: the pause is lifted while the ramp clamps maxReplicaCount stage by stage, and
    // the real HPA scales the Deployment out within each stage's ceiling, then to the
    // ScaledObject's maximum once the guard is released.
    w.fleet.set(recovered_behind_a_backlog);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut grew_within_a_stage = None;
    loop {
        let replicas = w.scene.replicas("w").await;
        let guard = w.status().await.guard;
        if let Some(g) = guard
            .as_ref()
            .filter(|g| g.clamp == GuardClamp::MaxReplicas)
        {
            let ceiling = g.max_replicas.unwrap_or(i32::MAX);
            if replicas > 2 && replicas < 12 && replicas <= ceiling {
                grew_within_a_stage.get_or_insert((replicas, ceiling));
            }
        }
        if replicas == 12 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "KEDA did not scale out to 12 within 120s of the recovery\n{}",
            diag().await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        grew_within_a_stage.is_some(),
        "the HPA never scaled out during the ramp (the pause was not lifted for it)\n{}",
        diag().await
    );
    wait_for_every(
        Duration::from_millis(500),
        Duration::from_secs(60),
        "the guard released and KEDA's HPA behaviour restored",
        diag,
        || async {
            let so = serde_json::to_value(sos.get("w").await.ok()?).unwrap();
            let up = scale_up_policy(&hpas).await?;
            let s = w.status().await;
            let released = condition(&s, "GuardApplied").is_some_and(|c| c.reason == "NotClamped");
            (annotation(&so, KEDA_PAUSED_SCALE_OUT).is_none()
                && so["spec"]["maxReplicaCount"] == 12
                && up.as_deref() != Some("Disabled")
                && released)
                .then_some(())
        },
    )
    .await;
}
