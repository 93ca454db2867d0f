//! Authentication of configuration pushes: a bearer token checked by a [`TokenVerifier`].
//!
//! The real verifier, [`TokenReviewVerifier`] (cargo feature `kube`, on by default), asks the
//! Kubernetes API server with a `TokenReview` for this worker's own audience,
//! [`push_audience`](backpressure_api::wire::push_audience)`(namespace, workload)`: the operator
//! mints one token per target, so a token that one target's pod received cannot configure
//! another target's workers. The worker's ServiceAccount needs `create` on
//! `tokenreviews.authentication.k8s.io` (the `system:auth-delegator` ClusterRole).
//!
//! A TokenReview costs the API server a request, so before one is made the verifier
//!
//! 1. checks the token locally ([`check_jwt`]): three base64url parts, a JSON payload, `exp` in
//!    the future and our audience in `aud`. The signature is not checked (the TokenReview stays
//!    the authority); this only keeps garbage, expired tokens and other targets' tokens away from
//!    the API server;
//! 2. answers from a short cache of positive reviews (keyed by a SHA-256 of the token);
//! 3. refuses a token the API server refused in the last [`DEFAULT_NEGATIVE_TTL`] (a
//!    [`NegativeCache`], also keyed by the token's SHA-256).
//!
//! The admin server adds a per-source limit on failed authentications (`admin`). Tokens are
//! never logged.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

/// Who a token belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The authenticated username, for a ServiceAccount
    /// `system:serviceaccount:<namespace>:<name>`.
    pub username: String,
}

/// Why a token was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The token is not valid (or not for our audience): HTTP 401.
    #[error("token not authenticated: {0}")]
    Unauthenticated(String),
    /// The token could not be checked (API server unreachable): HTTP 503.
    #[error("token review unavailable: {0}")]
    Unavailable(String),
}

/// Checks a bearer token. Object safe.
pub trait TokenVerifier: Send + Sync {
    /// The identity of `token`, if it is valid for our audience.
    fn verify<'a>(
        &'a self,
        token: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Identity, VerifyError>> + Send + 'a>>;
}

/// The username of a ServiceAccount.
pub fn service_account_username(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// The SHA-256 of a token: the key of the caches, so that no token is kept in memory longer
/// than its request.
pub fn token_key(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Longest token looked at; a ServiceAccount token is about 1 KiB.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The local check of a token before any TokenReview: a JWT (three base64url parts, the first
/// two JSON objects) whose `exp` is after `now_unix` and whose `aud` (a string or a list)
/// contains `audience`. The signature is NOT checked: only the API server can, and it does in
/// the TokenReview that follows. The error says which part is wrong (never the token).
pub fn check_jwt(token: &str, audience: &str, now_unix: i64) -> Result<(), String> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(format!("token longer than {MAX_TOKEN_BYTES} bytes"));
    }
    let parts: Vec<&str> = token.split('.').collect();
    let [header, payload, signature] = parts.as_slice() else {
        return Err("not a JWT (expected three dot-separated parts)".into());
    };
    if signature.is_empty() {
        return Err("not a JWT (empty signature)".into());
    }
    let json = |part: &str, name: &str| -> Result<serde_json::Value, String> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(part.trim_end_matches('='))
            .map_err(|_| format!("not a JWT ({name} is not base64url)"))?;
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|_| format!("not a JWT ({name} is not JSON)"))?;
        if value.is_object() {
            Ok(value)
        } else {
            Err(format!("not a JWT ({name} is not a JSON object)"))
        }
    };
    json(header, "header")?;
    let claims = json(payload, "payload")?;
    match claims.get("exp").and_then(serde_json::Value::as_f64) {
        Some(exp) if exp > now_unix as f64 => {}
        Some(_) => return Err("token expired".into()),
        None => return Err("token has no exp claim".into()),
    }
    let ours = match claims.get("aud") {
        Some(serde_json::Value::String(a)) => a == audience,
        Some(serde_json::Value::Array(all)) => all.iter().any(|a| a.as_str() == Some(audience)),
        _ => false,
    };
    if !ours {
        return Err(format!("token is not for audience {audience:?}"));
    }
    Ok(())
}

