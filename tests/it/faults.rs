//! Faults under the real operator (issue 8), against real components: the real binary as its
//! own ServiceAccount with the chart's RBAC, a real kube-apiserver + etcd (restarted under the
//! operator in one test), a real Prometheus scraping a fake fleet (behind a fault-injecting
//! proxy in one test), real worker admin servers next to pods that refuse or hang.
//!
//! Each test fails when the behaviour breaks:
//! - the kube-apiserver restarts: the operator survives, its watches resume (a spec change made
//!   after the restart is acted on), and every scale write it made changed the replicas (no
//!   duplicate writes: the audit log's count equals the Deployment's generation changes);
//! - leader failover: the standby takes over within the lease duration and continues the ramp
//!   from status; only the leader acts;
//! - Prometheus slow, failing, NaN, empty, and stale: MetricsUnavailable with the fallback,
//!   never a scale towards zero (the test makes a misread zero visible), and recovery;
//! - a conflicting writer: followed, not fought; no flapping;
//! - pods that refuse or hang on config push: retried with backoff, counted out of sync, and a
//!   healthy object in another namespace keeps its pace.
//!
//! Like every test on the control plane they hold [`serial`] (one of them restarts the API
//! server under everyone).

use std::time::{Duration, Instant};

use backpressure_api::conditions as cond;
use backpressure_api::v1alpha1::{Regime, WorkerBackpressureStatus};
use backpressure_envtest::TestEnv;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use serde_json::json;

use crate::common::badpods::{self, Refusal};
use crate::common::fakeprom::{FakeProm, PromMode};
use crate::common::fleet::{backlog, failing, recovered, steady};
use crate::common::operator::OPERATOR_NAMESPACE;
use crate::common::pods;
use crate::common::scene::{Scene, condition, has_condition, tail, wait_for, zero_trap};
use crate::common::serial;
use crate::common::world::World;

/// No Prometheus listens here.
const NO_PROMETHEUS: &str = "http://127.0.0.1:9";

/// The value of the unlabelled sample `name` in a metrics exposition.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// kube-runtime backs off the controller's *merged* trigger stream on an error of any one
/// watch; with its default exponential backoff (30 s and more) a spec change made after a
/// restart went unseen for more than 90 s. The operator sets a short, capped
/// `Controller::trigger_backoff` (`controller::WatchBackoff`), and the change is acted on within
/// seconds.
#[tokio::test]
async fn kube_apiserver_restart_resumes_watches_without_duplicate_writes() {
    let _serial = serial().await;
    let mut w = World::builder("apirestart").replicas(2).start().await;
    w.fleet.set(backlog);
    w.apply(json!({"scaling": {"maxReplicas": 6}})).await;
    w.start_operator().await;

    // Scaled out to the maximum: 2 -> 4 -> 6.
    w.wait_for(Duration::from_secs(60), "replicas 6", || async {
        (w.scene.replicas("w").await == 6).then_some(())
    })
    .await;

    let env = w.scene.env;
    tokio::task::spawn_blocking(move || env.restart_apiserver(Duration::from_secs(3)))
        .await
        .unwrap()
        .expect("kube-apiserver restarts");
    assert!(
        w.operator_mut().process.is_running(),
        "the operator died with the API server:\n{}",
        tail(&w.operator().log(), 40)
    );

    // A change made after the restart reaches the operator only through a resumed watch (a
    // requeue alone would reconcile the cached, old spec).
    w.apply(json!({"scaling": {"maxReplicas": 10}})).await;
    let generation = w.scene.wbps().get("w").await.unwrap().metadata.generation;
    let restarted = Instant::now();
    let s = w
        .wait_status(
            Duration::from_secs(60),
            "the new spec acted on after the restart",
            |s| {
                s.observed_generation == generation
                    && s.replicas.as_ref().is_some_and(|r| r.current == 10)
            },
        )
        .await;
    eprintln!(
        "the spec change made after the restart was acted on within {:?}",
        restarted.elapsed()
    );
    assert_eq!(w.scene.replicas("w").await, 10, "{s:?}");

    // Settle, then compare the writes with what they changed: every scale write bumped the
    // Deployment's generation (created at 1), so no write was a duplicate.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes = w.scene.operator_scale_writes("w");
    let changes = w.scene.deployment_generation("w").await - 1;
    assert_eq!(
        writes as i64, changes,
        "{writes} scale writes for {changes} replica changes"
    );
    assert!(
        writes >= 4,
        "expected 2->4->6 and 6->8->10, saw {writes} writes"
    );
    assert!(w.operator_mut().process.is_running());
}

