"""Authentication of configuration pushes: a bearer token checked by a :class:`TokenVerifier`
(``crates/worker/src/config/token.rs``).

The real verifier, :class:`TokenReviewVerifier`, POSTs a Kubernetes ``TokenReview`` to the API
server (plain HTTPS, no Kubernetes client library) for this worker's own audience,
``backpressure.dev/<namespace>/<workload>``: the operator mints one token per target, so a token
that one target's pod received cannot configure another target's workers. The worker's
ServiceAccount needs ``create`` on ``tokenreviews.authentication.k8s.io`` (the
``system:auth-delegator`` ClusterRole).

Before a TokenReview is made the verifier checks the token locally (:func:`check_jwt`: a JWT
whose ``exp`` is in the future and whose ``aud`` holds our audience; the signature is left to
the API server), answers from a short cache of positive reviews, and refuses a token the API
server refused in the last 30 s (:class:`NegativeCache`). Caches are keyed by the token's
SHA-256; tokens are never logged.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .wire import push_audience

__all__ = [
    "DEFAULT_CACHE_TTL_S",
    "DEFAULT_NEGATIVE_TTL_S",
    "Identity",
    "Reviewer",
    "TokenReviewClient",
    "MAX_TOKEN_BYTES",
    "NegativeCache",
    "TokenReviewVerifier",
    "TokenVerifier",
    "Unauthenticated",
    "Unavailable",
    "VerifyError",
    "check_jwt",
    "service_account_username",
    "token_key",
]

MAX_TOKEN_BYTES = 16 * 1024
"""Longest token looked at; a ServiceAccount token is about 1 KiB."""
DEFAULT_NEGATIVE_TTL_S = 30.0
"""Default time a refused token is refused without asking the API server again."""
NEGATIVE_CACHE_MAX = 1024
DEFAULT_CACHE_TTL_S = 60.0
"""Default time a positive review is cached."""
CACHE_MAX = 256

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class Identity:
    """Who a token belongs to: for a ServiceAccount ``system:serviceaccount:<ns>:<name>``."""

    username: str


class VerifyError(Exception):
    """Why a token was not accepted."""


class Unauthenticated(VerifyError):
    """The token is not valid (or not for our audience): HTTP 401."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"token not authenticated: {reason}")


class Unavailable(VerifyError):
    """The token could not be checked (API server unreachable): HTTP 503."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"token review unavailable: {reason}")


class TokenVerifier(Protocol):
    """Checks a bearer token: the identity, or :class:`Unauthenticated` / :class:`Unavailable`."""

    def verify(self, token: str) -> Identity: ...


def service_account_username(namespace: str, name: str) -> str:
    """The username of a ServiceAccount."""
    return f"system:serviceaccount:{namespace}:{name}"


def token_key(token: str) -> bytes:
    """The SHA-256 of a token: the key of the caches."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


_B64URL = re.compile(r"^[A-Za-z0-9_-]*$")


def _b64url_json(part: str, name: str) -> dict[str, Any]:
    raw = part.rstrip("=")
    if not _B64URL.match(raw) or len(raw) % 4 == 1:
        raise ValueError(f"not a JWT ({name} is not base64url)")
    try:
        data = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    except (binascii.Error, ValueError):
        raise ValueError(f"not a JWT ({name} is not base64url)") from None
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"not a JWT ({name} is not JSON)") from None
    if not isinstance(value, dict):
        raise ValueError(f"not a JWT ({name} is not a JSON object)")
    return value


