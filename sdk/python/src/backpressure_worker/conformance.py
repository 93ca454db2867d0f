"""The conformance hook's executor: one golden-vector case (``conformance/vectors/controller.json``,
format in ``conformance/README.md``) run on a fresh controller, with the readings after every
step (``crates/worker/src/conformance.rs``).

It is the only implementation of a case's step semantics in this SDK: the admin server answers
``POST`` :data:`HOOK_PATH` with it when the worker was started for a conformance run
(:meth:`~.admin.Admin.with_conformance_hook`), and the SDK's golden-vector tests run every case
of the committed vectors through it. The controller that serves messages is never touched:
each case builds its own from its ``config`` and ``seed``, and the case's times are the only
clock.

>>> from backpressure_worker.wire import WorkerConfig
>>> case = Case.from_json({
...     "seed": 7, "brakeOffsetNs": 0, "config": WorkerConfig.default().to_json(),
...     "steps": [{"t": 1_000_000_000, "op": "permits", "inFlight": 0}],
... })
>>> [o.to_json() for o in execute(case)]  # doctest: +NORMALIZE_WHITESPACE
[{'backoff': 0.0, 'mode': 'starting', 'limit': 2, 'failureFloor': 0.0, 'floorEstimate': None,
  'permits': 2}]
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from .controller import Brake, Controller, Outcome, Settings, apply_settings, from_config
from .wire import ConfigError, Malformed, WorkerConfig, _decode, _i64, _u32, _u64

__all__ = [
    "HOOK_PATH",
    "MAX_CASE_BYTES",
    "MAX_STEPS",
    "Case",
    "CaseError",
    "Configure",
    "InvalidConfig",
    "MalformedCase",
    "Observation",
    "Op",
    "Permits",
    "Record",
    "ReleaseUnused",
    "Step",
    "TimeBackwards",
    "TooManySteps",
    "answer",
    "execute",
    "observations_json",
]

HOOK_PATH = "/v1/conformance/controller"
"""The hook's path on the admin port."""
MAX_STEPS = 1_000_000
"""Most steps one case may run."""
MAX_CASE_BYTES = 16 * 1024 * 1024
"""Largest request body the hook reads (a case of the committed vectors is far smaller)."""

_T = TypeVar("_T")

_OPS = ("record", "permits", "releaseUnused", "configure")
_OUTCOMES = tuple(o.value for o in Outcome)


# ---------------------------------------------------------------------------------------------
# Errors


class CaseError(ValueError):
    """Why a case cannot run (the hook answers 400 with this message)."""


