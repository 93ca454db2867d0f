"""Backpressure controllers: they turn message outcomes into a backoff factor and permits.

A :class:`Controller` is plain, synchronous, deterministic state. It never reads a clock: every
call takes the current time as integer nanoseconds since an epoch the caller picks, and the only
randomness (probe jitter) comes from a :class:`SplitMix64` seeded at construction.

- :class:`SetPoint` (default): the set-point integrator with probing, slow start, the startup
  ramp and failure-floor learning;
- :class:`RatioThrottle`: Google SRE client-side throttling with ``K = 1/(1 - s)``, windowed;
- :class:`Fixed`: always ``maxPermits``, honouring the operator's brake;
- :class:`Off`: always ``maxPermits``, brake ignored.

>>> from backpressure_worker.controller import from_config, Outcome
>>> from backpressure_worker.wire import WorkerConfig
>>> c = from_config(WorkerConfig.default(), 7)
>>> now = 1_000_000_000
>>> c.permits(now, 0)  # a fresh controller ramps up from 2 (the startup ramp)
2
>>> for _ in range(40):
...     c.record(now, Outcome.DEPENDENCY_FAILURE)
>>> c.backoff(now), c.permits(now, 0)
(1.0, 0)
"""

from __future__ import annotations

from ..wire import Algorithm, WorkerConfig
from ._core import (
    DEFAULT_BRAKE_RELEASE,
    DEFAULT_CREDIT,
    DEFAULT_RATIO_WINDOW,
    DEFAULT_REDELIVERY,
    Brake,
    Controller,
    Mode,
    Nanos,
    Outcome,
    Settings,
    SplitMix64,
    from_millis,
    from_secs,
    limit_for,
)
from ._fixed import Fixed, Off
from ._ratio import RatioThrottle
from ._set_point import SetPoint

__all__ = [
    "Algorithm",
    "Brake",
    "Controller",
    "DEFAULT_BRAKE_RELEASE",
    "DEFAULT_CREDIT",
    "DEFAULT_RATIO_WINDOW",
    "DEFAULT_REDELIVERY",
    "Fixed",
    "Mode",
    "Nanos",
    "Off",
    "Outcome",
    "RatioThrottle",
    "SetPoint",
    "Settings",
    "SplitMix64",
    "apply_settings",
    "build",
    "from_config",
    "from_millis",
    "from_secs",
    "limit_for",
]


def build(settings: Settings, seed: int) -> Controller:
    """Builds the controller named by ``settings.algorithm``; ``seed`` seeds the probe jitter."""
    settings = settings.sanitized()
    if settings.algorithm == Algorithm.SET_POINT:
        return SetPoint(settings, seed)
    if settings.algorithm == Algorithm.RATIO_THROTTLE:
        return RatioThrottle(settings, seed)
    if settings.algorithm == Algorithm.FIXED:
        return Fixed(settings)
    return Off(settings)


def from_config(cfg: WorkerConfig, seed: int) -> Controller:
    """Builds the controller of a wire configuration (without its brake; see
    :meth:`Brake.from_wire`)."""
    return build(Settings.from_config(cfg), seed)


def apply_settings(
    controller: Controller, now: Nanos, settings: Settings, seed: int, brake: Brake | None
) -> Controller:
    """Applies ``settings``: reconfigures ``controller`` in place when the algorithm is
    unchanged, otherwise builds a new controller that starts from the old controller's own backoff
    (without the brake). The brake is
    set on the result. Returns the controller in force (``controller`` itself or its
    replacement)."""
    settings = settings.sanitized()
    if controller.algorithm == settings.algorithm:
        controller.reconfigure(now, settings)
    else:
        # The old controller's own backoff, without the brake (set again below).
        controller.set_brake(None)
        previous = controller.backoff(now)
        nxt = build(settings, seed)
        nxt.start_from(now, previous)
        controller = nxt
    controller.set_brake(brake)
    return controller
