"""Controllers without backoff: ``Fixed`` (honours the brake) and ``Off`` (ignores it)."""

from __future__ import annotations

from ..wire import Algorithm
from ._core import Brake, Controller, Mode, Nanos, Outcome, Settings, brake_cap


class Fixed(Controller):
    """Always ``maxPermits``, except under the operator's brake. Backoff is 0 (or the brake)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings.sanitized()
        self._brake: Brake | None = None

    @property
    def algorithm(self) -> Algorithm:
        return Algorithm.FIXED

    @property
    def settings(self) -> Settings:
        return self._settings

    @property
    def mode(self) -> Mode:
        return Mode.NORMAL

    def record(self, now: Nanos, outcome: Outcome) -> None:
        pass

    def permits(self, now: Nanos, in_flight: int) -> int:
        return max(self.limit(now) - in_flight, 0)

    def limit(self, now: Nanos) -> int:
        return brake_cap(self._brake, self._settings.max_permits, now)

    def backoff(self, now: Nanos) -> float:
        level = self._brake.active(now) if self._brake is not None else None
        return 0.0 if level is None else level

    def reconfigure(self, now: Nanos, settings: Settings) -> None:
        self._settings = settings.sanitized()

    def set_brake(self, brake: Brake | None) -> None:
        self._brake = brake

    def next_change(self, now: Nanos) -> Nanos | None:
        if self._brake is None:
            return None
        return self._brake.next_change(now, self._settings.max_permits)

    def __repr__(self) -> str:
        return f"Fixed(settings={self._settings!r}, brake={self._brake!r})"


class Off(Controller):
    """Backpressure switched off: always ``maxPermits``, backoff always 0, the brake ignored."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings.sanitized()

    @property
    def algorithm(self) -> Algorithm:
        return Algorithm.OFF

    @property
    def settings(self) -> Settings:
        return self._settings

    @property
    def mode(self) -> Mode:
        return Mode.NORMAL

    def record(self, now: Nanos, outcome: Outcome) -> None:
        pass

    def permits(self, now: Nanos, in_flight: int) -> int:
        return max(self._settings.max_permits - in_flight, 0)

    def limit(self, now: Nanos) -> int:
        return self._settings.max_permits

    def backoff(self, now: Nanos) -> float:
        return 0.0

    def reconfigure(self, now: Nanos, settings: Settings) -> None:
        self._settings = settings.sanitized()

    def set_brake(self, brake: Brake | None) -> None:
        pass

    def next_change(self, now: Nanos) -> Nanos | None:
        return None

    def __repr__(self) -> str:
        return f"Off(settings={self._settings!r})"
