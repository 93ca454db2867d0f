//! Pushing the worker configuration (and a producer workload's producer state) to each ready
//! pod's admin port.
//!
//! The push is authenticated with a ServiceAccount token of the operator's own identity, minted
//! through the TokenRequest API for one target only: audience
//! [`wire::push_audience`]`(namespace, workload)`, lifetime [`TOKEN_LIFETIME`] (the API's
//! minimum). Workers accept only their own audience, so a token a pod receives (a pod of the
//! target is whatever the target's selector matches, which a namespace owner controls) cannot
//! configure another target's workers, and it expires within minutes. Tokens are cached per
//! audience (at most [`TOKEN_CACHE_MAX`]) and minted again after half their lifetime, so a
//! token in use always has minutes left; one is minted only when a pod is due a push.
//!
//! A pod whose annotation [`wire::ADMIN_SCHEME_ANNOTATION`] says `https` is pushed to over TLS
//! only: the operator connects to the pod IP and verifies the certificate against the CA bundle
//! of `--push-ca-file` and the name [`wire::admin_server_name`]`(namespace, workload)`
//! (`<workload>.<namespace>.svc`); without a CA bundle such a pod is not pushed to at all (never
//! in clear text). Other pods are pushed to over plain HTTP.
//!
//! A pod that refuses or times out is retried with exponential backoff and counted as out of
//! sync; pushes run concurrently with a short timeout, so one slow pod never holds up the
//! reconcile of other objects.
//!
//! Migration from the legacy (0.1) content hash (`docs/wire-contract.md`): a pod counts as
//! running a document when it acknowledges its hash or its legacy hash. A pod that answers a
//! push with 400 `hash mismatch`, or acknowledges the legacy hash, is a 0.1 worker: it is sent
//! the same document with an empty `hash` (which every version accepts as "not given" and
//! answers with the hash it computes) at once and from then on, so a fleet of old workers under
//! a new operator neither fails its pushes nor falls out of sync.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backpressure_api::wire::{self, ConfigAck, ProducerConfig, WorkerConfig};
use futures::StreamExt as _;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};

use crate::observe::target::PodInfo;

