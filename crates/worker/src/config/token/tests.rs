#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use base64::Engine as _;
use serde_json::json;

use super::*;

const AUD: &str = "backpressure.dev/shop/export";
const NOW: i64 = 1_700_000_000;

fn b64(v: &serde_json::Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
}

/// A JWT-shaped token with `claims` (unsigned: the signature part is filler).
pub(crate) fn jwt(claims: serde_json::Value) -> String {
    format!(
        "{}.{}.c2lnbmF0dXJl",
        b64(&json!({"alg": "RS256", "kid": "k"})),
        b64(&claims)
    )
}

#[test]
fn local_check_accepts_our_audience_and_refuses_everything_else_with_a_reason() {
    assert_eq!(
        check_jwt(&jwt(json!({"aud": [AUD], "exp": NOW + 600})), AUD, NOW),
        Ok(())
    );
    assert_eq!(
        check_jwt(&jwt(json!({"aud": AUD, "exp": NOW + 1})), AUD, NOW),
        Ok(())
    );
    assert_eq!(
        check_jwt(
            &jwt(json!({"aud": ["x", AUD], "exp": (NOW + 600) as f64})),
            AUD,
            NOW
        ),
        Ok(())
    );
    let payload = b64(&json!({"aud": [AUD], "exp": NOW + 600}));
    let cases: Vec<(String, &str)> = vec![
        ("not-a-jwt".into(), "three"),
        (format!("a.{payload}"), "three"),
        (format!("a.{payload}.s.d"), "three"),
        (format!("{payload}.{payload}."), "empty signature"),
        (format!("!!!.{payload}.s"), "header is not base64url"),
        (
            format!("{}.{payload}.s", b64(&json!([1]))),
            "header is not a JSON object",
        ),
        (format!("{payload}.bm90IGpzb24.s"), "payload is not JSON"),
        (jwt(json!({"aud": [AUD]})), "no exp"),
        (jwt(json!({"aud": [AUD], "exp": "soon"})), "no exp"),
        (jwt(json!({"aud": [AUD], "exp": NOW})), "expired"),
        (jwt(json!({"aud": [AUD], "exp": NOW - 3600})), "expired"),
        (jwt(json!({"exp": NOW + 600})), "audience"),
        // The old shared audience, another target's audience, a prefix of ours.
        (
            jwt(json!({"aud": ["backpressure.dev"], "exp": NOW + 600})),
            "audience",
        ),
        (
            jwt(json!({"aud": ["backpressure.dev/other/export"], "exp": NOW + 600})),
            "audience",
        ),
        (
            jwt(json!({"aud": ["backpressure.dev/shop/export-2"], "exp": NOW + 600})),
            "audience",
        ),
        (jwt(json!({"aud": [7], "exp": NOW + 600})), "audience"),
        ("a".repeat(MAX_TOKEN_BYTES + 1), "longer"),
    ];
    for (token, why) in cases {
        let err = check_jwt(&token, AUD, NOW).unwrap_err();
        assert!(err.contains(why), "{err:?} should say {why:?}");
        assert!(!err.contains(&token), "the error repeats the token");
    }
}

#[tokio::test(start_paused = true)]
async fn negative_cache_forgets_after_its_ttl_and_stays_bounded() {
    let cache = NegativeCache::new(Duration::from_secs(30), 4);
    let a = token_key("a");
    assert!(!cache.contains(&a));
    cache.insert(a);
    assert!(cache.contains(&a));
    tokio::time::advance(Duration::from_secs(29)).await;
    assert!(cache.contains(&a));
    tokio::time::advance(Duration::from_secs(2)).await;
    assert!(!cache.contains(&a), "kept past its TTL");

    for i in 0..100 {
        cache.insert(token_key(&format!("t{i}")));
        tokio::time::advance(Duration::from_millis(10)).await;
        assert!(cache.len() <= 4, "{} entries", cache.len());
    }
    // The newest are kept, the oldest dropped.
    assert!(cache.contains(&token_key("t99")));
    assert!(!cache.contains(&token_key("t0")));

    let off = NegativeCache::new(Duration::ZERO, 4);
    off.insert(a);
    assert!(!off.contains(&a));
}

