//! The admin config endpoint against a real kube-apiserver (started by `backpressure-envtest`):
//! real ServiceAccount tokens from the TokenRequest API, verified by the worker with a real
//! TokenReview.
#![cfg(feature = "kube")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use backpressure_api::wire::{
    CONFIG_PATH, ConfigAck, GateState, PRODUCER_PATH, ProducerConfig, TOKEN_AUDIENCE, WorkerConfig,
    push_audience,
};
use backpressure_envtest::TestEnv;
use backpressure_worker::config::ConfigState;
use backpressure_worker::config::admin::{Admin, FailureLimit};
use backpressure_worker::config::token::{TokenReviewVerifier, service_account_username};
use backpressure_worker::metrics::Metrics;
use backpressure_worker::producer::ProducerGate;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn service_account(api: &Api<ServiceAccount>, name: &str) {
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    api.create(&PostParams::default(), &sa).await.unwrap();
}

async fn token(api: &Api<ServiceAccount>, name: &str, audience: &str) -> String {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_owned()],
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let answer = api
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap();
    answer.status.expect("token request status").token
}

/// Sends one `PUT` [`CONFIG_PATH`] and returns the status code and body.
async fn put(addr: SocketAddr, token: Option<&str>, body: &str) -> (u16, String) {
    put_to(addr, CONFIG_PATH, token, body).await
}

