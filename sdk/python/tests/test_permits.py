"""The permit gate (crates/worker/src/permits.rs tests, ported): a settable clock stands in for
tokio's paused time; the blocking and asyncio waits run for real."""

from __future__ import annotations

import asyncio
import gc
import math
import re
import threading
import time

import pytest

from backpressure_worker.controller import (
    Algorithm,
    Mode,
    Outcome,
    Settings,
    build,
    from_millis,
    from_secs,
)
from backpressure_worker.metrics import Metrics
from backpressure_worker.permits import Gate
from backpressure_worker.wire import BrakeConfig, WorkerConfig

from .test_controller import drive


class Clock:
    """A controller clock the test moves."""

    def __init__(self) -> None:
        self.t = from_secs(1)

    def __call__(self) -> int:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += int(seconds * 1e9)


def plain_settings() -> Settings:
    return Settings.steady().replace(credit=0.0)


def back_off(gate: Gate) -> None:
    for _ in range(40):
        p = gate.try_acquire(1)
        assert p is not None, "permit while backing off"
        m = p.start()
        p.release()
        m.finish(Outcome.DEPENDENCY_FAILURE)
        if gate.snapshot().mode == Mode.PROBING:
            return
    pytest.fail(f"did not back off: {gate!r}")


def test_grants_follow_the_controller_and_unused_permits_return() -> None:
    gate = Gate(build(plain_settings(), 1))
    p = gate.acquire(100)
    assert p is not None and p.granted == 16
    assert gate.try_acquire(1) is None, "all reserved"
    a = p.start()
    b = p.start()
    p.release()
    s = gate.snapshot()
    assert (s.in_flight, s.reserved) == (2, 0)
    q = gate.try_acquire(100)
    assert q is not None and q.granted == 14
    q.release()
    a.finish(Outcome.SUCCESS)
    b.finish(Outcome.DEPENDENCY_FAILURE)
    assert gate.snapshot().in_flight == 0
    assert gate.snapshot().limit == 15


@pytest.mark.parametrize("algorithm", [Algorithm.SET_POINT, Algorithm.RATIO_THROTTLE])
def test_probe_permit_used_by_an_empty_poll_is_returned(algorithm: Algorithm) -> None:
    clock = Clock()
    gate = Gate(build(plain_settings().replace(algorithm=algorithm), 7), clock=clock)
    back_off(gate)
    assert gate.try_acquire(1) is None
    for _ in range(20):
        p = None
        for _ in range(600):  # within the probe interval (2 s, in 10 ms steps)
            p = gate.try_acquire(10)
            if p is not None:
                break
            clock.advance(0.01)
        assert p is not None, "a probe permit within the probe interval"
        assert p.is_probe and p.granted == 1
        p.release()  # the poll came back empty
        s = gate.snapshot()
        assert (s.reserved, s.in_flight) == (0, 0)
    p = gate.try_acquire(10)
    assert p is not None
    m = p.start()
    p.release()
    m.finish(Outcome.SUCCESS)
    assert gate.snapshot().limit >= 1


def test_a_dropped_permit_and_message_are_returned_by_the_next_caller() -> None:
    gate = Gate(build(plain_settings(), 1))
    p = gate.try_acquire(16)
    assert p is not None
    p.start()  # never finished
    del p
    gc.collect()
    s = gate.snapshot()
    assert (s.reserved, s.in_flight) == (0, 0), s


def test_acquire_waits_for_a_finished_message() -> None:
    gate = Gate(build(plain_settings().replace(max_permits=1), 1))
    p = gate.acquire(1)
    assert p is not None
    m = p.start()
    p.release()
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(gate.acquire(1).granted))
    waiter.start()
    time.sleep(0.05)
    assert waiter.is_alive() and not got
    m.finish(Outcome.SUCCESS)
    waiter.join(2)
    assert got == [1]
    # The waiter dropped its permit unused: the next caller gets it back.
    q = gate.acquire(1, timeout=1)
    assert q is not None and q.granted == 1


