"""Token checks (crates/worker/src/config/token/tests.rs, ported): the local JWT check, the
negative cache, and the verifier's caching around an injected reviewer."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest

from backpressure_worker.token import (
    DEFAULT_NEGATIVE_TTL_S,
    MAX_TOKEN_BYTES,
    Identity,
    NegativeCache,
    TokenReviewClient,
    TokenReviewVerifier,
    Unauthenticated,
    Unavailable,
    check_jwt,
    service_account_username,
    token_key,
)

AUD = "backpressure.dev/shop/export"
NOW = 1_700_000_000
OPERATOR = "system:serviceaccount:bp-system:backpressure-operator"


def b64(v: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(v).encode()).rstrip(b"=").decode()


def jwt(claims: Any) -> str:
    """A JWT-shaped token with ``claims`` (unsigned: the signature part is filler)."""
    return f"{b64({'alg': 'RS256', 'kid': 'k'})}.{b64(claims)}.c2lnbmF0dXJl"


def test_local_check_accepts_our_audience_and_refuses_everything_else_with_a_reason() -> None:
    assert check_jwt(jwt({"aud": [AUD], "exp": NOW + 600}), AUD, NOW) is None
    assert check_jwt(jwt({"aud": AUD, "exp": NOW + 1}), AUD, NOW) is None
    assert check_jwt(jwt({"aud": ["x", AUD], "exp": float(NOW + 600)}), AUD, NOW) is None
    payload = b64({"aud": [AUD], "exp": NOW + 600})
    cases = [
        ("not-a-jwt", "three"),
        (f"a.{payload}", "three"),
        (f"a.{payload}.s.d", "three"),
        (f"{payload}.{payload}.", "empty signature"),
        (f"!!!.{payload}.s", "header is not base64url"),
        (f"{b64([1])}.{payload}.s", "header is not a JSON object"),
        (f"{payload}.bm90IGpzb24.s", "payload is not JSON"),
        (jwt({"aud": [AUD]}), "no exp"),
        (jwt({"aud": [AUD], "exp": "soon"}), "no exp"),
        (jwt({"aud": [AUD], "exp": NOW}), "expired"),
        (jwt({"aud": [AUD], "exp": NOW - 3600}), "expired"),
        (jwt({"exp": NOW + 600}), "audience"),
        (jwt({"aud": ["backpressure.dev"], "exp": NOW + 600}), "audience"),
        (jwt({"aud": ["backpressure.dev/other/export"], "exp": NOW + 600}), "audience"),
        (jwt({"aud": ["backpressure.dev/shop/export-2"], "exp": NOW + 600}), "audience"),
        (jwt({"aud": [7], "exp": NOW + 600}), "audience"),
        ("a" * (MAX_TOKEN_BYTES + 1), "longer"),
    ]
    for token, why in cases:
        err = check_jwt(token, AUD, NOW)
        assert err is not None and why in err, (err, why)
        assert token not in err, "the error repeats the token"


def test_negative_cache_forgets_after_its_ttl_and_stays_bounded() -> None:
    now = [0.0]
    cache = NegativeCache(30.0, 4, clock=lambda: now[0])
    a = token_key("a")
    assert a not in cache
    cache.insert(a)
    assert a in cache
    now[0] += 29
    assert a in cache
    now[0] += 2
    assert a not in cache, "kept past its TTL"
    for i in range(100):
        cache.insert(token_key(f"t{i}"))
        now[0] += 0.01
        assert len(cache) <= 4
    assert token_key("t99") in cache
    assert token_key("t0") not in cache
    off = NegativeCache(0.0, 4)
    off.insert(a)
    assert a not in off


class CountingReviewer:
    """The API server's answer as a TokenReview gives it: the operator's token is valid for
    the audience asked, anything else is not authenticated. Counts the reviews."""

    def __init__(self, operator_token: str) -> None:
        self.operator_token = operator_token
        self.reviews = 0

    def review(self, token: str, audience: str) -> Identity:
        self.reviews += 1
        if token == self.operator_token:
            return Identity(OPERATOR)
        raise Unauthenticated("invalid bearer token")


def far() -> int:
    return int(time.time()) + 3600


def test_no_token_review_for_garbage_expired_or_other_audiences() -> None:
    operator_token = jwt({"aud": [AUD], "exp": far(), "sub": "operator"})
    reviewer = CountingReviewer(operator_token)
    verifier = TokenReviewVerifier("shop", "export", reviewer=reviewer)
    assert verifier.audience == AUD
    for token in [
        "not-a-jwt",
        jwt({"aud": [AUD], "exp": 1000}),
        jwt({"aud": ["backpressure.dev"], "exp": far()}),
        jwt({"aud": ["backpressure.dev/other/export"], "exp": far()}),
    ]:
        for _ in range(3):
            with pytest.raises(Unauthenticated):
                verifier.verify(token)
    assert reviewer.reviews == 0, "a TokenReview was made"
    for _ in range(3):
        assert verifier.verify(operator_token).username.endswith(":backpressure-operator")
    assert reviewer.reviews == 1, "served from the positive cache"


def test_a_refused_token_is_reviewed_once_per_negative_ttl() -> None:
    now = [0.0]
    reviewer = CountingReviewer("")
    verifier = TokenReviewVerifier("shop", "export", reviewer=reviewer, clock=lambda: now[0])
    forged = jwt({"aud": [AUD], "exp": far(), "sub": "forged"})
    for _ in range(20):
        with pytest.raises(Unauthenticated):
            verifier.verify(forged)
    assert reviewer.reviews == 1
    now[0] += DEFAULT_NEGATIVE_TTL_S + 1
    with pytest.raises(Unauthenticated):
        verifier.verify(forged)
    assert reviewer.reviews == 2
    with pytest.raises(Unauthenticated):
        verifier.verify(jwt({"aud": [AUD], "exp": far(), "sub": "other"}))
    assert reviewer.reviews == 3
    uncached_reviewer = CountingReviewer("")
    uncached = TokenReviewVerifier("shop", "export", reviewer=uncached_reviewer, negative_ttl=0)
    for _ in range(5):
        with pytest.raises(Unauthenticated):
            uncached.verify(forged)
    assert uncached_reviewer.reviews == 5


def test_an_unreachable_api_server_is_unavailable_not_unauthenticated() -> None:
    # A real connection to a closed local port: refused.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = TokenReviewClient(f"http://127.0.0.1:{port}", token="x", timeout=2)
    verifier = TokenReviewVerifier("shop", "export", reviewer=client)
    with pytest.raises(Unavailable):
        verifier.verify(jwt({"aud": [AUD], "exp": far()}))
    assert len(verifier.refused) == 0, "an outage is not a refusal"


def test_in_cluster_configuration_needs_the_service_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ValueError, match="KUBERNETES_SERVICE_HOST"):
        TokenReviewClient()
    assert service_account_username("bp-system", "op") == "system:serviceaccount:bp-system:op"