def check_jwt(token: str, audience: str, now_unix: int) -> str | None:
    """The local check of a token before any TokenReview: a JWT (three base64url parts, the
    first two JSON objects) whose ``exp`` is after ``now_unix`` and whose ``aud`` (a string or
    a list) contains ``audience``. The signature is NOT checked (the TokenReview does).
    Returns None when it passes, else what is wrong (never the token)."""
    if len(token) > MAX_TOKEN_BYTES:
        return f"token longer than {MAX_TOKEN_BYTES} bytes"
    parts = token.split(".")
    if len(parts) != 3:
        return "not a JWT (expected three dot-separated parts)"
    header, payload, signature = parts
    if not signature:
        return "not a JWT (empty signature)"
    try:
        _b64url_json(header, "header")
        claims = _b64url_json(payload, "payload")
    except ValueError as e:
        return str(e)
    exp = claims.get("exp")
    if isinstance(exp, bool) or not isinstance(exp, (int, float)):
        return "token has no exp claim"
    if not float(exp) > float(now_unix):
        return "token expired"
    aud = claims.get("aud")
    ours = (
        aud == audience
        if isinstance(aud, str)
        else isinstance(aud, list) and audience in [a for a in aud if isinstance(a, str)]
    )
    if not ours:
        return f"token is not for audience {json.dumps(audience)}"
    return None