async fn lease_holder(client: &kube::Client, name: &str) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
}

#[tokio::test]
async fn leader_failover_takes_over_within_the_lease_and_continues_the_ramp() {
    let _serial = serial().await;
    // The chart's RBAC lets the operator touch only its own Lease.
    const LEASE: &str = "backpressure-operator-leader";
    const LEASE_SECONDS: u64 = 4;
    let mut w = World::builder("failover").replicas(4).start().await;
    w.fleet.set(failing);
    w.apply(json!({"scaling": {"rampUp": {"stages": [34, 67, 100], "dwell": "8s"}}}))
        .await;
    let flags = |who: &str| {
        vec![
            "--leader-elect=true".to_owned(),
            format!("--lease-name={LEASE}"),
            format!("--lease-duration={LEASE_SECONDS}s"),
            format!("--pod-name={who}"),
        ]
    };
    // Operator 0 is "a", operator 1 is "b".
    let prometheus = w.prom.url();
    for who in ["a", "b"] {
        let f = flags(who);
        w.start_operator_with(
            &prometheus,
            &f.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .await;
    }
    w.wait_status(Duration::from_secs(60), "regime DependencyFailing", |s| {
        s.regime == Some(Regime::DependencyFailing)
    })
    .await;
    let leader = lease_holder(&w.scene.client, LEASE)
        .await
        .expect("a Lease holder");
    let (lead, standby, standby_name) = if leader == "a" {
        (0, 1, "b")
    } else {
        (1, 0, "a")
    };
    // Only the leader acts: the standby reports itself as such and has not reconciled.
    let standby_metrics = w.operators[standby].scrape();
    assert_eq!(
        metric(&standby_metrics, "backpressure_operator_leader"),
        Some(0.0),
        "{standby_metrics}"
    );
    assert_eq!(
        metric(
            &standby_metrics,
            "backpressure_operator_reconciles_total{result=\"success\"}"
        ),
        Some(0.0),
        "the standby reconciled:\n{standby_metrics}"
    );
    assert_eq!(
        metric(&w.operators[lead].scrape(), "backpressure_operator_leader"),
        Some(1.0)
    );

    // Recovery starts a staged ramp; kill the leader at stage 1.
    w.fleet.set(recovered);
    let s1 = w
        .wait_status(Duration::from_secs(60), "ramp stage 1", |s| {
            s.ramp.as_ref().is_some_and(|r| r.stage == 1)
        })
        .await;
    let ramp = s1.ramp.clone().unwrap();
    w.operators[lead].kill();
    let killed = Instant::now();
    let killed_wall = k8s_openapi::jiff::Timestamp::now();
    w.wait_for(
        Duration::from_secs(LEASE_SECONDS + 10),
        "the standby to take the Lease",
        || async {
            (lease_holder(&w.scene.client, LEASE).await.as_deref() == Some(standby_name))
                .then_some(())
        },
    )
    .await;
    let took = killed.elapsed();
    eprintln!("{standby_name} took the Lease {took:?} after the leader was killed");
    // The Lease expires LEASE_SECONDS after the last renewal (at most a third of it before the
    // kill), and the standby tries every third of it.
    assert!(
        took <= Duration::from_secs(LEASE_SECONDS) + Duration::from_secs(3),
        "takeover took {took:?} with a {LEASE_SECONDS}s lease"
    );

    // The ramp continues from status: same origin, the next stage, never restarted.
    let s2 = w
        .wait_status(
            Duration::from_secs(60),
            "ramp stage 2 under the new leader",
            |s| s.ramp.as_ref().is_some_and(|r| r.stage >= 2),
        )
        .await;
    let resumed = s2.ramp.clone().unwrap();
    assert_eq!(
        resumed.from, ramp.from,
        "the ramp restarted: {resumed:?} vs {ramp:?}"
    );
    assert!(resumed.to <= ramp.to, "{resumed:?} vs {ramp:?}");
    assert!(
        resumed.stage_started_at.as_ref().unwrap().0 > ramp.stage_started_at.as_ref().unwrap().0,
        "stage 2 did not start after stage 1"
    );
    assert_eq!(
        metric(
            &w.operators[standby].scrape(),
            "backpressure_operator_leader"
        ),
        Some(1.0)
    );

    // Events name their reporter: the new leader published nothing before the kill.
    for e in w.scene.events().await {
        if e.reporting_instance.as_deref() == Some(standby_name) {
            let at = e
                .event_time
                .as_ref()
                .map(|t| t.0)
                .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
                .unwrap();
            assert!(
                at.as_second() >= killed_wall.as_second() - 1,
                "{standby_name} published {:?} at {at} before the leader was killed at {killed_wall}",
                e.reason
            );
        }
    }
}

#[tokio::test]
async fn prometheus_slow_failing_nan_empty_or_stale_means_unavailable_never_zero() {
    let _serial = serial().await;
    let mut w = World::builder("promfaults").replicas(3).start().await;
    w.fleet.set(|k| {
        steady(k);
        // For the stale case at the end (see FleetKnobs::frozen_at_ms).
        k.explicit_timestamps = true;
    });
    let proxy = FakeProm::start(&w.prom.url(), &[(&w.scene.ns, "w")]);
    // A missing value misread as zero would take the fleet to zero within seconds.
    w.scene.apply_w("w", &proxy.url(), zero_trap()).await;
    w.start_operator_with(NO_PROMETHEUS, &[]).await;
    let available = |s: &WorkerBackpressureStatus| {
        has_condition(s, cond::METRICS_AVAILABLE, "True")
            && s.regime.is_some_and(|r| r != Regime::MetricsUnavailable)
    };
    w.wait_status(Duration::from_secs(60), "metrics available", available)
        .await;
    assert_eq!(w.scene.replicas("w").await, 3);

    let cases: Vec<(&str, PromMode, &str)> = vec![
        ("slow", PromMode::Delay(Duration::from_secs(4)), "timed out"),
        ("HTTP 503", PromMode::Status(503), "query failed"),
        ("HTTP 500", PromMode::Status(500), "query failed"),
        ("NaN", PromMode::Nan, "unknown"),
        ("empty", PromMode::Empty, "unknown"),
    ];
    for (name, mode, says) in cases {
        let queries = proxy.queries();
        proxy.set(mode);
        let s = w
            .wait_status(
                Duration::from_secs(30),
                &format!("MetricsUnavailable on {name}"),
                |s| {
                    s.regime == Some(Regime::MetricsUnavailable)
                        && has_condition(s, cond::METRICS_AVAILABLE, "False")
                },
            )
            .await;
        let c = condition(&s, cond::METRICS_AVAILABLE).unwrap();
        assert!(
            c.message.contains(says),
            "{name}: the condition should say {says:?}: {}",
            c.message
        );
        assert!(
            proxy.queries() > queries,
            "{name}: the fault was never queried"
        );
        // The fallback (Hold) keeps the replicas; nothing moves towards zero.
        for _ in 0..12 {
            assert_eq!(w.scene.replicas("w").await, 3, "{name}: replicas changed");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        proxy.set(PromMode::Pass);
        w.wait_status(
            Duration::from_secs(30),
            &format!("recovery after {name}"),
            available,
        )
        .await;
        assert_eq!(
            w.scene.replicas("w").await,
            3,
            "{name}: replicas changed on recovery"
        );
    }

    // Stale samples from the real Prometheus: the exporter freezes with explicit timestamps,
    // so Prometheus keeps answering with the old samples (no staleness marker) and only their
    // age tells that they are stale.
    let frozen = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    w.fleet.set(|k| k.frozen_at_ms = Some(frozen));
    let s = w
        .wait_status(
            Duration::from_secs(40),
            "MetricsUnavailable on stale samples",
            |s| s.regime == Some(Regime::MetricsUnavailable),
        )
        .await;
    let c = condition(&s, cond::METRICS_AVAILABLE).unwrap();
    assert!(
        c.message.contains("fleet backoff"),
        "the stale backoff is unknown: {}",
        c.message
    );
    let still_there = w.prom.query("backpressure_backoff_factor").unwrap();
    assert!(
        still_there["data"]["result"]
            .as_array()
            .is_some_and(|r| !r.is_empty()),
        "Prometheus should still return the stale sample: {still_there}"
    );
    for _ in 0..12 {
        assert_eq!(w.scene.replicas("w").await, 3, "stale: replicas changed");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    w.fleet.set(|k| k.frozen_at_ms = None);
    w.wait_status(
        Duration::from_secs(40),
        "recovery after stale samples",
        available,
    )
    .await;
    assert_eq!(w.scene.replicas("w").await, 3);
}

#[tokio::test]
async fn a_conflicting_writer_is_followed_not_fought() {
    let _serial = serial().await;
    let mut w = World::builder("conflict").replicas(3).start().await;
    w.fleet.set(steady);
    w.apply(json!({})).await;
    w.start_operator().await;
    w.wait_status(Duration::from_secs(60), "Healthy with metrics", |s| {
        s.regime == Some(Regime::Healthy) && has_condition(s, cond::METRICS_AVAILABLE, "True")
    })
    .await;
    assert_eq!(w.scene.operator_scale_writes("w"), 0);

    // A human scales to 7 while the queue is at its target age: the operator takes the new
    // size as the current one and has no reason to undo it.
    w.scene.kubectl_scale("w", 7).await;
    w.wait_status(Duration::from_secs(20), "status.replicas.current 7", |s| {
        s.replicas.as_ref().is_some_and(|r| r.current == 7)
    })
    .await;
    for _ in 0..32 {
        assert_eq!(
            w.scene.replicas("w").await,
            7,
            "the operator undid the change"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        w.scene.operator_scale_writes("w"),
        0,
        "the operator wrote /scale in a steady state"
    );

    // Now the operator has an opinion (backlog, at most 5): it scales down to 5. A human
    // scales to 2; the operator returns to 5 in step-limited writes, monotonically, records
    // the human's value as its starting point, and then stays put.
    w.fleet.set(backlog);
    w.apply(json!({"scaling": {"maxReplicas": 5}})).await;
    w.wait_for(Duration::from_secs(40), "replicas 5", || async {
        (w.scene.replicas("w").await == 5).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let before = w.scene.operator_scale_writes("w");
    w.scene.kubectl_scale("w", 2).await;
    let mut seen = vec![2];
    let mut decisions = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    while *seen.last().unwrap() != 5 {
        assert!(
            Instant::now() < deadline,
            "did not return to 5: {seen:?}\n{}",
            w.diag().await
        );
        let r = w.scene.replicas("w").await;
        if seen.last() != Some(&r) {
            seen.push(r);
        }
        if let Some(d) = w.scene.status("w").await.last_decision
            && decisions.last() != Some(&(d.from, d.to))
        {
            decisions.push((d.from, d.to));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        seen.windows(2).all(|p| p[1] > p[0]),
        "replicas flapped after the external change: {seen:?}"
    );
    assert!(
        decisions.iter().any(|(from, _)| *from == 2),
        "no decision started from the externally set 2 replicas: {decisions:?}"
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    let after = w.scene.operator_scale_writes("w");
    assert!(
        after - before <= 3,
        "{} scale writes to return from 2 to 5 (step limit 2 pods): flapping",
        after - before
    );
    assert_eq!(w.scene.replicas("w").await, 5);
    assert_eq!(after, w.scene.operator_scale_writes("w"));
}

#[tokio::test]
async fn pods_that_refuse_or_hang_are_retried_with_backoff_and_block_nobody() {
    let _serial = serial().await;
    let env = TestEnv::shared();
    // Namespace A: one good pod, one answering 500, one 403, one never answering.
    let a = Scene::new("pushfail").await;
    a.deployment("w", 4).await;
    let good = pods::start(env, &a.ns, "w", 0).await;
    let bad = vec![
        badpods::start(&a.client, &a.ns, "w", "w-500", Refusal::Status(500)).await,
        badpods::start(&a.client, &a.ns, "w", "w-403", Refusal::Status(403)).await,
        badpods::start(&a.client, &a.ns, "w", "w-hang", Refusal::Hang).await,
    ];
    a.apply_w("w", NO_PROMETHEUS, json!({"worker": {"maxPermits": 7}}))
        .await;
    // Namespace B: a healthy workload with one good pod and live metrics.
    let mut b = World::builder("pushok").replicas(2).pods(1).start().await;
    b.fleet.set(steady);
    b.apply(json!({})).await;
    b.start_operator_with(NO_PROMETHEUS, &[]).await;
    let b_pod = &b.pods[0];

    let diag_a = || async {
        format!(
            "A status: {}\n{}",
            serde_json::to_string_pretty(&a.status("w").await).unwrap_or_default(),
            tail(&b.operator().log(), 40)
        )
    };
    let s = wait_for(
        Duration::from_secs(60),
        "A: 1 of 4 pods in sync, ConfigInSync=False",
        diag_a,
        || async {
            let s = a.status("w").await;
            (s.config
                .as_ref()
                .is_some_and(|c| c.pods_in_sync == 1 && c.pods_total == 4)
                && has_condition(&s, cond::CONFIG_IN_SYNC, "False"))
            .then_some(s)
        },
    )
    .await;
    assert_eq!(good.running().max_permits, 7, "the good pod got the config");
    let c = condition(&s, cond::CONFIG_IN_SYNC).unwrap();
    assert!(
        c.message.contains('1') && c.message.contains('4'),
        "{}",
        c.message
    );
    // Events are published right after the status write: wait for it rather than race it.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while a.events_of("w", "ConfigPushFailed").await.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no ConfigPushFailed event"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // B keeps its pace meanwhile: its pod is in sync, and a dependency failure is seen and
    // held as fast as without the bad pods next door.
    b.wait_status(Duration::from_secs(30), "B in sync and healthy", |s| {
        s.config.as_ref().is_some_and(|c| c.pods_in_sync == 1) && s.regime == Some(Regime::Healthy)
    })
    .await;
    assert_eq!(
        b_pod.running().hash,
        b.scene.status("w").await.config.unwrap().hash
    );
    let flipped = Instant::now();
    b.fleet.set(failing);
    b.wait_status(Duration::from_secs(20), "B held", |s| {
        s.regime == Some(Regime::DependencyFailing)
    })
    .await;
    let reaction = flipped.elapsed();
    eprintln!("B held {reaction:?} after its dependency failed");
    // Scrape (1 s) + rate window + hold.for (2 s) + a reconcile (1 s): a few seconds; a
    // reconcile stuck behind A's hanging pod would add its 2 s push timeout per attempt.
    assert!(
        reaction < Duration::from_secs(15),
        "B reacted after {reaction:?}"
    );

    // Backoff: with a 1 s requeue, an unbacked-off retry would push ~25 times in 25 s.
    tokio::time::sleep(Duration::from_secs(20)).await;
    for p in &bad {
        let times = p.push_times();
        assert!(
            times.len() >= 2,
            "{}: not retried ({} pushes)",
            p.name,
            times.len()
        );
        assert!(
            times.len() <= 7,
            "{}: {} pushes, no backoff",
            p.name,
            times.len()
        );
        let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
        eprintln!("{}: {} pushes, gaps {gaps:?}", p.name, times.len());
        assert!(
            gaps.last().unwrap() >= gaps.first().unwrap(),
            "{}: the retry gaps do not grow: {gaps:?}",
            p.name
        );
        if gaps.len() >= 3 {
            assert!(
                *gaps.last().unwrap() >= Duration::from_secs(4),
                "{}: gaps {gaps:?}",
                p.name
            );
        }
    }
    let s = a.status("w").await;
    assert_eq!(s.config.as_ref().map(|c| c.pods_in_sync), Some(1), "{s:?}");
}

/// An exporter of one gauge, `custom_fleet_backoff{workload="w"} 0`, every sample with an
/// explicit timestamp (now): Prometheus leaves such series out of its staleness tracking, so
/// once the exporter is no longer scraped it keeps answering with the last sample until its
/// lookback window (5 minutes) ends. Returns the scrape target.
fn timestamped_exporter(namespace: &str) -> backpressure_envtest::ScrapeTarget {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 2048];
            let _ = conn.read(&mut buf);
            let now_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond();
            let body = format!(
                "# TYPE custom_fleet_backoff gauge\ncustom_fleet_backoff{{workload=\"w\"}} 0 {now_ms}\n"
            );
            let _ = write!(
                conn,
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    backpressure_envtest::ScrapeTarget {
        address,
        labels: std::collections::BTreeMap::from([("namespace".to_owned(), namespace.to_owned())]),
    }
}

/// `staleAfter` applies to a query override as to the default queries: the object reads its
/// fleet backoff from a custom exporter's series (`spec.metrics.queries.backoff`); the
/// exporter stops being scraped, Prometheus goes on answering with its last sample (explicit
/// timestamps, no staleness marker), and after `staleAfter` (10 s) the object reports
/// MetricsUnavailable, keeps its replicas, and recovers once the exporter is scraped again.
///
/// Protection: `backpressure_core::freshness::with_freshness` (the override returns the
/// timestamps of the series it reads) and the fold in `observe::promql`.
#[tokio::test]
async fn a_custom_query_whose_series_stops_being_scraped_is_stale_after_stale_after() {
    let _serial = serial().await;
    let mut w = World::builder("customstale").replicas(3).start().await;
    w.fleet.set(steady);
    let custom = timestamped_exporter(&w.scene.ns);
    w.prom
        .set_targets(&[w.fleet.target(), custom.clone()])
        .unwrap();
    let query = "avg by (namespace, workload) (custom_fleet_backoff)";
    w.prom
        .wait_for_series(query, Duration::from_secs(30))
        .unwrap();
    w.apply(json!({"metrics": {"queries": {"backoff": query}}}))
        .await;
    w.start_operator().await;
    let available = |s: &WorkerBackpressureStatus| {
        has_condition(s, cond::METRICS_AVAILABLE, "True")
            && s.regime.is_some_and(|r| r != Regime::MetricsUnavailable)
    };
    w.wait_status(Duration::from_secs(60), "metrics available", available)
        .await;

    // The exporter is no longer scraped; the worker library's series stay fresh.
    w.prom.set_targets(&[w.fleet.target()]).unwrap();
    let dropped = Instant::now();
    let s = w
        .wait_status(
            Duration::from_secs(40),
            "MetricsUnavailable once the custom series is stale",
            |s| s.regime == Some(Regime::MetricsUnavailable),
        )
        .await;
    let c = condition(&s, cond::METRICS_AVAILABLE).unwrap();
    assert!(
        c.message.contains("fleet backoff"),
        "the stale backoff is unknown: {}",
        c.message
    );
    assert!(
        dropped.elapsed() >= Duration::from_secs(8),
        "unavailable after {:?}, before staleAfter (10 s) could have passed: something else \
         than staleness made it so",
        dropped.elapsed()
    );
    let still_there = w.prom.query(query).unwrap();
    assert!(
        still_there["data"]["result"]
            .as_array()
            .is_some_and(|r| !r.is_empty()),
        "Prometheus should still return the stale sample: {still_there}"
    );
    for _ in 0..8 {
        assert_eq!(w.scene.replicas("w").await, 3, "stale: replicas changed");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    w.prom.set_targets(&[w.fleet.target(), custom]).unwrap();
    w.wait_status(
        Duration::from_secs(40),
        "recovery once the custom series is scraped again",
        available,
    )
    .await;
    assert_eq!(w.scene.replicas("w").await, 3);
}
