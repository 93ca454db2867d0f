"""Shared types of the controllers: time, outcomes, modes, settings, the brake, SplitMix64.

A port of ``crates/worker/src/controller/mod.rs``. Time is an ``int`` of nanoseconds since an
epoch the caller picks (monotonic); every Rust ``u64`` operation is reproduced with its
saturation or wrapping so that results match the Rust worker's bit for bit.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import math
from dataclasses import dataclass

from ..wire import (
    DEFAULT_BRAKE_RELEASE_MS,
    DEFAULT_FLOOR_MAX,
    DEFAULT_INITIAL_PERMITS,
    DEFAULT_RATIO_WINDOW_MS,
    DEFAULT_REDELIVERY_BASE_MS,
    DEFAULT_REDELIVERY_MAX_MS,
    MAX_FLOOR_MAX,
    U32_MAX,
    U64_MAX,
    Algorithm,
    BrakeConfig,
    WorkerConfig,
)
from ..wire import metrics as _names

Nanos = int
"""Nanoseconds since an epoch chosen by the caller (u64 semantics: never negative)."""

NANOS_PER_SEC = 1_000_000_000
NANOS_PER_MS = 1_000_000
MASK64 = 0xFFFF_FFFF_FFFF_FFFF
I64_MIN = -(1 << 63)
I64_MAX = (1 << 63) - 1


# -- u64 / f64 helpers with Rust semantics ----------------------------------------------------


def sat_add(a: int, b: int) -> int:
    """``u64::saturating_add``."""
    return min(a + b, U64_MAX)


def sat_sub(a: int, b: int) -> int:
    """``u64::saturating_sub``."""
    return a - b if a > b else 0


def sat_mul(a: int, b: int) -> int:
    """``u64::saturating_mul``."""
    return min(a * b, U64_MAX)


def from_secs(s: int) -> Nanos:
    """``Nanos::from_secs``."""
    return sat_mul(s, NANOS_PER_SEC)


def from_millis(ms: int) -> Nanos:
    """``Nanos::from_millis``."""
    return sat_mul(ms, NANOS_PER_MS)


def secs_f64(n: Nanos) -> float:
    """``Nanos::as_secs_f64``."""
    return float(n) / 1e9


def f64_to_uint(x: float, maximum: int) -> int:
    """Rust's saturating ``as`` cast from f64 to an unsigned integer (NaN gives 0)."""
    if math.isnan(x) or x <= 0.0:
        return 0
    if x >= maximum:
        return maximum
    return int(x)


def f64_to_u32(x: float) -> int:
    return f64_to_uint(x, U32_MAX)


def f64_to_u64(x: float) -> int:
    return f64_to_uint(x, U64_MAX)


def fmax(a: float, b: float) -> float:
    """``f64::max``: NaN is ignored."""
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return a if a >= b else b


def fmin(a: float, b: float) -> float:
    """``f64::min``: NaN is ignored."""
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return a if a <= b else b


