"""The concurrency gate a worker passes before each poll (``crates/worker/src/permits.rs``).

A :class:`Gate` shares one controller between the poll loop and the threads (or tasks)
processing messages. :meth:`Gate.acquire` blocks until the controller allows at least one more
message and returns a :class:`PollPermit` for up to that many (:meth:`Gate.acquire_async` is
the asyncio version). A permit is only the right to poll: each message the poll returns is
started with :meth:`PollPermit.start`, which always succeeds, even past the grant (a message
that has been received is never dropped), and finished with :meth:`InFlight.finish`, which
records its outcome. Permits the poll did not use go back with :meth:`PollPermit.release` (or
when the ``with`` block ends), so an empty poll that used a probe grant gives it back instead of
leaving the worker at zero.

>>> from backpressure_worker.controller import from_config, Outcome
>>> from backpressure_worker.wire import WorkerConfig
>>> gate = Gate(from_config(WorkerConfig.default(), 1))
>>> with gate.acquire(10) as permit:   # poll for up to permit.granted messages
...     message = permit.start()       # one message came back; the other permit goes back
>>> permit.granted
2
>>> message.finish(Outcome.SUCCESS)
>>> gate.snapshot().in_flight
0

The controller's time is the gate's clock: integer nanoseconds of ``time.monotonic_ns()`` since
the gate was built. The gate is safe to use from many threads and from asyncio tasks.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, overload

from .controller import Brake, Controller, Mode, Nanos, Outcome, Settings, apply_settings
from .wire import BrakeConfig

if TYPE_CHECKING:
    from .metrics import Metrics

__all__ = ["Gate", "InFlight", "MonotonicClock", "PollPermit", "Snapshot"]

log = logging.getLogger(__name__)

MAX_WAIT_S = 1.0
"""Upper bound on one wait, so that a missed wake-up can never stall a worker for long."""


class MonotonicClock:
    """Nanoseconds of ``time.monotonic_ns()`` since the clock was made."""

    def __init__(self) -> None:
        self._origin = time.monotonic_ns()

    def __call__(self) -> Nanos:
        return max(time.monotonic_ns() - self._origin, 0)


@dataclass(frozen=True)
class Snapshot:
    """A point-in-time view of the gate."""

    backoff: float
    limit: int
    in_flight: int
    reserved: int
    mode: Mode
    failure_floor: float | None = None
    """The failure floor the controller learned: None until it has tested for one (see
    :meth:`~.controller.Controller.floor_estimate`)."""


class Gate:
    """The shared concurrency gate around one controller.

    ``health_check``: called (from the acquiring thread, or a worker thread for
    :meth:`acquire_async`) instead of a message probe while the controller is fully backed off
    and its settings ask for health-check probes. ``seed`` seeds the controllers built when the
    algorithm changes at runtime. ``brake_jitter`` is this pod's share of the brake's lift
    offset, in [0, 1): random per process unless given. ``clock`` is for tests.
    """

    def __init__(
        self,
        controller: Controller,
        *,
        metrics: Metrics | None = None,
        health_check: Callable[[], bool] | None = None,
        seed: int = 0,
        brake_jitter: float | None = None,
        clock: Callable[[], Nanos] | None = None,
    ) -> None:
        self._controller = controller
        self._metrics = metrics
        self._health_check = health_check
        self._seed = seed
        if brake_jitter is None:
            brake_jitter = random.SystemRandom().random()
        self._brake_jitter = min(max(brake_jitter, 0.0), 1.0) if brake_jitter == brake_jitter else 0.0
        self._clock: Callable[[], Nanos] = clock if clock is not None else MonotonicClock()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._in_flight = 0
        self._reserved = 0
        self._brake: Brake | None = None
        self._async_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._waiting = 0
        # Releases of permits and messages dropped without a call (garbage collected); applied
        # under the lock by the next caller, never from a finalizer.
        self._orphans: collections.deque[tuple[str, int]] = collections.deque()
        self._publish()

    # -- inspection ----------------------------------------------------------------------------

    def now(self) -> Nanos:
        """The gate's clock."""
        return self._clock()

    def snapshot(self) -> Snapshot:
        now = self._clock()
        with self._lock:
            self._collect_orphans(now)
            return self._snapshot_locked(now)

    def _snapshot_locked(self, now: Nanos) -> Snapshot:
        c = self._controller
        return Snapshot(
            backoff=c.backoff(now),
            limit=c.limit(now),
            in_flight=self._in_flight,
            reserved=self._reserved,
            mode=c.mode,
            failure_floor=c.floor_estimate(),
        )

    @property
    def settings(self) -> Settings:
        """The settings in force."""
        with self._lock:
            return self._controller.settings

    @property
    def controller(self) -> Controller:
        """The controller in force (read it under no assumption of stability: pushes replace
        it when the algorithm changes)."""
        return self._controller

    # -- granting ------------------------------------------------------------------------------

    def try_acquire(self, maximum: int = 1) -> PollPermit | None:
        """Grants up to ``maximum`` permits without waiting, if the controller allows any now."""
        now = self._clock()
        with self._lock:
            self._collect_orphans(now)
            permit = self._grant(now, maximum)
        if permit is not None:
            self._publish()
        return permit

    def _grant(self, now: Nanos, maximum: int) -> PollPermit | None:
        if maximum <= 0:
            return None
        busy = self._in_flight + self._reserved
        allowed = min(self._controller.permits(now, busy), maximum)
        if allowed == 0:
            return None
        probe = self._controller.mode == Mode.PROBING
        self._reserved += allowed
        return PollPermit(self, allowed, probe)

    def _wait_plan(self, now: Nanos) -> tuple[float, bool]:
        """Under the lock, after a refused grant: seconds to wait, and whether a health check
        is due instead."""
        hc = self._health_check is not None and self._controller.health_check_due(now)
        wake_at = self._controller.next_change(now)
        wait = MAX_WAIT_S
        if wake_at is not None:
            wait = min(max(wake_at - now, 0) / 1e9, MAX_WAIT_S)
        return wait, hc

    @overload
    def acquire(self, maximum: int = 1) -> PollPermit: ...

    @overload
    def acquire(self, maximum: int, timeout: float) -> PollPermit | None: ...

    @overload
    def acquire(self, maximum: int = 1, *, timeout: float) -> PollPermit | None: ...

    def acquire(self, maximum: int = 1, timeout: float | None = None) -> PollPermit | None:
        """Blocks until the controller allows at least one message and grants up to
        ``maximum`` (0 is treated as 1). Returns None only when ``timeout`` (seconds) passes."""
        maximum = max(maximum, 1)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            now = self._clock()
            with self._lock:
                self._collect_orphans(now)
                permit = self._grant(now, maximum)
                if permit is None:
                    wait, health_check = self._wait_plan(now)
                    if deadline is not None:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return None
                        wait = min(wait, left)
                    if not health_check:
                        self._waiting += 1
                        try:
                            self._changed.wait(max(wait, 0.0005))
                        finally:
                            self._waiting -= 1
            if permit is not None:
                self._publish()
                return permit
            if health_check:
                self._run_health_check_sync()

    async def acquire_async(self, maximum: int = 1) -> PollPermit:
        """:meth:`acquire` for asyncio: waits without blocking the event loop."""
        maximum = max(maximum, 1)
        loop = asyncio.get_running_loop()
        while True:
            event = asyncio.Event()
            waiter = (loop, event)
            now = self._clock()
            with self._lock:
                self._collect_orphans(now)
                permit = self._grant(now, maximum)
                if permit is None:
                    wait, health_check = self._wait_plan(now)
                    self._async_waiters.add(waiter)
            if permit is not None:
                self._publish()
                return permit
            try:
                if health_check:
                    await asyncio.to_thread(self._run_health_check_sync)
                else:
                    try:
                        await asyncio.wait_for(event.wait(), timeout=max(wait, 0.0005))
                    except TimeoutError:
                        pass
            finally:
                with self._lock:
                    self._async_waiters.discard(waiter)

    def _run_health_check_sync(self) -> None:
        hc = self._health_check
        if hc is None:
            return
        if self._metrics is not None:
            self._metrics.record_probe()
        try:
            healthy = bool(hc())
        except Exception:  # a failing check is an unhealthy dependency
            log.exception("backpressure health check raised")
            healthy = False
        log.debug("backpressure health check: healthy=%s", healthy)
        now = self._clock()
        with self._lock:
            self._controller.record_health_check(now, healthy)
        self._publish()

    # -- configuration -------------------------------------------------------------------------

    def apply(self, settings: Settings, brake: BrakeConfig | None, now_unix: int) -> None:
        """Applies new controller settings and brake at runtime (see
        :func:`~backpressure_worker.controller.apply_settings`). ``now_unix`` converts the
        brake's expiry; a lowered or removed brake lifts gently over ``settings.brake_release``."""
        now = self._clock()
        with self._lock:
            new = Brake.from_wire(brake, now, now_unix) if brake is not None else None
            release = settings.brake_release
            # Offset in [0, release / 2): pods lift at different moments.
            offset = int(float(release) * 0.5 * self._brake_jitter)
            self._brake = Brake.succeed(self._brake, new, now, release, offset)
            self._controller = apply_settings(self._controller, now, settings, self._seed, self._brake)
        self._publish()
        self._wake()

    # -- bookkeeping ---------------------------------------------------------------------------

    def _publish(self) -> None:
        m = self._metrics
        if m is None:
            return
        snap = self.snapshot()
        m.set_backoff(snap.backoff)
        # NaN until tested: a fresh pod must not read as "no floor" (0) and pull the fleet's
        # mean floor down before it has learned anything.
        m.set_failure_floor(snap.failure_floor)
        m.set_permits(snap.limit)
        m.set_in_flight(snap.in_flight)

    def _wake(self) -> None:
        with self._lock:
            self._changed.notify_all()
            waiters = list(self._async_waiters)
        for loop, event in waiters:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop is closed
                pass

    def _has_waiters(self) -> bool:
        return self._waiting > 0 or bool(self._async_waiters)

    def _collect_orphans(self, now: Nanos) -> None:
        while self._orphans:
            kind, n = self._orphans.popleft()
            if kind == "permit":
                self._release_locked(now, n)
            else:
                self._in_flight -= 1

    def _release_locked(self, now: Nanos, unused: int) -> None:
        self._reserved -= unused
        self._controller.release_unused(now, unused)

    def _release(self, unused: int) -> None:
        now = self._clock()
        with self._lock:
            self._release_locked(now, unused)
            waiting = self._has_waiters()
        if waiting:
            self._wake()

    def _start(self, permit: PollPermit) -> InFlight:
        with self._lock:
            if permit._remaining > 0:
                permit._remaining -= 1
                self._reserved -= 1
            else:
                log.warning("source returned more messages than permitted; processing anyway")
            self._in_flight += 1
            in_flight = self._in_flight
        m = self._metrics
        if m is not None:
            if permit.is_probe:
                m.record_probe()
            m.set_in_flight(in_flight)
        return InFlight(self)

    def _finish(self, outcome: Outcome | None) -> None:
        now = self._clock()
        with self._lock:
            self._collect_orphans(now)
            self._in_flight -= 1
            c = self._controller
            if outcome is not None:
                c.record(now, outcome)
            backoff, floor, limit = c.backoff(now), c.floor_estimate(), c.limit(now)
            in_flight = self._in_flight
            waiting = self._has_waiters()
        m = self._metrics
        if m is not None:
            if outcome is not None:
                m.record_outcome(outcome)
            m.set_backoff(backoff)
            m.set_failure_floor(floor)
            m.set_permits(limit)
            m.set_in_flight(in_flight)
        if waiting:
            self._wake()

    def __repr__(self) -> str:
        return f"Gate({self.snapshot()!r})"