/// The TLS client configuration for HTTPS pushes: the certificates of the PEM bundle `ca_file`
/// as the only roots (not the system's: the workers' issuer is the cluster's own CA), TLS 1.2
/// and 1.3, HTTP/1.1.
pub fn push_tls_config(ca_file: &Path) -> Result<Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_file)
        .map_err(|e| format!("{}: {e}", ca_file.display()))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("{}: {e}", ca_file.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("{}: {e}", ca_file.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "{}: no CA certificate in the file",
            ca_file.display()
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Timeout of one push.
pub const PUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// Pushes in flight at once, across all objects.
const PUSH_CONCURRENCY: usize = 32;
/// A confirmed pod is asked again after this long (it may have restarted).
const RECONFIRM_AFTER: Duration = Duration::from_secs(300);

/// Where [`Pusher::sync`] records each push and whether the pod accepted it. The operator's
/// metrics registry implements it; act does not depend on the registry.
pub trait PushRecorder: Send + Sync {
    /// Records one push.
    fn record_push(&self, ok: bool);
}

/// Who the operator is, for minting its push token.
#[derive(Debug, Clone)]
pub struct Identity {
    /// Namespace of the operator's ServiceAccount.
    pub namespace: String,
    /// Name of the operator's ServiceAccount.
    pub name: String,
}

/// Lifetime asked for each push token: the TokenRequest API's minimum (10 minutes).
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(600);
/// Default age at which a cached token is replaced: half its lifetime, so a token sent always
/// has at least five minutes left (more than any clock skew a worker tolerates).
pub const DEFAULT_TOKEN_RENEW: Duration = Duration::from_secs(300);
/// Most tokens cached (one per target audience, about 1 KiB each). Beyond it, tokens due for
/// renewal are dropped, then the oldest: a larger fleet mints more often, never more memory.
pub const TOKEN_CACHE_MAX: usize = 4096;

/// Mints and caches the push tokens, one per target audience.
#[derive(Debug)]
pub struct TokenSource {
    identity: Option<Identity>,
    renew_after: Duration,
    cached: Mutex<HashMap<String, (String, Instant)>>,
}

impl TokenSource {
    /// A source for `identity` (None: pushes carry no token and workers will refuse them),
    /// renewing each token after `renew_after` (at most [`DEFAULT_TOKEN_RENEW`]).
    pub fn new(identity: Option<Identity>, renew_after: Duration) -> Self {
        Self {
            identity,
            renew_after: renew_after.min(DEFAULT_TOKEN_RENEW),
            cached: Mutex::new(HashMap::new()),
        }
    }

    fn cached(&self, audience: &str) -> Option<String> {
        let cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        cached
            .get(audience)
            .filter(|(_, renew_at)| Instant::now() < *renew_at)
            .map(|(token, _)| token.clone())
    }

    fn remember(&self, audience: &str, token: &str, renew_at: Instant) {
        let now = Instant::now();
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        if cached.len() >= TOKEN_CACHE_MAX && !cached.contains_key(audience) {
            cached.retain(|_, (_, at)| *at > now);
            while cached.len() >= TOKEN_CACHE_MAX {
                let Some(oldest) = cached
                    .iter()
                    .min_by_key(|(_, (_, at))| *at)
                    .map(|(k, _)| k.clone())
                else {
                    break;
                };
                cached.remove(&oldest);
            }
        }
        cached.insert(audience.to_owned(), (token.to_owned(), renew_at));
    }

    /// Tokens cached.
    pub fn cached_len(&self) -> usize {
        self.cached.lock().map(|c| c.len()).unwrap_or(0)
    }

    /// A valid token for `audience`, minted when none is cached or the cached one is due for
    /// renewal. Two reconciles racing for the same audience may both mint; either token works.
    pub async fn token(
        &self,
        client: &kube::Client,
        audience: &str,
    ) -> Result<Option<String>, kube::Error> {
        let Some(id) = &self.identity else {
            return Ok(None);
        };
        if let Some(token) = self.cached(audience) {
            return Ok(Some(token));
        }
        let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &id.namespace);
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![audience.to_owned()],
                expiration_seconds: Some(TOKEN_LIFETIME.as_secs() as i64),
                ..Default::default()
            },
            ..Default::default()
        };
        let resp = api
            .create_token_request(&id.name, &PostParams::default(), &req)
            .await?;
        let token = resp.status.map(|s| s.token).unwrap_or_default();
        tracing::debug!(audience, "minted a push token");
        self.remember(audience, &token, Instant::now() + self.renew_after);
        Ok(Some(token))
    }
}

#[derive(Debug, Clone)]
struct PodPushState {
    confirmed_hash: Option<String>,
    confirmed_at: Option<Instant>,
    failures: u32,
    next_attempt: Option<Instant>,
    last_error: Option<String>,
    /// The pod computes the legacy hash: it is pushed documents without a hash.
    legacy: bool,
}

/// A document to push: the worker config to [`wire::CONFIG_PATH`] of a worker pod, or the
/// producer state to [`wire::PRODUCER_PATH`] of a producer pod. A pod's confirmations are kept
/// per path, so a pod that is both (a workload that produces and consumes) holds both.
#[derive(Debug, Clone)]
pub struct Document {
    /// The admin path it is `PUT` to.
    pub path: &'static str,
    /// Its content hash, which the pod's acknowledgement must name.
    pub hash: String,
    /// The legacy (0.1) hash of the same content, which a 0.1 pod acknowledges instead.
    pub legacy_hash: String,
    /// The JSON body.
    pub body: Vec<u8>,
    /// The JSON body with `hash` empty, for pods that compute the legacy hash.
    pub unhashed_body: Vec<u8>,
}

impl Document {
    /// The worker config.
    #[allow(deprecated)] // The legacy hash, until 0.1 workers are gone (0.3.0).
    pub fn worker(config: &WorkerConfig) -> Result<Self, serde_json::Error> {
        Ok(Document {
            path: wire::CONFIG_PATH,
            hash: config.hash.clone(),
            legacy_hash: config.legacy_hash(),
            body: serde_json::to_vec(config)?,
            unhashed_body: serde_json::to_vec(&WorkerConfig {
                hash: String::new(),
                ..config.clone()
            })?,
        })
    }

