//! The operator end to end against a real kube-apiserver + etcd and a real Prometheus that
//! scrapes metric endpoints served by the test. The operator is the real binary, running as
//! its own ServiceAccount with a real token and the Helm chart's RBAC: every test below is
//! also a test of that least-privilege role.
//!
//! The operator watches all namespaces: each test holds [`serial`] for its whole duration.

use std::time::{Duration, Instant};

use backpressure_api::v1alpha1::{Action, Regime};
use backpressure_api::wire::WorkerConfig;
use backpressure_envtest::TestEnv;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::common::fleet::{backlog, failing, recovered};
use crate::common::operator::{operator_kubeconfig, operator_user};
use crate::common::scene::condition;
use crate::common::serial;
use crate::common::world::{W, World};

#[tokio::test]
async fn scales_out_for_a_backlog_within_step_limits() {
    let _serial = serial().await;
    let mut w = World::builder("backlog").replicas(2).pods(2).start().await;
    w.fleet.set(backlog);
    w.apply(json!({})).await;
    w.start_operator().await;

    // Watch the replicas climb: every step within max(maxPods 2, 50% of current).
    let mut seen = vec![w.replicas().await];
    let deadline = Instant::now() + Duration::from_secs(60);
    while *seen.last().unwrap() < 6 {
        assert!(
            Instant::now() < deadline,
            "replicas {seen:?} did not reach 6\n{}",
            w.operator().log()
        );
        let r = w.replicas().await;
        if seen.last() != Some(&r) {
            seen.push(r);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for pair in seen.windows(2) {
        let (from, to) = (pair[0], pair[1]);
        let limit = from + 2.max((from as f64 * 0.5).ceil() as i32);
        assert!(
            to <= limit,
            "step {from} -> {to} exceeds the limit {limit} (sequence {seen:?})"
        );
    }
    let s = w.status().await;
    assert_eq!(s.regime, Some(Regime::Backlogged), "{s:?}");
    assert!(s.replicas.as_ref().unwrap().recommended > 6, "{s:?}");
    let ev = w
        .event("ScaledOut")
        .await
        .unwrap_or_else(|| panic!("no ScaledOut event\n{}", w.operator().log()));
    let note = ev.note.unwrap_or_default();
    assert!(
        note.chars().any(|c| c.is_ascii_digit()),
        "the event gives numbers: {note}"
    );
}

/// Issue 13: the fleet's failure floor is the mean over the workers that know theirs (a pod that
/// has not tested it exports NaN), read through the real Prometheus. Failures at the floor
/// neither hold nor defer the backlog's scale-out; without a known floor the same failure rate
/// defers it.
#[tokio::test]
async fn failures_at_the_fleet_failure_floor_let_a_backlog_scale_out() {
    let _serial = serial().await;
    let mut w = World::builder("floor").replicas(3).pods(3).start().await;
    let failing_at = |floors: Vec<Option<f64>>| {
        move |k: &mut crate::common::fleet::FleetKnobs| {
            backlog(k);
            k.backoff = 0.3;
            k.failure_rate = 0.16;
            k.failure_floors = floors;
        }
    };
    w.fleet.set(failing_at(vec![None, None, None]));
    // No hold can start while the test looks: only the deferral and its end are at stake.
    w.apply(json!({"scaling": {"hold": {"for": "10m"}}})).await;
    w.start_operator().await;
    let s = w
        .wait_status(Duration::from_secs(60), "scale-out deferred", |s| {
            s.last_decision
                .as_ref()
                .is_some_and(|d| d.reason.contains("deferred"))
        })
        .await;
    assert_eq!(w.replicas().await, 3, "{s:?}");

    // One pod still learning (NaN) must not pull the fleet's floor to 0.
    w.fleet.set(failing_at(vec![Some(0.15), None, Some(0.15)]));
    w.wait_for(
        Duration::from_secs(60),
        "scale-out at failures on the floor",
        || async { (w.replicas().await > 3).then_some(()) },
    )
    .await;
    let s = w.status().await;
    assert_ne!(s.regime, Some(Regime::DependencyFailing), "{s:?}");
}

/// Issue 13: the fleet's own load test, read through the real Prometheus, and its floor pushed
/// to the workers. A busy fleet (100 completions/s, no failures to speak of) whose calls fall to
/// about a tenth while 16 % of them keep failing has a load-independent floor: the operator
/// records it (`status.tracking.fleetFloor`, event `FailureFloor`) and every pod is pushed the
/// effective set point `f0 + 0.05·(1 − f0)`; when the failures fall to the set point the floor
/// ends and the pods run 0.05 again.
#[tokio::test]
async fn the_fleets_failure_floor_is_found_and_pushed_to_the_workers() {
    let _serial = serial().await;
    let mut w = World::builder("fleetfloor")
        .replicas(3)
        .pods(3)
        .start()
        .await;
    let busy = |k: &mut crate::common::fleet::FleetKnobs| {
        backlog(k);
        k.completion_rate = 100.0;
        k.attempt_rate = 100.0;
        k.failure_rate = 0.005;
    };
    w.fleet.set(busy);
    // No scale-out while the test looks: the replicas are not at stake.
    w.apply(json!({"scaling": {"maxReplicas": 3}})).await;
    w.start_operator().await;
    w.wait_status(Duration::from_secs(60), "the fleet's load peak", |s| {
        s.tracking
            .as_ref()
            .and_then(|t| t.load_peak.as_ref())
            .is_some_and(|p| p.calls > 80.0)
    })
    .await;
    let on_every_pod = |set_point: f64| {
        let pods = &w.pods;
        move || async move {
            pods.iter()
                .all(|p| (p.running().set_point - set_point).abs() < 1e-9)
                .then_some(())
        }
    };
    w.wait_for(
        Duration::from_secs(30),
        "set point 0.05 on every pod",
        on_every_pod(0.05),
    )
    .await;

    w.fleet.set(|k| {
        backlog(k);
        k.backoff = 0.9;
        k.failure_rate = 0.16;
        k.completion_rate = 12.0;
        k.attempt_rate = 14.3;
    });
    let s = w
        .wait_status(Duration::from_secs(90), "a fleet failure floor", |s| {
            s.tracking.as_ref().and_then(|t| t.fleet_floor).is_some()
        })
        .await;
    let f0 = s.tracking.and_then(|t| t.fleet_floor).unwrap();
    // The floor is the lower of the failure rates at the evidence's start and now: a start
    // window that straddled the fall of the load reads between the two loads' rates, so the
    // floor may come out below 16 % (the conservative side: the workers throttle more), never
    // above it, and never at or below 1.5x the set point.
    assert!(f0 > 0.075 && f0 <= 0.17, "floor {f0}");
    let pushed = ((f0 + 0.05 * (1.0 - f0)) * 1e6).round() / 1e6;
    w.wait_for(
        Duration::from_secs(30),
        "the effective set point on every pod",
        on_every_pod(pushed),
    )
    .await;
    let events = w.scene.events_of(W, "FailureFloor").await;
    assert!(
        events.iter().any(|e| e
            .note
            .as_deref()
            .is_some_and(|n| n.contains("failure floor"))),
        "{events:?}"
    );

    // Healed: the failures fall to the set point, the floor ends, the pods run 0.05 again.
    w.fleet.set(busy);
    w.wait_for(
        Duration::from_secs(60),
        "set point 0.05 again",
        on_every_pod(0.05),
    )
    .await;
    let s = w.status().await;
    assert_eq!(s.tracking.and_then(|t| t.fleet_floor), None);
}

/// Issue 16, metrics-only workers: with `spec.worker.push: Disabled` the fleet is scaled out for
/// a backlog and held while the dependency fails like any other, the pods' admin servers never
/// receive a config, and `ConfigInSync` says `NotManaged` (not a `ConfigPushFailed` forever).
#[tokio::test]
async fn metrics_only_workers_are_scaled_and_held_with_no_push() {
    let _serial = serial().await;
    let mut w = World::builder("metricsonly")
        .replicas(2)
        .pods(2)
        .start()
        .await;
    let before: Vec<String> = w.pods.iter().map(|p| p.running().hash).collect();
    w.fleet.set(backlog);
    // A setting the pods do not run yet: a push would change their config.
    w.apply(json!({"worker": {"push": "Disabled", "maxPermits": 7}}))
        .await;
    w.start_operator().await;

    w.wait_for(
        Duration::from_secs(60),
        "scale-out for the backlog",
        || async { (w.replicas().await > 2).then_some(()) },
    )
    .await;
    let s = w
        .wait_status(Duration::from_secs(30), "ConfigInSync NotManaged", |s| {
            condition(s, "ConfigInSync").is_some_and(|c| c.reason == "NotManaged")
        })
        .await;
    assert_eq!(
        condition(&s, "ConfigInSync").map(|c| c.status.as_str()),
        Some("Unknown"),
        "{s:?}"
    );

    w.fleet.set(failing);
    w.wait_regime(Regime::DependencyFailing, Duration::from_secs(60))
        .await;

    let s = w.status().await;
    let after: Vec<String> = w.pods.iter().map(|p| p.running().hash).collect();
    assert_eq!(
        after, before,
        "a metrics-only worker received a config: {s:?}"
    );
    assert_eq!(s.config.as_ref().map(|c| c.pods_in_sync), Some(0), "{s:?}");
    assert!(
        w.event("ConfigPushFailed").await.is_none(),
        "{}",
        w.operator().log()
    );
}

#[tokio::test]
async fn holds_while_the_dependency_fails_then_ramps_in_stages_and_aborts_on_a_spike() {
    let _serial = serial().await;
    let mut w = World::builder("hold").replicas(4).pods(2).start().await;
    w.fleet.set(failing);
    w.apply(json!({})).await;
    w.start_operator().await;

    let s = w
        .wait_regime(Regime::DependencyFailing, Duration::from_secs(40))
        .await;
    let held = condition(&s, "ScaleOutHeld").expect("ScaleOutHeld condition");
    assert_eq!(held.status, "True");
    assert!(
        held.message.contains("0.6"),
        "the hold gives the backoff: {}",
        held.message
    );
    // Held for a while: no scale-out although a backlog-only autoscaler would add pods.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(w.replicas().await, 4, "replicas grew during the hold");
    let s = w.status().await;
    assert_eq!(s.regime, Some(Regime::DependencyFailing));
    let r = s.replicas.clone().unwrap();
    assert!(
        r.recommended > r.current,
        "recommended {} should exceed current {}",
        r.recommended,
        r.current
    );
    w.wait_event("ScaleOutHeld", Duration::from_secs(20)).await;

    // Recovery: backoff falls below release; a staged ramp starts.
    w.fleet.set(recovered);
    let s1 = w
        .wait_for(Duration::from_secs(40), "ramp stage 1", || async {
            let s = w.status().await;
            (s.regime == Some(Regime::Recovering) && s.ramp.as_ref().is_some_and(|r| r.stage == 1))
                .then_some(s)
        })
        .await;
    let ramp = s1.ramp.clone().unwrap();
    assert_eq!(ramp.of, 3);
    assert_eq!(ramp.from, 4);
    let stage1_target = ramp.from + ((ramp.to - ramp.from) as f64 * 0.34).ceil() as i32;
    let s2 = w
        .wait_for(Duration::from_secs(40), "ramp stage 2", || async {
            let s = w.status().await;
            s.ramp.as_ref().is_some_and(|r| r.stage == 2).then_some(s)
        })
        .await;
    let t1 = ramp.stage_started_at.clone().unwrap().0;
    let t2 = s2
        .ramp
        .as_ref()
        .unwrap()
        .stage_started_at
        .clone()
        .unwrap()
        .0;
    assert!(
        t2.as_second() - t1.as_second() >= 4,
        "stage 2 started {}s after stage 1 (dwell 4s)",
        t2.as_second() - t1.as_second()
    );
    assert!(w.replicas().await >= stage1_target.min(ramp.to));

    // A backoff spike mid-ramp aborts back to hold.
    w.fleet.set(failing);
    let s = w
        .wait_regime(Regime::DependencyFailing, Duration::from_secs(30))
        .await;
    let aborted = w.event("RampAborted").await;
    assert!(
        aborted.is_some()
            || s.last_decision
                .as_ref()
                .is_some_and(|d| d.action == Action::AbortRamp),
        "no abort recorded: {s:?}"
    );
    let at_abort = w.replicas().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        w.replicas().await,
        at_abort,
        "replicas grew after the abort"
    );
}

#[tokio::test]
async fn a_killed_operator_resumes_the_ramp_at_the_recorded_stage() {
    let _serial = serial().await;
    let mut w = World::builder("restart").replicas(4).pods(2).start().await;
    w.fleet.set(failing);
    w.apply(json!({"scaling": {"rampUp": {"stages": [34, 67, 100], "dwell": "8s"}}}))
        .await;
    w.start_operator().await;
    w.wait_regime(Regime::DependencyFailing, Duration::from_secs(40))
        .await;
    w.fleet.set(recovered);
    let s1 = w
        .wait_for(Duration::from_secs(40), "ramp stage 1", || async {
            let s = w.status().await;
            s.ramp.as_ref().is_some_and(|r| r.stage == 1).then_some(s)
        })
        .await;
    let ramp = s1.ramp.clone().unwrap();

    // Crash: SIGKILL, no graceful shutdown.
    w.operator_mut().kill();
    let at_crash = w.replicas().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(w.status().await.ramp.unwrap().stage, 1);
    w.start_operator().await;

    // It continues from stage 1 (same ramp: same origin and target), reaching stage 2 only
    // after the dwell, and never jumps to the final size first.
    let final_target = ramp.to;
    let s2 = w
        .wait_for(
            Duration::from_secs(40),
            "ramp stage 2 after restart",
            || async {
                let s = w.status().await;
                let r = w.replicas().await;
                assert!(
                    r <= at_crash
                        .max(ramp.from + ((final_target - ramp.from) as f64 * 0.67).ceil() as i32),
                    "replicas {r} beyond stage 2 while resuming"
                );
                s.ramp.as_ref().is_some_and(|x| x.stage >= 2).then_some(s)
            },
        )
        .await;
    let resumed = s2.ramp.unwrap();
    assert_eq!(
        resumed.from, ramp.from,
        "the ramp restarted instead of resuming"
    );
    assert!(resumed.stage_started_at.is_some());
}

#[tokio::test]
async fn prometheus_down_means_metrics_unavailable_and_no_scaling() {
    let _serial = serial().await;
    let mut w = World::builder("promdown").replicas(3).pods(2).start().await;
    w.fleet.set(|k| {
        k.queue_age = 2.0;
        k.arrival_rate = 10.0;
        k.completion_rate = 10.0;
    });
    w.apply(json!({})).await;
    w.start_operator().await;
    w.wait_for(Duration::from_secs(40), "metrics available", || async {
        let s = w.status().await;
        condition(&s, "MetricsAvailable")
            .is_some_and(|c| c.status == "True")
            .then_some(())
    })
    .await;
    let before = w.replicas().await;
    w.prom.stop();
    let s = w
        .wait_regime(Regime::MetricsUnavailable, Duration::from_secs(30))
        .await;
    assert_eq!(condition(&s, "MetricsAvailable").unwrap().status, "False");
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        w.replicas().await,
        before,
        "replicas changed on missing metrics"
    );
    assert!(w.replicas().await > 0);
    w.prom.start_again().unwrap();
    w.wait_for(
        Duration::from_secs(40),
        "metrics available again",
        || async {
            let s = w.status().await;
            (s.regime != Some(Regime::MetricsUnavailable)
                && condition(&s, "MetricsAvailable").is_some_and(|c| c.status == "True"))
            .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn dry_run_reports_decisions_and_never_scales() {
    let _serial = serial().await;
    let mut w = World::builder("dryrun").replicas(2).pods(2).start().await;
    w.fleet.set(backlog);
    w.apply(json!({"mode": "DryRun"})).await;
    w.start_operator().await;
    let s = w
        .wait_regime(Regime::Backlogged, Duration::from_secs(40))
        .await;
    let d = w
        .wait_for(Duration::from_secs(20), "a dry-run decision", || async {
            let s = w.status().await;
            s.last_decision
                .filter(|d| d.dry_run == Some(true) && d.to > d.from)
        })
        .await;
    assert!(s.replicas.as_ref().unwrap().desired > 2 || d.to > 2);
    assert_eq!(s.dry_run_by.as_deref(), Some("spec.mode"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(w.replicas().await, 2, "DryRun wrote to the target");
    assert!(
        !w.scene.events().await.is_empty(),
        "DryRun publishes its decisions as events"
    );
}

#[tokio::test]
async fn config_reaches_every_ready_pod_and_follows_spec_changes() {
    let _serial = serial().await;
    let mut w = World::builder("config").replicas(3).pods(3).start().await;
    w.apply(json!({"worker": {"setPoint": 0.05, "maxPermits": 8}}))
        .await;
    w.start_operator().await;
    let s = w
        .wait_for(Duration::from_secs(40), "3 pods in sync", || async {
            let s = w.status().await;
            s.config
                .as_ref()
                .is_some_and(|c| c.pods_in_sync == 3 && c.pods_total == 3)
                .then_some(s)
        })
        .await;
    let hash = s.config.unwrap().hash;
    for p in &w.pods {
        assert_eq!(p.running().hash, hash, "pod {} runs another config", p.name);
        assert_eq!(p.running().max_permits, 8);
    }
    let cms: Api<ConfigMap> = Api::namespaced(w.scene.client.clone(), &w.scene.ns);
    // The file carries the document without its hash (every worker version computes it); its
    // content hashes to the status's hash.
    let cm = cms.get("w-worker-config").await.unwrap();
    let file = WorkerConfig::parse(cm.data.unwrap()["worker-config.json"].as_bytes()).unwrap();
    assert_eq!(
        (file.hash.as_str(), file.compute_hash()),
        ("", hash.clone())
    );

    // A set point change reaches every pod and the ConfigMap.
    w.apply(json!({"worker": {"setPoint": 0.1}})).await;
    w.wait_for(
        Duration::from_secs(40),
        "set point 0.1 on every pod",
        || async {
            w.pods
                .iter()
                .all(|p| (p.running().set_point - 0.1).abs() < 1e-9)
                .then_some(())
        },
    )
    .await;
    let s = w
        .wait_for(
            Duration::from_secs(20),
            "status in sync with the new hash",
            || async {
                let s = w.status().await;
                s.config
                    .as_ref()
                    .is_some_and(|c| c.pods_in_sync == 3 && c.hash != hash)
                    .then_some(s)
            },
        )
        .await;
    let new_hash = s.config.unwrap().hash;
    assert!(w.pods.iter().all(|p| p.running().hash == new_hash));
    let cm = cms.get("w-worker-config").await.unwrap();
    let file = WorkerConfig::parse(cm.data.unwrap()["worker-config.json"].as_bytes()).unwrap();
    assert_eq!(file.compute_hash(), new_hash);

    // Deleted and recreated (status gone, pods still running the old object's config): the
    // new object's config still reaches every pod, which refuse a generation older than theirs.
    let old_generation = w.pods[0].running().generation;
    w.wbps()
        .delete("w", &DeleteParams::default())
        .await
        .unwrap();
    w.wait_for(Duration::from_secs(20), "the object gone", || async {
        w.wbps().get_opt("w").await.unwrap().is_none().then_some(())
    })
    .await;
    w.apply(json!({"worker": {"setPoint": 0.07, "maxPermits": 8}}))
        .await;
    w.wait_for(
        Duration::from_secs(40),
        "the recreated object's set point 0.07 on every pod",
        || async {
            w.pods
                .iter()
                .all(|p| (p.running().set_point - 0.07).abs() < 1e-9)
                .then_some(())
        },
    )
    .await;
    assert!(
        w.pods
            .iter()
            .all(|p| p.running().generation > old_generation)
    );
}

#[tokio::test]
async fn a_no_op_reconcile_writes_nothing() {
    let _serial = serial().await;
    let mut w = World::builder("noop").replicas(2).pods(2).start().await;
    w.fleet.set(|k| {
        k.queue_age = 2.0;
        k.queue_depth = 5.0;
        k.arrival_rate = 10.0;
        k.completion_rate = 10.0;
    });
    w.apply(json!({})).await;
    w.start_operator().await;
    let user = operator_user();
    w.wait_for(Duration::from_secs(40), "settled status", || async {
        let s = w.status().await;
        (s.regime == Some(Regime::Healthy)
            && s.config.as_ref().is_some_and(|c| c.pods_in_sync == 2)
            && condition(&s, "MetricsAvailable").is_some_and(|c| c.status == "True"))
        .then_some(())
    })
    .await;
    // Let rates settle, then count the operator's writes over several reconcile intervals.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let before = w.scene.env.audit_writes_by(&user).len();
    let rv_before = w.wbps().get("w").await.unwrap().metadata.resource_version;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let writes = w.scene.env.audit_writes_by(&user);
    let new: Vec<String> = writes[before..]
        .iter()
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect();
    assert!(
        new.is_empty(),
        "a steady state made {} writes: {new:?}",
        new.len()
    );
    let rv_after = w.wbps().get("w").await.unwrap().metadata.resource_version;
    assert_eq!(rv_before, rv_after, "the object changed");
    // It did reconcile meanwhile (the counter moved), it just had nothing to write.
    let metrics = w.operator().scrape();
    assert!(
        metrics.contains("backpressure_operator_reconciles_total{result=\"success\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_operator_role_cannot_touch_what_it_does_not_need() {
    let _serial = serial().await;
    let env = TestEnv::shared();
    let _ = operator_kubeconfig(env).await;
    let as_operator = env.client_as(&operator_user(), &[]).unwrap();
    let ns = env.namespace("rbac").await.unwrap();
    // Creating Deployments, deleting pods or reading Secrets cluster-wide in other ways is not
    // part of its job (it may get Secrets for Prometheus credentials, but not list them).
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(as_operator.clone(), &ns);
    let d: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
        "metadata": {"name": "x"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}
    }))
    .unwrap();
    let err = deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err:?}"
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(as_operator.clone(), &ns);
    let err = secrets.list(&ListParams::default()).await.unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err:?}"
    );
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(as_operator, &ns);
    let err = pods
        .delete("any", &DeleteParams::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err:?}"
    );
}

