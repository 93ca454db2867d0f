"""The conformance hook (conformance/README.md, "The conformance hook"; the Rust reference is
crates/worker/src/conformance.rs and Admin::hook): POST /v1/conformance/controller through the
SDK's admin handler, and over TCP."""

from __future__ import annotations

import copy
import json
import math
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest

from backpressure_worker.admin import Admin, Response
from backpressure_worker.config import ConfigState
from backpressure_worker.conformance import HOOK_PATH, MAX_CASE_BYTES, Observation
from backpressure_worker.controller import Outcome, from_config
from backpressure_worker.metrics import Metrics
from backpressure_worker.permits import Gate
from backpressure_worker.token import Identity
from backpressure_worker.wire import WorkerConfig

from .conftest import load_vectors

_path, _vectors, _error = load_vectors("controller.json")
T = 1_000_000_000


def make_admin(hook: bool = True) -> tuple[Admin, Gate, Metrics]:
    metrics = Metrics("w")
    gate = Gate(from_config(WorkerConfig.default(), 1), metrics=metrics)
    admin = Admin(ConfigState(gate, WorkerConfig.default(), metrics), metrics, conformance_hook=hook)
    return admin, gate, metrics


def post(admin: Admin, body: bytes | dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return admin.handle("POST", HOOK_PATH, headers or {}, data, "10.0.0.1")


def case(steps: list[dict[str, Any]], **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "n",
        "description": "d",
        "seed": 7,
        "brakeOffsetNs": 0,
        "config": WorkerConfig.default().to_json(),
        "steps": steps,
    }
    doc.update(over)
    return doc


def golden() -> tuple[list[dict[str, Any]], float]:
    assert _vectors is not None, _error
    return list(_vectors["cases"]), float(_vectors["tolerance"])


def test_the_hook_is_off_by_default_and_404() -> None:
    admin, _, _ = make_admin(hook=False)
    body = case([{"t": T, "op": "permits", "inFlight": 0}])
    r = post(admin, body)
    assert r.status == 404, r.body
    assert "error" in r.json()
    assert post(admin.with_conformance_hook(), body).status == 200
    assert post(admin.with_conformance_hook(False), body).status == 404


def test_a_fresh_controller_runs_the_steps_and_the_answer_has_the_expect_fields() -> None:
    # The library's doc example: a fresh controller starts at 2 permits (the startup ramp) and
    # 40 dependency failures back it off fully.
    admin, gate, metrics = make_admin()
    steps = [{"t": T, "op": "permits", "inFlight": 0, "expect": {"ignored": True}}]
    steps += [{"t": T, "op": "record", "outcome": "dependency_failure"}] * 40
    steps += [{"t": T, "op": "permits", "inFlight": 0}]
    r = post(admin, case(steps), {"Content-Type": "application/json"})
    assert r.status == 200, r.body
    assert r.content_type == "application/json"
    obs = r.json()["observations"]
    assert len(obs) == 42
    assert obs[0] == {
        "backoff": 0.0,
        "mode": "starting",
        "limit": 2,
        "failureFloor": 0.0,
        "floorEstimate": None,
        "permits": 2,
    }
    assert "permits" not in obs[1], "permits only on permits steps"
    assert obs[1]["floorEstimate"] is None and "floorEstimate" in obs[1]
    assert obs[41]["backoff"] == 1.0 and obs[41]["permits"] == 0
    # The worker's own controller and metrics were not touched.
    snap = gate.snapshot()
    assert (snap.backoff, snap.mode.value, snap.limit) == (0.0, "starting", 2)
    assert metrics.outcome_count(Outcome.DEPENDENCY_FAILURE) == 0
    # Each request is a fresh controller: the same case gives the same answer.
    assert post(admin, case(steps)).json() == r.json()


def test_every_golden_case_sent_as_in_the_file_reproduces_its_expect() -> None:
    admin, _, _ = make_admin()
    cases, tolerance = golden()
    for c in cases:
        r = post(admin, c)
        assert r.status == 200, (c["name"], r.body)
        obs = r.json()["observations"]
        assert len(obs) == len(c["steps"]), c["name"]
        for i, (step, got) in enumerate(zip(c["steps"], obs, strict=True)):
            where = f"{c['name']} step {i}"
            want = step["expect"]
            assert set(got) == set(want), where  # same field names, permits only on permits
            for field, w in want.items():
                g = got[field]
                if field in ("backoff", "failureFloor", "floorEstimate") and w is not None:
                    assert g is not None and abs(g - w) <= tolerance, (where, field, g, w)
                else:
                    assert g == w, (where, field, g, w)


def test_a_golden_case_with_a_broken_expect_still_runs() -> None:
    # `expect` is ignored: the answer is the controller's, not the file's.
    admin, _, _ = make_admin()
    cases, _ = golden()
    original = cases[0]
    broken = copy.deepcopy(original)
    for step in broken["steps"]:
        step["expect"] = {"backoff": "nonsense"}
    assert post(admin, broken).json() == post(admin, original).json()


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (b"{not json", "malformed"),
        (b"[]", "object"),
        (b'{"seed": 1, "seed": 2}', "duplicate"),
        (json.dumps(case([])).encode().replace(b'"seed": 7', b'"seed": NaN'), "malformed"),
        (json.dumps({k: v for k, v in case([]).items() if k != "seed"}).encode(), "seed"),
        (json.dumps(case([], seed=-1)).encode(), "seed"),
        (json.dumps(dict(case([]), steps={})).encode(), "steps"),
        (json.dumps(case([{"t": 1, "op": "explode"}])).encode(), "explode"),
        (json.dumps(case([{"op": "permits", "inFlight": 0}])).encode(), "`t`"),
        (json.dumps(case([{"t": 1.5, "op": "permits", "inFlight": 0}])).encode(), "`t`"),
        (json.dumps(case([{"t": 1, "op": "permits"}])).encode(), "inFlight"),
        (json.dumps(case([{"t": 1, "op": "record", "outcome": "meh"}])).encode(), "meh"),
        (json.dumps(case([{"t": 1, "op": "releaseUnused", "unused": -1}])).encode(), "unused"),
        (json.dumps(case([], config={"version": "x"})).encode(), "config"),
        (
            json.dumps(case([], config=dict(WorkerConfig.default().to_json(), bogus=1))).encode(),
            "bogus",
        ),
        (
            json.dumps(case([], config=WorkerConfig(set_point=2.0).to_json())).encode(),
            "setPoint",
        ),
        (
            json.dumps(case([], config=dict(WorkerConfig.default().to_json(), hash="000000000000"))).encode(),
            "hash mismatch",
        ),
        (
            json.dumps(
                case([{"t": 1, "op": "configure", "unixS": 0, "config": WorkerConfig(reaction=0).to_json()}])
            ).encode(),
            "steps[0].config",
        ),
        (
            json.dumps(case([{"t": 1, "op": "configure", "config": WorkerConfig().to_json()}])).encode(),
            "unixS",
        ),
        (
            json.dumps(
                case(
                    [
                        {"t": 2, "op": "record", "outcome": "success"},
                        {"t": 1, "op": "record", "outcome": "success"},
                    ]
                )
            ).encode(),
            "steps[1]: t goes back in time",
        ),
    ],
)
def test_a_body_that_is_not_a_case_is_400_saying_why(body: bytes, names: str) -> None:
    admin, _, _ = make_admin()
    r = post(admin, body)
    assert r.status == 400, r.body
    error = r.json()["error"]
    assert isinstance(error, str) and names in error, error