    /// The producer state.
    #[allow(deprecated)] // The legacy hash, until 0.1 producers are gone (0.3.0).
    pub fn producer(config: &ProducerConfig) -> Result<Self, serde_json::Error> {
        Ok(Document {
            path: wire::PRODUCER_PATH,
            hash: config.hash.clone(),
            legacy_hash: config.legacy_hash(),
            body: serde_json::to_vec(config)?,
            unhashed_body: serde_json::to_vec(&ProducerConfig {
                hash: String::new(),
                ..config.clone()
            })?,
        })
    }

    /// Whether an acknowledged hash names this document's content.
    pub fn names(&self, hash: &str) -> bool {
        hash == self.hash || hash == self.legacy_hash
    }
}

/// What one push to a pod came to.
#[derive(Debug)]
struct Pushed {
    ack: ConfigAck,
    /// The pod computes the legacy hash (it refused the hash or acknowledged the legacy one).
    legacy: bool,
}

/// What the pushes of one reconcile found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushReport {
    /// Ready pods confirmed running `hash`.
    pub in_sync: i32,
    /// Ready pods.
    pub total: i32,
    /// Pods that refused or timed out this time, with the reason.
    pub failed: Vec<(String, String)>,
}

/// Remembers, per pod UID and document path, which hash each pod confirmed.
#[derive(Debug)]
pub struct Pusher {
    http: reqwest::Client,
    tls: Option<Arc<rustls::ClientConfig>>,
    state: Mutex<HashMap<(&'static str, String), PodPushState>>,
    semaphore: tokio::sync::Semaphore,
}

impl Pusher {
    /// A pusher with its own HTTP client.
    pub fn new() -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .timeout(PUSH_TIMEOUT)
            .connect_timeout(PUSH_TIMEOUT)
            .build()?;
        Ok(Self {
            http,
            tls: None,
            state: Mutex::new(HashMap::new()),
            semaphore: tokio::sync::Semaphore::new(PUSH_CONCURRENCY),
        })
    }

    /// Pushes to pods that declare `https` with `config` (see [`push_tls_config`]).
    pub fn with_tls(mut self, config: Option<Arc<rustls::ClientConfig>>) -> Self {
        self.tls = config;
        self
    }

    fn snapshot(&self, path: &'static str, uid: &str) -> Option<PodPushState> {
        self.state
            .lock()
            .ok()
            .and_then(|s| s.get(&(path, uid.to_owned())).cloned())
    }

    fn update(&self, path: &'static str, uid: &str, f: impl FnOnce(&mut PodPushState)) {
        if let Ok(mut s) = self.state.lock() {
            let entry = s.entry((path, uid.to_owned())).or_insert(PodPushState {
                confirmed_hash: None,
                confirmed_at: None,
                failures: 0,
                next_attempt: None,
                last_error: None,
                legacy: false,
            });
            f(entry);
        }
    }

    /// Forgets pods that are gone.
    pub fn retain_pods(&self, alive: &dyn Fn(&str) -> bool) {
        if let Ok(mut s) = self.state.lock() {
            s.retain(|(_, uid), _| alive(uid));
        }
    }

