"""The admin HTTP server: ``PUT``/``GET /v1/config``, ``GET /metrics``, ``GET /healthz``, and
for conformance runs only ``POST /v1/conformance/controller`` (``crates/worker/src/config/admin.rs``).

Answers follow the wire contract: 200 with ``{"hash", "generation"}`` when a push is applied or
already running, 400 for a malformed or invalid payload, 401 without a valid token (missing, not
a bearer token, refused by the :class:`~.token.TokenVerifier`, wrong audience), 403 for a valid
token of an identity that is not allowed, 409 for a payload older than the running generation,
413 for a body over 64 KiB, 408 when the body does not arrive in time, 429 (with
``Retry-After``) for a source that failed authentication too often (:class:`FailureLimit`) and
503 when the token cannot be checked. The token is checked before the body is read. Errors are
JSON ``{"error": "..."}``.

The conformance hook (:meth:`Admin.with_conformance_hook`, off by default; otherwise its path
answers 404) runs the golden-vector case in the body on a fresh controller
(:mod:`.conformance`) and answers 200 with ``{"observations": [...]}``, 400 for a body that is
not a case, 413 over 16 MiB. It takes no token and never touches the worker's own controller.

:meth:`Admin.handle` answers one request and does no I/O but reading the body through the
callable it is given; :meth:`Admin.serve` runs it on a threaded HTTP/1.1 server.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import conformance
from .config import ConfigState, Invalid, Origin, Stale
from .metrics import CONTENT_TYPE as OPENMETRICS
from .metrics import Metrics
from .token import Identity, TokenVerifier, Unauthenticated, Unavailable
from .wire import CONFIG_PATH, MAX_PAYLOAD_BYTES, ConfigAck, TooLarge

__all__ = [
    "Admin",
    "AdminServer",
    "BodyError",
    "BodyTimeout",
    "BodyTooLarge",
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HEADER_TIMEOUT_S",
    "FailureLimit",
    "HEALTHZ_PATH",
    "METRICS_PATH",
    "Response",
]

log = logging.getLogger(__name__)

HEALTHZ_PATH = "/healthz"
METRICS_PATH = "/metrics"
DEFAULT_HEADER_TIMEOUT_S = 5.0
DEFAULT_BODY_TIMEOUT_S = 10.0
MAX_SOURCES = 4096
"""Most sources tracked by the failure limiter."""


@dataclass(frozen=True)
class FailureLimit:
    """How many failed authentications a source may make: a bucket of ``burst`` failures
    refilled by one every ``refill_s`` seconds. Successful pushes cost nothing."""

    burst: int = 10
    refill_s: float = 2.0


@dataclass
class Response:
    """One answer."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)


class BodyError(Exception):
    """The body could not be read (400)."""


class BodyTooLarge(BodyError):
    """The body is over the limit (413)."""


class BodyTimeout(BodyError):
    """The body did not arrive in time (408)."""


BodyReader = Callable[[int], bytes]
"""Reads the request body, at most ``limit`` bytes (raises a :class:`BodyError`)."""


def _error(status: int, message: object) -> Response:
    body = json.dumps({"error": str(message)}, separators=(",", ":")).encode()
    return Response(status, body)


def _ack(ack: ConfigAck) -> Response:
    return Response(200, json.dumps(ack.to_json(), separators=(",", ":")).encode())


def _read(headers: Mapping[str, str], body: BodyReader | bytes, limit: int, what: str) -> bytes | Response:
    """The request body, or the refusal: 413 over ``limit`` bytes (declared or read), 408 when
    it does not arrive in time, 400 when it cannot be read."""
    declared = _header(headers, "content-length")
    too_large = f"{what} exceeds the limit of {limit} bytes"
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        return _error(413, f"{what} of {int(declared)} bytes exceeds the limit of {limit} bytes")
    try:
        if isinstance(body, (bytes, bytearray)):
            if len(body) > limit:
                raise BodyTooLarge()
            return bytes(body)
        return body(limit)
    except BodyTooLarge:
        return _error(413, too_large)
    except BodyTimeout:
        return _error(408, "request body timed out")
    except BodyError as e:
        return _error(400, f"reading body: {e}")


