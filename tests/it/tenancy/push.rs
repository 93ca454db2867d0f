//! Push tokens bound to their target (issue 12, attack 1): a tenant's pod receives the
//! operator's push token (a pod of the tenant's target is whatever the target's selector
//! matches, so the tenant decides who receives pushes) and replays it to another namespace's
//! worker to stop it. The token's audience names the tenant's own target
//! (`backpressure.dev/<namespace>/<workload>`), the victim's worker accepts only its own, so the
//! replay is refused (401) and changes nothing; legitimate pushes keep working, also across
//! token rotation.

use std::time::Duration;

use backpressure_api::conditions as cond;
use backpressure_api::wire::{self, BrakeConfig, CONFIG_PATH, WorkerConfig};
use base64::Engine as _;
use serde_json::json;

use crate::common::badpods::{self, Refusal};
use crate::common::operator::operator_user;
use crate::common::pods::{self, TlsFiles};
use crate::common::scene::{Scene, has_condition, spec, tail, wait_for};
use crate::common::serial;
use crate::common::tenant::Tenant;
use crate::common::world::World;

/// The `aud` claim of a JWT (decoded without verification: the test only reads it).
fn audiences(token: &str) -> Vec<String> {
    let payload = token.split('.').nth(1).unwrap_or_default();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    let claims: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    match &claims["aud"] {
        serde_json::Value::String(a) => vec![a.clone()],
        serde_json::Value::Array(all) => all
            .iter()
            .filter_map(|a| a.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// PUTs `config` to a worker's admin port with `token`; the status and body.
async fn replay(addr: std::net::SocketAddr, token: &str, config: &WorkerConfig) -> (u16, String) {
    let resp = reqwest::Client::new()
        .put(format!("http://{addr}{CONFIG_PATH}"))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(config).unwrap())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

/// The attack payloads: a full brake without expiry, with the largest generation (every later
/// legitimate push would be stale) and with a plausible one (the operator's clock).
fn stop_payloads() -> Vec<WorkerConfig> {
    let brake = |generation| {
        WorkerConfig {
            generation,
            brake: Some(BrakeConfig {
                min_backoff: 1.0,
                expires_at_unix: None,
            }),
            ..WorkerConfig::default()
        }
        .with_hash()
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    vec![brake(i64::MAX), brake(now_ms + 1000)]
}

#[tokio::test]
async fn a_push_token_captured_in_one_namespace_cannot_configure_another() {
    let _serial = serial().await;
    // The victim: namespace B, workload w with two real worker admin servers.
    let mut b = World::builder("victim").replicas(2).pods(2).start().await;
    b.apply(json!({"worker": {"maxPermits": 8}})).await;
    // The tenant: namespace A, whose pod of its own target keeps what it receives.
    let a = Scene::new("tenant-push").await;
    a.deployment("w", 1).await;
    let thief = badpods::start(&a.client, &a.ns, "w", "w-thief", Refusal::Status(500)).await;
    let tenant = Tenant::of(&a).await;
    tenant
        .apply("w", spec("w", "w", "http://127.0.0.1:9", json!({})))
        .await
        .unwrap();
    b.start_operator().await;

    let in_sync = |s: &backpressure_api::v1alpha1::WorkerBackpressureStatus| {
        s.config
            .as_ref()
            .is_some_and(|c| c.pods_in_sync == 2 && c.pods_total == 2)
            && has_condition(s, cond::CONFIG_IN_SYNC, "True")
    };
    let s = b
        .wait_status(Duration::from_secs(40), "B: 2 of 2 pods in sync", in_sync)
        .await;
    let b_hash = s.config.unwrap().hash;
    let diag = || async { tail(&b.operator().log(), 40) };
    let token = wait_for(
        Duration::from_secs(40),
        "the tenant's pod to receive a push token",
        diag,
        || async { thief.captured_tokens().first().cloned() },
    )
    .await;
    // The captured token names the tenant's target only.
    assert_eq!(audiences(&token), vec![wire::push_audience(&a.ns, "w")]);

    let before: Vec<_> = b
        .pods
        .iter()
        .map(|p| (p.running(), p.state.gate().snapshot().limit))
        .collect();
    for pod in &b.pods {
        for payload in stop_payloads() {
            let (status, text) = replay(pod.addr, &token, &payload).await;
            assert!(
                status == 401 || status == 403,
                "replay of A's token to {} (generation {}) answered {status}: {text}",
                pod.name,
                payload.generation
            );
        }
    }
    let after: Vec<_> = b
        .pods
        .iter()
        .map(|p| (p.running(), p.state.gate().snapshot().limit))
        .collect();
    assert_eq!(after, before, "the replay changed B's running config");
    assert!(b.pods.iter().all(|p| p.running().hash == b_hash));
    assert!(
        b.pods
            .iter()
            .all(|p| p.state.gate().snapshot().backoff == 0.0),
        "B's workers were braked"
    );

    // The operator's next legitimate push to B still succeeds.
    b.apply(json!({"worker": {"maxPermits": 8, "setPoint": 0.1}}))
        .await;
    let s = b
        .wait_status(
            Duration::from_secs(40),
            "B's new config on 2 of 2 pods, ConfigInSync",
            |s| in_sync(s) && s.config.as_ref().is_some_and(|c| c.hash != b_hash),
        )
        .await;
    let new_hash = s.config.unwrap().hash;
    for p in &b.pods {
        assert_eq!(p.running().hash, new_hash, "{}", p.name);
        assert!((p.running().set_point - 0.1).abs() < 1e-9);
    }
}

/// TokenRequests the operator made for `audience`'s ServiceAccount token so far (the audit
/// log names the subresource, not the audience: every request of the test's operator).
fn token_requests() -> usize {
    backpressure_envtest::TestEnv::shared()
        .audit_writes_by(&operator_user())
        .iter()
        .filter(|e| {
            e["objectRef"]["resource"] == "serviceaccounts"
                && e["objectRef"]["subresource"] == "token"
                && e["verb"] == "create"
        })
        .count()
}

#[tokio::test]
async fn legitimate_pushes_keep_working_across_token_rotation() {
    let _serial = serial().await;
    let mut w = World::builder("rotation").replicas(3).pods(3).start().await;
    w.apply(json!({"worker": {"setPoint": 0.05}})).await;
    let minted_before = token_requests();
    // Tokens are replaced after 2 s instead of 5 min.
    let url = w.prom.url();
    w.start_operator_with(&url, &["--push-token-renew=2s"])
        .await;
    let mut hash = String::new();
    for (round, set_point) in [0.05, 0.06, 0.07, 0.08].into_iter().enumerate() {
        if round > 0 {
            // Past the renewal age: the next push needs a new token.
            tokio::time::sleep(Duration::from_secs(3)).await;
            w.apply(json!({"worker": {"setPoint": set_point}})).await;
        }
        let previous = hash.clone();
        let s = w
            .wait_status(
                Duration::from_secs(40),
                &format!("round {round}: set point {set_point} on 3 of 3 pods, ConfigInSync"),
                |s| {
                    s.config.as_ref().is_some_and(|c| {
                        c.pods_in_sync == 3 && c.pods_total == 3 && c.hash != previous
                    }) && has_condition(s, cond::CONFIG_IN_SYNC, "True")
                },
            )
            .await;
        hash = s.config.unwrap().hash;
        for p in &w.pods {
            assert_eq!(p.running().hash, hash, "round {round}: {}", p.name);
            assert!((p.running().set_point - set_point).abs() < 1e-9);
        }
        let minted = token_requests() - minted_before;
        assert!(
            minted > round,
            "round {round}: {minted} tokens minted; the rotation did not happen"
        );
    }
    let log = w.operator().log();
    assert!(
        !log.contains("cannot mint the config push token"),
        "{}",
        tail(&log, 40)
    );
}

/// A CA for the workers' admin certificates, as cert-manager's issuer would be.
struct TestCa {
    pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    fn new() -> TestCa {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa {
            pem,
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A certificate for DNS name `name` signed by this CA.
    fn issue(&self, name: &str) -> TlsFiles {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .signed_by(&key, &self.issuer)
            .unwrap();
        TlsFiles {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// Pods that serve their admin port over HTTPS get the config over TLS, verified against the
/// operator's CA bundle and the workload's name; a pod with a certificate for another workload
/// (same CA) or from another CA is not pushed to (its token would go to an impostor).
#[tokio::test]
async fn https_workers_get_the_config_only_with_the_workloads_certificate() {
    let _serial = serial().await;
    let mut w = World::builder("tls").replicas(3).start().await;
    let env = w.scene.env;
    let ns = w.scene.ns.clone();
    let ca = TestCa::new();
    let ca_file = env
        .dir()
        .join(format!("push-ca-{}.pem", backpressure_envtest::unique()));
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let good = pods::start_tls(
        env,
        &ns,
        "w",
        0,
        &ca.issue(&wire::admin_server_name(&ns, "w")),
    )
    .await;
    let impostor = pods::start_tls(
        env,
        &ns,
        "w",
        1,
        &ca.issue(&wire::admin_server_name("elsewhere", "w")),
    )
    .await;
    let stranger = pods::start_tls(
        env,
        &ns,
        "w",
        2,
        &TestCa::new().issue(&wire::admin_server_name(&ns, "w")),
    )
    .await;
    w.apply(json!({"worker": {"maxPermits": 6}})).await;
    let url = w.prom.url();
    let flag = format!("--push-ca-file={}", ca_file.display());
    w.start_operator_with(&url, &[&flag]).await;

    let s = w
        .wait_status(
            Duration::from_secs(40),
            "1 of 3 pods in sync (the HTTPS pod with the right certificate)",
            |s| {
                s.config
                    .as_ref()
                    .is_some_and(|c| c.pods_in_sync == 1 && c.pods_total == 3)
                    && has_condition(s, cond::CONFIG_IN_SYNC, "False")
            },
        )
        .await;
    let hash = s.config.unwrap().hash;
    assert_eq!(good.running().hash, hash);
    assert_eq!(good.running().max_permits, 6);
    // The others never got a push: they run their initial config.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for p in [&impostor, &stranger] {
        assert_eq!(
            p.running(),
            WorkerConfig::default().with_hash(),
            "{}",
            p.name
        );
    }
    let events = w.scene.events_of("w", "ConfigPushFailed").await;
    let text: Vec<String> = events.iter().filter_map(|e| e.note.clone()).collect();
    assert!(text.iter().any(|t| t.contains("TLS handshake")), "{text:?}");
}