    /// Pushes `doc` to every ready pod that has not confirmed it, honouring per-pod
    /// backoff, and reports how many ready pods run it. `token` is asked for only when some pod
    /// is due a push (a token costs a TokenRequest). `server_name` is the name an HTTPS pod's
    /// certificate must carry.
    pub async fn sync<F, Fut>(
        &self,
        pods: &[PodInfo],
        doc: &Document,
        server_name: &str,
        token: F,
        recorder: &dyn PushRecorder,
        dry_run: bool,
    ) -> PushReport
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Option<String>>,
    {
        let now = Instant::now();
        let ready: Vec<&PodInfo> = pods.iter().filter(|p| p.ready && p.ip.is_some()).collect();
        let path = doc.path;
        let due: Vec<&PodInfo> = ready
            .iter()
            .copied()
            .filter(|p| {
                let s = self.snapshot(path, &p.uid);
                let confirmed = s.as_ref().is_some_and(|s| {
                    s.confirmed_hash.as_deref().is_some_and(|h| doc.names(h))
                        && s.confirmed_at
                            .is_some_and(|t| now.duration_since(t) < RECONFIRM_AFTER)
                });
                let waiting = s
                    .as_ref()
                    .and_then(|s| s.next_attempt)
                    .is_some_and(|t| now < t);
                !confirmed && !waiting && !dry_run
            })
            .collect();
        let token: Option<String> = if due.is_empty() { None } else { token().await };
        let due: Vec<PodInfo> = due.into_iter().cloned().collect();
        let results: Vec<(String, String, Result<Pushed, String>)> = futures::stream::iter(due)
            .map(|pod: PodInfo| {
                let token = token.clone();
                let legacy = self.snapshot(path, &pod.uid).is_some_and(|s| s.legacy);
                async move {
                    let _permit = self.semaphore.acquire().await;
                    let r = self
                        .push_doc(&pod, doc, legacy, server_name, token.as_deref())
                        .await;
                    (pod.uid, pod.name, r)
                }
            })
            .buffer_unordered(PUSH_CONCURRENCY)
            .collect()
            .await;
        let mut failed = Vec::new();
        for (uid, name, r) in results {
            recorder.record_push(r.is_ok());
            match r {
                Ok(Pushed { ack, legacy }) => self.update(path, &uid, |s| {
                    if legacy && !s.legacy {
                        tracing::info!(pod = %name, path, "the pod computes the legacy (0.1) content hash: pushing it documents without a hash until it is upgraded");
                    }
                    s.legacy = legacy;
                    s.confirmed_hash = Some(ack.hash);
                    s.confirmed_at = Some(Instant::now());
                    s.failures = 0;
                    s.next_attempt = None;
                    s.last_error = None;
                }),
                Err(e) => {
                    tracing::debug!(pod = %name, error = %e, "config push failed");
                    failed.push((name, e.clone()));
                    self.update(path, &uid, |s| {
                        s.failures = s.failures.saturating_add(1);
                        let backoff = Duration::from_secs(1u64 << s.failures.min(6))
                            .min(Duration::from_secs(60));
                        s.next_attempt = Some(Instant::now() + backoff);
                        s.last_error = Some(e);
                    });
                }
            }
        }
        let in_sync = ready
            .iter()
            .filter(|p| {
                self.snapshot(path, &p.uid)
                    .is_some_and(|s| s.confirmed_hash.as_deref().is_some_and(|h| doc.names(h)))
            })
            .count() as i32;
        PushReport {
            in_sync,
            total: ready.len() as i32,
            failed,
        }
    }

    /// Pushes `doc` to `pod`: without a hash to a pod known to compute the legacy hash (`legacy`),
    /// else with its hash, and again at once without it when the pod refuses the hash (a 0.1
    /// worker). The acknowledgement must name the document's hash or its legacy hash.
    async fn push_doc(
        &self,
        pod: &PodInfo,
        doc: &Document,
        legacy: bool,
        server_name: &str,
        token: Option<&str>,
    ) -> Result<Pushed, String> {
        let put = |body: &Vec<u8>| self.push_one(pod, doc.path, body.clone(), server_name, token);
        let (ack, refused_hash) = if legacy {
            (put(&doc.unhashed_body).await?, false)
        } else {
            match put(&doc.body).await {
                Err(Refusal::HashMismatch(_)) => (put(&doc.unhashed_body).await?, true),
                other => (other?, false),
            }
        };
        if !doc.names(&ack.hash) {
            return Err(format!(
                "the pod acknowledged hash {:?}, not the document's {:?} (or its legacy {:?}): it computes the content hash otherwise than docs/wire-contract.md says",
                ack.hash, doc.hash, doc.legacy_hash
            ));
        }
        let legacy = refused_hash || (ack.hash != doc.hash && ack.hash == doc.legacy_hash);
        Ok(Pushed { ack, legacy })
    }