def test_acquire_async_waits_for_a_finished_message() -> None:
    gate = Gate(build(plain_settings().replace(max_permits=1), 1))

    async def main() -> int:
        p = await gate.acquire_async(1)
        m = p.start()
        p.release()
        waiter = asyncio.create_task(gate.acquire_async(1))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        # Finished from another thread, as a worker pool would.
        t = threading.Thread(target=m.finish, args=(Outcome.SUCCESS,))
        t.start()
        q = await asyncio.wait_for(waiter, 2)
        t.join()
        return q.granted

    assert asyncio.run(main()) == 1


def test_messages_beyond_the_grant_are_still_processed() -> None:
    gate = Gate(build(plain_settings().replace(max_permits=2), 1))
    with gate.acquire(2) as p:
        started = [p.start() for _ in range(3)]
    assert gate.snapshot().in_flight == 3
    for m in started:
        m.finish(Outcome.SUCCESS)
    s = gate.snapshot()
    assert (s.in_flight, s.reserved) == (0, 0)


def test_a_message_left_without_an_outcome_frees_the_slot_and_records_nothing() -> None:
    gate = Gate(build(plain_settings(), 1))
    with pytest.raises(RuntimeError), gate.acquire(1) as p:
        with p.start():
            raise RuntimeError("handler crashed")
    s = gate.snapshot()
    assert (s.in_flight, s.reserved, s.limit, s.backoff) == (0, 0, 16, 0.0)


def test_metrics_follow_the_gate() -> None:
    metrics = Metrics("w")
    clock = Clock()
    gate = Gate(build(plain_settings(), 1), metrics=metrics, clock=clock)
    with gate.acquire(4) as p:
        m = p.start()
    assert re.search(r'backpressure_in_flight\{workload="w"\} 1(\.0)?\n', metrics.encode())
    m.finish(Outcome.DEPENDENCY_FAILURE)
    assert metrics.outcome_count(Outcome.DEPENDENCY_FAILURE) == 1
    text = metrics.encode()
    assert re.search(r'backpressure_permits\{workload="w"\} 15(\.0)?\n', text), text
    assert 'backpressure_backoff_factor{workload="w"} 0.05\n' in text
    back_off(gate)
    probe = None
    for _ in range(300):
        probe = gate.try_acquire(1)
        if probe is not None:
            break
        clock.advance(0.01)
    assert probe is not None and probe.is_probe
    probe.start().finish(Outcome.SUCCESS)
    assert metrics.probe_count() == 1


def failure_floor_gauge(metrics: Metrics) -> float:
    m = re.search(r'^backpressure_failure_floor\{workload="w"\} (\S+)$', metrics.encode(), re.M)
    assert m is not None, metrics.encode()
    return float(m.group(1))


def test_failure_floor_gauge_is_nan_until_the_controller_has_tested_for_a_floor() -> None:
    metrics = Metrics("w")
    metrics.set_failure_floor(0.2)  # left by a gate this registry served before
    clock = Clock()
    gate = Gate(build(plain_settings(), 1), metrics=metrics, clock=clock)
    # A fresh gate has not tested for a floor: NaN ("untested"), not 0 ("tested, none").
    assert math.isnan(failure_floor_gauge(metrics))
    with gate.acquire(1) as p:
        m = p.start()
    m.finish(Outcome.SUCCESS)
    assert math.isnan(failure_floor_gauge(metrics)), "one success tests nothing"
    # A controller that learned a floor of ~15 % exports it from the gate's first publish.
    learned, _, _ = drive(1800, 600, lambda _l, _t: 0.15)
    estimate = learned.floor_estimate()
    assert estimate is not None and 0.12 <= estimate <= 0.18, estimate
    gate = Gate(learned, metrics=metrics, clock=lambda: from_secs(1800))
    assert failure_floor_gauge(metrics) == pytest.approx(estimate)
    # Switching to an algorithm that learns no floor: untested again.
    gate.apply(learned.settings.replace(algorithm=Algorithm.FIXED), None, 1_000)
    assert math.isnan(failure_floor_gauge(metrics))
    assert gate.snapshot().failure_floor is None


