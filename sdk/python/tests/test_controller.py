"""The Rust controller unit tests (crates/worker/src/controller/tests/mod.rs), ported."""

from __future__ import annotations

import pytest

from backpressure_worker.controller import (
    Algorithm,
    Brake,
    Controller,
    Fixed,
    Mode,
    Nanos,
    Off,
    Outcome,
    RatioThrottle,
    SetPoint,
    Settings,
    SplitMix64,
    apply_settings,
    build,
    from_config,
    from_millis,
    from_secs,
    limit_for,
)
from backpressure_worker.wire import BrakeConfig, WorkerConfig

S = Outcome.SUCCESS
D = Outcome.DEPENDENCY_FAILURE
M = Outcome.MESSAGE_FAILURE
T0: Nanos = from_secs(100)


def settings(max_permits: int, set_point: float, reaction: int) -> Settings:
    return Settings.steady().replace(
        algorithm=Algorithm.SET_POINT, set_point=set_point, reaction=reaction, max_permits=max_permits
    )


def plain(max_permits: int, set_point: float, reaction: int) -> SetPoint:
    return SetPoint(settings(max_permits, set_point, reaction).replace(credit=0.0), 1)


def starting(max_permits: int, initial_permits: int) -> SetPoint:
    return SetPoint(settings(max_permits, 0.05, 20).replace(initial_permits=initial_permits), 1)


def back_off_fully(c: Controller, now: Nanos) -> None:
    for _ in range(10_000):
        if c.mode == Mode.PROBING:
            return
        c.record(now, D)
    pytest.fail(f"never backed off fully: {c!r}")


def next_probe_time(c: Controller, start: Nanos) -> Nanos:
    t = start
    for _ in range(10_000):
        if c.permits(t, 0) == 1:
            return t
        nxt = c.next_change(t)
        t = max(nxt if nxt is not None else t + from_millis(10), t + 1)
    pytest.fail(f"no probe granted after {start}: {c!r}")


def secs(s: int) -> Nanos:
    return T0 + from_secs(s)


def test_splitmix64_reference_values() -> None:
    # Vigna's reference implementation, seed 0.
    rng = SplitMix64(0)
    assert [rng.next_u64() for _ in range(3)] == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]
    rng = SplitMix64(0xFFFF_FFFF_FFFF_FFFF)
    values = [rng.next_u64() for _ in range(100)]
    assert all(0 <= v < 2**64 for v in values)
    f = SplitMix64(7)
    assert all(0.0 <= f.next_f64() < 1.0 for _ in range(1000))


def test_startup_ramps_one_permit_per_round_trip_without_backoff_and_keeps_the_credit() -> None:
    c = starting(16, 2)
    assert c.mode == Mode.STARTING
    assert (c.permits(T0, 0), c.limit(T0), c.backoff(T0)) == (2, 2, 0.0)
    assert c.permits(T0, 2) == 0, "in-flight messages count against the window"
    successes, last = 0, 2
    while c.mode == Mode.STARTING:
        c.record(T0, S)
        successes += 1
        limit = c.limit(T0)
        assert limit in (last, last + 1), f"{last} -> {limit}"
        assert c.backoff(T0) == 0.0
        last = limit
    assert 120 <= successes <= 135, successes
    assert (c.mode, c.limit(T0), c.backoff(T0)) == (Mode.NORMAL, 16, 0.0)
    for _ in range(20):
        c.record(T0, D)
    assert c.limit(T0) == 16
    c.record(T0, D)
    assert c.limit(T0) == 15


def test_startup_ramp_is_scaled_to_max_permits() -> None:
    c = starting(160, 20)
    for _ in range(20):
        c.record(T0, S)
    assert 27 <= c.limit(T0) <= 29, c.limit(T0)