    async fn push_one(
        &self,
        pod: &PodInfo,
        path: &'static str,
        body: Vec<u8>,
        server_name: &str,
        token: Option<&str>,
    ) -> Result<ConfigAck, Refusal> {
        let ip = pod.ip.as_deref().ok_or("no pod IP")?;
        let (status, text) = if pod.tls {
            let Some(tls) = &self.tls else {
                return Err(
                    "the pod's admin port is https and the operator has no --push-ca-file to verify it"
                        .into(),
                );
            };
            let ip: std::net::IpAddr = ip.parse().map_err(|e| format!("pod IP {ip:?}: {e}"))?;
            let addr = SocketAddr::new(ip, pod.admin_port);
            tokio::time::timeout(
                PUSH_TIMEOUT,
                https_put(tls, addr, server_name, path, body, token),
            )
            .await
            .map_err(|_| format!("timed out after {PUSH_TIMEOUT:?}"))??
        } else {
            self.http_put(ip, pod.admin_port, path, body, token).await?
        };
        if !(200..300).contains(&status) {
            return Err(Refusal::of(status, &text));
        }
        Ok(serde_json::from_str::<ConfigAck>(&text)
            .map_err(|e| format!("unreadable acknowledgement: {e}"))?)
    }

    async fn http_put(
        &self,
        ip: &str,
        port: u16,
        path: &str,
        body: Vec<u8>,
        token: Option<&str>,
    ) -> Result<(u16, String), String> {
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.to_owned()
        };
        let url = format!("http://{host}:{port}{path}");
        let mut req = self
            .http
            .put(&url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.map_err(|e| {
            if e.is_timeout() {
                format!("timed out after {PUSH_TIMEOUT:?}")
            } else {
                format!("connection failed: {e}")
            }
        })?;
        let status = resp.status().as_u16();
        Ok((status, resp.text().await.unwrap_or_default()))
    }
}

/// Why one `PUT` did not come back with an acknowledgement.
#[derive(Debug)]
enum Refusal {
    /// 400 with an error body starting `hash mismatch`: the pod computes another hash.
    HashMismatch(String),
    /// Anything else (the message says what).
    Other(String),
}

impl Refusal {
    /// The refusal a non-2xx answer is: a hash mismatch when it is 400 with an error body whose
    /// message starts `hash mismatch` ([`wire::ErrorBody::is_hash_mismatch`]).
    fn of(status: u16, text: &str) -> Self {
        let snippet: String = text.chars().take(200).collect();
        let message = format!("HTTP {status}: {snippet}");
        let hash_refused = status == 400
            && serde_json::from_str::<wire::ErrorBody>(text).is_ok_and(|b| b.is_hash_mismatch());
        if hash_refused {
            Refusal::HashMismatch(message)
        } else {
            Refusal::Other(message)
        }
    }
}

impl From<String> for Refusal {
    fn from(message: String) -> Self {
        Refusal::Other(message)
    }
}

impl From<&str> for Refusal {
    fn from(message: &str) -> Self {
        Refusal::Other(message.to_owned())
    }
}

impl From<Refusal> for String {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::HashMismatch(m) | Refusal::Other(m) => m,
        }
    }
}

/// Largest acknowledgement read from a worker.
const MAX_ACK_BYTES: usize = 64 * 1024;

/// One `PUT` of `path` over TLS to `addr`, verifying `server_name`; the status and body.
async fn https_put(
    tls: &Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    server_name: &str,
    path: &str,
    body: Vec<u8>,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    use bytes::Bytes;
    use http_body_util::{BodyExt as _, Full, Limited};
    let name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(|e| format!("invalid server name {server_name:?}: {e}"))?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connection failed: {e}"))?;
    let stream = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake (expecting {server_name}): {e}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP over TLS: {e}"))?;
    let driver = tokio::spawn(connection);
    let mut req = http::Request::builder()
        .method(http::Method::PUT)
        .uri(path)
        .header(http::header::HOST, server_name)
        .header(http::header::CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let result = async {
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("HTTP over TLS: {e}"))?;
        let status = resp.status().as_u16();
        let bytes = Limited::new(resp.into_body(), MAX_ACK_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }
    .await;
    driver.abort();
    result
}

#[cfg(test)]
mod tests;