class NegativeCache:
    """Token hashes the API server refused recently, bounded in size."""

    def __init__(
        self,
        ttl: float = DEFAULT_NEGATIVE_TTL_S,
        maximum: int = NEGATIVE_CACHE_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.max = max(maximum, 1)
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[bytes, float] = {}

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            until = self._entries.get(key)
            return until is not None and self._clock() < until

    def insert(self, key: bytes) -> None:
        if self.ttl <= 0:
            return
        now = self._clock()
        with self._lock:
            if len(self._entries) >= self.max and key not in self._entries:
                self._entries = {k: u for k, u in self._entries.items() if u > now}
                while len(self._entries) >= self.max:
                    oldest = min(self._entries, key=lambda k: self._entries[k])
                    del self._entries[oldest]
            self._entries[key] = now + self.ttl

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class Reviewer(Protocol):
    """Asks the authority about a token for an audience (a TokenReview): the identity, or
    :class:`Unauthenticated` / :class:`Unavailable`."""

    def review(self, token: str, audience: str) -> Identity: ...


class TokenReviewClient:
    """Posts TokenReviews to the Kubernetes API server over plain HTTPS.

    The API server and credentials come from the arguments or, when ``api_url`` is not given,
    from the pod (``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` and the mounted
    ServiceAccount's ``token`` and ``ca.crt``). ``token`` is a fixed bearer token;
    ``token_file`` (re-read for every review, as kubelet rotates it) is used otherwise.
    ``client_cert``/``client_key`` authenticate with a certificate instead.
    """

    def __init__(
        self,
        api_url: str | None = None,
        *,
        ca_file: str | os.PathLike[str] | None = None,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        client_cert: str | os.PathLike[str] | None = None,
        client_key: str | os.PathLike[str] | None = None,
        timeout: float = 5.0,
    ) -> None:
        if api_url is None:
            host = os.environ.get("KUBERNETES_SERVICE_HOST")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ValueError("no API server: pass api_url, or run in a pod (KUBERNETES_SERVICE_HOST)")
            if ":" in host:  # IPv6
                host = f"[{host}]"
            api_url = f"https://{host}:{port}"
            if ca_file is None:
                ca_file = SA_DIR / "ca.crt"
            if token is None and token_file is None and client_cert is None:
                token_file = SA_DIR / "token"
        self.api_url = api_url.rstrip("/")
        self._token = token
        self._token_file = Path(token_file) if token_file is not None else None
        self._timeout = timeout
        self._ssl: ssl.SSLContext | None = None
        if self.api_url.startswith("https:"):
            ctx = ssl.create_default_context(cafile=os.fspath(ca_file) if ca_file else None)
            if client_cert is not None:
                ctx.load_cert_chain(os.fspath(client_cert), os.fspath(client_key) if client_key else None)
            self._ssl = ctx

    def __repr__(self) -> str:
        return f"TokenReviewClient(api_url={self.api_url!r})"

    def _credentials(self) -> str | None:
        if self._token is not None:
            return self._token
        if self._token_file is not None:
            try:
                return self._token_file.read_text().strip()
            except OSError as e:
                raise Unavailable(f"reading the ServiceAccount token: {e}") from e
        return None

    def review(self, token: str, audience: str) -> Identity:
        body = json.dumps(
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token, "audiences": [audience]},
            }
        ).encode()
        req = urllib.request.Request(
            self.api_url + "/apis/authentication.k8s.io/v1/tokenreviews",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        bearer = self._credentials()
        if bearer:
            req.add_header("Authorization", f"Bearer {bearer}")
        try:
            with urllib.request.urlopen(req, timeout=self._timeout, context=self._ssl) as resp:
                result = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise Unavailable(f"API server answered {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise Unavailable(str(e)) from None
        status = result.get("status") if isinstance(result, dict) else None
        if not isinstance(status, dict):
            status = {}
        if status.get("authenticated") is not True:
            error = status.get("error")
            raise Unauthenticated(error if isinstance(error, str) and error else "not authenticated")
        # The API server returns the audiences the token is valid for among those asked.
        audiences = status.get("audiences") or []
        if not isinstance(audiences, list) or audience not in audiences:
            raise Unauthenticated(f"token is not for audience {json.dumps(audience)}")
        user = status.get("user")
        username = user.get("username") if isinstance(user, dict) else None
        if not isinstance(username, str) or not username:
            raise Unauthenticated("review names no user")
        return Identity(username=username)


class TokenReviewVerifier:
    """Verifies tokens for one audience, ``backpressure.dev/<namespace>/<workload>``: the local
    JWT check, a positive cache (``cache_ttl`` seconds), a negative cache (``negative_ttl``),
    then a TokenReview by ``reviewer`` (by default a :class:`TokenReviewClient` built from the
    other keyword arguments, or from the pod's ServiceAccount)."""

    def __init__(
        self,
        namespace: str,
        workload: str,
        *,
        reviewer: Reviewer | None = None,
        audience: str | None = None,
        cache_ttl: float = DEFAULT_CACHE_TTL_S,
        negative_ttl: float = DEFAULT_NEGATIVE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        **client: Any,
    ) -> None:
        self.reviewer: Reviewer = reviewer if reviewer is not None else TokenReviewClient(**client)
        self.audience = audience if audience is not None else push_audience(namespace, workload)
        self._ttl = cache_ttl
        self._clock = clock
        self._cache: dict[bytes, tuple[Identity, float]] = {}
        self._cache_lock = threading.Lock()
        self.refused = NegativeCache(negative_ttl, NEGATIVE_CACHE_MAX, clock)

    def __repr__(self) -> str:
        return f"TokenReviewVerifier(audience={self.audience!r}, reviewer={self.reviewer!r})"

    def _cached(self, key: bytes) -> Identity | None:
        with self._cache_lock:
            hit = self._cache.get(key)
            if hit is not None and self._clock() < hit[1]:
                return hit[0]
            return None

    def _remember(self, key: bytes, identity: Identity) -> None:
        if self._ttl <= 0:
            return
        now = self._clock()
        with self._cache_lock:
            if len(self._cache) >= CACHE_MAX:
                self._cache = {k: v for k, v in self._cache.items() if v[1] > now}
                if len(self._cache) >= CACHE_MAX:
                    self._cache.clear()
            self._cache[key] = (identity, now + self._ttl)

    def verify(self, token: str) -> Identity:
        # First, so that a cached token stops working at its `exp`, not up to a TTL later.
        problem = check_jwt(token, self.audience, int(time.time()))
        if problem is not None:
            raise Unauthenticated(problem)
        key = token_key(token)
        cached = self._cached(key)
        if cached is not None:
            return cached
        if key in self.refused:
            raise Unauthenticated("token refused by the API server within the last seconds")
        try:
            identity = self.reviewer.review(token, self.audience)
        except Unauthenticated:
            self.refused.insert(key)
            raise
        self._remember(key, identity)
        return identity
