//! The admin HTTP server: `PUT`/`GET` [`CONFIG_PATH`], `GET /metrics`, `GET /healthz`.
//!
//! Answers follow the wire contract (`backpressure_api::wire`): 200 with a [`ConfigAck`] when a
//! push is applied or already running, 400 for a malformed or invalid payload, 401 without a
//! valid token (missing, not a bearer token, rejected by the [`TokenVerifier`], wrong audience),
//! 403 for a valid token of an identity that is not allowed, 409 for a payload older than the
//! running generation, 413 for a body over [`MAX_PAYLOAD_BYTES`]; also 408 when the body does
//! not arrive in time, 429 (with `Retry-After`) for a source that failed authentication too
//! often ([`FailureLimit`]) and 503 when the token cannot be checked. The token is checked
//! before the body is read. Errors are JSON `{"error": "..."}`.
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

use backpressure_api::wire::{CONFIG_PATH, ConfigAck, ConfigError, MAX_PAYLOAD_BYTES};
use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Body;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::token::{TokenVerifier, VerifyError};
use super::{ApplyError, ConfigState, Origin};
use crate::metrics::Metrics;

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

/// The admin endpoint: serves the running config, metrics and health, and accepts pushes from
/// allowed identities.
pub struct Admin {
    state: ConfigState,
    metrics: Option<Metrics>,
    verifier: Option<Arc<dyn TokenVerifier>>,
    allowed: Vec<String>,
    header_timeout: Duration,
    body_timeout: Duration,
    limiter: Limiter,
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("state", &self.state)
            .field("allowed", &self.allowed)
            .field("pushes", &self.verifier.is_some())
            .finish_non_exhaustive()
    }
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
    let body = serde_json::json!({ "error": message.to_string() }).to_string();
    reply(status, "application/json", body)
}

fn ack_reply(ack: &ConfigAck) -> Reply {
    match serde_json::to_vec(ack) {
        Ok(body) => reply(StatusCode::OK, "application/json", body),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

impl Admin {
    /// An admin endpoint that accepts no pushes (until [`Admin::with_verifier`]).
    pub fn new(state: ConfigState, metrics: Option<Metrics>) -> Self {
        Admin {
            state,
            metrics,
            verifier: None,
            allowed: Vec::new(),
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            limiter: Limiter::new(FailureLimit::default()),
        }
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

    /// Time limits for a request's headers and body.
    pub fn with_timeouts(mut self, headers: Duration, body: Duration) -> Self {
        self.header_timeout = headers;
        self.body_timeout = body;
        self
    }

    /// The configuration state.
    pub fn state(&self) -> &ConfigState {
        &self.state
    }

    /// Answers one request.
    pub async fn handle<B>(&self, req: Request<B>) -> Reply
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let path = req.uri().path();
        match (req.method(), path) {
            (&Method::GET, HEALTHZ_PATH) => reply(StatusCode::OK, "text/plain", "ok\n"),
            (&Method::GET, METRICS_PATH) => match &self.metrics {
                Some(m) => reply(StatusCode::OK, OPENMETRICS, m.encode()),
                None => error(StatusCode::NOT_FOUND, "no metrics registered"),
            },
            (&Method::GET, CONFIG_PATH) => ack_reply(&self.state.ack()),
            (&Method::PUT, CONFIG_PATH) => self.push(req).await,
            (_, HEALTHZ_PATH | METRICS_PATH | CONFIG_PATH) => {
                error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
            }
            _ => error(StatusCode::NOT_FOUND, "not found"),
        }
    }

    async fn push<B>(&self, req: Request<B>) -> Reply
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let Some(verifier) = &self.verifier else {
            return error(
                StatusCode::UNAUTHORIZED,
                "configuration pushes are disabled on this worker",
            );
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
            return r;
        }
        let Some(token) = bearer(&req) else {
            self.limiter.failed(source);
            return error(StatusCode::UNAUTHORIZED, "missing bearer token");
        };
        let identity = match verifier.verify(token).await {
            Ok(id) => id,
            Err(e @ VerifyError::Unauthenticated(_)) => {
                self.limiter.failed(source);
                tracing::warn!(error = %e, ?source, "config push refused: unauthenticated");
                return error(StatusCode::UNAUTHORIZED, e);
            }
            Err(e @ VerifyError::Unavailable(_)) => {
                tracing::warn!(error = %e, "config push refused: cannot review the token");
                return error(StatusCode::SERVICE_UNAVAILABLE, e);
            }
        };
        if !self.allowed.iter().any(|a| a == &identity.username) {
            self.limiter.failed(source);
            tracing::warn!(user = %identity.username, ?source, "config push refused: identity not allowed");
            return error(
                StatusCode::FORBIDDEN,
                format!("{} may not configure this worker", identity.username),
            );
        }
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if let Some(n) = declared.filter(|n| *n > MAX_PAYLOAD_BYTES) {
            return error(StatusCode::PAYLOAD_TOO_LARGE, ConfigError::TooLarge(n));
        }
        let body = Limited::new(req.into_body(), MAX_PAYLOAD_BYTES);
        let bytes = match tokio::time::timeout(self.body_timeout, body.collect()).await {
            Err(_) => return error(StatusCode::REQUEST_TIMEOUT, "request body timed out"),
            Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("worker config exceeds the limit of {MAX_PAYLOAD_BYTES} bytes"),
                );
            }
            Ok(Err(e)) => return error(StatusCode::BAD_REQUEST, format!("reading body: {e}")),
            Ok(Ok(collected)) => collected.to_bytes(),
        };
        match self.state.apply_bytes(&bytes, Origin::Push) {
            Ok(ack) => {
                tracing::info!(user = %identity.username, hash = %ack.hash, generation = ack.generation, "config push accepted");
                ack_reply(&ack)
            }
            Err(ApplyError::Invalid(e @ ConfigError::TooLarge(_))) => {
                error(StatusCode::PAYLOAD_TOO_LARGE, e)
            }
            Err(ApplyError::Invalid(e)) => error(StatusCode::BAD_REQUEST, e),
            Err(e @ ApplyError::Stale { .. }) => error(StatusCode::CONFLICT, e),
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
