"""Timing of probes while fully backed off: exponentially growing, jittered intervals."""

from __future__ import annotations

from ._core import Nanos, SplitMix64, f64_to_u64, sat_add, sat_mul


class ProbeSchedule:
    """When the next probe may go out. Intervals start at ``initial``, double after each failed
    probe up to ``max``, and each wait is the interval times a jitter factor from U[0.5, 1)."""

    __slots__ = ("initial", "max", "interval", "next_at", "rng")

    def __init__(self, initial: Nanos, maximum: Nanos, seed: int) -> None:
        self.initial = initial
        self.max = maximum
        self.interval = initial
        self.next_at: Nanos = 0
        self.rng = SplitMix64(seed)

    def start(self, now: Nanos) -> None:
        """Entering full backoff: the first probe after a jittered initial interval."""
        self.interval = self.initial
        self._schedule(now)

    def due(self, now: Nanos) -> bool:
        return now >= self.next_at

    def failed(self, now: Nanos) -> None:
        """A probe failed: double the interval (up to the maximum) and wait."""
        self.interval = min(sat_mul(self.interval, 2), self.max)
        self._schedule(now)

    def hold(self, now: Nanos) -> None:
        """Waits one current interval again without growing it (a health check was started)."""
        self._schedule(now)

    def reset(self, now: Nanos) -> None:
        """A probe succeeded: allow the next one now and reset the interval."""
        self.interval = self.initial
        self.next_at = now

    def allow_now(self, now: Nanos) -> None:
        """Allows the next probe now, keeping the interval."""
        self.next_at = now

    def set_bounds(self, initial: Nanos, maximum: Nanos) -> None:
        """New bounds at runtime; the current interval is clamped into them."""
        self.initial = initial
        self.max = maximum
        # u64::clamp(initial, max) (sanitized settings guarantee initial <= max).
        self.interval = max(initial, min(self.interval, maximum))

    def _schedule(self, now: Nanos) -> None:
        jitter = 0.5 + 0.5 * self.rng.next_f64()
        wait = f64_to_u64(float(self.interval) * jitter)
        self.next_at = sat_add(now, max(wait, 1))