/// Sends one HTTP/1.1 `PUT path` and returns the status code and body.
async fn put_to(addr: SocketAddr, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "PUT {path} HTTP/1.1\r\nHost: worker\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
        .await
        .expect("answer in time")
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_are_authenticated_with_token_review() {
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    let ns = env.namespace("worker-config").await.unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    service_account(&sas, "backpressure-operator").await;
    service_account(&sas, "intruder").await;
    // The worker is the workload `export-worker` of `ns`: it accepts only its own audience.
    let ours = push_audience(&ns, "export-worker");
    let operator_token = token(&sas, "backpressure-operator", &ours).await;
    let intruder_token = token(&sas, "intruder", &ours).await;
    let wrong_audience = token(&sas, "backpressure-operator", "some-other-service").await;
    // The operator's tokens for other targets, and for the old shared audience.
    let shared_audience = token(&sas, "backpressure-operator", TOKEN_AUDIENCE).await;
    let other_workload = token(
        &sas,
        "backpressure-operator",
        &push_audience(&ns, "other-worker"),
    )
    .await;
    let other_namespace = token(
        &sas,
        "backpressure-operator",
        &push_audience("elsewhere", "export-worker"),
    )
    .await;

    // The worker, with its admin server on loopback.
    let metrics = Metrics::new("export-worker");
    let gate = common::running_gate(&metrics);
    let state = ConfigState::new(gate.clone(), WorkerConfig::default(), Some(metrics.clone()));
    let admin = Admin::new(state.clone(), Some(metrics))
        .with_verifier(
            Arc::new(TokenReviewVerifier::new(
                client.clone(),
                &ns,
                "export-worker",
            )),
            [service_account_username(&ns, "backpressure-operator")],
        )
        // This test counts answers, not sources: no throttling of its dozen refusals.
        .with_failure_limit(FailureLimit {
            burst: 1000,
            refill: Duration::from_secs(1),
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::new(admin).serve(listener, std::future::pending()));

    let initial = state.ack();
    let next = WorkerConfig {
        generation: 2,
        max_permits: 5,
        ..WorkerConfig::default()
    }
    .with_hash();
    let payload = serde_json::to_string(&next).unwrap();

    let refusals: [(&str, Option<&str>, &str, u16); 7] = [
        ("the shared audience", Some(&shared_audience), &payload, 401),
        (
            "another workload's audience",
            Some(&other_workload),
            &payload,
            401,
        ),
        (
            "another namespace's audience",
            Some(&other_namespace),
            &payload,
            401,
        ),
        (
            "another ServiceAccount",
            Some(&intruder_token),
            &payload,
            403,
        ),
        ("wrong audience", Some(&wrong_audience), &payload, 401),
        ("no token", None, &payload, 401),
        (
            "malformed payload",
            Some(&operator_token),
            "{\"version\":",
            400,
        ),
    ];
    for (case, token, body, want) in refusals {
        let (status, text) = put(addr, token, body).await;
        assert_eq!(status, want, "{case}: {text}");
        assert!(text.contains("error"), "{case}: {text}");
        assert_eq!(state.ack(), initial, "{case} changed the running config");
        assert_eq!(gate.snapshot().limit, 16, "{case} changed the gate");
    }

    let (status, text) = put(addr, Some(&operator_token), &payload).await;
    assert_eq!(status, 200, "allowed ServiceAccount: {text}");
    let ack: ConfigAck = serde_json::from_str(&text).unwrap();
    assert_eq!(
        ack,
        ConfigAck {
            hash: next.hash.clone(),
            generation: 2
        }
    );
    assert_eq!(state.ack(), ack);
    assert_eq!(gate.snapshot().limit, 5);

    // After a successful push, refused pushes still change nothing.
    let newer = serde_json::to_string(
        &WorkerConfig {
            generation: 3,
            max_permits: 9,
            ..WorkerConfig::default()
        }
        .with_hash(),
    )
    .unwrap();
    for (case, token, want) in [
        ("another ServiceAccount", Some(intruder_token.as_str()), 403),
        (
            "another workload's audience",
            Some(other_workload.as_str()),
            401,
        ),
        ("wrong audience", Some(wrong_audience.as_str()), 401),
        ("no token", None, 401),
    ] {
        let (status, text) = put(addr, token, &newer).await;
        assert_eq!(status, want, "{case}: {text}");
        assert_eq!(state.ack(), ack, "{case} changed the running config");
        assert_eq!(gate.snapshot().limit, 5);
    }
    // A garbage token is not authenticated either.
    let (status, _) = put(addr, Some("not-a-jwt"), &newer).await;
    assert_eq!(status, 401);
    assert_eq!(state.ack(), ack);
}

/// Issue 17: a producer pod checks pushes of the producer state with a TokenReview for its own
/// audience, the producer workload's: the operator's token for the workers of the same queue
/// is worth nothing there, and another ServiceAccount's token for the right audience neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_pushes_are_authenticated_for_the_producer_workload_audience() {
    let env = TestEnv::shared();
    let client = env.client().unwrap();
    let ns = env.namespace("producer-state").await.unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    service_account(&sas, "backpressure-operator").await;
    service_account(&sas, "intruder").await;
    let ours = push_audience(&ns, "orders-api");
    let operator_token = token(&sas, "backpressure-operator", &ours).await;
    let intruder_token = token(&sas, "intruder", &ours).await;
    let worker_token = token(
        &sas,
        "backpressure-operator",
        &push_audience(&ns, "export-worker"),
    )
    .await;

    // A producer-only pod: the gate, no worker config.
    let metrics = Metrics::producer("orders-api");
    let gate = ProducerGate::new(Some(metrics.clone()));
    let admin = Admin::for_producer(gate.clone(), Some(metrics))
        .with_verifier(
            Arc::new(TokenReviewVerifier::new(client.clone(), &ns, "orders-api")),
            [service_account_username(&ns, "backpressure-operator")],
        )
        .with_failure_limit(FailureLimit {
            burst: 1000,
            refill: Duration::from_secs(1),
        });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::new(admin).serve(listener, std::future::pending()));

    let paused = ProducerConfig {
        generation: 2,
        state: GateState::Paused,
        ..ProducerConfig::default()
    }
    .with_hash();
    let payload = serde_json::to_string(&paused).unwrap();
    let initial = gate.ack();
    for (case, token, want) in [
        ("the workers' audience", Some(worker_token.as_str()), 401),
        ("another ServiceAccount", Some(intruder_token.as_str()), 403),
        ("no token", None, 401),
        ("not a JWT", Some("not-a-jwt"), 401),
    ] {
        let (status, text) = put_to(addr, PRODUCER_PATH, token, &payload).await;
        assert_eq!(status, want, "{case}: {text}");
        assert_eq!(gate.ack(), initial, "{case} changed the producer state");
        assert_eq!(gate.state(), GateState::Open);
    }
    // Not a worker: the worker config is not served at all.
    let (status, _) = put(addr, Some(&operator_token), "{}").await;
    assert_eq!(status, 404);
    let (status, text) = put_to(addr, PRODUCER_PATH, Some(&operator_token), &payload).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<ConfigAck>(&text).unwrap(),
        gate.ack()
    );
    assert_eq!(gate.state(), GateState::Paused);
}
