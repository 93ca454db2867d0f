//! The admin HTTP server: `PUT`/`GET` [`CONFIG_PATH`] (a worker), `PUT`/`GET`
//! [`PRODUCER_PATH`] (a producer), `GET /metrics`, `GET /healthz`.
//!
//! A pod serves the worker config ([`Admin::new`]), the producer state
//! ([`Admin::for_producer`]) or both ([`Admin::with_producer`]: a pipeline stage that consumes
//! one queue and feeds the next); a path it does not serve answers 404. Both documents go
//! through the same code: the same authentication (bearer token, [`TokenVerifier`], allowed
//! identities, [`FailureLimit`]), body limits and status codes.
//!
//! Answers follow the wire contract (`backpressure_api::wire`): 200 with a [`ConfigAck`] when a
//! push is applied or already running, 400 for a malformed or invalid payload, 401 without a
//! valid token (missing, not a bearer token, rejected by the [`TokenVerifier`], wrong audience),
//! 403 for a valid token of an identity that is not allowed, 409 for a payload older than the
//! running generation, 413 for a body over [`MAX_PAYLOAD_BYTES`]; also 408 when the body does
//! not arrive in time, 429 (with `Retry-After`) for a source that failed authentication too
//! often ([`FailureLimit`]) and 503 when the token cannot be checked. The token is checked
//! before the body is read. Errors are JSON `{"error": "..."}` ([`ErrorBody`]); a hash that
//! matches neither the canonical nor the legacy hash of the content is refused with 400 and
//! a message starting `hash mismatch`. The specification is `docs/wire-contract.md`.
//!
//! The source of a request is the peer IP address, which [`Admin::serve`] attaches to each
//! request as a [`SocketAddr`] extension (a request handed to [`Admin::handle`] without it
//! counts against one shared "unknown" source).

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backpressure_api::wire::{
    CONFIG_PATH, ConfigAck, ConfigError, ErrorBody, MAX_PAYLOAD_BYTES, PRODUCER_PATH,
};
use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Body;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::token::{Identity, TokenVerifier, VerifyError};
use super::{Apply, ApplyError, ConfigState, Origin};
use crate::conformance::{self, HOOK_PATH};
use crate::metrics::Metrics;
use crate::producer::ProducerGate;

/// Path of the liveness endpoint.
pub const HEALTHZ_PATH: &str = "/healthz";
/// Path of the metrics endpoint.
pub const METRICS_PATH: &str = "/metrics";
/// Default time allowed for a request's headers.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time allowed for a request's body.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How many failed authentications a source may make: a bucket of `burst` failures refilled
/// by one every `refill`. A source whose bucket is empty gets 429 for every push, before its
/// token is looked at, until a failure's worth has refilled; successful pushes cost nothing.
/// The operator retries a refused pod with exponential backoff (1 s doubling to 60 s), far
/// below the default rate, so only a source replaying or guessing tokens is throttled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureLimit {
    /// Failures allowed in a row.
    pub burst: u32,
    /// Time for one failure to be forgiven.
    pub refill: Duration,
}

impl Default for FailureLimit {
    fn default() -> Self {
        FailureLimit {
            burst: 10,
            refill: Duration::from_secs(2),
        }
    }
}

/// Most sources tracked; beyond it, sources with a full bucket are forgotten, and if all are
/// busy, new sources share one bucket (so many addresses cannot grow the map without bound).
const MAX_SOURCES: usize = 4096;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// Failures still allowed.
    credit: f64,
    at: Instant,
}

/// Per-source failed-authentication buckets.
#[derive(Debug)]
struct Limiter {
    limit: FailureLimit,
    buckets: Mutex<HashMap<Option<IpAddr>, Bucket>>,
}

