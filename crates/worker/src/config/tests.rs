#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use backpressure_api::wire::{BrakeConfig, CONFIG_PATH, MAX_PAYLOAD_BYTES, WorkerConfig};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::admin::{Admin, FailureLimit};
use super::token::{Identity, TokenVerifier, VerifyError};
use super::*;
use crate::controller::{self, Algorithm, Nanos};

fn state() -> (ConfigState, Gate, Metrics) {
    let metrics = Metrics::new("w");
    let gate = Gate::builder(controller::build(Settings::steady(), 1))
        .metrics(metrics.clone())
        .build();
    let state = ConfigState::new(gate.clone(), WorkerConfig::default(), Some(metrics.clone()));
    (state, gate, metrics)
}

fn config(generation: i64, max_permits: u32) -> WorkerConfig {
    WorkerConfig {
        generation,
        max_permits,
        ..WorkerConfig::default()
    }
    .with_hash()
}

#[tokio::test]
async fn apply_updates_gate_and_metrics_and_refuses_stale_or_invalid() {
    let (state, gate, metrics) = state();
    assert_eq!(state.ack().hash, WorkerConfig::default().hash);
    let ack = state.apply(config(3, 4), Origin::Push).unwrap();
    assert_eq!(ack.generation, 3);
    assert_eq!(gate.snapshot().limit, 4);
    let text = metrics.encode();
    let info: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("backpressure_config_info{"))
        .collect();
    assert_eq!(info.len(), 1, "{text}");
    assert!(
        info[0].contains(&format!(r#"hash="{}""#, ack.hash)),
        "{text}"
    );
    assert!(info[0].contains(r#"algorithm="SetPoint""#), "{text}");
    assert!(info[0].ends_with(" 1"), "{text}");
    // Older generation: 409, nothing changes.
    let err = state.apply(config(2, 8), Origin::Push).unwrap_err();
    assert!(
        matches!(
            err,
            ApplyError::Stale {
                running: 3,
                given: 2
            }
        ),
        "{err}"
    );
    assert_eq!(gate.snapshot().limit, 4);
    // Invalid: nothing changes.
    let bad = WorkerConfig {
        set_point: 2.0,
        generation: 9,
        ..WorkerConfig::default()
    };
    assert!(matches!(
        state.apply(bad, Origin::Push),
        Err(ApplyError::Invalid(_))
    ));
    assert!(state.apply_bytes(b"{", Origin::Push).is_err());
    assert_eq!(state.ack(), ack);
    assert_eq!(state.origin(), Origin::Push);
    // The same payload again is accepted and changes nothing.
    assert_eq!(state.apply(config(3, 4), Origin::File).unwrap(), ack);
    assert_eq!(state.origin(), Origin::Push);
    // Brake and algorithm reach the gate; an empty hash is filled in.
    let braked = WorkerConfig {
        generation: 4,
        algorithm: Algorithm::Fixed,
        brake: Some(BrakeConfig {
            min_backoff: 0.5,
            expires_at_unix: None,
        }),
        hash: String::new(),
        ..WorkerConfig::default()
    };
    let ack = state.apply(braked, Origin::Push).unwrap();
    assert_eq!(ack.hash.len(), 12);
    assert_eq!(gate.settings().algorithm, Algorithm::Fixed);
    assert_eq!(gate.snapshot().limit, 8);
    assert_eq!(gate.snapshot().backoff, 0.5);
}

#[tokio::test]
async fn library_knobs_survive_a_push() {
    let gate = Gate::new(controller::build(
        controller::Settings {
            credit: 0.25,
            health_check_probes: true,
            ..Settings::steady()
        },
        1,
    ));
    let state = ConfigState::new(gate.clone(), WorkerConfig::default(), None);
    state.apply(config(1, 5), Origin::Push).unwrap();
    let s = gate.settings();
    assert_eq!(
        (s.max_permits, s.credit, s.health_check_probes),
        (5, 0.25, true)
    );
}

async fn wait_for(state: &ConfigState, generation: i64) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while state.ack().generation != generation {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("generation {generation} not applied: {:?}", state.ack()));
}

fn spawn_watcher(state: &ConfigState, path: &Path) -> tokio::sync::oneshot::Sender<()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let watcher = FileWatcher::new(state.clone(), path);
    tokio::spawn(watcher.run(Duration::from_millis(20), async move {
        let _ = rx.await;
    }));
    tx
}

#[tokio::test]
async fn file_rewritten_in_place_is_hot_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(backpressure_api::wire::CONFIG_FILE_NAME);
    let (state, gate, _) = state();
    let _stop = spawn_watcher(&state, &path);
    // Not there yet: waited for.
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(state.origin(), Origin::Initial);
    std::fs::write(&path, serde_json::to_vec(&config(1, 3)).unwrap()).unwrap();
    wait_for(&state, 1).await;
    assert_eq!(gate.snapshot().limit, 3);
    assert_eq!(state.origin(), Origin::File);
    // Rewrite the same file (same inode) in place.
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, &serde_json::to_vec(&config(2, 6)).unwrap()).unwrap();
    }
    wait_for(&state, 2).await;
    assert_eq!(gate.snapshot().limit, 6);
    // An invalid rewrite is refused; the running config stays.
    std::fs::write(&path, b"{\"version\": \"nope\"}").unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(state.ack().generation, 2);
    assert_eq!(gate.snapshot().limit, 6);
    // And a valid one after it is applied.
    std::fs::write(&path, serde_json::to_vec(&config(3, 7)).unwrap()).unwrap();
    wait_for(&state, 3).await;
    assert_eq!(gate.snapshot().limit, 7);
}

