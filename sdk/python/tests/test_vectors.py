"""The golden vectors (conformance/vectors/, format in conformance/README.md): every case of
controller.json step by step, and every payload of hash.json. A missing file fails."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from backpressure_worker import jcs
from backpressure_worker.controller import (
    Brake,
    Controller,
    Outcome,
    Settings,
    apply_settings,
    from_config,
)
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


def run_controller_case(case: dict[str, Any], tolerance: float) -> None:
    """Drives one controller through the case's steps; fails at the first step whose
    readings differ, naming the case and the step."""
    name = case["name"]
    seed = int(case["seed"])
    offset = int(case["brakeOffsetNs"])
    controller: Controller = from_config(WorkerConfig.from_json(case["config"]), seed)
    brake: Brake | None = None
    for i, step in enumerate(case["steps"]):
        t = int(step["t"])
        op = step["op"]
        where = f"case {name!r} step {i} (op {op} at t={t})"
        permits: int | None = None
        if op == "record":
            controller.record(t, Outcome(step["outcome"]))
        elif op == "permits":
            permits = controller.permits(t, int(step["inFlight"]))
        elif op == "releaseUnused":
            controller.release_unused(t, int(step["unused"]))
        elif op == "configure":
            cfg = WorkerConfig.from_json(step["config"])
            cfg.validate()
            settings = Settings.from_config(cfg)
            new = Brake.from_wire(cfg.brake, t, int(step["unixS"])) if cfg.brake else None
            brake = Brake.succeed(brake, new, t, settings.brake_release, offset)
            controller = apply_settings(controller, t, settings, seed, brake)
        else:
            pytest.fail(f"{where}: unknown op")
        expect = step["expect"]
        got: dict[str, Any] = {
            "backoff": controller.backoff(t),
            "mode": controller.mode.value,
            "limit": controller.limit(t),
            "failureFloor": controller.failure_floor(),
            "floorEstimate": controller.floor_estimate(),
        }
        problems = []
        if not _close(got["backoff"], float(expect["backoff"]), tolerance):
            problems.append(f"backoff {got['backoff']!r} != {expect['backoff']!r}")
        if got["mode"] != expect["mode"]:
            problems.append(f"mode {got['mode']} != {expect['mode']}")
        if got["limit"] != expect["limit"]:
            problems.append(f"limit {got['limit']} != {expect['limit']}")
        if "permits" in expect and permits != expect["permits"]:
            problems.append(f"permits {permits} != {expect['permits']}")
        if "permits" in expect and op != "permits":
            problems.append("expect.permits on a step that is not `permits`")
        if "failureFloor" in expect and not _close(
            got["failureFloor"], float(expect["failureFloor"]), tolerance
        ):
            problems.append(f"failureFloor {got['failureFloor']!r} != {expect['failureFloor']!r}")
        if "floorEstimate" in expect:
            want = expect["floorEstimate"]
            if not _close(got["floorEstimate"], None if want is None else float(want), tolerance):
                problems.append(f"floorEstimate {got['floorEstimate']!r} != {want!r}")
        if problems:
            pytest.fail(f"{where}: " + "; ".join(problems), pytrace=False)


@pytest.mark.parametrize("case", _cases(_ctl), ids=_ids(_ctl))
def test_controller_vector(case: dict[str, Any] | None) -> None:
    assert _ctl is not None and case is not None, _ctl_error or f"{_ctl_path}: no cases"
    run_controller_case(case, float(_ctl["tolerance"]))


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