def test_startup_window_shrinks_above_the_set_point_and_never_below_one() -> None:
    c = starting(16, 2)
    while c.limit(T0) < 10:
        c.record(T0, S)
    w = c.window()
    c.record(T0, D)
    assert abs(c.window() - (w - 19.0 / w)) < 1e-9
    assert c.mode == Mode.STARTING
    c.record(T0, M)
    assert abs(c.window() - (w - 19.0 / w)) < 1e-9
    for _ in range(50):
        for _ in range(9):
            c.record(T0, S)
        c.record(T0, D)
        assert c.mode == Mode.STARTING
    assert c.limit(T0) <= 2, c.limit(T0)
    for _ in range(40):
        c.record(T0, D)
        if c.mode == Mode.STARTING:
            assert c.startup_window() == 1


def test_an_outage_during_startup_ends_it_in_probing() -> None:
    c = starting(16, 2)
    for i in range(38):
        c.record(T0, D)
        expected = Mode.STARTING if i < 37 else Mode.NORMAL
        assert (c.mode, c.limit(T0)) == (expected, 1), f"after {i + 1} failures"
    c.record(T0, D)
    assert (c.mode, c.backoff(T0), c.limit(T0)) == (Mode.PROBING, 1.0, 0)


def test_startup_ends_when_the_integrator_limits_more_than_the_window() -> None:
    c = starting(16, 2)
    for _ in range(6):
        c.record(T0, S)
    for _ in range(36):
        c.record(T0, D)
    own = limit_for(16, c.integrator())
    assert 1 < own < 16, own
    while c.mode == Mode.STARTING:
        c.record(T0, S)
    assert c.mode == Mode.NORMAL
    assert c.limit(T0) == limit_for(16, c.integrator())
    assert c.backoff(T0) > 0.0


def test_startup_is_on_by_default_and_ends_on_carry_over_or_a_smaller_max() -> None:
    assert SetPoint(Settings(), 1).mode == Mode.STARTING
    assert SetPoint(Settings.steady(), 1).mode == Mode.NORMAL
    assert starting(16, 16).mode == Mode.NORMAL
    assert starting(16, 0).mode == Mode.NORMAL
    c = starting(16, 2)
    c.start_from(T0, 0.25)
    assert (c.mode, c.limit(T0)) == (Mode.NORMAL, 12)
    c = starting(16, 2)
    for _ in range(3):
        c.record(T0, S)
    c.reconfigure(T0, settings(3, 0.05, 20).replace(initial_permits=2))
    assert (c.mode, c.limit(T0)) == (Mode.NORMAL, 3)


def test_integrator_steps_are_one_over_n_and_s_over_one_minus_s_n() -> None:
    c = plain(16, 0.05, 20)
    c.record(T0, D)
    assert abs(c.backoff(T0) - 1.0 / 20.0) < 1e-12
    c.record(T0, S)
    expected = 1.0 / 20.0 - 0.05 / (0.95 * 20.0)
    assert abs(c.backoff(T0) - expected) < 1e-12
    c = plain(16, 0.05, 20)
    c.record(T0, D)
    for _ in range(19):
        c.record(T0, S)
    assert c.backoff(T0) < 1e-9
    c = plain(16, 0.05, 20)
    c.record(T0, D)
    assert c.permits(T0, 0) == 15
    assert c.permits(T0, 10) == 5
    assert c.permits(T0, 20) == 0


@pytest.mark.parametrize("algorithm", [Algorithm.SET_POINT, Algorithm.RATIO_THROTTLE])
def test_message_failures_never_drive_backoff(algorithm: Algorithm) -> None:
    c = build(Settings.steady().replace(algorithm=algorithm), 3)
    for i in range(10_000):
        c.record(T0 + from_millis(i), M)
    end = T0 + from_secs(10)
    assert c.backoff(end) == 0.0
    assert c.permits(end, 0) == 16


def test_credit_absorbs_one_reaction_of_failures_then_backs_off() -> None:
    c = SetPoint(settings(16, 0.05, 20), 1)
    assert c.integrator() == -1.0
    for _ in range(20):
        c.record(T0, D)
    assert c.backoff(T0) == 0.0
    assert c.permits(T0, 0) == 16
    c.record(T0, D)
    assert c.backoff(T0) > 0.0
    assert c.permits(T0, 0) == 15
    for _ in range(19):
        c.record(T0, D)
    assert c.mode == Mode.PROBING
    assert c.backoff(T0) == 1.0


