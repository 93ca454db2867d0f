"""The golden vectors (conformance/vectors/, format in conformance/README.md): every case of
controller.json step by step through the conformance executor the hook serves
(backpressure_worker.conformance), and every payload of hash.json. A missing file fails."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from backpressure_worker import jcs
from backpressure_worker.conformance import Case, execute
from backpressure_worker.wire import WIRE_VERSION, WorkerConfig, content_hash

from .conftest import load_vectors

CONTROLLER_FORMAT = "backpressure.dev/controller-vectors/v1"
HASH_FORMAT = "backpressure.dev/hash-vectors/v1"

_ctl_path, _ctl, _ctl_error = load_vectors("controller.json")
_hash_path, _hash, _hash_error = load_vectors("hash.json")


def _cases(data: dict[str, Any] | None) -> list[Any]:
    if data is None or not isinstance(data.get("cases"), list) or not data["cases"]:
        return [None]  # one test that fails with the reason
    return list(data["cases"])


def _ids(data: dict[str, Any] | None) -> list[str]:
    return [c["name"] if isinstance(c, dict) else "missing" for c in _cases(data)]


def test_controller_vectors_file() -> None:
    assert _ctl is not None, _ctl_error
    assert _ctl.get("format") == CONTROLLER_FORMAT, _ctl.get("format")
    assert isinstance(_ctl.get("tolerance"), (int, float))
    assert _ctl.get("cases"), f"{_ctl_path}: no cases"
    names = [c["name"] for c in _ctl["cases"]]
    assert len(names) == len(set(names)), "case names are unique"


def _close(a: float | None, b: float | None, tol: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= tol


def check_controller_case(case: dict[str, Any], tolerance: float) -> None:
    """Runs the case through the SDK's conformance executor (the one the hook serves) and
    fails at the first step whose readings differ from its ``expect``, naming the case and the
    step."""
    name = case["name"]
    observations = execute(Case.from_json(case))
    steps = case["steps"]
    assert len(observations) == len(steps), f"case {name!r}: one observation per step"
    for i, (step, obs) in enumerate(zip(steps, observations, strict=True)):
        where = f"case {name!r} step {i} (op {step['op']} at t={step['t']})"
        expect = step["expect"]
        problems = []
        if not _close(obs.backoff, float(expect["backoff"]), tolerance):
            problems.append(f"backoff {obs.backoff!r} != {expect['backoff']!r}")
        if obs.mode != expect["mode"]:
            problems.append(f"mode {obs.mode} != {expect['mode']}")
        if obs.limit != expect["limit"]:
            problems.append(f"limit {obs.limit} != {expect['limit']}")
        if ("permits" in expect) != (step["op"] == "permits"):
            problems.append("expect.permits on a step that is not `permits`, or missing on one")
        if "permits" in expect and obs.permits != expect["permits"]:
            problems.append(f"permits {obs.permits} != {expect['permits']}")
        if "failureFloor" in expect and not _close(
            obs.failure_floor, float(expect["failureFloor"]), tolerance
        ):
            problems.append(f"failureFloor {obs.failure_floor!r} != {expect['failureFloor']!r}")
        if "floorEstimate" in expect:
            want = expect["floorEstimate"]
            if not _close(obs.floor_estimate, None if want is None else float(want), tolerance):
                problems.append(f"floorEstimate {obs.floor_estimate!r} != {want!r}")
        if problems:
            pytest.fail(f"{where}: " + "; ".join(problems), pytrace=False)


@pytest.mark.parametrize("case", _cases(_ctl), ids=_ids(_ctl))
def test_controller_vector(case: dict[str, Any] | None) -> None:
    assert _ctl is not None and case is not None, _ctl_error or f"{_ctl_path}: no cases"
    check_controller_case(case, float(_ctl["tolerance"]))


def test_hash_vectors_file() -> None:
    assert _hash is not None, _hash_error
    assert _hash.get("format") == HASH_FORMAT, _hash.get("format")
    assert _hash.get("cases"), f"{_hash_path}: no cases"


@pytest.mark.parametrize("case", _cases(_hash), ids=_ids(_hash))
def test_hash_vector(case: dict[str, Any] | None) -> None:
    assert _hash is not None and case is not None, _hash_error or f"{_hash_path}: no cases"
    name = case["name"]
    payload = case["payload"]
    content = dict(payload, hash="", generation=0)
    assert jcs.canonicalize(content) == case["jcs"], f"{name}: canonical JSON"
    # Any document of the contract: SHA-256 of the canonical JSON, 12 hex digits.
    assert content_hash(content) == case["hash"], f"{name}: hash"
    if payload.get("version") == WIRE_VERSION:
        # A worker config: parsed and validated as a push is, with its given hash checked.
        cfg = WorkerConfig.parse(json.dumps(payload).encode())
        assert cfg.compute_hash() == case["hash"], f"{name}: hash"
        assert cfg.hash == case["hash"], f"{name}: the payload carries its hash"