class PollPermit:
    """The right to poll for up to :attr:`granted` messages. Unused permits go back with
    :meth:`release`, at the end of a ``with`` block, or (as a last resort) when it is garbage
    collected."""

    def __init__(self, gate: Gate, granted: int, probe: bool) -> None:
        self._gate = gate
        self._remaining = granted
        self.granted = granted
        """How many messages to poll for."""
        self.is_probe = probe
        """Whether this is a probe (the controller is fully backed off)."""

    def start(self) -> InFlight:
        """Starts processing one received message. Always succeeds: a message beyond the
        grant (a source that returned more than asked) is processed too, over the limit."""
        return self._gate._start(self)

    def release(self) -> None:
        """Gives back the permits no message came back for. Idempotent."""
        with self._gate._lock:
            unused, self._remaining = self._remaining, 0
        if unused > 0:
            self._gate._release(unused)

    def __enter__(self) -> PollPermit:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __del__(self) -> None:
        # No lock in a finalizer: the next caller of the gate applies it.
        if getattr(self, "_remaining", 0) > 0:
            self._gate._orphans.append(("permit", self._remaining))
            self._remaining = 0

    def __repr__(self) -> str:
        return f"PollPermit(granted={self.granted}, remaining={self._remaining}, probe={self.is_probe})"


class InFlight:
    """A message being processed. Finish it with its outcome (in a ``with`` block, leaving
    it without an outcome frees the slot and records nothing)."""

    def __init__(self, gate: Gate) -> None:
        self._gate: Gate | None = gate

    def finish(self, outcome: Outcome) -> None:
        """Records the outcome and frees the slot. Only the first call counts."""
        gate, self._gate = self._gate, None
        if gate is not None:
            gate._finish(outcome)

    @property
    def finished(self) -> bool:
        return self._gate is None

    def __enter__(self) -> InFlight:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            log.warning("message finished without an outcome; not recorded")
            gate._finish(None)

    def __del__(self) -> None:
        gate = getattr(self, "_gate", None)
        if gate is not None:
            self._gate = None
            gate._orphans.append(("message", 1))
