"""The exposition (crates/worker/src/metrics.rs tests, ported): the wire names, types and
labels, parsed back with prometheus_client's own OpenMetrics parser."""

from __future__ import annotations

import math

from prometheus_client import Counter
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from backpressure_worker.controller import Algorithm, Outcome
from backpressure_worker.metrics import Metrics
from backpressure_worker.wire import metrics as names


def samples(text: str) -> list[tuple[str, dict[str, str], float, str]]:
    out = []
    for family in text_string_to_metric_families(text):  # type: ignore[no-untyped-call]
        for s in family.samples:
            out.append((s.name, dict(s.labels), s.value, family.type))
    return out


def test_exposition_uses_the_wire_names_types_and_labels() -> None:
    m = Metrics("export-worker")
    m.set_backoff(0.5)
    m.set_permits(8)
    m.set_in_flight(3)
    m.record_outcome(Outcome.SUCCESS)
    m.record_outcome(Outcome.SUCCESS)
    m.record_outcome(Outcome.DEPENDENCY_FAILURE)
    m.record_probe()
    m.set_config("abc123def456", Algorithm.SET_POINT)
    m.set_config("0123456789ab", Algorithm.RATIO_THROTTLE)
    got = samples(m.encode())
    assert {n for n, _, _, _ in got} == {
        names.BACKOFF,
        names.FAILURE_FLOOR,
        names.PERMITS,
        names.IN_FLIGHT,
        names.OUTCOMES_TOTAL,
        names.PROBES_TOTAL,
        names.CONFIG_INFO,
    }
    for name, labels, _, kind in got:
        assert labels.get(names.LABEL_WORKLOAD) == "export-worker", name
        want = "counter" if name.endswith("_total") else "gauge"
        assert kind == want, name

    def value(name: str, **extra: str) -> list[float]:
        return [v for n, lb, v, _ in got if n == name and all(lb.get(k) == x for k, x in extra.items())]

    assert value(names.BACKOFF) == [0.5]
    assert value(names.PERMITS) == [8.0]
    assert value(names.IN_FLIGHT) == [3.0]
    assert value(names.PROBES_TOTAL) == [1.0]
    assert math.isnan(value(names.FAILURE_FLOOR)[0]), "NaN until the floor is tested"
    for cls, count in zip(names.CLASSES, [2.0, 1.0, 0.0], strict=True):
        assert value(names.OUTCOMES_TOTAL, **{names.LABEL_CLASS: cls}) == [count]
    info = [(lb, v) for n, lb, v, _ in got if n == names.CONFIG_INFO]
    assert len(info) == 1, "only the running config is reported"
    assert info[0][0][names.LABEL_HASH] == "0123456789ab"
    assert info[0][0][names.LABEL_ALGORITHM] == "RatioThrottle"
    assert info[0][1] == 1.0
    for n, labels, _, _ in got:
        if n == names.OUTCOMES_TOTAL:
            assert sorted(labels) == sorted([names.LABEL_CLASS, names.LABEL_WORKLOAD])
    m.set_failure_floor(0.15)
    assert [v for n, _, v, _ in samples(m.encode()) if n == names.FAILURE_FLOOR] == [0.15]


def test_extra_metrics_share_the_registry() -> None:
    registry = CollectorRegistry()
    things = Counter("app_things", "things", registry=registry)
    things.inc()
    m = Metrics("w", registry=registry)
    text = m.encode()
    assert "app_things_total 1.0" in text
    assert 'backpressure_permits{workload="w"}' in text