def fclamp(x: float, lo: float, hi: float) -> float:
    """``f64::clamp`` (NaN stays NaN)."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def clamp01(x: float) -> float:
    """Clamps to ``[0, 1]``, mapping NaN to 1 (fail safe: a broken computation backs off)."""
    return 1.0 if math.isnan(x) else fclamp(x, 0.0, 1.0)


def limit_for(max_permits: int, backoff: float) -> int:
    """Permits for a backoff: ``floor(max * (1 - b))``, with a small tolerance so that
    ``b = 1 - k/max`` gives exactly ``k``."""
    raw = float(max_permits) * (1.0 - clamp01(backoff)) + 1e-9
    return min(f64_to_u32(math.floor(raw)), max_permits)


def earliest(a: Nanos | None, b: Nanos | None) -> Nanos | None:
    """The earliest of two optional times."""
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


# -- SplitMix64 --------------------------------------------------------------------------------


class SplitMix64:
    """SplitMix64: a tiny seedable generator (for probe jitter), bit-exact with the Rust one."""

    __slots__ = ("state",)

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E37_79B9_7F4A_7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & MASK64
        return z ^ (z >> 31)

    def next_f64(self) -> float:
        """Uniform in [0, 1)."""
        return float(self.next_u64() >> 11) / float(1 << 53)

    def copy(self) -> SplitMix64:
        c = SplitMix64(0)
        c.state = self.state
        return c


# -- outcomes and modes ------------------------------------------------------------------------


class Outcome(enum.Enum):
    """The outcome of processing one message."""

    SUCCESS = _names.CLASS_SUCCESS
    """Processed successfully."""
    DEPENDENCY_FAILURE = _names.CLASS_DEPENDENCY_FAILURE
    """Failed because of a dependency or overload (timeouts, 429/503, throttling, connection
    errors). The only outcome that drives backoff up."""
    MESSAGE_FAILURE = _names.CLASS_MESSAGE_FAILURE
    """Failed because of the message itself (validation, poison message, a 4xx). Never drives
    backoff: the dependency answered."""

    @property
    def class_label(self) -> str:
        """The ``class`` label value of the wire contract."""
        return self.value

    @property
    def index(self) -> int:
        return _OUTCOME_INDEX[self]


_OUTCOME_INDEX = {Outcome.SUCCESS: 0, Outcome.DEPENDENCY_FAILURE: 1, Outcome.MESSAGE_FAILURE: 2}


class Mode(enum.Enum):
    """What a controller is doing."""

    NORMAL = "normal"
    """Permits follow the backoff factor."""
    PROBING = "probing"
    """Fully backed off: one probe at a time on a growing, jittered interval."""
    SLOW_START = "slow_start"
    """A probe succeeded: permits grow by one per success up to the slow-start threshold."""
    STARTING = "starting"
    """A freshly built controller ramps its permits up from ``initial_permits``."""

    def __str__(self) -> str:
        return self.value


# -- the brake ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Brake:
    """The operator's emergency brake in controller time: a minimum backoff, optionally until a
    moment, and how it lifts (gently: see the Rust ``Brake`` docs, "Lifting gently")."""

    min_backoff: float = 0.0
    """Minimum backoff in [0, 1]."""
    until: Nanos | None = None
    """The brake lifts itself at this time, if set."""
    release: Nanos = 0
    """How long a full brake takes to lift; 0 lifts at once."""
    offset: Nanos = 0
    """This pod's delay before its level starts to fall."""
    lift: tuple[float, Nanos] | None = None
    """An earlier, higher level still falling: ``(level, from when it falls)``."""

    @staticmethod
    def from_wire(brake: BrakeConfig, now: Nanos, now_unix: int) -> Brake:
        """Converts the wire brake (expiry in Unix seconds) to controller time. An expiry
        already in the past gives a brake that is inactive."""
        until: Nanos | None = None
        if brake.expires_at_unix is not None:
            ahead = max(I64_MIN, min(I64_MAX, brake.expires_at_unix - now_unix))
            until = now if ahead <= 0 else sat_add(now, from_secs(ahead))
        return Brake(min_backoff=clamp01(brake.min_backoff), until=until)

    @staticmethod
    def succeed(
        old: Brake | None, new: Brake | None, now: Nanos, release: Nanos, offset: Nanos
    ) -> Brake | None:
        """The brake that follows ``old`` when ``new`` is pushed (None: removed) at ``now``,
        lifting gently over ``release`` with this pod's ``offset``. None when nothing is left."""
        base = new if new is not None else Brake()
        lift: tuple[float, Nanos] | None = None
        nxt = dataclasses.replace(base, release=release, offset=offset, lift=None)
        new_level = _or0(nxt._steady(now))
        if old is not None:
            old_level = _or0(old.active(now))
            if old_level > new_level:
                if _or0(old._steady(now)) > new_level:
                    # The old brake itself was in force and now drops.
                    lift = (old_level, sat_add(now, offset))
                else:
                    # A fall under way (an earlier drop, or the old expiry): it goes on.
                    best: tuple[float, Nanos] | None = None
                    for cand in (old.lift, old._expiry_fall()):
                        if cand is None:
                            continue
                        # Iterator::max_by keeps the last of equal maxima.
                        if best is None or old._fall(cand, now) >= old._fall(best, now):
                            best = cand
                    lift = best
        nxt = dataclasses.replace(nxt, lift=lift)
        empty = nxt.min_backoff <= 0.0 and nxt.until is None and nxt.lift is None
        return None if empty else nxt

    def _steady(self, now: Nanos) -> float | None:
        if self.until is not None and now >= self.until:
            return None
        return clamp01(self.min_backoff)

    def _expiry_fall(self) -> tuple[float, Nanos] | None:
        if self.until is None:
            return None
        return (clamp01(self.min_backoff), sat_add(self.until, self.offset))

    def _fall(self, fall: tuple[float, Nanos], now: Nanos) -> float:
        start_level, start = fall
        if now < start:
            return start_level
        if self.release == 0:
            return 0.0
        return start_level - secs_f64(sat_sub(now, start)) / secs_f64(self.release)

    def active(self, now: Nanos) -> float | None:
        """The minimum backoff in force at ``now``, if any."""
        levels: list[float] = []
        steady = self._steady(now)
        if steady is not None:
            levels.append(steady)
        if self.until is not None and now >= self.until:
            ef = self._expiry_fall()
            if ef is not None:
                levels.append(self._fall(ef, now))
        if self.lift is not None:
            levels.append(self._fall(self.lift, now))
        if not levels:
            return None
        level = levels[0]
        for v in levels[1:]:
            level = fmax(level, v)
        return clamp01(level) if level > 0.0 else None

    def next_change(self, now: Nanos, max_permits: int) -> Nanos | None:
        """The next time after ``now`` at which the permits cap may rise without a new
        outcome."""
        nxt = self.until if self.until is not None and self.until > now else None
        falls = [self.lift, self._expiry_fall() if self.until is not None else None]
        for fall in falls:
            if fall is None:
                continue
            _, start = fall
            if start > now:
                nxt = earliest(nxt, start)
            elif self._fall(fall, now) > 0.0 and self.release > 0:
                step = self.release // max(max_permits, 1)
                nxt = earliest(nxt, sat_add(now, max(step, 1_000_000)))
        return nxt