def test_probing_grants_one_message_on_a_doubling_jittered_interval() -> None:
    c = plain(16, 0.05, 20)
    back_off_fully(c, T0)
    assert c.permits(T0, 0) == 0, "the first probe waits an interval"
    due = c.next_change(T0)
    assert due is not None
    wait = due - T0
    assert from_secs(1) <= wait < from_secs(2), wait
    assert c.permits(due, 1) == 0, "never with something in flight"
    assert c.permits(due, 0) == 1
    now = due
    intervals = []
    for _ in range(8):
        c.record(now, D)
        nxt = c.next_change(now)
        assert nxt is not None
        intervals.append((c.probe_interval(), nxt - now))
        now = nxt
        assert c.permits(now, 0) == 1
    for (interval, wait), s in zip(intervals, [4, 8, 16, 32, 60, 60, 60, 60], strict=True):
        assert interval == from_secs(s)
        assert interval // 2 <= wait < interval, (wait, interval)
    waits = [w for _, w in intervals[4:]]
    assert any(a != b for a, b in zip(waits, waits[1:], strict=False)), waits


def test_successful_probe_slow_starts_to_half_the_peak() -> None:
    c = plain(16, 0.05, 20)
    back_off_fully(c, T0)
    assert c.ssthresh() == 8
    t = next_probe_time(c, T0)
    assert c.permits(t, 0) == 1
    c.record(t, S)
    assert c.mode == Mode.SLOW_START
    assert c.limit(t) == 2
    assert c.probe_interval() == from_secs(2)
    limits = [c.limit(t)]
    while c.mode == Mode.SLOW_START:
        c.record(t, S)
        limits.append(c.limit(t))
    assert limits == [2, 3, 4, 5, 6, 7, 8]
    assert c.mode == Mode.NORMAL


def test_slow_start_ends_at_the_first_dependency_failure() -> None:
    c = plain(16, 0.05, 20)
    back_off_fully(c, T0)
    t = next_probe_time(c, T0)
    c.permits(t, 0)
    c.record(t, S)
    c.record(t, S)
    assert c.limit(t) == 3
    c.record(t, D)
    assert c.mode == Mode.NORMAL
    assert c.limit(t) == 2


def test_the_peak_decays_so_a_long_outage_restarts_low() -> None:
    c = plain(16, 0.05, 20)
    now = T0
    c.record(now, S)
    c.set_backoff(now, 0.75)
    assert c.limit(now) == 4
    now = now + from_secs(60)
    back_off_fully(c, now)
    assert c.ssthresh() == 2
    c = plain(16, 0.05, 20)
    c.record(T0, S)
    c.set_backoff(T0, 0.75)
    back_off_fully(c, T0 + from_secs(1))
    assert c.ssthresh() == 7


def test_late_outcomes_in_probing_are_not_probe_results() -> None:
    c = plain(16, 0.05, 20)
    back_off_fully(c, T0)
    interval = c.probe_interval()
    for _ in range(10):
        c.record(T0, D)
    assert c.probe_interval() == interval
    c.record(T0, S)
    assert c.mode == Mode.PROBING


def test_message_failure_probe_allows_another_probe_at_once() -> None:
    c = plain(16, 0.05, 20)
    back_off_fully(c, T0)
    t = next_probe_time(c, T0)
    c.record(t, M)
    assert c.mode == Mode.PROBING
    assert c.permits(t, 0) == 1


def test_health_check_replaces_message_probes() -> None:
    c = SetPoint(settings(16, 0.05, 20).replace(health_check_probes=True, credit=0.0), 9)
    back_off_fully(c, T0)
    now = T0
    checks = 0
    for _ in range(1000):
        assert c.permits(now, 0) == 0, "no message probes"
        if c.health_check_due(now):
            checks += 1
            assert not c.health_check_due(now), "one check at a time"
            c.record_health_check(now, checks >= 3)
            if c.mode != Mode.PROBING:
                break
        nxt = c.next_change(now)
        assert nxt is not None
        now = nxt
    assert checks == 3
    assert c.mode == Mode.SLOW_START
    assert c.permits(now, 0) == 2