class _Limiter:
    """Per-source failed-authentication buckets."""

    def __init__(self, limit: FailureLimit, clock: Callable[[], float]) -> None:
        self.limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str | None, tuple[float, float]] = {}  # credit, at

    def _burst(self) -> float:
        return float(max(self.limit.burst, 1))

    def _refilled(self, bucket: tuple[float, float], now: float) -> tuple[float, float]:
        credit, at = bucket
        per = self.limit.refill_s
        gained = max(now - at, 0.0) / per if per > 0 else self._burst()
        return min(credit + gained, self._burst()), now

    def _key(self, source: str | None) -> str | None:
        return source if source in self._buckets or len(self._buckets) < MAX_SOURCES else None

    def throttled(self, source: str | None) -> float | None:
        """None when ``source`` may try to authenticate; otherwise seconds until it may."""
        now = self._clock()
        with self._lock:
            key = self._key(source)
            bucket = self._buckets.get(key)
            if bucket is None:
                return None
            b = self._refilled(bucket, now)
            self._buckets[key] = b
            if b[0] < 1.0:
                return self.limit.refill_s * min(max(1.0 - b[0], 0.0), 1.0)
            return None

    def failed(self, source: str | None) -> None:
        """Charges one failed authentication to ``source``."""
        now = self._clock()
        burst = self._burst()
        with self._lock:
            if len(self._buckets) >= MAX_SOURCES and source not in self._buckets:
                for k in [k for k, b in self._buckets.items() if self._refilled(b, now)[0] >= burst]:
                    del self._buckets[k]
            key = self._key(source)
            old = self._buckets.get(key)
            credit = burst if old is None else self._refilled(old, now)[0]
            self._buckets[key] = (max(credit - 1.0, 0.0), now)


def _bearer(headers: Mapping[str, str]) -> str | None:
    value = _header(headers, "authorization")
    if value is None:
        return None
    scheme, sep, token = value.partition(" ")
    token = token.strip()
    if not sep or scheme.lower() != "bearer" or not token:
        return None
    return token


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for k, v in headers.items():
        if k.lower() == name:
            return v
    return None