impl Limiter {
    fn new(limit: FailureLimit) -> Self {
        Limiter {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn refilled(&self, b: Bucket, now: Instant) -> Bucket {
        let burst = f64::from(self.limit.burst.max(1));
        let per = self.limit.refill.as_secs_f64();
        let gained = if per > 0.0 {
            now.saturating_duration_since(b.at).as_secs_f64() / per
        } else {
            burst
        };
        Bucket {
            credit: (b.credit + gained).min(burst),
            at: now,
        }
    }

    fn key(
        &self,
        buckets: &HashMap<Option<IpAddr>, Bucket>,
        source: Option<IpAddr>,
    ) -> Option<IpAddr> {
        if buckets.contains_key(&source) || buckets.len() < MAX_SOURCES {
            source
        } else {
            None
        }
    }

    /// `None` when `source` may try to authenticate; otherwise how long until it may.
    fn throttled(&self, source: Option<IpAddr>) -> Option<Duration> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let key = self.key(&buckets, source);
        let b = self.refilled(*buckets.get(&key)?, now);
        buckets.insert(key, b);
        (b.credit < 1.0).then(|| self.limit.refill.mul_f64((1.0 - b.credit).clamp(0.0, 1.0)))
    }

    /// Charges one failed authentication to `source`.
    fn failed(&self, source: Option<IpAddr>) {
        let now = Instant::now();
        let burst = f64::from(self.limit.burst.max(1));
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_SOURCES && !buckets.contains_key(&source) {
            let full: Vec<Option<IpAddr>> = buckets
                .iter()
                .filter(|(_, b)| self.refilled(**b, now).credit >= burst)
                .map(|(k, _)| *k)
                .collect();
            for k in full {
                buckets.remove(&k);
            }
        }
        let key = self.key(&buckets, source);
        let b = buckets.get(&key).copied().map_or(
            Bucket {
                credit: burst,
                at: now,
            },
            |b| self.refilled(b, now),
        );
        buckets.insert(
            key,
            Bucket {
                credit: (b.credit - 1.0).max(0.0),
                at: now,
            },
        );
    }
}

/// The admin endpoint: serves the running worker config and/or producer state, metrics and
/// health, and accepts pushes from allowed identities.
pub struct Admin {
    state: Option<ConfigState>,
    producer: Option<ProducerGate>,
    metrics: Option<Metrics>,
    verifier: Option<Arc<dyn TokenVerifier>>,
    /// Checks producer pushes instead of `verifier` when the producer workload's audience is
    /// not the worker's (see [`Admin::with_producer_verifier`]).
    producer_verifier: Option<Arc<dyn TokenVerifier>>,
    allowed: Vec<String>,
    header_timeout: Duration,
    body_timeout: Duration,
    limiter: Limiter,
    /// Serves `POST` [`HOOK_PATH`] (see [`Admin::with_conformance_hook`]).
    conformance_hook: bool,
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("state", &self.state)
            .field("producer", &self.producer)
            .field("allowed", &self.allowed)
            .field("pushes", &self.verifier.is_some())
            .finish_non_exhaustive()
    }
}

/// Which document a request is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Config,
    Producer,
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r
}

fn error(status: StatusCode, message: impl fmt::Display) -> Reply {
    let body = ErrorBody {
        error: message.to_string(),
    };
    match serde_json::to_vec(&body) {
        Ok(bytes) => reply(status, "application/json", bytes),
        // A struct of one string always serializes; keep the status regardless.
        Err(_) => reply(status, "text/plain", body.error),
    }
}