def test_brake_is_a_minimum_backoff_until_it_expires() -> None:
    c = build(Settings.steady(), 1)
    until = T0 + from_secs(30)
    c.set_brake(Brake(min_backoff=0.5, until=until))
    assert c.backoff(T0) == 0.5
    assert c.permits(T0, 0) == 8
    assert c.next_change(T0) == until
    assert c.backoff(until) == 0.0
    assert c.permits(until, 0) == 16
    p = plain(16, 0.05, 20)
    back_off_fully(p, T0)
    p.set_brake(Brake(min_backoff=1.0))
    assert p.permits(T0 + from_secs(3600), 0) == 0
    fixed = build(Settings.steady().replace(algorithm=Algorithm.FIXED), 1)
    off = build(Settings.steady().replace(algorithm=Algorithm.OFF), 1)
    assert isinstance(fixed, Fixed) and isinstance(off, Off)
    for ctl in (fixed, off):
        ctl.set_brake(Brake(min_backoff=0.75))
        for _ in range(100):
            ctl.record(T0, D)
    assert fixed.permits(T0, 0) == 4
    assert fixed.backoff(T0) == 0.75
    assert off.permits(T0, 0) == 16
    assert off.backoff(T0) == 0.0


def lifting(min_backoff: float, until: Nanos | None, offset: int) -> Brake:
    b = Brake.succeed(None, Brake(min_backoff=min_backoff, until=until), T0, from_secs(60), from_secs(offset))
    assert b is not None
    return b


def test_an_expiring_brake_lifts_gently_after_this_pods_offset() -> None:
    c = build(Settings.steady(), 1)
    c.set_brake(lifting(1.0, secs(10), 20))
    assert c.permits(secs(0), 0) == 0
    assert c.permits(secs(10), 0) == 0
    assert c.permits(secs(29), 0) == 0
    assert c.next_change(secs(29)) == secs(30)
    assert c.permits(secs(45), 0) == 4
    assert abs(c.backoff(secs(45)) - 0.75) < 1e-9
    assert c.next_change(secs(45)) == secs(45) + from_millis(3750)
    assert c.permits(secs(60), 0) == 8
    assert c.permits(secs(90), 0) == 16
    assert c.backoff(secs(90)) == 0.0
    assert c.next_change(secs(90)) is None
    other = build(Settings.steady(), 1)
    other.set_brake(lifting(1.0, secs(10), 5))
    assert other.permits(secs(30), 0) == 4
    assert c.permits(secs(30), 0) == 0


def _active(b: Brake | None, t: Nanos) -> float | None:
    assert b is not None
    return b.active(t)


def test_a_removed_or_lowered_brake_falls_to_the_new_level() -> None:
    release = from_secs(60)
    offset = from_secs(6)
    full = lifting(1.0, None, 6)
    half = Brake(min_backoff=0.5)
    lowered = Brake.succeed(full, half, T0, release, offset)
    assert _active(lowered, secs(5)) == 1.0
    assert abs((_active(lowered, secs(21)) or 0) - 0.75) < 1e-9
    assert _active(lowered, secs(40)) == 0.5
    again = Brake.succeed(lowered, half, secs(21), release, offset)
    assert abs((_active(again, secs(21)) or 0) - 0.75) < 1e-9
    assert abs((_active(again, secs(27)) or 0) - 0.65) < 1e-9
    removed = Brake.succeed(again, None, secs(40), release, offset)
    assert _active(removed, secs(46)) == 0.5
    assert abs((_active(removed, secs(61)) or 0) - 0.25) < 1e-9
    assert _active(removed, secs(76)) is None
    assert Brake.succeed(removed, None, secs(80), release, offset) is None
    expired = lifting(0.5, secs(1), 0)
    assert Brake.succeed(expired, None, secs(100), release, offset) is None
    mid = Brake.succeed(expired, None, secs(16), release, offset)
    assert abs((_active(mid, secs(16)) or 0) - 0.25) < 1e-9
    step = Brake.succeed(full, None, T0, 0, 0)
    assert step is None or step.active(T0) is None