/// Writes `cfg` the way kubelet updates a ConfigMap volume: a new timestamped directory, a
/// temporary `..data_tmp` symlink to it renamed over `..data` (atomic), the old directory removed.
fn kubelet_update(dir: &Path, stamp: &str, cfg: &WorkerConfig) {
    use backpressure_api::wire::CONFIG_FILE_NAME;
    kubelet_update_file(
        dir,
        stamp,
        CONFIG_FILE_NAME,
        &serde_json::to_vec(cfg).unwrap(),
    );
}

/// [`kubelet_update`] of any file of the ConfigMap.
pub(crate) fn kubelet_update_file(dir: &Path, stamp: &str, name: &str, bytes: &[u8]) {
    let ts = dir.join(stamp);
    std::fs::create_dir(&ts).unwrap();
    std::fs::write(ts.join(name), bytes).unwrap();
    let old = std::fs::read_link(dir.join("..data")).ok();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(stamp, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    let link = dir.join(name);
    if std::fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
}

#[tokio::test]
async fn configmap_symlink_swap_is_hot_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    kubelet_update(dir.path(), "..2024_01_01_00_00_00.000000001", &config(1, 2));
    let path = dir.path().join(backpressure_api::wire::CONFIG_FILE_NAME);
    let (state, gate, _) = state();
    let _stop = spawn_watcher(&state, &path);
    wait_for(&state, 1).await;
    assert_eq!(gate.snapshot().limit, 2);
    kubelet_update(dir.path(), "..2024_01_01_00_01_00.000000002", &config(2, 9));
    wait_for(&state, 2).await;
    assert_eq!(gate.snapshot().limit, 9);
    kubelet_update(dir.path(), "..2024_01_01_00_02_00.000000003", &config(5, 1));
    wait_for(&state, 5).await;
    assert_eq!(gate.snapshot().limit, 1);
}

/// A verifier with a fixed token table, for the status-code mapping (the real TokenReview is
/// tested against a real API server in tests/config_endpoint.rs).
pub(crate) struct StaticTokens(pub(crate) HashMap<&'static str, Result<&'static str, bool>>);