def test_health_check_replaces_message_probes() -> None:
    calls = []
    running = threading.Lock()

    def check() -> bool:
        assert running.acquire(blocking=False), "one check at a time"
        try:
            calls.append(1)
            return len(calls) >= 3
        finally:
            running.release()

    settings = plain_settings().replace(
        health_check_probes=True, probe_initial=from_millis(20), probe_max=from_millis(80)
    )
    gate = Gate(build(settings, 1), health_check=check)
    back_off(gate)
    p = gate.acquire(10, timeout=10)
    assert p is not None
    assert not p.is_probe, "a normal grant after the healthy check"
    assert p.granted == 2, "slow start"
    assert len(calls) == 3


def test_apply_changes_settings_and_brake_at_runtime() -> None:
    clock = Clock()
    gate = Gate(build(Settings.steady(), 1), brake_jitter=0.5, clock=clock)  # offset 15 s
    settings = Settings.from_config(WorkerConfig(max_permits=4))
    assert settings.brake_release == from_secs(60)

    def granted() -> int | None:
        p = gate.try_acquire(100)
        if p is None:
            return None
        p.release()
        return p.granted

    gate.apply(settings, BrakeConfig(min_backoff=0.5, expires_at_unix=1_000 + 30), 1_000)
    assert granted() == 2
    clock.advance(31)
    assert granted() == 2
    clock.advance(29)  # 60 s: level 0.25
    assert granted() == 3
    clock.advance(15)  # 75 s: lifted
    assert granted() == 4
    full = BrakeConfig(min_backoff=1.0)
    gate.apply(settings, full, 1_000)
    assert granted() is None, "a full brake stops everything"
    gate.apply(settings, None, 1_000)
    assert granted() is None, "removed: still held for the offset"
    clock.advance(30)  # 15 s into the fall: 0.75
    gate.apply(settings, None, 1_000)
    assert granted() == 1
    clock.advance(30)
    assert granted() == 3
    clock.advance(15)
    assert granted() == 4
    instant = settings.replace(brake_release=0)
    gate.apply(instant, full, 1_000)
    assert granted() is None
    gate.apply(instant, None, 1_000)
    assert granted() == 4
    gate.apply(settings.replace(algorithm=Algorithm.OFF), None, 1_000)
    assert gate.settings.algorithm == Algorithm.OFF


def test_a_waiting_worker_wakes_up_as_the_brake_lifts() -> None:
    # Real time, scaled down: a full brake expiring after 0.2 s and lifting over 1.6 s.
    gate = Gate(build(Settings.steady(), 1), brake_jitter=0.0)
    settings = Settings.steady().replace(brake_release=from_millis(1600))
    now_unix = int(time.time())
    gate.apply(settings, BrakeConfig(min_backoff=1.0, expires_at_unix=now_unix + 1), now_unix)
    start = time.monotonic()
    p = gate.acquire(100, timeout=10)
    waited = time.monotonic() - start
    assert p is not None
    # 16 permits lifting over 1.6 s after the expiry: one permit after a further 0.1 s.
    assert p.granted == 1, "one permit, not sixteen"
    assert 0.0 < waited < 2.5, waited


def test_many_threads_share_one_gate() -> None:
    gate = Gate(build(plain_settings().replace(max_permits=8), 1))
    peak = [0]
    lock = threading.Lock()
    active = [0]

    def worker() -> None:
        for _ in range(200):
            p = gate.acquire(1, timeout=5)
            assert p is not None
            with p:
                m = p.start()
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            with lock:
                active[0] -= 1
            m.finish(Outcome.SUCCESS)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = gate.snapshot()
    assert (s.in_flight, s.reserved) == (0, 0)
    assert peak[0] <= 8