def test_brake_from_wire_converts_unix_expiry() -> None:
    now = from_secs(50)
    b = Brake.from_wire(BrakeConfig(min_backoff=0.3, expires_at_unix=1_000_010), now, 1_000_000)
    assert b.until == from_secs(60)
    assert b.active(from_secs(59)) == 0.3
    assert b.active(from_secs(60)) is None
    expired = Brake.from_wire(BrakeConfig(min_backoff=0.3, expires_at_unix=999_000), now, 1_000_000)
    assert expired.active(now) is None


def test_reconfigure_keeps_state_and_algorithm_change_carries_backoff() -> None:
    c = build(Settings.steady().replace(credit=0.0), 1)
    for _ in range(10):
        c.record(T0, D)
    b = c.backoff(T0)
    assert abs(b - 0.5) < 1e-9
    same = apply_settings(c, T0, Settings.steady().replace(max_permits=32), 1, None)
    assert same is c
    assert c.backoff(T0) == b
    assert c.permits(T0, 0) == 16
    c = apply_settings(c, T0, Settings.steady().replace(algorithm=Algorithm.FIXED), 1, None)
    assert c.algorithm == Algorithm.FIXED
    assert c.backoff(T0) == 0.0
    c2 = build(Settings.steady().replace(algorithm=Algorithm.FIXED), 1)
    c2.set_brake(Brake(min_backoff=0.25))
    c2 = apply_settings(c2, T0, Settings.steady(), 1, Brake(min_backoff=0.25))
    assert c2.algorithm == Algorithm.SET_POINT
    assert c2.backoff(T0) == 0.25, "carried from Fixed under brake"


def test_same_seed_same_probe_schedule() -> None:
    def schedule(seed: int) -> list[Nanos]:
        c = SetPoint(Settings.steady().replace(credit=0.0), seed)
        back_off_fully(c, T0)
        now = T0
        out = []
        for _ in range(6):
            now = next_probe_time(c, now)
            out.append(now)
            c.record(now, D)
        return out

    assert schedule(42) == schedule(42)
    assert schedule(42) != schedule(43)


def test_from_config_uses_the_wire_knobs() -> None:
    cfg = WorkerConfig(
        algorithm=Algorithm.RATIO_THROTTLE, max_permits=7, probe_initial_ms=500, probe_max_ms=4000
    )
    c = from_config(cfg, 1)
    assert c.algorithm == Algorithm.RATIO_THROTTLE
    assert c.settings.max_permits == 7
    assert c.settings.probe_initial == from_millis(500)
    assert c.settings.probe_max == from_secs(4)
    assert c.limit(T0) == 7


def test_settings_are_sanitized() -> None:
    s = Settings(
        set_point=float("nan"),
        reaction=0,
        max_permits=0,
        probe_initial=0,
        probe_max=0,
        credit=-1.0,
        ratio_window=0,
        floor_max=float("inf"),
        redelivery=(0, 5),
    ).sanitized()
    assert (s.set_point, s.reaction, s.max_permits, s.probe_initial, s.probe_max) == (0.0001, 1, 1, 1, 1)
    assert (s.credit, s.ratio_window, s.floor_max, s.redelivery) == (0.0, 1_000_000, 0.0, None)
    assert Settings(set_point=1.5).sanitized().set_point == 0.99
    assert Settings(floor_max=5.0, redelivery=(10, 5)).sanitized().floor_max == 0.9
    assert Settings(redelivery=(10, 5)).sanitized().redelivery == (10, 10)
    assert Settings() == Settings.from_config(WorkerConfig.default())


def test_ratio_throttle_backs_off_probes_and_forgets_after_the_window() -> None:
    c = RatioThrottle(Settings.steady(), 5)
    now = T0
    for _ in range(200):
        c.record(now, D)
        now = now + from_millis(5)
    assert c.mode == Mode.PROBING
    assert c.limit(now) == 0
    end = now + from_secs(60)
    while now < end:
        k = c.permits(now, 0)
        for _ in range(k):
            c.record(now, S)
        nxt = c.next_change(now)
        now = min(nxt if nxt is not None else now + from_millis(100), now + from_millis(100))
    mode: Mode = c.mode  # re-read: mypy narrowed the property above
    assert mode == Mode.NORMAL
    assert c.limit(now) == 16