fn ack_reply(ack: &ConfigAck) -> Reply {
    match serde_json::to_vec(ack) {
        Ok(body) => reply(StatusCode::OK, "application/json", body),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

impl Admin {
    fn empty(metrics: Option<Metrics>) -> Self {
        Admin {
            state: None,
            producer: None,
            metrics,
            verifier: None,
            producer_verifier: None,
            allowed: Vec::new(),
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            limiter: Limiter::new(FailureLimit::default()),
            conformance_hook: false,
        }
    }

    /// A worker's admin endpoint (the worker config on [`CONFIG_PATH`]); it accepts no pushes
    /// until [`Admin::with_verifier`].
    pub fn new(state: ConfigState, metrics: Option<Metrics>) -> Self {
        Admin {
            state: Some(state),
            ..Admin::empty(metrics)
        }
    }

    /// A producer pod's admin endpoint: the producer state on [`PRODUCER_PATH`], no worker
    /// config ([`CONFIG_PATH`] answers 404). It accepts no pushes until
    /// [`Admin::with_verifier`], whose verifier is for the producer workload's audience
    /// (`push_audience(namespace, producerWorkload)`).
    pub fn for_producer(gate: ProducerGate, metrics: Option<Metrics>) -> Self {
        Admin {
            producer: Some(gate),
            ..Admin::empty(metrics)
        }
    }

    /// Also serves the producer state of `gate` on [`PRODUCER_PATH`], authenticated as the
    /// worker config (the same verifier, unless [`Admin::with_producer_verifier`]).
    pub fn with_producer(mut self, gate: ProducerGate) -> Self {
        self.producer = Some(gate);
        self
    }

    /// Checks producer pushes with `verifier` instead of the one of [`Admin::with_verifier`]:
    /// for a pod that is a worker of one workload and a producer of another, whose tokens
    /// carry different audiences. Everything else (allowed identities, failure limit) is
    /// shared. Without [`Admin::with_verifier`] no push is accepted at all.
    pub fn with_producer_verifier(mut self, verifier: Arc<dyn TokenVerifier>) -> Self {
        self.producer_verifier = Some(verifier);
        self
    }

    /// The per-source limit on failed authentications (default [`FailureLimit::default`]).
    pub fn with_failure_limit(mut self, limit: FailureLimit) -> Self {
        self.limiter = Limiter::new(limit);
        self
    }

    /// Accepts pushes whose token `verifier` maps to one of `allowed` usernames (for a
    /// ServiceAccount, see [`super::token::service_account_username`]).
    pub fn with_verifier(
        mut self,
        verifier: Arc<dyn TokenVerifier>,
        allowed: impl IntoIterator<Item = String>,
    ) -> Self {
        self.verifier = Some(verifier);
        self.allowed = allowed.into_iter().collect();
        self
    }

    /// Also serves the conformance hook, `POST` [`HOOK_PATH`]: one golden-vector case run on a
    /// fresh controller ([`crate::conformance`]), for the conformance suite. For conformance
    /// runs only: the hook takes no token (it touches no state of the worker, but it costs
    /// CPU), so a production worker leaves it off, the default.
    pub fn with_conformance_hook(mut self) -> Self {
        self.conformance_hook = true;
        self
    }

    /// Time limits for a request's headers and body.
    pub fn with_timeouts(mut self, headers: Duration, body: Duration) -> Self {
        self.header_timeout = headers;
        self.body_timeout = body;
        self
    }

    /// The worker configuration state, if this pod is a worker.
    pub fn state(&self) -> Option<&ConfigState> {
        self.state.as_ref()
    }

    /// The producer gate, if this pod is a producer.
    pub fn producer(&self) -> Option<&ProducerGate> {
        self.producer.as_ref()
    }

    /// What `endpoint` applies to, if this pod serves it.
    fn target(&self, endpoint: Endpoint) -> Option<&dyn Apply> {
        match endpoint {
            Endpoint::Config => self.state.as_ref().map(|s| s as &dyn Apply),
            Endpoint::Producer => self.producer.as_ref().map(|p| p as &dyn Apply),
        }
    }

    fn running(&self, endpoint: Endpoint) -> Option<ConfigAck> {
        match endpoint {
            Endpoint::Config => self.state.as_ref().map(ConfigState::ack),
            Endpoint::Producer => self.producer.as_ref().map(ProducerGate::ack),
        }
    }

    /// Answers one request.
    pub async fn handle<B>(&self, req: Request<B>) -> Reply
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let path = req.uri().path();
        let endpoint = match path {
            CONFIG_PATH => Some(Endpoint::Config),
            PRODUCER_PATH => Some(Endpoint::Producer),
            _ => None,
        };
        match (req.method(), path, endpoint) {
            (&Method::GET, HEALTHZ_PATH, _) => reply(StatusCode::OK, "text/plain", "ok\n"),
            (&Method::GET, METRICS_PATH, _) => match &self.metrics {
                Some(m) => reply(StatusCode::OK, OPENMETRICS, m.encode()),
                None => error(StatusCode::NOT_FOUND, "no metrics registered"),
            },
            (_, _, Some(endpoint)) if self.target(endpoint).is_none() => {
                let what = match endpoint {
                    Endpoint::Config => "this pod runs no worker config",
                    Endpoint::Producer => "this pod runs no producer gate",
                };
                error(StatusCode::NOT_FOUND, what)
            }
            (&Method::GET, _, Some(endpoint)) => match self.running(endpoint) {
                Some(ack) => ack_reply(&ack),
                None => error(StatusCode::NOT_FOUND, "not found"),
            },
            (&Method::PUT, _, Some(endpoint)) => self.push(req, endpoint).await,
            (&Method::POST, HOOK_PATH, _) if self.conformance_hook => self.hook(req).await,
            (_, HEALTHZ_PATH | METRICS_PATH, _) | (_, _, Some(_)) => {
                error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
            }
            _ => error(StatusCode::NOT_FOUND, "not found"),
        }
    }

    /// A push of either document: authenticated, read and applied by the same code.
    async fn push<B>(&self, req: Request<B>, endpoint: Endpoint) -> Reply
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let Some(target) = self.target(endpoint) else {
            return error(StatusCode::NOT_FOUND, "not found");
        };
        let identity = match self.authenticate(&req, endpoint).await {
            Ok(identity) => identity,
            Err(refused) => return refused,
        };
        let bytes = match self.read_body(req).await {
            Ok(bytes) => bytes,
            Err(refused) => return refused,
        };
        match target.apply_bytes(&bytes, Origin::Push) {
            Ok(ack) => {
                tracing::info!(user = %identity.username, kind = target.kind(), hash = %ack.hash, generation = ack.generation, "push accepted");
                ack_reply(&ack)
            }
            Err(ApplyError::Invalid(e @ ConfigError::TooLarge(_))) => {
                error(StatusCode::PAYLOAD_TOO_LARGE, e)
            }
            Err(ApplyError::Invalid(e)) => error(StatusCode::BAD_REQUEST, e),
            Err(e @ ApplyError::Stale { .. }) => error(StatusCode::CONFLICT, e),
        }
    }

    /// The conformance hook: the case in the body run on a fresh controller; 400 for a body
    /// that is not a case, 413 over [`conformance::MAX_CASE_BYTES`].
    async fn hook<B>(&self, req: Request<B>) -> Reply
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let body = Limited::new(req.into_body(), conformance::MAX_CASE_BYTES);
        let bytes = match tokio::time::timeout(self.body_timeout, body.collect()).await {
            Err(_) => return error(StatusCode::REQUEST_TIMEOUT, "request body timed out"),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!(
                        "case exceeds the limit of {} bytes",
                        conformance::MAX_CASE_BYTES
                    ),
                );
            }
            Ok(Err(e)) => return error(StatusCode::BAD_REQUEST, format!("reading body: {e}")),
            Ok(Ok(collected)) => collected.to_bytes(),
        };
        match conformance::parse(&bytes).and_then(|case| conformance::execute(&case)) {
            Ok(out) => match serde_json::to_vec(&out) {
                Ok(body) => reply(StatusCode::OK, "application/json", body),
                Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
            },
            Err(e) => error(StatusCode::BAD_REQUEST, e),
        }
    }

    /// The pusher's identity, or the refusal: the failure limit first (429), then the bearer
    /// token (401), the verifier (401, 503) and the allowed identities (403). Every failure
    /// but an unavailable verifier is charged to the source.
    async fn authenticate<B>(
        &self,
        req: &Request<B>,
        endpoint: Endpoint,
    ) -> Result<Identity, Reply> {
        let verifier = match endpoint {
            Endpoint::Producer if self.verifier.is_some() => {
                self.producer_verifier.as_ref().or(self.verifier.as_ref())
            }
            _ => self.verifier.as_ref(),
        };
        let Some(verifier) = verifier else {
            return Err(error(
                StatusCode::UNAUTHORIZED,
                "pushes are disabled on this pod",
            ));
        };
        let source = req.extensions().get::<SocketAddr>().map(SocketAddr::ip);
        if let Some(wait) = self.limiter.throttled(source) {
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "too many failed authentications from this address; retry later",
            );
            let secs = wait.as_secs().max(1).to_string();
            if let Ok(v) = http::HeaderValue::from_str(&secs) {
                r.headers_mut().insert(http::header::RETRY_AFTER, v);
            }
            return Err(r);
        }
        let Some(token) = bearer(req) else {
            self.limiter.failed(source);
            return Err(error(StatusCode::UNAUTHORIZED, "missing bearer token"));
        };
        let identity = match verifier.verify(token).await {
            Ok(id) => id,
            Err(e @ VerifyError::Unauthenticated(_)) => {
                self.limiter.failed(source);
                tracing::warn!(error = %e, ?source, ?endpoint, "push refused: unauthenticated");
                return Err(error(StatusCode::UNAUTHORIZED, e));
            }
            Err(e @ VerifyError::Unavailable(_)) => {
                tracing::warn!(error = %e, ?endpoint, "push refused: cannot review the token");
                return Err(error(StatusCode::SERVICE_UNAVAILABLE, e));
            }
        };
        if !self.allowed.iter().any(|a| a == &identity.username) {
            self.limiter.failed(source);
            tracing::warn!(user = %identity.username, ?source, ?endpoint, "push refused: identity not allowed");
            return Err(error(
                StatusCode::FORBIDDEN,
                format!("{} may not configure this pod", identity.username),
            ));
        }
        Ok(identity)
    }

    /// The body, at most [`MAX_PAYLOAD_BYTES`] (413) within the body timeout (408).
    async fn read_body<B>(&self, req: Request<B>) -> Result<Bytes, Reply>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if let Some(n) = declared.filter(|n| *n > MAX_PAYLOAD_BYTES) {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                ConfigError::TooLarge(n),
            ));
        }
        let body = Limited::new(req.into_body(), MAX_PAYLOAD_BYTES);
        match tokio::time::timeout(self.body_timeout, body.collect()).await {
            Err(_) => Err(error(StatusCode::REQUEST_TIMEOUT, "request body timed out")),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("document exceeds the limit of {MAX_PAYLOAD_BYTES} bytes"),
            )),
            Ok(Err(e)) => Err(error(StatusCode::BAD_REQUEST, format!("reading body: {e}"))),
            Ok(Ok(collected)) => Ok(collected.to_bytes()),
        }
    }

    /// Serves connections from `listener` until `shutdown` resolves; connections in progress
    /// finish on their own.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        self.accept_loop(listener, None, shutdown).await
    }

    /// [`Admin::serve`] over TLS with `config` (see [`super::tls`]): every connection must
    /// complete a TLS handshake within the header timeout; plain HTTP is not answered.
    #[cfg(feature = "tls")]
    pub async fn serve_tls(
        self: Arc<Self>,
        listener: TcpListener,
        config: Arc<rustls::ServerConfig>,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        self.accept_loop(listener, Some(acceptor), shutdown).await
    }

    async fn accept_loop(
        self: Arc<Self>,
        listener: TcpListener,
        #[cfg(feature = "tls")] tls: Option<tokio_rustls::TlsAcceptor>,
        #[cfg(not(feature = "tls"))] tls: Option<std::convert::Infallible>,
        shutdown: impl Future<Output = ()>,
    ) -> std::io::Result<()> {
        tokio::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                _ = &mut shutdown => return Ok(()),
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "admin accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let admin = self.clone();
            match &tls {
                None => {
                    tokio::spawn(async move { admin.connection(TokioIo::new(stream), peer).await });
                }
                #[cfg(feature = "tls")]
                Some(acceptor) => {
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        let handshake =
                            tokio::time::timeout(admin.header_timeout, acceptor.accept(stream));
                        match handshake.await {
                            Ok(Ok(tls)) => admin.connection(TokioIo::new(tls), peer).await,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "admin TLS handshake failed");
                            }
                            Err(_) => tracing::debug!(%peer, "admin TLS handshake timed out"),
                        }
                    });
                }
                #[cfg(not(feature = "tls"))]
                Some(never) => match *never {},
            }
        }
    }

    async fn connection<I>(self: Arc<Self>, io: I, peer: SocketAddr)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let admin = self.clone();
        let service = hyper::service::service_fn(move |mut req: Request<hyper::body::Incoming>| {
            let admin = admin.clone();
            req.extensions_mut().insert(peer);
            async move { Ok::<_, Infallible>(admin.handle(req).await) }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_timeout);
        if let Err(e) = builder.serve_connection(io, service).await {
            tracing::debug!(%peer, error = %e, "admin connection ended with an error");
        }
    }
}

fn bearer<B>(req: &Request<B>) -> Option<&str> {
    let value = req.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}