class Admin:
    """The admin endpoint of a worker: serves the running config, metrics and health, and
    accepts pushes from allowed identities once :meth:`with_verifier` is called."""

    def __init__(
        self,
        state: ConfigState,
        metrics: Metrics | None = None,
        *,
        failure_limit: FailureLimit | None = None,
        header_timeout: float = DEFAULT_HEADER_TIMEOUT_S,
        body_timeout: float = DEFAULT_BODY_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        conformance_hook: bool = False,
    ) -> None:
        self.state = state
        self.metrics = metrics
        self.verifier: TokenVerifier | None = None
        self.allowed: list[str] = []
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self._clock = clock
        self._limiter = _Limiter(failure_limit or FailureLimit(), clock)
        self.conformance_hook = conformance_hook
        """Serves ``POST`` :data:`~.conformance.HOOK_PATH` (see :meth:`with_conformance_hook`)."""

    def with_verifier(self, verifier: TokenVerifier, allowed: Iterable[str]) -> Admin:
        """Accepts pushes whose token ``verifier`` maps to one of the ``allowed`` usernames
        (for a ServiceAccount see :func:`~.token.service_account_username`)."""
        self.verifier = verifier
        self.allowed = list(allowed)
        return self

    def with_failure_limit(self, limit: FailureLimit) -> Admin:
        self._limiter = _Limiter(limit, self._clock)
        return self

    def with_conformance_hook(self, enabled: bool = True) -> Admin:
        """Also serves the conformance hook, ``POST`` :data:`~.conformance.HOOK_PATH`: one
        golden-vector case run on a fresh controller (:mod:`.conformance`), for the conformance
        suite. For conformance runs only: the hook takes no token (it touches no state of the
        worker, but it costs CPU), so a production worker must not serve it."""
        self.conformance_hook = enabled
        return self

    def handle(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: BodyReader | bytes = b"",
        source: str | None = None,
    ) -> Response:
        """Answers one request. ``body`` is read only after the token is accepted; ``source``
        is the peer address that failed authentications are charged to."""
        path = target.split("?", 1)[0]
        if method == "GET" and path == HEALTHZ_PATH:
            return Response(200, b"ok\n", "text/plain")
        if method == "GET" and path == METRICS_PATH:
            if self.metrics is None:
                return _error(404, "no metrics registered")
            return Response(200, self.metrics.encode().encode(), OPENMETRICS)
        if path == CONFIG_PATH and method == "GET":
            return _ack(self.state.ack())
        if path == CONFIG_PATH and method == "PUT":
            return self._push(headers, body, source)
        if path == conformance.HOOK_PATH and method == "POST" and self.conformance_hook:
            return self._hook(headers, body)
        if path in (HEALTHZ_PATH, METRICS_PATH, CONFIG_PATH):
            return _error(405, "method not allowed")
        return _error(404, "not found")

    def _push(self, headers: Mapping[str, str], body: BodyReader | bytes, source: str | None) -> Response:
        refused = self._authenticate(headers, source)
        if isinstance(refused, Response):
            return refused
        identity = refused
        data = _read(headers, body, MAX_PAYLOAD_BYTES, "document")
        if isinstance(data, Response):
            return data
        try:
            ack = self.state.apply_bytes(data, Origin.PUSH)
        except Invalid as e:
            return _error(413 if isinstance(e.error, TooLarge) else 400, e)
        except Stale as e:
            return _error(409, e)
        log.info("push accepted: user=%s hash=%s generation=%d", identity.username, ack.hash, ack.generation)
        return _ack(ack)

    def _hook(self, headers: Mapping[str, str], body: BodyReader | bytes) -> Response:
        """The conformance hook: the case in the body run on a fresh controller; 400 for a body
        that is not a case, 413 over :data:`~.conformance.MAX_CASE_BYTES`."""
        data = _read(headers, body, conformance.MAX_CASE_BYTES, "case")
        if isinstance(data, Response):
            return data
        try:
            return Response(200, conformance.answer(data))
        except conformance.CaseError as e:
            return _error(400, e)

    def _authenticate(self, headers: Mapping[str, str], source: str | None) -> Identity | Response:
        """The failure limit first (429), then the bearer token (401), the verifier (401, 503)
        and the allowed identities (403). Every failure but an unavailable verifier is charged
        to the source."""
        verifier = self.verifier
        if verifier is None:
            return _error(401, "pushes are disabled on this pod")
        wait = self._limiter.throttled(source)
        if wait is not None:
            r = _error(429, "too many failed authentications from this address; retry later")
            r.headers["Retry-After"] = str(max(int(wait), 1))
            return r
        token = _bearer(headers)
        if token is None:
            self._limiter.failed(source)
            return _error(401, "missing bearer token")
        try:
            identity = verifier.verify(token)
        except Unauthenticated as e:
            self._limiter.failed(source)
            log.warning("push refused: unauthenticated (%s) from %s", e, source)
            return _error(401, e)
        except Unavailable as e:
            log.warning("push refused: cannot review the token (%s)", e)
            return _error(503, e)
        if identity.username not in self.allowed:
            self._limiter.failed(source)
            log.warning("push refused: identity %s not allowed, from %s", identity.username, source)
            return _error(403, f"{identity.username} may not configure this pod")
        return identity

    def serve(self, host: str = "0.0.0.0", port: int = 9464) -> AdminServer:
        """Starts serving on ``host:port`` in a daemon thread; stop it with
        :meth:`AdminServer.shutdown`."""
        server = AdminServer(self, (host, port))
        server.start()
        return server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: AdminServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        log.debug("admin %s: " + format, self.address_string(), *args)

    def setup(self) -> None:
        super().setup()
        self._watchdog: threading.Timer | None = None

    def _arm(self) -> None:
        """Closes the connection if the request's headers are not complete in time."""
        sock = self.connection

        def expire() -> None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        self._watchdog = threading.Timer(self.server.admin.header_timeout, expire)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _disarm(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def handle_one_request(self) -> None:
        self._arm()
        try:
            super().handle_one_request()
        finally:
            self._disarm()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self._disarm()
        return ok

    def _read_body(self, limit: int) -> bytes:
        deadline = time.monotonic() + self.server.admin.body_timeout
        chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        self._body_consumed = False

        def read(n: int) -> bytes:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BodyTimeout()
            self.connection.settimeout(left)
            try:
                data = self.rfile.read1(n) if n > 0 else b""
            except TimeoutError:
                raise BodyTimeout() from None
            except OSError as e:
                raise BodyError(str(e)) from None
            if n > 0 and not data:
                raise BodyError("connection closed before the body was complete")
            return data

        def readline() -> bytes:
            line = b""
            while not line.endswith(b"\n"):
                line += read(1)
                if len(line) > 1024:
                    raise BodyError("chunk header too long")
            return line

        out = bytearray()
        try:
            if chunked:
                while True:
                    size_text = readline().split(b";", 1)[0].strip()
                    try:
                        size = int(size_text, 16)
                    except ValueError:
                        raise BodyError("bad chunk size") from None
                    if size == 0:
                        while readline() not in (b"\r\n", b"\n"):
                            pass
                        break
                    if len(out) + size > limit:
                        raise BodyTooLarge()
                    while size > 0:
                        data = read(min(size, 65536))
                        out += data
                        size -= len(data)
                    readline()
            else:
                length_text = self.headers.get("Content-Length")
                length = int(length_text) if length_text and length_text.strip().isdigit() else 0
                if length > limit:
                    raise BodyTooLarge()
                while len(out) < length:
                    out += read(min(length - len(out), 65536))
            self._body_consumed = True
            return bytes(out)
        finally:
            self.connection.settimeout(None)

    def _dispatch(self) -> None:
        self._body_consumed = False
        has_body = bool(self.headers.get("Content-Length", "0").strip() not in ("", "0")) or (
            "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        )
        resp = self.server.admin.handle(
            self.command,
            self.path,
            dict(self.headers.items()),
            self._read_body,
            self.client_address[0] if self.client_address else None,
        )
        if has_body and not self._body_consumed:
            # The rest of the body would be read as the next request.
            self.close_connection = True
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(resp.body)))
        for k, v in resp.headers.items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(resp.body)

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _dispatch


class AdminServer(ThreadingHTTPServer):
    """The admin port: :class:`Admin` behind a threaded HTTP/1.1 server."""

    daemon_threads = True

    def __init__(self, admin: Admin, address: tuple[str, int]) -> None:
        self.admin = admin
        super().__init__(address, _Handler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> AdminServer:
        self._thread = threading.Thread(target=self.serve_forever, name="bp-admin", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        super().shutdown()
        self.server_close()
        if self._thread is not None:
            self._thread.join()
