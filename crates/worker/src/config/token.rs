//! Authentication of configuration pushes: a bearer token checked by a [`TokenVerifier`].
//!
//! The real verifier, [`TokenReviewVerifier`] (cargo feature `kube`, on by default), asks the
//! Kubernetes API server with a `TokenReview` for audience
//! [`TOKEN_AUDIENCE`](backpressure_api::wire::TOKEN_AUDIENCE). The worker's ServiceAccount needs
//! `create` on `tokenreviews.authentication.k8s.io` (the `system:auth-delegator` ClusterRole).
//! Positive reviews are cached briefly, keyed by a SHA-256 of the token; tokens are never logged.

use std::future::Future;
use std::pin::Pin;

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

#[cfg(feature = "kube")]
pub use self::review::TokenReviewVerifier;

#[cfg(feature = "kube")]
mod review {
    use std::collections::HashMap;
    use std::fmt;
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::time::Duration;

    use backpressure_api::wire::TOKEN_AUDIENCE;
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    use kube::api::{Api, PostParams};
    use sha2::{Digest, Sha256};
    use tokio::time::Instant;

    use super::{Identity, TokenVerifier, VerifyError};

    /// Default time a positive review is cached.
    pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(60);
    /// Most cached reviews; beyond it, expired entries are dropped, then all.
    const CACHE_MAX: usize = 256;

    /// Verifies tokens with a Kubernetes `TokenReview`.
    pub struct TokenReviewVerifier {
        client: kube::Client,
        audience: String,
        ttl: Duration,
        cache: Mutex<HashMap<[u8; 32], (Identity, Instant)>>,
    }

    impl fmt::Debug for TokenReviewVerifier {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("TokenReviewVerifier")
                .field("audience", &self.audience)
                .field("ttl", &self.ttl)
                .finish_non_exhaustive()
        }
    }

    impl TokenReviewVerifier {
        /// A verifier for audience [`TOKEN_AUDIENCE`] using `client`.
        pub fn new(client: kube::Client) -> Self {
            TokenReviewVerifier {
                client,
                audience: TOKEN_AUDIENCE.to_owned(),
                ttl: DEFAULT_CACHE_TTL,
                cache: Mutex::new(HashMap::new()),
            }
        }

        /// Caches positive reviews for `ttl` (zero disables the cache).
        pub fn with_cache_ttl(mut self, ttl: Duration) -> Self {
            self.ttl = ttl;
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
            let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            if let Some(id) = self.cached(&key) {
                return Ok(id);
            }
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
            let id = Identity { username };
            self.remember(key, &id);
            Ok(id)
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
