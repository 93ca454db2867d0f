"""The wire contract between the operator and the workers (``backpressure.dev/worker-config/v1``).

A port of ``crates/api/src/wire.rs``: the :class:`WorkerConfig` payload, its parsing and
validation (:meth:`WorkerConfig.parse`, :meth:`WorkerConfig.validate`) with the same refusals,
each naming the JSON field, the content hash over the RFC 8785 (JCS) canonical JSON of the
payload, and the names of the HTTP endpoints and metrics.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NoReturn

from . import jcs

__all__ = [
    "ADMIN_PORT_NAME",
    "Algorithm",
    "BrakeConfig",
    "CONFIG_FILE_NAME",
    "CONFIG_PATH",
    "ConfigAck",
    "ConfigError",
    "DEFAULT_ADMIN_PORT",
    "FieldError",
    "HashMismatch",
    "MAX_GENERATION_LEAD_MS",
    "MAX_PAYLOAD_BYTES",
    "MAX_SAFE_INTEGER",
    "Malformed",
    "RedeliveryConfig",
    "TOKEN_AUDIENCE",
    "TooLarge",
    "UnsupportedVersion",
    "WIRE_VERSION",
    "WorkerConfig",
    "metrics",
    "push_audience",
]

WIRE_VERSION = "backpressure.dev/worker-config/v1"
"""Version of the contract, carried in every payload."""
PRODUCER_WIRE_VERSION = "backpressure.dev/producer-state/v1"
TOKEN_AUDIENCE = "backpressure.dev"
"""Prefix of the push token's audience (see :func:`push_audience`)."""
MAX_GENERATION_LEAD_MS = 5 * 60 * 1000
"""How far (ms) a pushed ``generation`` may be ahead of the worker's wall clock."""
CONFIG_PATH = "/v1/config"
ADMIN_PORT_NAME = "bp-admin"
DEFAULT_ADMIN_PORT = 9464
CONFIG_FILE_NAME = "worker-config.json"
MAX_PAYLOAD_BYTES = 64 * 1024
"""Largest payload a worker must accept; larger bodies are refused with 413."""
MAX_SAFE_INTEGER = (1 << 53) - 1
"""Largest integer a document may carry (I-JSON's bound): a larger generation, duration or
time is refused (400) naming the field."""
HASH_MISMATCH = "hash mismatch"
"""How the message of a refused hash starts."""

# Built-in defaults (crates/api/src/defaults.rs).
DEFAULT_SET_POINT = 0.05
DEFAULT_MAX_PERMITS = 16
MIN_REACTION = 20
DEFAULT_PROBE_INITIAL_MS = 2000
DEFAULT_PROBE_MAX_MS = 60_000
DEFAULT_INITIAL_PERMITS = 2
DEFAULT_RATIO_WINDOW_MS = 30_000
DEFAULT_BRAKE_RELEASE_MS = 60_000
DEFAULT_FLOOR_MAX = 0.25
MAX_FLOOR_MAX = 0.9
DEFAULT_REDELIVERY_BASE_MS = 60_000
DEFAULT_REDELIVERY_MAX_MS = 480_000

U32_MAX = 0xFFFF_FFFF
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1


def default_reaction(max_permits: int) -> int:
    """Default reaction size for a maximum of permits: ``max(20, maxPermits)``."""
    return max_permits if max_permits > MIN_REACTION else MIN_REACTION


def push_audience(namespace: str, workload: str) -> str:
    """The token audience of the workers of ``workload`` in ``namespace``."""
    return f"{TOKEN_AUDIENCE}/{namespace}/{workload}"