def _or0(x: float | None) -> float:
    return 0.0 if x is None else x


def brake_cap(brake: Brake | None, max_permits: int, now: Nanos) -> int:
    """The permits cap of an active brake (``max_permits`` without one)."""
    level = brake.active(now) if brake is not None else None
    return max_permits if level is None else limit_for(max_permits, level)


# -- settings ----------------------------------------------------------------------------------

DEFAULT_BRAKE_RELEASE: Nanos = from_millis(DEFAULT_BRAKE_RELEASE_MS)
DEFAULT_CREDIT = 1.0
DEFAULT_RATIO_WINDOW: Nanos = from_millis(DEFAULT_RATIO_WINDOW_MS)
DEFAULT_REDELIVERY: tuple[Nanos, Nanos] | None = (
    from_millis(DEFAULT_REDELIVERY_BASE_MS),
    from_millis(DEFAULT_REDELIVERY_MAX_MS),
)


@dataclass(frozen=True)
class Settings:
    """Knobs of every controller: the WorkerConfig fields plus library-side settings.

    ``Settings()`` is ``Settings.from_config(WorkerConfig())``: the defaults.
    """

    algorithm: Algorithm = Algorithm.SET_POINT
    set_point: float = 0.05
    reaction: int = 20
    max_permits: int = 16
    probe_initial: Nanos = from_millis(2000)
    probe_max: Nanos = from_millis(60_000)
    credit: float = DEFAULT_CREDIT
    """SetPoint only: headroom below zero backoff, in units of one reaction."""
    health_check_probes: bool = False
    """Replace message probes with a health check while fully backed off."""
    ratio_window: Nanos = DEFAULT_RATIO_WINDOW
    initial_permits: int = DEFAULT_INITIAL_PERMITS
    brake_release: Nanos = DEFAULT_BRAKE_RELEASE
    floor_max: float = DEFAULT_FLOOR_MAX
    redelivery: tuple[Nanos, Nanos] | None = DEFAULT_REDELIVERY

    @staticmethod
    def from_config(cfg: WorkerConfig) -> Settings:
        """The settings of a (validated) wire configuration, with library defaults for the
        rest. Out-of-range values are clamped to the nearest valid one."""
        ms = from_millis
        redelivery: tuple[Nanos, Nanos] | None
        if cfg.redelivery is None:
            redelivery = DEFAULT_REDELIVERY
        elif cfg.redelivery.base_ms == 0:
            redelivery = None
        else:
            redelivery = (ms(cfg.redelivery.base_ms), ms(cfg.redelivery.max_ms))
        return Settings(
            algorithm=cfg.algorithm,
            set_point=cfg.set_point,
            reaction=cfg.reaction,
            max_permits=cfg.max_permits,
            probe_initial=ms(cfg.probe_initial_ms),
            probe_max=ms(cfg.probe_max_ms),
            credit=DEFAULT_CREDIT,
            health_check_probes=False,
            ratio_window=DEFAULT_RATIO_WINDOW if cfg.ratio_window_ms is None else ms(cfg.ratio_window_ms),
            initial_permits=DEFAULT_INITIAL_PERMITS if cfg.initial_permits is None else cfg.initial_permits,
            brake_release=DEFAULT_BRAKE_RELEASE if cfg.brake_release_ms is None else ms(cfg.brake_release_ms),
            floor_max=DEFAULT_FLOOR_MAX if cfg.floor_max is None else cfg.floor_max,
            redelivery=redelivery,
        ).sanitized()

    @staticmethod
    def steady() -> Settings:
        """The defaults without the startup ramp (``initial_permits`` 0)."""
        return Settings(initial_permits=0)

    def replace(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def sanitized(self) -> Settings:
        """Clamps every field into its valid range (so a controller never divides by zero)."""
        sp = self.set_point
        if not (math.isfinite(sp) and 0.0 < sp < 1.0):
            sp = 0.99 if sp >= 1.0 else 0.0001
        sp = fclamp(sp, 0.0001, 0.99)
        probe_initial = max(self.probe_initial, 1)
        credit = self.credit if math.isfinite(self.credit) and self.credit >= 0.0 else 0.0
        floor_max = fclamp(self.floor_max, 0.0, MAX_FLOOR_MAX) if math.isfinite(self.floor_max) else 0.0
        redelivery = self.redelivery
        if redelivery is not None:
            base, mx = redelivery
            redelivery = None if base <= 0 else (base, max(mx, base))
        return dataclasses.replace(
            self,
            set_point=sp,
            reaction=max(self.reaction, 1),
            max_permits=max(self.max_permits, 1),
            probe_initial=probe_initial,
            probe_max=max(self.probe_max, probe_initial),
            credit=credit,
            ratio_window=max(self.ratio_window, 1_000_000),
            floor_max=floor_max,
            redelivery=redelivery,
        )


# -- the controller interface ------------------------------------------------------------------


class Controller(abc.ABC):
    """A backpressure controller: plain, synchronous, deterministic state; never reads a clock.

    The calling protocol of a worker:

    1. before each poll, ``permits(now, in_flight)`` where ``in_flight`` counts messages being
       processed *and* permits handed out for polls that have not returned yet;
    2. after a poll, ``release_unused(now, k)`` for the ``k`` permits the poll did not use;
    3. after each processed message, ``record(now, outcome)``.
    """

    @property
    @abc.abstractmethod
    def algorithm(self) -> Algorithm:
        """The algorithm implemented."""

    @property
    @abc.abstractmethod
    def settings(self) -> Settings:
        """The settings in force."""

    @abc.abstractmethod
    def record(self, now: Nanos, outcome: Outcome) -> None:
        """Records the outcome of one processed message."""

    @abc.abstractmethod
    def permits(self, now: Nanos, in_flight: int) -> int:
        """How many more messages may be taken now."""

    def release_unused(self, now: Nanos, unused: int) -> None:  # noqa: B027 - an optional hook
        """Returns ``unused`` permits of the last grant that no message came back for."""

    @abc.abstractmethod
    def limit(self, now: Nanos) -> int:
        """Total concurrency allowed now (the permits gauge); 0 when fully backed off."""

    @abc.abstractmethod
    def backoff(self, now: Nanos) -> float:
        """The backoff factor in [0, 1] (including an active brake)."""

    @property
    @abc.abstractmethod
    def mode(self) -> Mode:
        """The current mode."""

    def failure_floor(self) -> float:
        """The failure floor in force (0 for controllers that do not learn one)."""
        return 0.0

    def floor_estimate(self) -> float | None:
        """What this controller knows about its failure floor (None: not tested yet)."""
        return None

    @abc.abstractmethod
    def reconfigure(self, now: Nanos, settings: Settings) -> None:
        """Applies new settings of the same algorithm, keeping the backoff state."""

    @abc.abstractmethod
    def set_brake(self, brake: Brake | None) -> None:
        """Sets or clears the operator's brake."""

    @abc.abstractmethod
    def next_change(self, now: Nanos) -> Nanos | None:
        """The earliest future time at which ``permits`` may grant more without a new
        outcome, if any."""

    def health_check_due(self, now: Nanos) -> bool:
        """With ``health_check_probes``: whether a health check should run now."""
        return False

    def start_from(self, now: Nanos, backoff: float) -> None:  # noqa: B027 - an optional hook
        """Starts from a backoff carried over from a previous controller."""

    def record_health_check(self, now: Nanos, healthy: bool) -> None:  # noqa: B027 - an optional hook
        """Reports the result of a health check started after ``health_check_due``."""


__all__ = [
    "Brake",
    "Controller",
    "DEFAULT_BRAKE_RELEASE",
    "DEFAULT_CREDIT",
    "DEFAULT_RATIO_WINDOW",
    "DEFAULT_REDELIVERY",
    "Mode",
    "Nanos",
    "Outcome",
    "Settings",
    "SplitMix64",
]
