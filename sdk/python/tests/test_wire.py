"""WorkerConfig parsing and validation (crates/api/src/wire.rs tests, ported) and JCS."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import pytest

from backpressure_worker import jcs
from backpressure_worker.wire import (
    MAX_PAYLOAD_BYTES,
    MAX_SAFE_INTEGER,
    BrakeConfig,
    ConfigError,
    FieldError,
    HashMismatch,
    Malformed,
    RedeliveryConfig,
    TooLarge,
    UnsupportedVersion,
    WorkerConfig,
    push_audience,
)


def field_of(cfg: WorkerConfig) -> str:
    with pytest.raises(FieldError) as e:
        cfg.validate()
    return e.value.field


def doc(**changes: Any) -> bytes:
    d = WorkerConfig.default().to_json()
    d.update(changes)
    return json.dumps(d).encode()


def test_optional_fields_are_validated_naming_the_field_and_absent_by_default() -> None:
    d = WorkerConfig.default()
    j = d.to_json()
    assert "initialPermits" not in j and "redelivery" not in j
    assert field_of(d.replace(ratio_window_ms=0)) == "ratioWindowMs"
    assert field_of(d.replace(floor_max=0.95)) == "floorMax"
    assert field_of(d.replace(floor_max=math.nan)) == "floorMax"
    assert field_of(d.replace(redelivery=RedeliveryConfig(base_ms=10, max_ms=5))) == "redelivery.maxMs"
    ok = d.replace(
        initial_permits=0,
        ratio_window_ms=1,
        brake_release_ms=0,
        floor_max=0.0,
        redelivery=RedeliveryConfig(base_ms=0, max_ms=0),
    ).with_hash()
    ok.validate()
    assert WorkerConfig.parse(ok.to_bytes()) == ok


def test_default_round_trips_and_validates() -> None:
    cfg = WorkerConfig.default()
    assert WorkerConfig.parse(cfg.to_bytes()) == cfg
    assert cfg.to_json() == {
        "version": "backpressure.dev/worker-config/v1",
        "generation": 0,
        "hash": cfg.hash,
        "algorithm": "SetPoint",
        "setPoint": 0.05,
        "reaction": 20,
        "maxPermits": 16,
        "probeInitialMs": 2000,
        "probeMaxMs": 60000,
    }


def test_hash_changes_with_content_not_generation() -> None:
    a = WorkerConfig.default()
    b = a.replace(set_point=0.1).with_hash()
    assert a.hash != b.hash and len(a.hash) == 12
    assert all(c in "0123456789abcdef" for c in a.hash)
    assert a.replace(generation=99).with_hash().hash == a.hash


def test_hash_is_over_the_canonical_form() -> None:
    # 1.0 and 1 are the same number to JCS: the hash does not depend on how it was written.
    a = json.loads(doc(brake={"minBackoff": 1.0}, hash=""))
    b = json.loads(doc(brake={"minBackoff": 1}, hash=""))
    ha = WorkerConfig.parse(json.dumps(a).encode()).compute_hash()
    hb = WorkerConfig.parse(json.dumps(b).encode()).compute_hash()
    assert ha == hb
    cfg = WorkerConfig.default()
    text = jcs.canonicalize(cfg.replace(hash="").to_json())
    assert text.startswith('{"algorithm":"SetPoint","generation":0,"hash":"","maxPermits":16,')


def test_rejects_with_field_names() -> None:
    base = WorkerConfig.default()
    cases: list[tuple[WorkerConfig, str]] = [
        (base.replace(set_point=1.5, hash=""), "setPoint"),
        (base.replace(set_point=math.nan, hash=""), "setPoint"),
        (base.replace(reaction=0, hash=""), "reaction"),
        (base.replace(max_permits=0, hash=""), "maxPermits"),
        (base.replace(probe_max_ms=1, hash=""), "probeMaxMs"),
        (base.replace(probe_initial_ms=0, probe_max_ms=0, hash=""), "probeInitialMs"),
        (base.replace(generation=-1, hash=""), "generation"),
        (base.replace(brake=BrakeConfig(min_backoff=2.0), hash=""), "brake.minBackoff"),
        (base.replace(generation=MAX_SAFE_INTEGER + 1, hash=""), "generation"),
        (base.replace(probe_max_ms=MAX_SAFE_INTEGER + 1, hash=""), "probeMaxMs"),
        (base.replace(brake=BrakeConfig(0.5, -MAX_SAFE_INTEGER - 1), hash=""), "brake.expiresAtUnix"),
    ]
    for cfg, field in cases:
        with pytest.raises(FieldError) as e:
            cfg.validate()
        assert field in str(e.value), f"{e.value} should name {field}"
        assert e.value.field == field
    assert "1.5 is not in (0, 1)" in str(
        pytest.raises(FieldError, base.replace(set_point=1.5).validate).value
    )
    with pytest.raises(HashMismatch) as h:
        base.replace(set_point=0.2).validate()
    assert str(h.value).startswith("hash mismatch")
    with pytest.raises(Malformed):
        WorkerConfig.parse(b"{not json")
    with pytest.raises(TooLarge):
        WorkerConfig.parse(b" " * (MAX_PAYLOAD_BYTES + 1))
    with pytest.raises(Malformed, match="unknown field `surprise`"):
        WorkerConfig.parse(doc(surprise=1))
    with pytest.raises(UnsupportedVersion):
        WorkerConfig.parse(doc(version="v0", hash=""))


@pytest.mark.parametrize(
    "changes",
    [
        {"setPoint": "0.05"},
        {"setPoint": True},
        {"setPoint": None},
        {"reaction": 20.0},
        {"reaction": -1},
        {"reaction": 2**32},
        {"maxPermits": 1e2},
        {"probeInitialMs": 2**64},
        {"generation": 2**63},
        {"generation": "1"},
        {"algorithm": "Adaptive"},
        {"algorithm": 1},
        {"hash": None},
        {"version": 1},
        {"brake": {"minBackoff": 0.5, "extra": 1}},
        {"brake": {}},
        {"brake": [0.5]},
        {"redelivery": {"baseMs": 1}},
        {"redelivery": {"baseMs": 1.5, "maxMs": 2}},
    ],
)
def test_wrong_shapes_are_malformed(changes: dict[str, Any]) -> None:
    with pytest.raises(Malformed):
        WorkerConfig.parse(doc(**{"hash": "", **changes}))


@pytest.mark.parametrize(
    "raw",
    [
        b'{"version":"backpressure.dev/worker-config/v1","version":"x"}',
        b"NaN",
        b"[]",
        b"\xff\xfe",
        b'{"setPoint": 1e400}',
        b"",
        b'{"a":1} x',
    ],
)
def test_not_json_or_not_the_shape_is_malformed(raw: bytes) -> None:
    with pytest.raises(Malformed):
        WorkerConfig.parse(raw)


def test_missing_fields_and_nulls() -> None:
    d = WorkerConfig.default().to_json()
    del d["setPoint"]
    with pytest.raises(Malformed, match="missing field `setPoint`"):
        WorkerConfig.parse(json.dumps(d).encode())
    # Optional fields may be null (absent); the hash may be absent (not given).
    d = WorkerConfig.default().to_json()
    del d["hash"]
    d["initialPermits"] = None
    d["brake"] = None
    cfg = WorkerConfig.parse(json.dumps(d).encode())
    assert cfg.hash == "" and cfg.initial_permits is None and cfg.brake is None
    # Numbers written as integers for floats are fine.
    cfg = WorkerConfig.parse(doc(hash="", brake={"minBackoff": 1, "expiresAtUnix": 5}))
    assert cfg.brake == BrakeConfig(1.0, 5) and isinstance(cfg.brake.min_backoff, float)


def test_brake_expires() -> None:
    cfg = WorkerConfig(brake=BrakeConfig(min_backoff=0.5, expires_at_unix=100))
    assert cfg.active_brake(99) == 0.5
    assert cfg.active_brake(100) is None


def test_push_audience() -> None:
    assert push_audience("shop", "export") == "backpressure.dev/shop/export"


def test_hostile_fields_are_accepted_validly_or_refused_clearly() -> None:
    """A valid document with one field replaced by an arbitrary JSON value is either a valid
    config that round-trips, or a ConfigError with a message; never another exception."""
    rng = random.Random(1234)
    leaves: list[Any] = [
        None,
        True,
        False,
        0,
        -1,
        1,
        2**53,
        2**64,
        -(2**63),
        0.5,
        -0.0,
        1e308,
        1e-300,
        "",
        "SetPoint",
        "backpressure.dev/worker-config/v1",
        "\u2028",
        "x" * 50,
    ]

    def value(depth: int = 0) -> Any:
        r = rng.random()
        if depth < 2 and r < 0.15:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        if depth < 2 and r < 0.3:
            keys = ["minBackoff", "expiresAtUnix", "baseMs", "maxMs", "zz"]
            return {rng.choice(keys): value(depth + 1) for _ in range(rng.randint(0, 3))}
        return rng.choice(leaves)

    fields = list(WorkerConfig.default().to_json()) + ["brake", "redelivery", "floorMax", "unexpected"]
    for _ in range(3000):
        d = WorkerConfig.default().to_json()
        if rng.random() < 0.5:
            d["hash"] = ""
        d[rng.choice(fields)] = value()
        raw = json.dumps(d).encode()
        try:
            cfg = WorkerConfig.parse(raw)
        except ConfigError as e:
            assert str(e)
            continue
        assert 0.0 < cfg.set_point < 1.0 and cfg.reaction >= 1 and cfg.max_permits >= 1
        assert 1 <= cfg.probe_initial_ms <= cfg.probe_max_ms and cfg.generation >= 0
        assert WorkerConfig.parse(cfg.to_bytes()) == cfg


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"),
        (0.05, "0.05"),
        (1e21, "1e+21"),
        (1e20, "100000000000000000000"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (0.000001, "0.000001"),
        (-0.0, "0"),
        (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (2**64 - 1, "18446744073709552000"),
        (2**53 + 1, "9007199254740992"),
        (0.1 + 0.2, "0.30000000000000004"),
        (-4.5, "-4.5"),
        (1.25e-5, "0.0000125"),
        (math.nan, "null"),
        (10**400, "null"),
    ],
)
def test_jcs_numbers_are_written_as_ecmascript_does(value: float, text: str) -> None:
    assert jcs.format_number(value) == text


def test_jcs_sorts_members_by_utf16_and_escapes_as_json_stringify() -> None:
    value = {"b": [True, None, '\u2028/"\\\n\x01'], "a": {"\U0001f600": 1, "\ufb01": 2}, "": 0}
    assert jcs.canonicalize(value) == (
        '{"":0,"a":{"\U0001f600":1,"\ufb01":2},"b":[true,null,"\u2028/\\"\\\\\\n\\u0001"]}'
    )