class metrics:  # noqa: N801 - a namespace, as the Rust module
    """Metric names and labels every worker uses."""

    LABEL_WORKLOAD = "workload"
    LABEL_NAMESPACE = "namespace"
    LABEL_CLASS = "class"
    LABEL_HASH = "hash"
    LABEL_ALGORITHM = "algorithm"
    BACKOFF = "backpressure_backoff_factor"
    FAILURE_FLOOR = "backpressure_failure_floor"
    PERMITS = "backpressure_permits"
    IN_FLIGHT = "backpressure_in_flight"
    OUTCOMES_TOTAL = "backpressure_outcomes_total"
    PROBES_TOTAL = "backpressure_probes_total"
    CONFIG_INFO = "backpressure_config_info"
    CLASS_SUCCESS = "success"
    CLASS_DEPENDENCY_FAILURE = "dependency_failure"
    CLASS_MESSAGE_FAILURE = "message_failure"
    CLASSES = (CLASS_SUCCESS, CLASS_DEPENDENCY_FAILURE, CLASS_MESSAGE_FAILURE)


class Algorithm(enum.StrEnum):
    """The controller algorithms, named as in the CRD."""

    SET_POINT = "SetPoint"
    RATIO_THROTTLE = "RatioThrottle"
    FIXED = "Fixed"
    OFF = "Off"


def rust_float(x: float) -> str:
    """``x`` as Rust's ``{}`` formats an f64 (for error messages that match the Rust worker's)."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    text = format(Decimal(repr(x)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "-0" if text == "0" and math.copysign(1.0, x) < 0 else text


# ---------------------------------------------------------------------------------------------
# Errors


class ConfigError(ValueError):
    """Why a document was refused. Every subclass names the offending field."""


class Malformed(ConfigError):
    """Not JSON, or not the shape of the document."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"malformed document: {reason}")
        self.reason = reason


class UnsupportedVersion(ConfigError):
    """A version this receiver does not speak."""

    def __init__(self, version: str) -> None:
        super().__init__(
            f"unsupported version {json.dumps(version)}: expected {json.dumps(WIRE_VERSION)} "
            f"(worker config) or {json.dumps(PRODUCER_WIRE_VERSION)} (producer state)"
        )
        self.version = version


class FieldError(ConfigError):
    """A field out of range."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"invalid worker config field {field}: {reason}")
        self.field = field
        self.reason = reason


class HashMismatch(ConfigError):
    """The hash does not match the content."""

    def __init__(self, given: str, computed: str) -> None:
        super().__init__(
            f"hash mismatch: payload says {json.dumps(given)}, content hashes to {json.dumps(computed)}"
        )
        self.given = given
        self.computed = computed


class TooLarge(ConfigError):
    """Larger than :data:`MAX_PAYLOAD_BYTES`."""

    def __init__(self, size: int) -> None:
        super().__init__(f"document of {size} bytes exceeds the limit of {MAX_PAYLOAD_BYTES} bytes")
        self.size = size


# ---------------------------------------------------------------------------------------------
# Strict JSON decoding (what serde_json with deny_unknown_fields accepts)


def _malformed(reason: str) -> NoReturn:
    raise Malformed(reason)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            _malformed(f"duplicate field `{k}`")
        out[k] = v
    return out


def _finite_float(text: str) -> float:
    v = float(text)
    if math.isinf(v):
        _malformed(f"number out of range: {text}")
    return v


def _reject_constant(name: str) -> NoReturn:
    _malformed(f"expected value, found {name}")


def _decode(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        _malformed(f"invalid UTF-8: {e.reason}")
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_float=_finite_float,
            parse_constant=_reject_constant,
        )
    except json.JSONDecodeError as e:
        _malformed(f"{e.msg} at line {e.lineno} column {e.colno}")
    except RecursionError:
        _malformed("recursion limit exceeded")


def _kind(v: object) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{rust_float(v)}`"
    if isinstance(v, str):
        return f"string {json.dumps(v)}"
    if isinstance(v, list):
        return "sequence"
    return "map"


def _int(v: object, name: str, lo: int, hi: int, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        _malformed(f"invalid type: {_kind(v)}, expected {what} for `{name}`")
    if not lo <= v <= hi:
        _malformed(f"invalid value: integer `{v}`, expected {what} for `{name}`")
    return v


def _u32(v: object, name: str) -> int:
    return _int(v, name, 0, U32_MAX, "u32")


def _u64(v: object, name: str) -> int:
    return _int(v, name, 0, U64_MAX, "u64")


def _i64(v: object, name: str) -> int:
    return _int(v, name, I64_MIN, I64_MAX, "i64")


def _f64(v: object, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        _malformed(f"invalid type: {_kind(v)}, expected f64 for `{name}`")
    try:
        return float(v)
    except OverflowError:
        _malformed(f"number out of range for `{name}`")


def _str(v: object, name: str) -> str:
    if not isinstance(v, str):
        _malformed(f"invalid type: {_kind(v)}, expected a string for `{name}`")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        _malformed(f"lone surrogate in string `{name}`")
    return v


def _object(v: object, name: str, fields: tuple[str, ...], required: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(v, dict):
        _malformed(f"invalid type: {_kind(v)}, expected struct {name}")
    for k in v:
        if k not in fields:
            expected = ", ".join(f"`{f}`" for f in fields)
            _malformed(f"unknown field `{k}`, expected one of {expected}")
    for k in required:
        if k not in v:
            _malformed(f"missing field `{k}`")
    return v


# ---------------------------------------------------------------------------------------------
# Documents


@dataclass(frozen=True)
class RedeliveryConfig:
    """The redelivery backoff of a failed message (``baseMs`` 0 turns it off)."""

    base_ms: int
    max_ms: int

    def to_json(self) -> dict[str, Any]:
        return {"baseMs": self.base_ms, "maxMs": self.max_ms}


@dataclass(frozen=True)
class BrakeConfig:
    """The operator's brake: a minimum backoff, optionally until a Unix time (seconds)."""

    min_backoff: float
    expires_at_unix: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"minBackoff": self.min_backoff}
        if self.expires_at_unix is not None:
            out["expiresAtUnix"] = self.expires_at_unix
        return out