/// Issue 15, point 5: in Active mode, an HPA that scales the same Deployment is found from the
/// operator's watch (no list per reconcile) and reported: `Ready` False naming it, decisions as
/// in DryRun, no `/scale` write, so the two never fight over the replicas. Once it is deleted,
/// the operator scales.
#[tokio::test]
async fn an_hpa_on_the_same_target_is_reported_and_not_fought() {
    let _serial = serial().await;
    let mut w = World::builder("conflict").replicas(2).pods(2).start().await;
    let hpas: Api<kube::api::DynamicObject> = Api::namespaced_with(
        w.scene.client.clone(),
        &w.scene.ns,
        &backpressure_operator::act::guard::api_resource(
            backpressure_api::v1alpha1::GuardKind::HorizontalPodAutoscaler,
        ),
    );
    let hpa: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "w-cpu"},
        "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "w"},
                 "minReplicas": 1, "maxReplicas": 10},
    }))
    .unwrap();
    hpas.create(&PostParams::default(), &hpa).await.unwrap();
    w.fleet.set(backlog);
    w.apply(json!({})).await;
    w.start_operator().await;

    let s = w
        .wait_status(
            Duration::from_secs(40),
            "Ready False, AutoscalerConflict",
            |s| condition(s, "Ready").is_some_and(|c| c.reason == "AutoscalerConflict"),
        )
        .await;
    let ready = condition(&s, "Ready").unwrap();
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains("HorizontalPodAutoscaler/w-cpu")
            && ready.message.contains("Deployment/w"),
        "{ready:?}"
    );
    // The backlog asks for more replicas: decided, reported, not applied.
    let s = w
        .wait_status(
            Duration::from_secs(30),
            "a scale-out decided in DryRun",
            |s| {
                s.last_decision
                    .as_ref()
                    .is_some_and(|d| d.action == Action::ScaleOut && d.dry_run == Some(true))
            },
        )
        .await;
    assert!(
        s.dry_run_by
            .as_deref()
            .is_some_and(|b| b.contains("HorizontalPodAutoscaler/w-cpu")),
        "{s:?}"
    );
    assert_eq!(w.replicas().await, 2);
    assert!(w.scale_writes().is_empty(), "{:?}", w.scale_writes());
    w.wait_event("AutoscalerConflict", Duration::from_secs(20))
        .await;

    // The HPA gone, the operator scales out for the backlog.
    hpas.delete("w-cpu", &DeleteParams::default())
        .await
        .unwrap();
    w.wait_for(
        Duration::from_secs(60),
        "scale-out once the HPA is gone",
        || async { (w.replicas().await > 2).then_some(()) },
    )
    .await;
    // The status follows the /scale write (its own patch, after it): wait for it rather than
    // read it once (a single read raced it in a CI run).
    w.wait_status(Duration::from_secs(20), "Ready once the HPA is gone", |s| {
        s.dry_run_by.is_none() && condition(s, "Ready").map(|c| c.status.as_str()) == Some("True")
    })
    .await;
}