/// Default time a refused token is refused without asking the API server again.
pub const DEFAULT_NEGATIVE_TTL: Duration = Duration::from_secs(30);
/// Most tokens remembered as refused; beyond it, expired entries are dropped, then the oldest.
pub const NEGATIVE_CACHE_MAX: usize = 1024;

/// Token hashes the API server refused recently, with a bounded size: a client repeating a
/// refused token costs one TokenReview per [`DEFAULT_NEGATIVE_TTL`], not one per request.
#[derive(Debug)]
pub struct NegativeCache {
    ttl: Duration,
    max: usize,
    entries: Mutex<HashMap<[u8; 32], Instant>>,
}

impl NegativeCache {
    /// A cache keeping each refusal for `ttl` (zero disables it), at most `max` entries.
    pub fn new(ttl: Duration, max: usize) -> Self {
        NegativeCache {
            ttl,
            max: max.max(1),
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Instant>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `key` was refused less than the TTL ago.
    pub fn contains(&self, key: &[u8; 32]) -> bool {
        self.lock()
            .get(key)
            .is_some_and(|until| Instant::now() < *until)
    }

    /// Remembers that `key` was refused.
    pub fn insert(&self, key: [u8; 32]) {
        if self.ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut entries = self.lock();
        if entries.len() >= self.max && !entries.contains_key(&key) {
            entries.retain(|_, until| *until > now);
            while entries.len() >= self.max {
                let Some(oldest) = entries
                    .iter()
                    .min_by_key(|(_, until)| **until)
                    .map(|e| *e.0)
                else {
                    break;
                };
                entries.remove(&oldest);
            }
        }
        entries.insert(key, now + self.ttl);
    }

    /// Entries held (expired ones included until pruned).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(feature = "kube")]
pub use self::review::TokenReviewVerifier;

#[cfg(feature = "kube")]
mod review {
    use std::collections::HashMap;
    use std::fmt;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use backpressure_api::wire::push_audience;
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    use kube::api::{Api, PostParams};
    use tokio::time::Instant;

    use super::{
        DEFAULT_NEGATIVE_TTL, Identity, NEGATIVE_CACHE_MAX, NegativeCache, TokenVerifier,
        VerifyError, check_jwt, token_key,
    };

    /// Default time a positive review is cached.
    pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(60);
    /// Most cached reviews; beyond it, expired entries are dropped, then all.
    const CACHE_MAX: usize = 256;

    /// Verifies tokens with a Kubernetes `TokenReview`, for one audience.
    pub struct TokenReviewVerifier {
        client: kube::Client,
        audience: String,
        ttl: Duration,
        cache: Mutex<HashMap<[u8; 32], (Identity, Instant)>>,
        refused: NegativeCache,
    }

    impl fmt::Debug for TokenReviewVerifier {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("TokenReviewVerifier")
                .field("audience", &self.audience)
                .field("ttl", &self.ttl)
                .finish_non_exhaustive()
        }
    }

    fn unix_now() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }

    impl TokenReviewVerifier {
        /// A verifier for the workers of `workload` in `namespace`: it accepts only tokens for
        /// the audience [`push_audience`]`(namespace, workload)`. `namespace` is the pod's own
        /// (the downward API's `metadata.namespace`, or the ServiceAccount's namespace file;
        /// [`kube::Client::default_namespace`] in cluster) and `workload` the value of the
        /// `workload` label of the worker's metrics: both known to the worker without trusting
        /// whoever pushes.
        pub fn new(client: kube::Client, namespace: &str, workload: &str) -> Self {
            Self::with_audience(client, push_audience(namespace, workload))
        }

        /// A verifier for an explicit audience.
        pub fn with_audience(client: kube::Client, audience: impl Into<String>) -> Self {
            TokenReviewVerifier {
                client,
                audience: audience.into(),
                ttl: DEFAULT_CACHE_TTL,
                cache: Mutex::new(HashMap::new()),
                refused: NegativeCache::new(DEFAULT_NEGATIVE_TTL, NEGATIVE_CACHE_MAX),
            }
        }

        /// The audience accepted.
        pub fn audience(&self) -> &str {
            &self.audience
        }

        /// Caches positive reviews for `ttl` (zero disables the cache).
        pub fn with_cache_ttl(mut self, ttl: Duration) -> Self {
            self.ttl = ttl;
            self
        }

        /// Remembers refused tokens for `ttl` (zero disables the negative cache).
        pub fn with_negative_ttl(mut self, ttl: Duration) -> Self {
            self.refused = NegativeCache::new(ttl, NEGATIVE_CACHE_MAX);
            self
        }

        fn cached(&self, key: &[u8; 32]) -> Option<Identity> {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            match cache.get(key) {
                Some((id, until)) if Instant::now() < *until => Some(id.clone()),
                _ => None,
            }
        }

        fn remember(&self, key: [u8; 32], id: &Identity) {
            if self.ttl.is_zero() {
                return;
            }
            let now = Instant::now();
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() >= CACHE_MAX {
                cache.retain(|_, (_, until)| *until > now);
                if cache.len() >= CACHE_MAX {
                    cache.clear();
                }
            }
            cache.insert(key, (id.clone(), now + self.ttl));
        }

        async fn review(&self, token: &str) -> Result<Identity, VerifyError> {
            // First, so that a cached token stops working at its `exp`, not up to a TTL later.
            check_jwt(token, &self.audience, unix_now()).map_err(VerifyError::Unauthenticated)?;
            let key = token_key(token);
            if let Some(id) = self.cached(&key) {
                return Ok(id);
            }
            if self.refused.contains(&key) {
                return Err(VerifyError::Unauthenticated(
                    "token refused by the API server within the last seconds".into(),
                ));
            }
            match self.ask(token).await {
                Ok(id) => {
                    self.remember(key, &id);
                    Ok(id)
                }
                Err(e @ VerifyError::Unauthenticated(_)) => {
                    self.refused.insert(key);
                    Err(e)
                }
                Err(e) => Err(e),
            }
        }

        async fn ask(&self, token: &str) -> Result<Identity, VerifyError> {
            let api: Api<TokenReview> = Api::all(self.client.clone());
            let review = TokenReview {
                spec: TokenReviewSpec {
                    audiences: Some(vec![self.audience.clone()]),
                    token: Some(token.to_owned()),
                },
                ..TokenReview::default()
            };
            let result = api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| VerifyError::Unavailable(e.to_string()))?;
            let status = result.status.unwrap_or_default();
            if status.authenticated != Some(true) {
                let reason = status
                    .error
                    .filter(|e| !e.is_empty())
                    .unwrap_or_else(|| "not authenticated".to_owned());
                return Err(VerifyError::Unauthenticated(reason));
            }
            // The API server returns the audiences the token is valid for among those asked.
            let audiences = status.audiences.unwrap_or_default();
            if !audiences.iter().any(|a| a == &self.audience) {
                return Err(VerifyError::Unauthenticated(format!(
                    "token is not for audience {:?}",
                    self.audience
                )));
            }
            let username = status
                .user
                .and_then(|u| u.username)
                .filter(|u| !u.is_empty())
                .ok_or_else(|| VerifyError::Unauthenticated("review names no user".to_owned()))?;
            Ok(Identity { username })
        }
    }

    impl TokenVerifier for TokenReviewVerifier {
        fn verify<'a>(
            &'a self,
            token: &'a str,
        ) -> Pin<Box<dyn Future<Output = Result<Identity, VerifyError>> + Send + 'a>> {
            Box::pin(self.review(token))
        }
    }
}

#[cfg(test)]
mod tests;