@dataclass(frozen=True)
class ConfigAck:
    """The worker's answer to a push, and to ``GET /v1/config``."""

    hash: str
    generation: int

    def to_json(self) -> dict[str, Any]:
        return {"hash": self.hash, "generation": self.generation}


_FIELDS = (
    "version",
    "generation",
    "hash",
    "algorithm",
    "setPoint",
    "reaction",
    "maxPermits",
    "probeInitialMs",
    "probeMaxMs",
    "initialPermits",
    "ratioWindowMs",
    "brakeReleaseMs",
    "floorMax",
    "redelivery",
    "brake",
)
_REQUIRED = (
    "version",
    "generation",
    "algorithm",
    "setPoint",
    "reaction",
    "maxPermits",
    "probeInitialMs",
    "probeMaxMs",
)


@dataclass(frozen=True)
class WorkerConfig:
    """The configuration document pushed to every worker.

    ``WorkerConfig()`` holds the API's built-in defaults (without a hash; see
    :meth:`default` for the payload with its hash).
    """

    version: str = WIRE_VERSION
    generation: int = 0
    hash: str = ""
    algorithm: Algorithm = Algorithm.SET_POINT
    set_point: float = DEFAULT_SET_POINT
    reaction: int = default_reaction(DEFAULT_MAX_PERMITS)
    max_permits: int = DEFAULT_MAX_PERMITS
    probe_initial_ms: int = DEFAULT_PROBE_INITIAL_MS
    probe_max_ms: int = DEFAULT_PROBE_MAX_MS
    initial_permits: int | None = None
    ratio_window_ms: int | None = None
    brake_release_ms: int | None = None
    floor_max: float | None = None
    redelivery: RedeliveryConfig | None = None
    brake: BrakeConfig | None = None

    @classmethod
    def default(cls) -> WorkerConfig:
        """The built-in defaults of the API as a payload, with its hash."""
        return cls().with_hash()

    def replace(self, **changes: Any) -> WorkerConfig:
        """A copy with ``changes`` (the hash is kept: call :meth:`with_hash` to refresh it)."""
        return dataclasses.replace(self, **changes)

    # -- JSON --------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The payload as a JSON object (absent optional fields left out)."""
        out: dict[str, Any] = {
            "version": self.version,
            "generation": self.generation,
            "hash": self.hash,
            "algorithm": self.algorithm.value,
            "setPoint": self.set_point,
            "reaction": self.reaction,
            "maxPermits": self.max_permits,
            "probeInitialMs": self.probe_initial_ms,
            "probeMaxMs": self.probe_max_ms,
        }
        optional: dict[str, Any] = {
            "initialPermits": self.initial_permits,
            "ratioWindowMs": self.ratio_window_ms,
            "brakeReleaseMs": self.brake_release_ms,
            "floorMax": self.floor_max,
            "redelivery": self.redelivery.to_json() if self.redelivery else None,
            "brake": self.brake.to_json() if self.brake else None,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out

    def to_bytes(self) -> bytes:
        """The payload as compact JSON (what a push carries)."""
        return json.dumps(self.to_json(), separators=(",", ":"), allow_nan=True).encode()

    @classmethod
    def from_json(cls, value: object) -> WorkerConfig:
        """The shape of a decoded JSON document, as serde does it: unknown fields, missing
        required fields and wrong types are :class:`Malformed`. No range checks (see
        :meth:`validate`)."""
        doc = _object(value, "WorkerConfig", _FIELDS, _REQUIRED)
        algorithm_name = _str(doc["algorithm"], "algorithm")
        try:
            algorithm = Algorithm(algorithm_name)
        except ValueError:
            _malformed(
                f"unknown variant `{algorithm_name}`, expected one of "
                "`SetPoint`, `RatioThrottle`, `Fixed`, `Off`"
            )

        def opt(name: str) -> Any:
            return doc.get(name)

        redelivery = None
        if opt("redelivery") is not None:
            r = _object(doc["redelivery"], "RedeliveryConfig", ("baseMs", "maxMs"), ("baseMs", "maxMs"))
            redelivery = RedeliveryConfig(
                base_ms=_u64(r["baseMs"], "baseMs"), max_ms=_u64(r["maxMs"], "maxMs")
            )
        brake = None
        if opt("brake") is not None:
            b = _object(doc["brake"], "BrakeConfig", ("minBackoff", "expiresAtUnix"), ("minBackoff",))
            expires = b.get("expiresAtUnix")
            brake = BrakeConfig(
                min_backoff=_f64(b["minBackoff"], "minBackoff"),
                expires_at_unix=None if expires is None else _i64(expires, "expiresAtUnix"),
            )
        return cls(
            version=_str(doc["version"], "version"),
            generation=_i64(doc["generation"], "generation"),
            hash=_str(doc["hash"], "hash") if "hash" in doc else "",
            algorithm=algorithm,
            set_point=_f64(doc["setPoint"], "setPoint"),
            reaction=_u32(doc["reaction"], "reaction"),
            max_permits=_u32(doc["maxPermits"], "maxPermits"),
            probe_initial_ms=_u64(doc["probeInitialMs"], "probeInitialMs"),
            probe_max_ms=_u64(doc["probeMaxMs"], "probeMaxMs"),
            initial_permits=None
            if opt("initialPermits") is None
            else _u32(doc["initialPermits"], "initialPermits"),
            ratio_window_ms=None
            if opt("ratioWindowMs") is None
            else _u64(doc["ratioWindowMs"], "ratioWindowMs"),
            brake_release_ms=None
            if opt("brakeReleaseMs") is None
            else _u64(doc["brakeReleaseMs"], "brakeReleaseMs"),
            floor_max=None if opt("floorMax") is None else _f64(doc["floorMax"], "floorMax"),
            redelivery=redelivery,
            brake=brake,
        )

    @classmethod
    def parse(cls, data: bytes) -> WorkerConfig:
        """Parses and validates a payload: size, JSON shape, version, ranges, and (when
        present) hash. Raises a :class:`ConfigError`."""
        if len(data) > MAX_PAYLOAD_BYTES:
            raise TooLarge(len(data))
        cfg = cls.from_json(_decode(data))
        cfg.validate()
        return cfg

    # -- validation and hash -------------------------------------------------------------------

    def validate(self) -> None:
        """Checks version, ranges and the hash (an empty hash means "not given")."""
        if self.version != WIRE_VERSION:
            raise UnsupportedVersion(self.version)
        sp = self.set_point
        if not (math.isfinite(sp) and 0.0 < sp < 1.0):
            raise FieldError("setPoint", f"{rust_float(sp)} is not in (0, 1)")
        if self.reaction == 0:
            raise FieldError("reaction", "must be at least 1")
        if self.max_permits == 0:
            raise FieldError("maxPermits", "must be at least 1")
        if self.probe_initial_ms == 0:
            raise FieldError("probeInitialMs", "must be at least 1")
        if self.probe_max_ms < self.probe_initial_ms:
            raise FieldError(
                "probeMaxMs",
                f"{self.probe_max_ms} is below probeInitialMs {self.probe_initial_ms}",
            )
        if self.generation < 0:
            raise FieldError("generation", "must not be negative")
        expiry = self.brake.expires_at_unix if self.brake is not None else None
        _check_safe_integers(
            ("generation", self.generation),
            ("probeInitialMs", self.probe_initial_ms),
            ("probeMaxMs", self.probe_max_ms),
            ("ratioWindowMs", self.ratio_window_ms),
            ("brakeReleaseMs", self.brake_release_ms),
            ("redelivery.baseMs", self.redelivery.base_ms if self.redelivery else None),
            ("redelivery.maxMs", self.redelivery.max_ms if self.redelivery else None),
            ("brake.expiresAtUnix", expiry),
        )
        if self.ratio_window_ms == 0:
            raise FieldError("ratioWindowMs", "must be at least 1")
        f = self.floor_max
        if f is not None and not (math.isfinite(f) and 0.0 <= f <= MAX_FLOOR_MAX):
            raise FieldError("floorMax", f"{rust_float(f)} is not in [0, {rust_float(MAX_FLOOR_MAX)}]")
        r = self.redelivery
        if r is not None and r.max_ms < r.base_ms:
            raise FieldError("redelivery.maxMs", f"{r.max_ms} is below redelivery.baseMs {r.base_ms}")
        b = self.brake
        if b is not None and not (math.isfinite(b.min_backoff) and 0.0 <= b.min_backoff <= 1.0):
            raise FieldError("brake.minBackoff", f"{rust_float(b.min_backoff)} is not in [0, 1]")
        if self.hash:
            computed = self.compute_hash()
            if computed != self.hash:
                raise HashMismatch(self.hash, computed)

    def compute_hash(self) -> str:
        """SHA-256 over the JCS form of the payload with ``hash`` empty and ``generation`` 0,
        first 12 lowercase hex digits."""
        return content_hash(dataclasses.replace(self, hash="", generation=0).to_json())

    def with_hash(self) -> WorkerConfig:
        """The payload with its hash filled in."""
        return dataclasses.replace(self, hash=self.compute_hash())

    def active_brake(self, now_unix: int) -> float | None:
        """The effective brake at ``now_unix`` (None once expired)."""
        b = self.brake
        if b is None:
            return None
        if b.expires_at_unix is not None and now_unix >= b.expires_at_unix:
            return None
        return b.min_backoff


def _check_safe_integers(*fields: tuple[str, int | None]) -> None:
    """Refuses an integer field whose magnitude is beyond :data:`MAX_SAFE_INTEGER`."""
    for name, value in fields:
        if value is not None and abs(value) > MAX_SAFE_INTEGER:
            raise FieldError(
                name,
                f"{abs(value)} is beyond 2^53 - 1, the largest integer every JSON reader holds exactly",
            )


def content_hash(doc: object) -> str:
    """The first 12 hex digits of the SHA-256 of the JCS form of a JSON document."""
    return hashlib.sha256(jcs.canonical_bytes(doc)).hexdigest()[:12]