#[cfg(feature = "kube")]
mod review {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};

    use super::*;

    /// A kube client whose API server answers every TokenReview itself: `operator-token` is the
    /// operator's for audience `AUD`, anything else is not authenticated. Counts the reviews.
    fn fake_api_server() -> (kube::Client, Arc<AtomicUsize>) {
        let reviews = Arc::new(AtomicUsize::new(0));
        let counter = reviews.clone();
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let counter = counter.clone();
            async move {
                assert!(req.uri().path().ends_with("/tokenreviews"), "{}", req.uri());
                counter.fetch_add(1, Ordering::SeqCst);
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let review: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let token = review["spec"]["token"].as_str().unwrap_or_default();
                let audiences = review["spec"]["audiences"].clone();
                let status = if token == operator_token() {
                    json!({"authenticated": true, "audiences": audiences,
                           "user": {"username": "system:serviceaccount:bp-system:backpressure-operator"}})
                } else {
                    json!({"authenticated": false, "error": "invalid bearer token"})
                };
                let answer = json!({
                    "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                    "metadata": {}, "spec": review["spec"], "status": status,
                });
                let resp = http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(serde_json::to_vec(&answer).unwrap())))
                    .unwrap();
                Ok::<_, Infallible>(resp)
            }
        });
        (kube::Client::new(service, "default"), reviews)
    }

    fn far() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
            + 3600
    }

    fn operator_token() -> String {
        jwt(json!({"aud": [AUD], "exp": far(), "sub": "operator"}))
    }

    #[tokio::test]
    async fn no_token_review_for_garbage_expired_or_other_audiences() {
        let (client, reviews) = fake_api_server();
        let verifier = TokenReviewVerifier::new(client, "shop", "export");
        assert_eq!(verifier.audience(), AUD);
        for token in [
            "not-a-jwt".to_owned(),
            jwt(json!({"aud": [AUD], "exp": 1000})),
            jwt(json!({"aud": ["backpressure.dev"], "exp": far()})),
            jwt(json!({"aud": ["backpressure.dev/other/export"], "exp": far()})),
        ] {
            for _ in 0..3 {
                let e = verifier.verify(&token).await.unwrap_err();
                assert!(matches!(e, VerifyError::Unauthenticated(_)), "{e}");
            }
        }
        assert_eq!(reviews.load(Ordering::SeqCst), 0, "a TokenReview was made");
        // The operator's token is reviewed once, then served from the positive cache.
        for _ in 0..3 {
            let id = verifier.verify(&operator_token()).await.unwrap();
            assert!(id.username.ends_with(":backpressure-operator"));
        }
        assert_eq!(reviews.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_token_is_reviewed_once_per_negative_ttl() {
        let (client, reviews) = fake_api_server();
        let verifier = TokenReviewVerifier::new(client, "shop", "export");
        // Well-formed, our audience, not expired, but not a real token.
        let forged = jwt(json!({"aud": [AUD], "exp": far(), "sub": "forged"}));
        for _ in 0..20 {
            assert!(verifier.verify(&forged).await.is_err());
        }
        assert_eq!(reviews.load(Ordering::SeqCst), 1);
        tokio::time::advance(DEFAULT_NEGATIVE_TTL + Duration::from_secs(1)).await;
        assert!(verifier.verify(&forged).await.is_err());
        assert_eq!(reviews.load(Ordering::SeqCst), 2);
        // Another forged token is reviewed on its own.
        let other = jwt(json!({"aud": [AUD], "exp": far(), "sub": "other"}));
        assert!(verifier.verify(&other).await.is_err());
        assert_eq!(reviews.load(Ordering::SeqCst), 3);
        // Without the negative cache, every attempt costs a review.
        let (client, reviews) = fake_api_server();
        let uncached =
            TokenReviewVerifier::new(client, "shop", "export").with_negative_ttl(Duration::ZERO);
        for _ in 0..5 {
            assert!(uncached.verify(&forged).await.is_err());
        }
        assert_eq!(reviews.load(Ordering::SeqCst), 5);
    }
}