# -- the failure floor (issue 13) -------------------------------------------------------------


def drive(total: int, tail: int, fail: FailFn) -> tuple[SetPoint, float, float]:
    """One SetPoint for ``total`` seconds of 100 ms ticks; messages take 1 s and fail with
    ``fail(limit at their start, t)``."""
    c = SetPoint(settings(16, 0.05, 20), 7)
    rng = SplitMix64(11)
    in_flight: list[tuple[int, bool]] = []
    att = fails = permit_sum = samples = 0
    for tick in range(total * 10):
        now = from_millis(tick * 100)
        i = 0
        while i < len(in_flight):
            if in_flight[i][0] <= tick:
                # Vec::swap_remove
                _, ok = in_flight[i]
                last = in_flight.pop()
                if i < len(in_flight):
                    in_flight[i] = last
                c.record(now, S if ok else D)
                if tick >= (total - tail) * 10:
                    att += 1
                    fails += 0 if ok else 1
            else:
                i += 1
        limit = c.limit(now)
        k = c.permits(now, len(in_flight))
        for _ in range(k):
            ok = rng.next_f64() >= fail(max(limit, 1), tick // 10)
            in_flight.append((tick + 10, ok))
        if tick >= (total - tail) * 10:
            permit_sum += c.limit(now)
            samples += 1
    return c, fails / max(att, 1), permit_sum / max(samples, 1)


from collections.abc import Callable  # noqa: E402

FailFn = Callable[[int, int], float]


def test_load_independent_failures_learn_a_floor_and_stop_throttling() -> None:
    c, f, permits = drive(1800, 600, lambda _l, _t: 0.15)
    assert 0.12 <= c.failure_floor() <= 0.18, c.failure_floor()
    assert permits >= 14.0, permits
    assert 0.12 <= f <= 0.18, f
    assert SetPoint(settings(16, 0.05, 20).replace(floor_max=0.0), 7).failure_floor() == 0.0


def test_overload_learns_no_floor_and_keeps_the_set_point() -> None:
    c, f, _ = drive(1800, 900, lambda limit, _t: max(1.0 - 6.0 / limit, 0.0) + 0.005)
    assert c.failure_floor() == 0.0
    assert f <= 0.06, f


def test_outages_and_flapping_learn_no_floor() -> None:
    c, _, permits = drive(1800, 600, lambda _l, t: 1.0 if t >= 60 else 0.0)
    assert c.failure_floor() == 0.0
    assert permits < 1.0, permits
    c, _, _ = drive(3600, 600, lambda _l, t: 1.0 if (t // 60) % 2 == 1 else 0.005)
    assert c.failure_floor() == 0.0


def test_floor_ends_when_the_dependency_heals() -> None:
    c, f, permits = drive(3600, 300, lambda _l, t: 0.15 if t < 1800 else 0.005)
    assert c.failure_floor() == 0.0
    assert f < 0.02 and permits >= 15.0, (f, permits)


def test_floor_estimate_is_unknown_until_tested() -> None:
    assert SetPoint(settings(16, 0.05, 20), 7).floor_estimate() is None
    c, _, _ = drive(600, 60, lambda _l, _t: 0.005)
    assert c.floor_estimate() is None, "a healthy pod never ran an experiment"
    c, _, _ = drive(1800, 600, lambda _l, _t: 0.15)
    f0 = c.floor_estimate()
    assert f0 is not None and 0.12 <= f0 <= 0.18, f0
    c, _, _ = drive(1800, 900, lambda limit, _t: max(1.0 - 6.0 / limit, 0.0) + 0.005)
    assert (c.floor_estimate() or 0.0) == 0.0, "overload: no floor"
    c, _, _ = drive(1800, 600, lambda _l, t: 1.0 if t >= 60 else 0.0)
    assert (c.floor_estimate() or 0.0) == 0.0, "outage: no floor"
    c, _, _ = drive(900, 60, lambda limit, _t: 0.9 if limit > 1 else 0.0)
    assert c.floor_estimate() == 0.0
