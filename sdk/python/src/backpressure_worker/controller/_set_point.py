"""The set-point integrator with probing and slow start (the default controller).

A port of ``crates/worker/src/controller/set_point.rs``; its doc comments explain the algorithm
(``docs/algorithms.md`` §2 for the reasoning). The floating-point operations are done in the
same order as in Rust so that results match to the last bit.
"""

from __future__ import annotations

import math

from ..wire import Algorithm
from ._core import (
    Brake,
    Controller,
    Mode,
    Nanos,
    Outcome,
    Settings,
    brake_cap,
    clamp01,
    earliest,
    f64_to_u32,
    fmax,
    fmin,
    limit_for,
    sat_sub,
)
from ._probe import ProbeSchedule

STARTUP_ROUND_TRIPS = 16.0
"""A healthy startup ramp takes about this many round trips."""
PEAK_DECAY_PER_PERMIT = 3e9
"""How fast the remembered peak of permits decays: one permit per this many nanoseconds."""
EXPERIMENT_TAU = 600e9
"""Time constant (ns) of the experiment counts."""
MIN_EXPERIMENTS = 30.0
"""Experiments needed before their failure fraction is trusted at all."""
Z = 2.0
"""Confidence of the test "failures at minimal concurrency exceed the set point"."""
FLOOR_WINDOW = 1000.0
"""Outcomes in the moving average of the failure fraction the floor follows down."""
ADOPT = 1.5
"""A floor is adopted only above this multiple of the set point."""


def _snap(x: float) -> float:
    """Rounds values within 1e-12 of 0 to exactly 0."""
    return 0.0 if abs(x) < 1e-12 else x