def test_an_oversized_body_is_413_without_being_read() -> None:
    admin, _, _ = make_admin()
    r = post(admin, b" " * (MAX_CASE_BYTES + 1))
    assert r.status == 413 and "error" in r.json()
    # A declared length over the limit is refused before the body is read.
    reads: list[int] = []

    def reader(limit: int) -> bytes:
        reads.append(limit)
        return b""

    r = admin.handle("POST", HOOK_PATH, {"Content-Length": str(MAX_CASE_BYTES + 1)}, reader)
    assert r.status == 413 and reads == []
    # Within the limit the body is read with the hook's limit, not the push limit.
    admin.handle("POST", HOOK_PATH, {"Content-Length": "2"}, reader)
    assert reads == [MAX_CASE_BYTES]


def test_the_hook_takes_no_token_even_where_pushes_need_one() -> None:
    class Refuse:
        def verify(self, token: str) -> Identity:
            raise AssertionError("the hook must not authenticate")

    admin, _, _ = make_admin()
    admin.with_verifier(Refuse(), ["someone"])
    assert post(admin, case([{"t": T, "op": "permits", "inFlight": 0}])).status == 200
    assert admin.handle("GET", HOOK_PATH, {}).status == 404, "POST only"


def test_readings_without_a_json_number_are_null() -> None:
    o = Observation(backoff=math.nan, mode="normal", limit=1, failure_floor=math.inf, floor_estimate=None)
    assert o.to_json() == {
        "backoff": None,
        "mode": "normal",
        "limit": 1,
        "failureFloor": None,
        "floorEstimate": None,
    }


def http_post(port: int, body: bytes) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{HOOK_PATH}",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_hook_over_tcp() -> None:
    admin, _, _ = make_admin()
    off, _, _ = make_admin(hook=False)
    server, server_off = admin.serve("127.0.0.1", 0), off.serve("127.0.0.1", 0)
    try:
        cases, _ = golden()
        longest = max(cases, key=lambda c: len(c["steps"]))
        status, got = http_post(server.port, json.dumps(longest).encode())
        assert status == 200, got
        assert len(got["observations"]) == len(longest["steps"])
        status, got = http_post(server.port, b'{"seed": 1}')
        assert status == 400 and "brakeOffsetNs" in got["error"], got
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(
                b"POST %s HTTP/1.1\r\nHost: w\r\nContent-Length: %d\r\n\r\n"
                % (HOOK_PATH.encode(), MAX_CASE_BYTES + 1)
            )
            head = s.recv(65536)
        assert head.startswith(b"HTTP/1.1 413"), head
        status, got = http_post(server_off.port, json.dumps(longest).encode())
        assert status == 404, got
    finally:
        server.shutdown()
        server_off.shutdown()