class MalformedCase(CaseError):
    """Not a case: bad JSON, a missing or mistyped field, an unknown ``op`` or ``outcome``."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"malformed case: {reason}")
        self.reason = reason


class InvalidConfig(CaseError):
    """A payload of the case does not validate."""

    def __init__(self, at: str, reason: str) -> None:
        super().__init__(f"invalid config in {at}: {reason}")
        self.at = at
        self.reason = reason


class TimeBackwards(CaseError):
    """A step's ``t`` is below the previous step's."""

    def __init__(self, index: int) -> None:
        super().__init__(f"steps[{index}]: t goes back in time")
        self.index = index


class TooManySteps(CaseError):
    """More than :data:`MAX_STEPS` steps."""

    def __init__(self, count: int) -> None:
        super().__init__(f"{count} steps exceed the limit of {MAX_STEPS}")
        self.count = count


# ---------------------------------------------------------------------------------------------
# The case


@dataclass(frozen=True)
class Record:
    """``record(t, outcome)``."""

    outcome: Outcome


@dataclass(frozen=True)
class Permits:
    """``permits(t, inFlight)``; its return value is observed."""

    in_flight: int


@dataclass(frozen=True)
class ReleaseUnused:
    """``release_unused(t, unused)``."""

    unused: int


@dataclass(frozen=True)
class Configure:
    """A new payload: its brake succeeds the old one, then its settings apply. ``unix_s`` is
    the Unix time in seconds at ``t`` (for the brake's ``expiresAtUnix``)."""

    config: WorkerConfig
    unix_s: int


Op = Record | Permits | ReleaseUnused | Configure


@dataclass(frozen=True)
class Step:
    """One call at controller time ``t`` (nanoseconds)."""

    t: int
    op: Op


def _field(doc: dict[str, Any], name: str, at: str) -> Any:
    if name not in doc:
        raise MalformedCase(f"{at}missing field `{name}`")
    return doc[name]


def _shaped(at: str, make: Callable[[], _T]) -> _T:
    """``make()``, with the place of a malformed value in the case named."""
    try:
        return make()
    except Malformed as e:
        raise MalformedCase(f"{at}{e.reason}") from None


def _step(value: object, i: int) -> Step:
    at = f"steps[{i}]: "
    if not isinstance(value, dict):
        raise MalformedCase(f"{at}not an object")
    t = _shaped(at, lambda: _u64(_field(value, "t", at), "t"))
    op = _field(value, "op", at)
    if op == "record":
        outcome = _field(value, "outcome", at)
        if not isinstance(outcome, str) or outcome not in _OUTCOMES:
            expected = ", ".join(f"`{o}`" for o in _OUTCOMES)
            raise MalformedCase(f"{at}unknown outcome {json.dumps(outcome)}, expected one of {expected}")
        return Step(t, Record(Outcome(outcome)))
    if op == "permits":
        return Step(t, Permits(_shaped(at, lambda: _u32(_field(value, "inFlight", at), "inFlight"))))
    if op == "releaseUnused":
        return Step(t, ReleaseUnused(_shaped(at, lambda: _u32(_field(value, "unused", at), "unused"))))
    if op == "configure":
        config = _shaped(f"steps[{i}].config: ", lambda: WorkerConfig.from_json(_field(value, "config", at)))
        unix_s = _shaped(at, lambda: _i64(_field(value, "unixS", at), "unixS"))
        return Step(t, Configure(config, unix_s))
    expected = ", ".join(f"`{o}`" for o in _OPS)
    raise MalformedCase(f"{at}unknown op {json.dumps(op)}, expected one of {expected}")


@dataclass(frozen=True)
class Case:
    """One case. Fields the executor does not need (``name``, ``description``, each step's
    ``expect``) are ignored, so a case of the vectors file is taken as it is."""

    seed: int
    """The seed of the controller's generator."""
    brake_offset_ns: int
    """This worker's brake-lift offset in nanoseconds."""
    config: WorkerConfig
    """The payload the controller is built from."""
    steps: tuple[Step, ...]
    """The calls, in non-decreasing ``t``."""

    @classmethod
    def from_json(cls, value: object) -> Case:
        """A case from its decoded JSON; :class:`MalformedCase` when it is not one (the
        payloads are shaped here and validated by :func:`execute`)."""
        if not isinstance(value, dict):
            raise MalformedCase("a case is a JSON object")
        seed = _shaped("", lambda: _u64(_field(value, "seed", ""), "seed"))
        offset = _shaped("", lambda: _u64(_field(value, "brakeOffsetNs", ""), "brakeOffsetNs"))
        config = _shaped("config: ", lambda: WorkerConfig.from_json(_field(value, "config", "")))
        steps = _field(value, "steps", "")
        if not isinstance(steps, list):
            raise MalformedCase("`steps` is not an array")
        return cls(seed, offset, config, tuple(_step(s, i) for i, s in enumerate(steps)))

    @classmethod
    def parse(cls, data: bytes) -> Case:
        """A case from a request body (strict JSON: no duplicate keys, no NaN)."""
        return cls.from_json(_shaped("", lambda: _decode(data)))


# ---------------------------------------------------------------------------------------------
# Execution


def _finite(x: float | None) -> float | None:
    """JSON has no NaN or infinity: such a reading is written as null (as serde_json does)."""
    return x if x is None or math.isfinite(x) else None


@dataclass(frozen=True)
class Observation:
    """The readings after one step (the fields of a step's ``expect``), read at the step's
    ``t`` after the call."""

    backoff: float
    mode: str
    limit: int
    failure_floor: float
    floor_estimate: float | None
    permits: int | None = None
    """What ``permits`` returned (only after a ``permits`` step)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "backoff": _finite(self.backoff),
            "mode": self.mode,
            "limit": self.limit,
            "failureFloor": _finite(self.failure_floor),
            "floorEstimate": _finite(self.floor_estimate),
        }
        if self.permits is not None:
            out["permits"] = self.permits
        return out


def _validated(cfg: WorkerConfig, at: str) -> WorkerConfig:
    try:
        cfg.validate()
    except ConfigError as e:
        raise InvalidConfig(at, str(e)) from None
    return cfg


def execute(case: Case) -> list[Observation]:
    """Runs ``case`` on a fresh controller and returns the readings after every step.

    A ``configure`` step applies its payload as a worker does: the settings of the payload; its
    brake converted to controller time at (``t``, ``unixS``); the brake that succeeds the
    previous one, lifting over the settings' brake release with the case's offset; then the
    settings reconfigure the controller in place, or replace it (same seed, starting from the
    old backoff) when the algorithm changes; then it gets the brake.
    """
    if len(case.steps) > MAX_STEPS:
        raise TooManySteps(len(case.steps))
    seed, offset = case.seed, case.brake_offset_ns
    controller: Controller = from_config(_validated(case.config, "config"), seed)
    brake: Brake | None = None
    last = 0
    out: list[Observation] = []
    for i, step in enumerate(case.steps):
        t, op = step.t, step.op
        if t < last:
            raise TimeBackwards(i)
        last = t
        permits: int | None = None
        if isinstance(op, Record):
            controller.record(t, op.outcome)
        elif isinstance(op, Permits):
            permits = controller.permits(t, op.in_flight)
        elif isinstance(op, ReleaseUnused):
            controller.release_unused(t, op.unused)
        else:
            cfg = _validated(op.config, f"steps[{i}].config")
            settings = Settings.from_config(cfg)
            new = Brake.from_wire(cfg.brake, t, op.unix_s) if cfg.brake is not None else None
            brake = Brake.succeed(brake, new, t, settings.brake_release, offset)
            controller = apply_settings(controller, t, settings, seed, brake)
        out.append(
            Observation(
                backoff=controller.backoff(t),
                mode=controller.mode.value,
                limit=controller.limit(t),
                failure_floor=controller.failure_floor(),
                floor_estimate=controller.floor_estimate(),
                permits=permits,
            )
        )
    return out


def observations_json(observations: Iterable[Observation]) -> dict[str, Any]:
    """The hook's answer: ``{"observations": [...]}``."""
    return {"observations": [o.to_json() for o in observations]}


def answer(body: bytes) -> bytes:
    """The hook: the case in ``body`` run on a fresh controller, as the JSON answer. Raises a
    :class:`CaseError` for a body that is not a case."""
    doc = observations_json(execute(Case.parse(body)))
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
