"""The config receiver (crates/worker/src/config/tests.rs, ported): ConfigState, the file
watcher, and the admin endpoint with an injected token verifier, in process and over TCP."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from backpressure_worker.admin import Admin, FailureLimit, Response
from backpressure_worker.config import (
    ConfigState,
    FileWatcher,
    Invalid,
    Limits,
    Origin,
    Stale,
    unix_now,
)
from backpressure_worker.controller import Algorithm, Settings, build, from_secs
from backpressure_worker.metrics import Metrics
from backpressure_worker.permits import Gate
from backpressure_worker.token import Identity, Unauthenticated, Unavailable
from backpressure_worker.wire import (
    CONFIG_FILE_NAME,
    CONFIG_PATH,
    MAX_GENERATION_LEAD_MS,
    MAX_PAYLOAD_BYTES,
    BrakeConfig,
    FieldError,
    RedeliveryConfig,
    WorkerConfig,
)

OPERATOR = "system:serviceaccount:bp-system:backpressure-operator"


def make_state() -> tuple[ConfigState, Gate, Metrics]:
    metrics = Metrics("w")
    gate = Gate(build(Settings.steady(), 1), metrics=metrics)
    return ConfigState(gate, WorkerConfig.default(), metrics), gate, metrics


def config(generation: int, max_permits: int) -> WorkerConfig:
    return WorkerConfig(generation=generation, max_permits=max_permits).with_hash()


class StaticTokens:
    """A verifier with a fixed token table (the real TokenReview client is tested in
    test_token.py)."""

    def __init__(self, table: dict[str, str | None]) -> None:
        self.table = table  # token -> username, or None: the API server is down

    def verify(self, token: str) -> Identity:
        if token not in self.table:
            raise Unauthenticated("unknown token")
        user = self.table[token]
        if user is None:
            raise Unavailable("down")
        return Identity(user)


def make_admin(**kw: object) -> tuple[Admin, Gate]:
    state, gate, metrics = make_state()
    tokens = StaticTokens(
        {"good": OPERATOR, "other": "system:serviceaccount:bp-system:someone-else", "down": None}
    )
    admin = Admin(state, metrics, header_timeout=0.3, body_timeout=0.3, **kw)  # type: ignore[arg-type]
    return admin.with_verifier(tokens, [OPERATOR]), gate


def call(
    admin: Admin,
    method: str,
    path: str,
    token: str | None = None,
    body: bytes = b"",
    source: str | None = None,
) -> Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return admin.handle(method, path, headers, body, source)


def test_apply_updates_gate_and_metrics_and_refuses_stale_or_invalid() -> None:
    state, gate, metrics = make_state()
    assert state.ack().hash == WorkerConfig.default().hash
    ack = state.apply(config(3, 4), Origin.PUSH)
    assert ack.generation == 3
    assert gate.snapshot().limit == 4
    info = [line for line in metrics.encode().splitlines() if line.startswith("backpressure_config_info{")]
    assert len(info) == 1
    assert f'hash="{ack.hash}"' in info[0] and 'algorithm="SetPoint"' in info[0]
    assert info[0].split()[-1] in ("1", "1.0")
    with pytest.raises(Stale) as e:
        state.apply(config(2, 8), Origin.PUSH)
    assert (e.value.running, e.value.given) == (3, 2)
    assert gate.snapshot().limit == 4
    with pytest.raises(Invalid):
        state.apply(WorkerConfig(set_point=2.0, generation=9), Origin.PUSH)
    with pytest.raises(Invalid):
        state.apply_bytes(b"{", Origin.PUSH)
    assert state.ack() == ack
    assert state.origin() == Origin.PUSH
    assert state.apply(config(3, 4), Origin.FILE) == ack
    assert state.origin() == Origin.PUSH, "the same payload again changes nothing"
    braked = WorkerConfig(generation=4, algorithm=Algorithm.FIXED, brake=BrakeConfig(0.5))
    ack = state.apply(braked, Origin.PUSH)
    assert len(ack.hash) == 12, "an empty hash is filled in"
    assert gate.settings.algorithm == Algorithm.FIXED
    assert gate.snapshot().limit == 8
    assert gate.snapshot().backoff == 0.5


def test_library_knobs_survive_a_push() -> None:
    gate = Gate(build(Settings.steady().replace(credit=0.25, health_check_probes=True), 1))
    state = ConfigState(gate, WorkerConfig.default())
    state.apply(config(1, 5), Origin.PUSH)
    s = gate.settings
    assert (s.max_permits, s.credit, s.health_check_probes) == (5, 0.25, True)


def wait_for(state: ConfigState, generation: int) -> None:
    deadline = time.monotonic() + 10
    while state.ack().generation != generation:
        assert time.monotonic() < deadline, f"generation {generation} not applied: {state.ack()}"
        time.sleep(0.01)


def test_file_rewritten_in_place_is_hot_reloaded(tmp_path: Path) -> None:
    path = tmp_path / CONFIG_FILE_NAME
    state, gate, _ = make_state()
    watcher = FileWatcher(state, path).start(0.02)
    try:
        time.sleep(0.06)
        assert state.origin() == Origin.INITIAL, "a missing file is waited for"
        path.write_bytes(config(1, 3).to_bytes())
        wait_for(state, 1)
        assert gate.snapshot().limit == 3 and state.origin() == Origin.FILE
        with open(path, "r+b") as f:  # same inode
            f.truncate(0)
            f.write(config(2, 6).to_bytes())
        wait_for(state, 2)
        assert gate.snapshot().limit == 6
        path.write_bytes(b'{"version": "nope"}')
        time.sleep(0.15)
        assert state.ack().generation == 2 and gate.snapshot().limit == 6
        path.write_bytes(config(3, 7).to_bytes())
        wait_for(state, 3)
        assert gate.snapshot().limit == 7
    finally:
        watcher.stop()


def kubelet_update(d: Path, stamp: str, cfg: WorkerConfig) -> None:
    """Writes ``cfg`` as kubelet updates a ConfigMap volume: a new timestamped directory, a
    ``..data_tmp`` symlink to it renamed over ``..data``, the old directory removed."""
    ts = d / stamp
    ts.mkdir()
    (ts / CONFIG_FILE_NAME).write_bytes(cfg.to_bytes())
    data = d / "..data"
    old = os.readlink(data) if data.is_symlink() else None
    tmp = d / "..data_tmp"
    os.symlink(stamp, tmp)
    os.rename(tmp, data)
    link = d / CONFIG_FILE_NAME
    if not link.is_symlink():
        os.symlink(f"..data/{CONFIG_FILE_NAME}", link)
    if old is not None:
        for f in (d / old).iterdir():
            f.unlink()
        (d / old).rmdir()


def test_configmap_symlink_swap_is_hot_reloaded(tmp_path: Path) -> None:
    kubelet_update(tmp_path, "..2024_01_01_00_00_00.000000001", config(1, 2))
    state, gate, _ = make_state()
    watcher = FileWatcher(state, tmp_path / CONFIG_FILE_NAME).start(0.02)
    try:
        wait_for(state, 1)
        assert gate.snapshot().limit == 2
        kubelet_update(tmp_path, "..2024_01_01_00_01_00.000000002", config(2, 9))
        wait_for(state, 2)
        assert gate.snapshot().limit == 9
        kubelet_update(tmp_path, "..2024_01_01_00_02_00.000000003", config(5, 1))
        wait_for(state, 5)
        assert gate.snapshot().limit == 1
    finally:
        watcher.stop()


def test_push_status_codes_and_refusals_leave_config_unchanged() -> None:
    admin, gate = make_admin()
    running = admin.state.ack()
    good = config(7, 3).to_bytes()
    cases: list[tuple[str | None, bytes, int]] = [
        (None, good, 401),
        ("forged", good, 401),
        ("other", good, 403),
        ("down", good, 503),
        ("good", b"{not json", 400),
        ("good", WorkerConfig(reaction=0, generation=8).to_bytes(), 400),
        ("good", b" " * (MAX_PAYLOAD_BYTES + 1), 413),
    ]
    for token, body, want in cases:
        r = call(admin, "PUT", CONFIG_PATH, token, body)
        assert r.status == want, (token, r.body)
        assert "error" in r.json()
        assert admin.state.ack() == running, "a refused push changed the config"
        assert gate.snapshot().limit == 16
    # Not a bearer token.
    r = admin.handle("PUT", CONFIG_PATH, {"authorization": "Basic Z29vZA=="}, good)
    assert r.status == 401
    r = call(admin, "PUT", CONFIG_PATH, "good", good)
    assert r.status == 200, r.body
    assert r.json() == {"hash": config(7, 3).hash, "generation": 7}
    assert gate.snapshot().limit == 3
    r = call(admin, "PUT", CONFIG_PATH, "good", config(6, 9).to_bytes())
    assert r.status == 409, r.body
    r = call(admin, "GET", CONFIG_PATH)
    assert r.status == 200 and r.json() == {"hash": config(7, 3).hash, "generation": 7}
    r = call(admin, "GET", "/metrics")
    assert r.status == 200 and config(7, 3).hash in r.body.decode()
    assert r.content_type.startswith("application/openmetrics-text")
    assert call(admin, "GET", "/healthz").status == 200
    assert call(admin, "GET", "/nope").status == 404
    assert call(admin, "POST", CONFIG_PATH).status == 405
    assert call(admin, "DELETE", "/metrics").status == 405
    # A hash that does not match the content: 400 whose message starts "hash mismatch".
    tampered = json.loads(config(8, 3).to_bytes())
    tampered["maxPermits"] = 4
    r = call(admin, "PUT", CONFIG_PATH, "good", json.dumps(tampered).encode())
    assert r.status == 400 and r.json()["error"].startswith("hash mismatch")


def test_pushes_are_refused_without_a_verifier() -> None:
    state, _, _ = make_state()
    admin = Admin(state, None)
    r = call(admin, "PUT", CONFIG_PATH, "anything", config(1, 2).to_bytes())
    assert r.status == 401
    assert admin.state.ack().generation == 0
    assert call(admin, "GET", "/metrics").status == 404


def raw(port: int, request: bytes) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    return out.decode(errors="replace")


def test_server_over_tcp_with_limits_and_timeouts() -> None:
    admin, gate = make_admin()
    server = admin.serve("127.0.0.1", 0)
    try:
        port = server.port
        body = config(2, 5).to_bytes()
        ok = raw(
            port,
            b"PUT " + CONFIG_PATH.encode() + b" HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer good\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body,
        )
        assert ok.startswith("HTTP/1.1 200"), ok
        assert gate.snapshot().limit == 5
        # Chunked bodies are read too.
        body = config(3, 6).to_bytes()
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        ok = raw(
            port,
            b"PUT /v1/config HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer good\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked,
        )
        assert ok.startswith("HTTP/1.1 200"), ok
        assert gate.snapshot().limit == 6
        big = raw(
            port,
            b"PUT /v1/config HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer good\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (MAX_PAYLOAD_BYTES + 1),
        )
        assert big.startswith("HTTP/1.1 413"), big
        slow = raw(
            port,
            b"PUT /v1/config HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer good\r\n"
            b"Content-Length: 100\r\nConnection: close\r\n\r\n{",
        )
        assert slow.startswith("HTTP/1.1 408"), slow
        # A client that never finishes its headers is disconnected.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: w\r\n")
            start = time.monotonic()
            assert s.recv(1024) == b""
            assert time.monotonic() - start < 4
        assert admin.state.ack().generation == 3
        metrics = raw(port, b"GET /metrics HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n")
        assert metrics.startswith("HTTP/1.1 200"), metrics
        assert 'backpressure_permits{workload="w"} 6' in metrics
        # Keep-alive: two requests on one connection.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(
                b"GET /healthz HTTP/1.1\r\nHost: w\r\n\r\nGET /v1/config HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n"
            )
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        assert out.count(b"HTTP/1.1 200") == 2, out
    finally:
        server.shutdown()


def test_generations_far_ahead_of_the_clock_are_refused_without_effect() -> None:
    now = 1_700_000_000
    state, gate, _ = make_state()

    def ahead(generation: int) -> WorkerConfig:
        return WorkerConfig(generation=generation, max_permits=3, brake=BrakeConfig(1.0))

    for generation in [(1 << 53) - 1, now * 1000 + MAX_GENERATION_LEAD_MS + 1]:
        with pytest.raises(Invalid) as e:
            state.apply(ahead(generation), Origin.PUSH, now_unix=now)
        assert isinstance(e.value.error, FieldError) and e.value.error.field == "generation"
        assert "ahead of this worker's clock" in str(e.value)
        assert state.ack().generation == 0
        assert (gate.snapshot().limit, gate.snapshot().backoff) == (16, 0.0)
    ack = state.apply(ahead(now * 1000 + MAX_GENERATION_LEAD_MS), Origin.PUSH, now_unix=now)
    assert ack.generation == now * 1000 + MAX_GENERATION_LEAD_MS
    assert gate.snapshot().backoff == 1.0
    admin, gate = make_admin()
    running = admin.state.ack()
    r = call(admin, "PUT", CONFIG_PATH, "good", ahead((1 << 53) - 1).to_bytes())
    assert r.status == 400 and "generation" in r.json()["error"]
    assert admin.state.ack() == running and gate.snapshot().limit == 16
    nxt = config(0, 5).replace(generation=unix_now() * 1000)
    assert call(admin, "PUT", CONFIG_PATH, "good", nxt.to_bytes()).status == 200


def test_values_over_the_worker_limits_are_refused_naming_the_field() -> None:
    admin, gate = make_admin()
    running = admin.state.ack()
    limits = Limits()
    cases = [
        (config(1, 1).replace(max_permits=limits.max_permits + 1), "maxPermits"),
        (config(1, 1).replace(max_permits=2**32 - 1), "maxPermits"),
        (config(1, 1).replace(reaction=limits.max_reaction + 1), "reaction"),
        (config(1, 1).replace(probe_initial_ms=1), "probeInitialMs"),
        (config(1, 1).replace(probe_max_ms=limits.max_probe_ms + 1), "probeMaxMs"),
        (config(1, 1).replace(probe_initial_ms=2**52, probe_max_ms=2**53 - 1), "probeInitialMs"),
        (config(1, 1).replace(initial_permits=1025), "initialPermits"),
        (config(1, 1).replace(ratio_window_ms=3_600_001), "ratioWindowMs"),
        (config(1, 1).replace(brake_release_ms=3_600_001), "brakeReleaseMs"),
        (config(1, 1).replace(redelivery=RedeliveryConfig(1, 43_200_001)), "redelivery.maxMs"),
        (config(1, 1).replace(floor_max=0.91), "floorMax"),
    ]
    for cfg, field in cases:
        r = call(admin, "PUT", CONFIG_PATH, "good", cfg.replace(hash="").to_bytes())
        assert r.status == 400, (field, r.body)
        assert field in r.json()["error"], (field, r.body)
        assert admin.state.ack() == running and gate.snapshot().limit == 16
    with pytest.raises(Invalid):
        admin.state.apply(config(2, 5000), Origin.FILE)
    state, gate, _ = make_state()
    state.with_limits(Limits(max_permits=5000)).apply(config(2, 5000), Origin.PUSH)
    assert gate.snapshot().limit == 5000


def test_failed_authentications_are_rate_limited_per_source() -> None:
    now = [1000.0]
    admin, gate = make_admin(failure_limit=FailureLimit(burst=3, refill_s=2.0), clock=lambda: now[0])

    def put(source: str, token: str | None, generation: int) -> Response:
        return call(admin, "PUT", CONFIG_PATH, token, config(generation, 2).to_bytes(), source)

    attacker = "10.0.0.66"
    assert put(attacker, None, 1).status == 401
    assert put(attacker, "forged", 1).status == 401
    assert put(attacker, "other", 1).status == 403
    for token in ["forged", None, "good"]:
        r = put(attacker, token, 1)
        assert r.status == 429, token
        assert r.headers.get("Retry-After") == "2"
    assert admin.state.ack().generation == 0
    operator = "10.0.0.7"
    assert put(operator, "good", 2).status == 200
    assert gate.snapshot().limit == 2
    for g in range(3, 20):
        assert put(operator, "good", g).status == 200, "successful pushes cost nothing"
    now[0] += 2
    assert put(attacker, "forged", 1).status == 401, "one failure forgiven per refill period"
    assert put(attacker, "forged", 1).status == 429
    now[0] += 2
    assert put(attacker, "good", 30).status == 200
    assert admin.state.ack().generation == 30


def test_optional_settings_of_a_payload_are_applied_and_absent_ones_keep_the_application_s() -> None:
    state, gate, _ = make_state()
    before = gate.settings
    assert before.initial_permits == 0
    state.apply(
        config(2, 8)
        .replace(
            initial_permits=4,
            ratio_window_ms=10_000,
            brake_release_ms=0,
            floor_max=0.1,
            redelivery=RedeliveryConfig(30_000, 120_000),
        )
        .with_hash(),
        Origin.PUSH,
    )
    s = gate.settings
    assert (s.initial_permits, s.ratio_window, s.brake_release, s.floor_max) == (4, from_secs(10), 0, 0.1)
    assert s.redelivery == (from_secs(30), from_secs(120))
    state.apply(config(3, 8).replace(redelivery=RedeliveryConfig(0, 0)).with_hash(), Origin.PUSH)
    assert gate.settings.redelivery is None
    state.apply(config(4, 8), Origin.PUSH)
    s = gate.settings
    assert (s.initial_permits, s.ratio_window, s.brake_release, s.floor_max, s.redelivery) == (
        before.initial_permits,
        before.ratio_window,
        before.brake_release,
        before.floor_max,
        before.redelivery,
    )
