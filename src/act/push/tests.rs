//! The migration from the legacy (0.1) content hash, over real HTTP on loopback: a 0.1 worker
//! (its hash check reproduced below, as 0.1 shipped it) and a current worker (the real
//! `backpressure-worker` admin server) under one pusher.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use backpressure_api::wire::{self, ConfigAck, WorkerConfig};
use backpressure_worker::config::ConfigState;
use backpressure_worker::config::admin::Admin;
use backpressure_worker::config::token::{Identity, TokenVerifier, VerifyError};
use backpressure_worker::permits::Gate;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};

use super::*;

const TOKEN: &str = "operator-token";
const OPERATOR: &str = "system:serviceaccount:bp-system:backpressure-operator";

/// Accepts [`TOKEN`] as the operator (the TokenReview is not what these tests are about).
struct OneToken;

impl TokenVerifier for OneToken {
    fn verify<'a>(
        &'a self,
        token: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Identity, VerifyError>> + Send + 'a>> {
        Box::pin(async move {
            if token == TOKEN {
                Ok(Identity {
                    username: OPERATOR.to_owned(),
                })
            } else {
                Err(VerifyError::Unauthenticated("unknown token".into()))
            }
        })
    }
}

/// A current worker: the worker library's admin server on loopback.
async fn current_worker() -> (ConfigState, u16) {
    let initial = WorkerConfig::default();
    let gate = Gate::new(backpressure_worker::controller::from_config(&initial, 1));
    let state = ConfigState::new(gate, initial, None);
    let admin = Arc::new(
        Admin::new(state.clone(), None).with_verifier(Arc::new(OneToken), [OPERATOR.to_owned()]),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(admin.serve(listener, std::future::pending()));
    (state, port)
}

/// What a 0.1 worker received and runs.
#[derive(Default)]
struct Old {
    /// The `hash` of every `PUT` body, in order.
    hashes: Vec<String>,
    running: Option<ConfigAck>,
}

/// A 0.1 worker's `PUT /v1/config`: a given hash must be the legacy hash of the content (else
/// 400 `hash mismatch`, as 0.1's `ConfigError::Hash` said it), an empty one is filled in with
/// the legacy hash, and the acknowledgement names the hash it runs. `bogus` acknowledges a hash
/// of nothing instead (a worker that computes the hash some third way).
#[allow(deprecated)]
fn old_put(old: &Mutex<Old>, body: &[u8], bogus: bool) -> (u16, String) {
    let cfg: WorkerConfig = match serde_json::from_slice(body) {
        Ok(c) => c,
        Err(e) => {
            return (
                400,
                serde_json::json!({ "error": e.to_string() }).to_string(),
            );
        }
    };
    let mut old = old.lock().unwrap();
    old.hashes.push(cfg.hash.clone());
    let computed = cfg.legacy_hash();
    if !cfg.hash.is_empty() && cfg.hash != computed {
        let error = format!(
            "hash mismatch: payload says {:?}, content hashes to {computed:?}",
            cfg.hash
        );
        return (400, serde_json::json!({ "error": error }).to_string());
    }
    let ack = ConfigAck {
        hash: if bogus {
            "0123456789ab".to_owned()
        } else {
            computed
        },
        generation: cfg.generation,
    };
    old.running = Some(ack.clone());
    (200, serde_json::to_string(&ack).unwrap())
}

async fn old_worker(bogus: bool) -> (Arc<Mutex<Old>>, u16) {
    let old = Arc::new(Mutex::new(Old::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let state = old.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let state = state.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let state = state.clone();
                        async move {
                            let body = req.into_body().collect().await?.to_bytes();
                            let (status, text) = old_put(&state, &body, bogus);
                            let mut resp = http::Response::new(Full::new(Bytes::from(text)));
                            *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                            Ok::<_, hyper::Error>(resp)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (old, port)
}

fn pod(name: &str, port: u16) -> PodInfo {
    PodInfo {
        name: name.to_owned(),
        uid: format!("uid-{name}"),
        ready: true,
        ip: Some("127.0.0.1".to_owned()),
        admin_port: port,
        tls: false,
    }
}

#[derive(Default)]
struct Counts(AtomicUsize, AtomicUsize);

impl PushRecorder for Counts {
    fn record_push(&self, ok: bool) {
        if ok { &self.0 } else { &self.1 }.fetch_add(1, Ordering::Relaxed);
    }
}

fn config(generation: i64, max_permits: u32) -> WorkerConfig {
    WorkerConfig {
        generation,
        max_permits,
        ..WorkerConfig::default()
    }
    .with_hash()
}

/// A pusher, with the process's TLS provider installed as the operator does at start.
fn pusher() -> Pusher {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Pusher::new().unwrap()
}

async fn sync(pusher: &Pusher, pods: &[PodInfo], doc: &Document, counts: &Counts) -> PushReport {
    pusher
        .sync(
            pods,
            doc,
            "w.ns.svc",
            || async { Some(TOKEN.to_owned()) },
            counts,
            false,
        )
        .await
}

/// A new operator with a fleet half upgraded: the 0.1 pod refuses the hash once, gets the same
/// document without it at once, and both pods count as in sync with no failed push; the next
/// document reaches the 0.1 pod without a hash straight away.
#[tokio::test]
#[allow(deprecated)]
async fn old_and_new_workers_under_a_new_operator_stay_in_sync() {
    let (old, old_port) = old_worker(false).await;
    let (new, new_port) = current_worker().await;
    let pods = [pod("old", old_port), pod("new", new_port)];
    let pusher = pusher();
    let counts = Counts::default();

    let first = config(1_767_225_600_000, 8);
    let doc = Document::worker(&first).unwrap();
    assert_ne!(doc.hash, doc.legacy_hash);
    let report = sync(&pusher, &pods, &doc, &counts).await;
    assert_eq!((report.in_sync, report.total), (2, 2), "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(counts.1.load(Ordering::Relaxed), 0);
    assert_eq!(
        old.lock().unwrap().hashes,
        [first.hash.clone(), String::new()]
    );
    assert_eq!(
        old.lock().unwrap().running.as_ref().unwrap().hash,
        first.legacy_hash()
    );
    assert_eq!(new.ack().hash, first.hash);
    assert_eq!(new.running().max_permits, 8);

    // Confirmed pods are not pushed again.
    let report = sync(&pusher, &pods, &doc, &counts).await;
    assert_eq!(report.in_sync, 2);
    assert_eq!(old.lock().unwrap().hashes.len(), 2);

    let second = config(1_767_225_600_001, 4);
    let doc = Document::worker(&second).unwrap();
    let report = sync(&pusher, &pods, &doc, &counts).await;
    assert_eq!((report.in_sync, report.total), (2, 2), "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(old.lock().unwrap().hashes[2..], [String::new()]);
    let running = old.lock().unwrap().running.clone().unwrap();
    assert_eq!(
        (running.hash, running.generation),
        (second.legacy_hash(), second.generation)
    );
    assert_eq!(new.ack().hash, second.hash);
    assert_eq!(counts.0.load(Ordering::Relaxed), 4);
}

/// An old operator (it hashes the legacy way and sends that hash) with an upgraded worker: the
/// worker applies the document and acknowledges the hash it was sent, which is the one the
/// old operator counts pods in sync by.
#[tokio::test]
#[allow(deprecated)]
async fn a_new_worker_under_an_old_operator_stays_in_sync() {
    let (new, port) = current_worker().await;
    let cfg = config(1_767_225_600_000, 6);
    let sent = WorkerConfig {
        hash: cfg.legacy_hash(),
        ..cfg.clone()
    };
    // What a 0.1 operator pushes: its one hash, the legacy one.
    let doc = Document {
        path: wire::CONFIG_PATH,
        hash: sent.hash.clone(),
        legacy_hash: sent.hash.clone(),
        body: serde_json::to_vec(&sent).unwrap(),
        unhashed_body: Vec::new(),
    };
    let counts = Counts::default();
    let report = sync(&pusher(), &[pod("new", port)], &doc, &counts).await;
    assert_eq!((report.in_sync, report.total), (1, 1), "{report:?}");
    assert_eq!(new.ack().hash, sent.hash);
    assert_eq!(new.running().max_permits, 6);
}

/// A pod that acknowledges a hash that is neither the document's nor its legacy one computes
/// the hash some other way: its push fails (ConfigPushFailed says why) instead of leaving it
/// silently out of sync.
#[tokio::test]
async fn an_acknowledgement_of_another_hash_is_a_failed_push() {
    let (_old, port) = old_worker(true).await;
    let doc = Document::worker(&config(1_767_225_600_000, 8)).unwrap();
    let counts = Counts::default();
    let report = sync(&pusher(), &[pod("odd", port)], &doc, &counts).await;
    assert_eq!((report.in_sync, report.total), (0, 1));
    let (name, why) = &report.failed[0];
    assert_eq!(name, "odd");
    assert!(why.contains("acknowledged hash \"0123456789ab\""), "{why}");
    assert_eq!(counts.1.load(Ordering::Relaxed), 1);
}

#[test]
fn only_a_400_hash_mismatch_is_a_hash_refusal() {
    let hash =
        |status: u16, body: &str| matches!(Refusal::of(status, body), Refusal::HashMismatch(_));
    assert!(hash(
        400,
        r#"{"error":"hash mismatch: payload says \"a\", content hashes to \"b\""}"#
    ));
    assert!(!hash(
        400,
        r#"{"error":"invalid field setPoint: 2 is not in (0, 1)"}"#
    ));
    assert!(!hash(409, r#"{"error":"hash mismatch"}"#));
    assert!(!hash(400, "hash mismatch"));
    let message: String = Refusal::of(400, r#"{"error":"hash mismatch"}"#).into();
    assert_eq!(message, r#"HTTP 400: {"error":"hash mismatch"}"#);
}