class SetPoint(Controller):
    """The set-point integrator: an integrator ``x`` in ``[-credit, 1]``; backoff ``max(0, x)``.

    A dependency failure moves ``x`` up by ``1/N``, a success down by ``s/((1-s)N)``, a message
    failure not at all; permits are ``floor(maxPermits * (1 - backoff))``; at 0 permits it
    probes, then slow-starts. A fresh controller starts up in ``Mode.STARTING``; a failure
    floor is learned from the experiments of probing and slow start.
    """

    def __init__(self, settings: Settings, seed: int) -> None:
        settings = settings.sanitized()
        self._settings = settings
        self._probe = ProbeSchedule(settings.probe_initial, settings.probe_max, seed)
        self._x = -settings.credit
        self._up = 0.0
        self._down = 0.0
        self._mode = Mode.NORMAL
        self._probe_armed = False
        self._ssthresh = 2
        self._peak = float(settings.max_permits)
        self._peak_at: Nanos | None = None
        self._brake: Brake | None = None
        self._window = 0.0
        self._exp_n = 0.0
        self._exp_fail = 0.0
        self._exp_at: Nanos | None = None
        self._f_avg = 0.0
        self._floor = 0.0
        self._set_steps()
        initial = settings.initial_permits
        if 0 < initial < settings.max_permits:
            self._mode = Mode.STARTING
            self._window = float(initial)

    def __repr__(self) -> str:
        return (
            f"SetPoint(mode={self._mode}, x={self._x!r}, window={self._window!r}, "
            f"floor={self._floor!r}, settings={self._settings!r})"
        )

    # -- inspection ----------------------------------------------------------------------------

    def startup_window(self) -> int:
        """The startup window's permits (``maxPermits`` once started)."""
        if self._mode == Mode.STARTING:
            return max(1, min(f64_to_u32(math.floor(self._window)), self._settings.max_permits))
        return self._settings.max_permits

    def window(self) -> float:
        """The startup window as a float (tests)."""
        return self._window

    def integrator(self) -> float:
        """The integrator state, which may be negative (credit)."""
        return self._x

    def ssthresh(self) -> int:
        """The slow-start threshold set when full backoff was last entered."""
        return self._ssthresh

    def probe_interval(self) -> Nanos:
        """The current probe interval (before jitter)."""
        return self._probe.interval

    def effective_set_point(self) -> float:
        """The set point the integrator runs with: ``s_eff = f0 + s·(1 - f0)``."""
        s = self._settings.set_point
        return self._floor + s * (1.0 - self._floor)

    def set_backoff(self, now: Nanos, backoff: float) -> None:
        """Sets the backoff factor directly (carrying state over from another controller)."""
        self._x = clamp01(backoff)
        self._mode = Mode.NORMAL
        self._settle(now)

    # -- internals -----------------------------------------------------------------------------

    def _controlled_limit(self) -> int:
        return min(self._own_limit(), self.startup_window())

    def _record_starting(self, now: Nanos, outcome: Outcome) -> None:
        s = self.effective_set_point()
        gain = float(self._settings.max_permits) / STARTUP_ROUND_TRIPS / self._window
        if outcome == Outcome.SUCCESS:
            self._window += gain
        elif outcome == Outcome.DEPENDENCY_FAILURE:
            self._window = fmax(self._window - gain * (1.0 - s) / s, 1.0)
        else:
            return
        self._integrate(outcome)
        if self._own_limit() == 0:
            self._enter_probing(now)
        else:
            self._finish_starting_if_done(now)

    def _finish_starting_if_done(self, now: Nanos) -> None:
        if self._mode == Mode.STARTING and self._window >= float(self._own_limit()):
            self._mode = Mode.NORMAL
            self._track_peak(now, self._own_limit())

    def _learn(self, now: Nanos, mode: Mode, outcome: Outcome) -> None:
        if outcome == Outcome.SUCCESS:
            failed = 0.0
        elif outcome == Outcome.DEPENDENCY_FAILURE:
            failed = 1.0
        else:
            return
        self._f_avg += (failed - self._f_avg) / FLOOR_WINDOW
        if self._exp_at is not None:
            decay = math.exp(-float(sat_sub(now, self._exp_at)) / EXPERIMENT_TAU)
            self._exp_n *= decay
            self._exp_fail *= decay
        self._exp_at = now
        starting_low = mode == Mode.STARTING and self._window <= fmax(
            float(self._settings.max_permits) / 4.0, 2.0
        )
        if mode in (Mode.PROBING, Mode.SLOW_START) or starting_low:
            self._exp_n += 1.0
            self._exp_fail += failed
        s = self._settings.set_point
        mx = self._settings.floor_max
        f_exp = self._exp_fail / self._exp_n if self._exp_n > 0.0 else 0.0
        significant = (
            self._exp_n >= MIN_EXPERIMENTS
            and f_exp - Z * math.sqrt(f_exp * (1.0 - f_exp) / self._exp_n) > s
            and f_exp <= mx
        )
        candidate = fmin(fmin(f_exp, self._f_avg), mx)
        if (self._floor > 0.0 and candidate > s) or (significant and candidate > ADOPT * s):
            floor = candidate
        else:
            floor = 0.0
        if floor != self._floor:
            self._floor = floor
            self._set_steps()

    def _set_steps(self) -> None:
        s = self.effective_set_point()
        n = float(self._settings.reaction)
        self._up = 1.0 / n
        self._down = s / ((1.0 - s) * n)

    def _own_limit(self) -> int:
        return limit_for(self._settings.max_permits, self._x)

    def _integrate(self, outcome: Outcome) -> None:
        if outcome == Outcome.SUCCESS:
            self._x = _snap(fmax(self._x - self._down, -self._settings.credit))
        elif outcome == Outcome.DEPENDENCY_FAILURE:
            self._x = _snap(fmin(self._x + self._up, 1.0))

    def _settle(self, now: Nanos) -> None:
        limit = self._own_limit()
        if limit == 0:
            if self._mode != Mode.PROBING:
                self._enter_probing(now)
        elif self._mode == Mode.PROBING:
            self._mode = Mode.NORMAL
            self._probe_armed = False
        if self._mode == Mode.NORMAL:
            self._track_peak(now, limit)

    def _enter_probing(self, now: Nanos) -> None:
        self._track_peak(now, 0)
        half = f64_to_u32(math.floor(self._peak / 2.0))
        self._ssthresh = max(2, min(half, max(self._settings.max_permits, 2)))
        self._mode = Mode.PROBING
        self._probe_armed = False
        self._x = 1.0
        self._probe.start(now)

    def _track_peak(self, now: Nanos, limit: int) -> None:
        elapsed = 0.0 if self._peak_at is None else float(sat_sub(now, self._peak_at))
        decayed = self._peak - elapsed / PEAK_DECAY_PER_PERMIT
        self._peak = fmax(decayed, float(limit))
        self._peak_at = now

    def _probe_succeeded(self, now: Nanos) -> None:
        p = float(self._settings.max_permits)
        self._x = fmax(fmin(self._x, 1.0 - 2.0 / p), 0.0)
        self._probe.reset(now)
        self._mode = Mode.SLOW_START
        self._leave_slow_start_if_done(now)

    def _probe_failed(self, now: Nanos) -> None:
        self._x = 1.0
        self._probe.failed(now)

    def _leave_slow_start_if_done(self, now: Nanos) -> None:
        if self._own_limit() >= min(self._ssthresh, self._settings.max_permits):
            self._mode = Mode.NORMAL
            self._track_peak(now, self._own_limit())

    # -- Controller ----------------------------------------------------------------------------

    @property
    def algorithm(self) -> Algorithm:
        return Algorithm.SET_POINT

    @property
    def settings(self) -> Settings:
        return self._settings

    @property
    def mode(self) -> Mode:
        return self._mode

    def record(self, now: Nanos, outcome: Outcome) -> None:
        if self._settings.floor_max > 0.0:
            self._learn(now, self._mode, outcome)
        mode = self._mode
        if mode == Mode.PROBING and self._probe_armed:
            self._probe_armed = False
            if outcome == Outcome.SUCCESS:
                self._probe_succeeded(now)
            elif outcome == Outcome.DEPENDENCY_FAILURE:
                self._probe_failed(now)
            else:
                # The dependency was not exercised: another probe may go out now.
                self._probe.allow_now(now)
        elif mode == Mode.STARTING:
            self._record_starting(now, outcome)
        elif mode == Mode.SLOW_START:
            if outcome == Outcome.SUCCESS:
                p = float(self._settings.max_permits)
                self._x = fmax(self._x - 1.0 / p, 0.0)
                self._leave_slow_start_if_done(now)
            elif outcome == Outcome.DEPENDENCY_FAILURE:
                self._mode = Mode.NORMAL
                self._integrate(outcome)
                self._settle(now)
        else:
            # Normal, or a late outcome of a message taken before full backoff.
            self._integrate(outcome)
            self._settle(now)

    def permits(self, now: Nanos, in_flight: int) -> int:
        cap = brake_cap(self._brake, self._settings.max_permits, now)
        if self._mode == Mode.PROBING:
            if cap == 0 or in_flight > 0 or self._settings.health_check_probes or not self._probe.due(now):
                return 0
            # Stateless grant: if the poll comes back empty the grant is simply available
            # again; `probe_armed` only tells the next outcome it is a probe.
            self._probe_armed = True
            return 1
        return max(min(self._controlled_limit(), cap) - in_flight, 0)

    def release_unused(self, now: Nanos, unused: int) -> None:
        if unused > 0 and self._mode == Mode.PROBING:
            self._probe_armed = False

    def limit(self, now: Nanos) -> int:
        cap = brake_cap(self._brake, self._settings.max_permits, now)
        return min(self._controlled_limit(), cap)

    def backoff(self, now: Nanos) -> float:
        own = clamp01(self._x)
        level = self._brake.active(now) if self._brake is not None else None
        return own if level is None else fmax(own, level)

    def failure_floor(self) -> float:
        return self._floor

    def floor_estimate(self) -> float | None:
        if self._floor > 0.0:
            return self._floor
        if self._settings.floor_max <= 0.0 or self._exp_n < MIN_EXPERIMENTS:
            return None
        f = self._exp_fail / self._exp_n
        sigma = math.sqrt(f * (1.0 - f) / self._exp_n)
        under = f + Z * sigma <= ADOPT * self._settings.set_point
        outage = f - Z * sigma > self._settings.floor_max
        return 0.0 if (under or outage) else None

    def reconfigure(self, now: Nanos, settings: Settings) -> None:
        settings = settings.sanitized()
        self._probe.set_bounds(settings.probe_initial, settings.probe_max)
        self._settings = settings
        self._x = fmax(self._x, -settings.credit)
        self._floor = fmin(self._floor, settings.floor_max)
        if self._floor <= settings.set_point:
            self._floor = 0.0
        self._set_steps()
        self._peak = fmin(self._peak, float(settings.max_permits))
        self._settle(now)
        self._finish_starting_if_done(now)

    def set_brake(self, brake: Brake | None) -> None:
        self._brake = brake

    def next_change(self, now: Nanos) -> Nanos | None:
        probe = self._probe.next_at if self._mode == Mode.PROBING and not self._probe.due(now) else None
        brake = self._brake.next_change(now, self._settings.max_permits) if self._brake is not None else None
        return earliest(probe, brake)

    def health_check_due(self, now: Nanos) -> bool:
        if self._settings.health_check_probes and self._mode == Mode.PROBING and self._probe.due(now):
            # Schedule the next check now, so a lost result can never stall probing.
            self._probe.hold(now)
            return True
        return False

    def start_from(self, now: Nanos, backoff: float) -> None:
        self.set_backoff(now, backoff)

    def record_health_check(self, now: Nanos, healthy: bool) -> None:
        if self._mode != Mode.PROBING:
            return
        if healthy:
            self._probe_succeeded(now)
        else:
            self._probe_failed(now)