impl TokenVerifier for StaticTokens {
    fn verify<'a>(
        &'a self,
        token: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Identity, VerifyError>> + Send + 'a>> {
        Box::pin(async move {
            match self.0.get(token) {
                Some(Ok(user)) => Ok(Identity {
                    username: (*user).to_owned(),
                }),
                Some(Err(true)) => Err(VerifyError::Unavailable("down".into())),
                _ => Err(VerifyError::Unauthenticated("unknown token".into())),
            }
        })
    }
}

pub(crate) const OPERATOR: &str = "system:serviceaccount:bp-system:backpressure-operator";

fn admin() -> (Arc<Admin>, Gate) {
    let (state, gate, metrics) = state();
    let tokens = StaticTokens(HashMap::from([
        ("good", Ok(OPERATOR)),
        ("other", Ok("system:serviceaccount:bp-system:someone-else")),
        ("down", Err(true)),
    ]));
    let admin = Admin::new(state, Some(metrics))
        .with_verifier(Arc::new(tokens), [OPERATOR.to_owned()])
        .with_timeouts(Duration::from_millis(300), Duration::from_millis(300));
    (Arc::new(admin), gate)
}

pub(crate) async fn call(
    admin: &Admin,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, String) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = admin
        .handle(req.body(Full::new(Bytes::from(body))).unwrap())
        .await;
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn push_status_codes_and_refusals_leave_config_unchanged() {
    let (admin, gate) = admin();
    let running = admin.state().unwrap().ack();
    let good = serde_json::to_vec(&config(7, 3)).unwrap();
    let cases: Vec<(Option<&str>, Vec<u8>, StatusCode)> = vec![
        (None, good.clone(), StatusCode::UNAUTHORIZED),
        (Some("forged"), good.clone(), StatusCode::UNAUTHORIZED),
        (Some("other"), good.clone(), StatusCode::FORBIDDEN),
        (Some("down"), good.clone(), StatusCode::SERVICE_UNAVAILABLE),
        (Some("good"), b"{not json".to_vec(), StatusCode::BAD_REQUEST),
        (
            Some("good"),
            serde_json::to_vec(&WorkerConfig {
                reaction: 0,
                generation: 8,
                ..WorkerConfig::default()
            })
            .unwrap(),
            StatusCode::BAD_REQUEST,
        ),
        (
            Some("good"),
            vec![b' '; MAX_PAYLOAD_BYTES + 1],
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ];
    for (token, body, want) in cases {
        let (status, text) = call(&admin, "PUT", CONFIG_PATH, token, body).await;
        assert_eq!(status, want, "{token:?}: {text}");
        assert!(text.contains("\"error\""), "{text}");
        assert_eq!(
            admin.state().unwrap().ack(),
            running,
            "refused push changed the config"
        );
        assert_eq!(gate.snapshot().limit, 16);
    }
    let (status, text) = call(&admin, "PUT", CONFIG_PATH, Some("good"), good).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let ack: ConfigAck = serde_json::from_str(&text).unwrap();
    assert_eq!(ack.generation, 7);
    assert_eq!(gate.snapshot().limit, 3);
    let (status, text) = call(
        &admin,
        "PUT",
        CONFIG_PATH,
        Some("good"),
        serde_json::to_vec(&config(6, 9)).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{text}");
    let (status, text) = call(&admin, "GET", CONFIG_PATH, None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(serde_json::from_str::<ConfigAck>(&text).unwrap(), ack);
    let (status, text) = call(&admin, "GET", "/metrics", None, vec![]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains(&ack.hash), "{text}");
    assert_eq!(
        call(&admin, "GET", "/healthz", None, vec![]).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&admin, "GET", "/nope", None, vec![]).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        call(&admin, "POST", CONFIG_PATH, None, vec![]).await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

/// The migration to the RFC 8785 hash (`docs/wire-contract.md`): a payload carrying the legacy
/// hash of its content (what a 0.1 operator sends) is applied and acknowledged with that hash,
/// so the old operator counts the pod in sync; one carrying the canonical hash is acknowledged
/// with it; one without a hash gets the canonical hash; a hash of other content is refused
/// with 400 and a body starting `hash mismatch`, and nothing changes.
#[tokio::test]
#[allow(deprecated)]
async fn a_legacy_hash_is_accepted_and_acknowledged_as_given() {
    let (admin, gate) = admin();
    let put = |cfg: &WorkerConfig| {
        let body = serde_json::to_vec(cfg).unwrap();
        let admin = admin.clone();
        async move { call(&admin, "PUT", CONFIG_PATH, Some("good"), body).await }
    };
    let content = config(0, 5);
    let legacy = WorkerConfig {
        generation: 10,
        hash: content.legacy_hash(),
        ..content.clone()
    };
    assert_ne!(legacy.hash, content.hash);
    let (status, text) = put(&legacy).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let ack: ConfigAck = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (ack.hash.as_str(), ack.generation),
        (legacy.hash.as_str(), 10)
    );
    assert_eq!(gate.snapshot().limit, 5);
    let (_, running) = call(&admin, "GET", CONFIG_PATH, None, vec![]).await;
    assert_eq!(serde_json::from_str::<ConfigAck>(&running).unwrap(), ack);

    let canonical = WorkerConfig {
        generation: 11,
        ..config(0, 6)
    };
    let (status, text) = put(&canonical).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(
        serde_json::from_str::<ConfigAck>(&text).unwrap().hash,
        canonical.hash
    );

    let unhashed = WorkerConfig {
        generation: 12,
        hash: String::new(),
        ..config(0, 7)
    };
    let (status, text) = put(&unhashed).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(
        serde_json::from_str::<ConfigAck>(&text).unwrap().hash,
        unhashed.compute_hash()
    );

    let wrong = WorkerConfig {
        generation: 13,
        hash: config(0, 9).legacy_hash(),
        ..config(0, 8)
    };
    let (status, text) = put(&wrong).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let body: backpressure_api::wire::ErrorBody = serde_json::from_str(&text).unwrap();
    assert!(body.is_hash_mismatch(), "{text}");
    assert_eq!(gate.snapshot().limit, 7);
}

#[tokio::test]
async fn pushes_are_refused_without_a_verifier() {
    let (state, _, _) = state();
    let admin = Admin::new(state, None);
    let body = serde_json::to_vec(&config(1, 2)).unwrap();
    let (status, _) = call(&admin, "PUT", CONFIG_PATH, Some("anything"), body).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(admin.state().unwrap().ack().generation, 0);
}

async fn start_server(admin: Arc<Admin>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(admin.serve(listener, std::future::pending()));
    addr
}

async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("server closes the connection")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn server_over_tcp_with_limits_and_timeouts() {
    let (admin, gate) = admin();
    let addr = start_server(admin.clone()).await;
    let body = serde_json::to_string(&config(2, 5)).unwrap();
    let ok = raw(
        addr,
        format!(
            "PUT {CONFIG_PATH} HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer good\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert_eq!(gate.snapshot().limit, 5);
    // Declared too large: refused before reading the body.
    let big = raw(
        addr,
        format!(
            "PUT {CONFIG_PATH} HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer good\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            MAX_PAYLOAD_BYTES + 1
        )
        .as_bytes(),
    )
    .await;
    assert!(big.starts_with("HTTP/1.1 413"), "{big}");
    // A slow client that never sends its body gets 408 after the body timeout.
    let slow = raw(
        addr,
        format!(
            "PUT {CONFIG_PATH} HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer good\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{{"
        )
        .as_bytes(),
    )
    .await;
    assert!(slow.starts_with("HTTP/1.1 408"), "{slow}");
    // A client that never finishes its headers is disconnected.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: w\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
    assert!(
        read.is_ok(),
        "connection with unfinished headers was not closed"
    );
    assert_eq!(admin.state().unwrap().ack().generation, 2);
    let metrics = raw(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(
        metrics.contains("backpressure_permits{workload=\"w\"} 5"),
        "{metrics}"
    );
}

/// Issue 12: a generation far ahead of the worker's clock (`i64::MAX` made every later
/// legitimate push stale) is refused with 400 naming the field, and changes nothing.
#[tokio::test]
async fn generations_far_ahead_of_the_clock_are_refused_without_effect() {
    let now = 1_700_000_000i64;
    let (state, gate, _) = state();
    let lead = backpressure_api::wire::MAX_GENERATION_LEAD_MS;
    let ahead = |generation: i64| WorkerConfig {
        generation,
        max_permits: 3,
        brake: Some(BrakeConfig {
            min_backoff: 1.0,
            expires_at_unix: None,
        }),
        hash: String::new(),
        ..WorkerConfig::default()
    };
    for generation in [i64::MAX, now * 1000 + lead + 1, now * 1_000_000] {
        let err = state
            .apply_at(ahead(generation), Origin::Push, now)
            .unwrap_err();
        assert!(
            matches!(
                &err,
                ApplyError::Invalid(ConfigError::Field {
                    field: "generation",
                    ..
                })
            ),
            "{err}"
        );
        // Beyond 2^53 - 1 the contract's own range refuses it first.
        let why = if generation > backpressure_api::wire::MAX_SAFE_INTEGER {
            "beyond 2^53 - 1"
        } else {
            "ahead of this worker's clock"
        };
        assert!(err.to_string().contains(why), "{err}");
        assert_eq!(state.ack().generation, 0);
        assert_eq!(gate.snapshot().limit, 16);
        assert_eq!(gate.snapshot().backoff, 0.0);
    }
    // A generation from the operator's clock, even a few minutes fast, is accepted.
    let ack = state
        .apply_at(ahead(now * 1000 + lead), Origin::Push, now)
        .unwrap();
    assert_eq!(ack.generation, now * 1000 + lead);
    assert_eq!(gate.snapshot().backoff, 1.0);

    // Through the admin endpoint: 400, and the running config stays.
    let (admin, gate) = admin();
    let running = admin.state().unwrap().ack();
    let body = serde_json::to_vec(&ahead(i64::MAX)).unwrap();
    let (status, text) = call(&admin, "PUT", CONFIG_PATH, Some("good"), body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("generation"), "{text}");
    assert_eq!(admin.state().unwrap().ack(), running);
    assert_eq!(gate.snapshot().limit, 16);
    // The operator's next push (generation = its clock in ms) is not stale.
    let next = WorkerConfig {
        generation: unix_now() * 1000,
        ..config(0, 5)
    };
    let (status, text) = call(
        &admin,
        "PUT",
        CONFIG_PATH,
        Some("good"),
        serde_json::to_vec(&next).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{text}");
}

/// Issue 12: values the wire contract allows but that would hurt this worker are refused with
/// 400 naming the field (not clamped: the worker must run the hash it acknowledges).
#[tokio::test]
async fn values_over_the_worker_limits_are_refused_naming_the_field() {
    let (admin, gate) = admin();
    let running = admin.state().unwrap().ack();
    let limits = Limits::default();
    let cases: Vec<(WorkerConfig, &str)> = vec![
        (
            WorkerConfig {
                max_permits: limits.max_permits + 1,
                ..config(1, 1)
            },
            "maxPermits",
        ),
        (
            WorkerConfig {
                max_permits: u32::MAX,
                ..config(1, 1)
            },
            "maxPermits",
        ),
        (
            WorkerConfig {
                reaction: limits.max_reaction + 1,
                ..config(1, 1)
            },
            "reaction",
        ),
        (
            WorkerConfig {
                probe_initial_ms: 1,
                ..config(1, 1)
            },
            "probeInitialMs",
        ),
        (
            WorkerConfig {
                probe_max_ms: limits.max_probe_ms + 1,
                ..config(1, 1)
            },
            "probeMaxMs",
        ),
        (
            WorkerConfig {
                probe_initial_ms: u64::MAX / 2,
                probe_max_ms: u64::MAX,
                ..config(1, 1)
            },
            "probeInitialMs",
        ),
    ];
    for (cfg, field) in cases {
        let cfg = WorkerConfig {
            hash: String::new(),
            ..cfg
        };
        let (status, text) = call(
            &admin,
            "PUT",
            CONFIG_PATH,
            Some("good"),
            serde_json::to_vec(&cfg).unwrap(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{field}: {text}");
        assert!(text.contains(field), "{text} should name {field}");
        assert_eq!(admin.state().unwrap().ack(), running);
        assert_eq!(gate.snapshot().limit, 16);
    }
    // The file path is held to the same limits.
    let state = admin.state().unwrap();
    assert!(
        state
            .apply(
                WorkerConfig {
                    max_permits: 5000,
                    ..config(2, 1)
                }
                .with_hash(),
                Origin::File
            )
            .is_err()
    );
    // An application that really runs more raises its limit.
    let (state, gate, _) = super::tests::state();
    let state = state.with_limits(Limits {
        max_permits: 5000,
        ..Limits::default()
    });
    state
        .apply(
            WorkerConfig {
                max_permits: 5000,
                ..config(2, 1)
            }
            .with_hash(),
            Origin::Push,
        )
        .unwrap();
    assert_eq!(gate.snapshot().limit, 5000);
}

async fn call_from(
    admin: &Admin,
    peer: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, Option<String>) {
    put_from(admin, CONFIG_PATH, peer, token, body).await
}

/// A `PUT path` from `peer`: the status and the `Retry-After` header.
pub(crate) async fn put_from(
    admin: &Admin,
    path: &str,
    peer: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, Option<String>) {
    let mut req = Request::builder().method("PUT").uri(path);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let mut req = req.body(Full::new(Bytes::from(body))).unwrap();
    req.extensions_mut()
        .insert(peer.parse::<std::net::SocketAddr>().unwrap());
    let resp = admin.handle(req).await;
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (resp.status(), retry)
}

/// Issue 12: a source that keeps failing authentication gets 429 before its token is even
/// looked at; other sources and later legitimate pushes are not affected.
#[tokio::test(start_paused = true)]
async fn failed_authentications_are_rate_limited_per_source() {
    let (state, gate, _) = state();
    let tokens = StaticTokens(HashMap::from([
        ("good", Ok(OPERATOR)),
        ("other", Ok("system:serviceaccount:bp-system:someone-else")),
    ]));
    let admin = Admin::new(state, None)
        .with_verifier(Arc::new(tokens), [OPERATOR.to_owned()])
        .with_failure_limit(FailureLimit {
            burst: 3,
            refill: Duration::from_secs(2),
        });
    let body = |g: i64| serde_json::to_vec(&config(g, 2)).unwrap();
    let attacker = "10.0.0.66:40000";
    // Missing, forged and not-allowed tokens all count.
    assert_eq!(
        call_from(&admin, attacker, None, body(1)).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call_from(&admin, attacker, Some("forged"), body(1)).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call_from(&admin, attacker, Some("other"), body(1)).await.0,
        StatusCode::FORBIDDEN
    );
    for token in [Some("forged"), None, Some("good")] {
        let (status, retry) = call_from(&admin, attacker, token, body(1)).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{token:?}");
        assert_eq!(retry.as_deref(), Some("2"));
    }
    assert_eq!(admin.state().unwrap().ack().generation, 0);
    // Another source (another port of the same address is the same source).
    assert_eq!(
        call_from(&admin, "10.0.0.66:40001", Some("good"), body(1))
            .await
            .0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let operator = "10.0.0.7:50000";
    assert_eq!(
        call_from(&admin, operator, Some("good"), body(2)).await.0,
        StatusCode::OK
    );
    assert_eq!(gate.snapshot().limit, 2);
    // Successful pushes cost nothing.
    for g in 3..20 {
        assert_eq!(
            call_from(&admin, operator, Some("good"), body(g)).await.0,
            StatusCode::OK
        );
    }
    // One failure is forgiven per refill period.
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        call_from(&admin, attacker, Some("forged"), body(1)).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call_from(&admin, attacker, Some("forged"), body(1)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(
        call_from(&admin, attacker, Some("good"), body(30)).await.0,
        StatusCode::OK
    );
    assert_eq!(admin.state().unwrap().ack().generation, 30);
}

/// Issue 13: the optional settings of a payload reach the controller and the loop; a payload
/// without them keeps the application's settings (here: no startup ramp, as `state()` builds
/// the gate).
#[tokio::test]
async fn optional_settings_of_a_payload_are_applied_and_absent_ones_keep_the_application_s() {
    use backpressure_api::wire::RedeliveryConfig;
    let (state, gate, _) = state();
    let before = gate.settings();
    assert_eq!(before.initial_permits, 0);
    assert_eq!(before.redelivery, controller::DEFAULT_REDELIVERY);
    state
        .apply(
            WorkerConfig {
                initial_permits: Some(4),
                ratio_window_ms: Some(10_000),
                brake_release_ms: Some(0),
                floor_max: Some(0.1),
                redelivery: Some(RedeliveryConfig {
                    base_ms: 30_000,
                    max_ms: 120_000,
                }),
                ..config(2, 8)
            }
            .with_hash(),
            Origin::Push,
        )
        .unwrap();
    let s = gate.settings();
    assert_eq!(s.initial_permits, 4);
    assert_eq!(s.ratio_window, Nanos::from_secs(10));
    assert_eq!(s.brake_release, Nanos::ZERO);
    assert_eq!(s.floor_max, 0.1);
    assert_eq!(
        s.redelivery,
        Some((Nanos::from_secs(30), Nanos::from_secs(120)))
    );
    // baseMs 0 turns the redelivery backoff off.
    state
        .apply(
            WorkerConfig {
                redelivery: Some(RedeliveryConfig {
                    base_ms: 0,
                    max_ms: 0,
                }),
                ..config(3, 8)
            }
            .with_hash(),
            Origin::Push,
        )
        .unwrap();
    assert_eq!(gate.settings().redelivery, None);
    // A payload without them: back to the application's settings.
    state.apply(config(4, 8), Origin::Push).unwrap();
    let s = gate.settings();
    assert_eq!(
        (
            s.initial_permits,
            s.ratio_window,
            s.brake_release,
            s.floor_max,
            s.redelivery
        ),
        (
            before.initial_permits,
            before.ratio_window,
            before.brake_release,
            before.floor_max,
            before.redelivery
        )
    );
}

#[tokio::test]
async fn optional_settings_over_the_worker_limits_are_refused_naming_the_field() {
    use backpressure_api::wire::RedeliveryConfig;
    let (state, gate, _) = state();
    let before = (state.ack(), gate.settings());
    let cases = [
        (
            "initialPermits",
            WorkerConfig {
                initial_permits: Some(1025),
                ..config(2, 8)
            },
        ),
        (
            "ratioWindowMs",
            WorkerConfig {
                ratio_window_ms: Some(3_600_001),
                ..config(2, 8)
            },
        ),
        (
            "brakeReleaseMs",
            WorkerConfig {
                brake_release_ms: Some(3_600_001),
                ..config(2, 8)
            },
        ),
        (
            "redelivery.maxMs",
            WorkerConfig {
                redelivery: Some(RedeliveryConfig {
                    base_ms: 1,
                    max_ms: 43_200_001,
                }),
                ..config(2, 8)
            },
        ),
        (
            "floorMax",
            WorkerConfig {
                floor_max: Some(0.91),
                ..config(2, 8)
            },
        ),
    ];
    for (want, cfg) in cases {
        match state.apply(cfg.with_hash(), Origin::Push) {
            Err(e) => assert!(e.to_string().contains(want), "{want}: {e}"),
            Ok(_) => panic!("{want} accepted"),
        }
        assert_eq!((state.ack(), gate.settings()), before, "{want}");
    }
}
