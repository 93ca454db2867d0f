"""Google SRE client-side adaptive throttling, adapted to a pull worker.

A port of ``crates/worker/src/controller/ratio.rs``:
``backoff = max(0, (requests - K * accepts) / (requests + 1))`` over a sliding window of 30 bins,
with ``K = 1/(1 - s)``; each attempt counts with weight ``1/(1 - backoff)`` (at most
``maxPermits``); probing and a slow start after a successful probe as in SetPoint.
"""

from __future__ import annotations

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
    fmax,
    fmin,
    limit_for,
    sat_mul,
    sat_sub,
)
from ._probe import ProbeSchedule

BINS = 30
"""Number of bins of the sliding window."""
PADDING = 1.0
"""Padding of the denominator (the SRE book's ``+1``)."""


class _Bin:
    __slots__ = ("epoch", "requests", "accepts")

    def __init__(self) -> None:
        self.epoch = 0
        self.requests = 0.0
        self.accepts = 0.0


class RatioThrottle(Controller):
    """Client-side throttling from the Google SRE book ("Handling Overload")."""

    def __init__(self, settings: Settings, seed: int) -> None:
        settings = settings.sanitized()
        self._settings = settings
        self._probe = ProbeSchedule(settings.probe_initial, settings.probe_max, seed)
        self._k = 1.0
        self._bin_width = 1
        self._bins = [_Bin() for _ in range(BINS)]
        self._requests = 0.0
        self._accepts = 0.0
        self._current_epoch = 0
        self._backoff = 0.0
        self._mode = Mode.NORMAL
        self._slow_start_limit = 0
        self._probe_armed = False
        self._brake: Brake | None = None
        self._set_params()

    def __repr__(self) -> str:
        return (
            f"RatioThrottle(mode={self._mode}, backoff={self._backoff!r}, "
            f"requests={self._requests!r}, accepts={self._accepts!r}, settings={self._settings!r})"
        )

    def _set_params(self) -> None:
        self._k = 1.0 / (1.0 - self._settings.set_point)
        self._bin_width = max(self._settings.ratio_window // BINS, 1)

    def _advance(self, now: Nanos) -> None:
        """Moves the window to ``now``, dropping bins that fell out of it."""
        epoch = now // self._bin_width
        if epoch == self._current_epoch:
            return
        self._current_epoch = epoch
        oldest = sat_sub(epoch, BINS - 1)
        requests = 0.0
        accepts = 0.0
        for b in self._bins:
            if b.epoch < oldest:
                b.epoch = 0
                b.requests = 0.0
                b.accepts = 0.0
            else:
                requests += b.requests
                accepts += b.accepts
        self._requests = requests
        self._accepts = accepts
        self._recompute(now)

    def _recompute(self, now: Nanos) -> None:
        raw = (self._requests - self._k * self._accepts) / (self._requests + PADDING)
        self._backoff = clamp01(fmax(raw, 0.0))
        if self._mode == Mode.SLOW_START:
            return
        limit = limit_for(self._settings.max_permits, self._backoff)
        if limit == 0:
            if self._mode != Mode.PROBING:
                self._mode = Mode.PROBING
                self._probe_armed = False
                self._probe.start(now)
        elif self._mode == Mode.PROBING:
            self._mode = Mode.NORMAL
            self._probe_armed = False

    def _clear_window(self) -> None:
        self._bins = [_Bin() for _ in range(BINS)]
        self._requests = 0.0
        self._accepts = 0.0
        self._backoff = 0.0

    def _backoff_at(self, now: Nanos) -> float:
        """The window's backoff at ``now`` without moving the window."""
        epoch = now // self._bin_width
        if epoch == self._current_epoch:
            return self._backoff
        oldest = sat_sub(epoch, BINS - 1)
        requests = 0.0
        accepts = 0.0
        for b in self._bins:
            if b.epoch >= oldest:
                requests += b.requests
                accepts += b.accepts
        return clamp01(fmax((requests - self._k * accepts) / (requests + PADDING), 0.0))

    def _own_limit(self) -> int:
        return self._limit_with(self._backoff)

    def _limit_with(self, backoff: float) -> int:
        window = limit_for(self._settings.max_permits, backoff)
        if self._mode == Mode.SLOW_START:
            return min(window, self._slow_start_limit)
        return window

    def _probe_succeeded(self, now: Nanos) -> None:
        self._clear_window()
        self._probe.reset(now)
        self._mode = Mode.SLOW_START
        self._slow_start_limit = 2
        self._end_slow_start_if_done()

    def _end_slow_start_if_done(self) -> None:
        if self._slow_start_limit >= self._settings.max_permits:
            self._mode = Mode.NORMAL

    def _add(self, now: Nanos, outcome: Outcome) -> None:
        p = float(self._settings.max_permits)
        if self._mode == Mode.SLOW_START:
            weight = 1.0
        else:
            weight = fmin(1.0 / fmax(1.0 - self._backoff, 1.0 / p), p)
        accepted = 0.0 if outcome == Outcome.DEPENDENCY_FAILURE else 1.0
        b = self._bins[self._current_epoch % BINS]
        if b.epoch != self._current_epoch:
            b.epoch = self._current_epoch
            b.requests = 0.0
            b.accepts = 0.0
        b.requests += weight
        b.accepts += accepted
        self._requests += weight
        self._accepts += accepted
        self._recompute(now)

    # -- Controller ----------------------------------------------------------------------------

    @property
    def algorithm(self) -> Algorithm:
        return Algorithm.RATIO_THROTTLE

    @property
    def settings(self) -> Settings:
        return self._settings

    @property
    def mode(self) -> Mode:
        return self._mode

    def record(self, now: Nanos, outcome: Outcome) -> None:
        self._advance(now)
        if self._mode == Mode.PROBING and self._probe_armed:
            self._probe_armed = False
            if outcome == Outcome.SUCCESS:
                self._probe_succeeded(now)
                return
            if outcome == Outcome.DEPENDENCY_FAILURE:
                self._probe.failed(now)
            else:
                self._probe.allow_now(now)
        if self._mode == Mode.SLOW_START:
            if outcome == Outcome.SUCCESS:
                self._slow_start_limit += 1
                self._end_slow_start_if_done()
            elif outcome == Outcome.DEPENDENCY_FAILURE:
                self._mode = Mode.NORMAL
        self._add(now, outcome)

    def permits(self, now: Nanos, in_flight: int) -> int:
        self._advance(now)
        cap = brake_cap(self._brake, self._settings.max_permits, now)
        if self._mode == Mode.PROBING:
            if cap == 0 or in_flight > 0 or self._settings.health_check_probes or not self._probe.due(now):
                return 0
            self._probe_armed = True
            return 1
        return max(min(self._own_limit(), cap) - in_flight, 0)

    def release_unused(self, now: Nanos, unused: int) -> None:
        if unused > 0 and self._mode == Mode.PROBING:
            self._probe_armed = False

    def limit(self, now: Nanos) -> int:
        cap = brake_cap(self._brake, self._settings.max_permits, now)
        return min(self._limit_with(self._backoff_at(now)), cap)

    def backoff(self, now: Nanos) -> float:
        own = self._backoff_at(now)
        level = self._brake.active(now) if self._brake is not None else None
        return own if level is None else fmax(own, level)

    def reconfigure(self, now: Nanos, settings: Settings) -> None:
        settings = settings.sanitized()
        width_changed = settings.ratio_window != self._settings.ratio_window
        self._probe.set_bounds(settings.probe_initial, settings.probe_max)
        self._settings = settings
        self._set_params()
        if width_changed:
            self._clear_window()
            self._current_epoch = now // self._bin_width
        self._end_slow_start_if_done()
        self._recompute(now)

    def set_brake(self, brake: Brake | None) -> None:
        self._brake = brake

    def next_change(self, now: Nanos) -> Nanos | None:
        probe = self._probe.next_at if self._mode == Mode.PROBING and not self._probe.due(now) else None
        # The window forgets: the start of the next bin may lower the backoff.
        next_bin = sat_mul(now // self._bin_width + 1, self._bin_width) if self._backoff > 0.0 else None
        brake = self._brake.next_change(now, self._settings.max_permits) if self._brake is not None else None
        return earliest(earliest(probe, next_bin), brake)

    def health_check_due(self, now: Nanos) -> bool:
        self._advance(now)
        if self._settings.health_check_probes and self._mode == Mode.PROBING and self._probe.due(now):
            self._probe.hold(now)
            return True
        return False

    def record_health_check(self, now: Nanos, healthy: bool) -> None:
        if self._mode != Mode.PROBING:
            return
        self._advance(now)
        if healthy:
            self._probe_succeeded(now)
        else:
            self._add(now, Outcome.DEPENDENCY_FAILURE)
            self._probe.failed(now)
