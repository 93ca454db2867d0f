"""Prometheus metrics of the wire contract, every series labelled with the workload name
(``crates/worker/src/metrics.rs``), exported with ``prometheus_client``.

The families and their series are fixed: ``backpressure_backoff_factor``,
``backpressure_failure_floor`` (NaN while the controller has not tested its floor),
``backpressure_permits``, ``backpressure_in_flight`` (gauges), ``backpressure_outcomes_total``
by ``class`` and ``backpressure_probes_total`` (counters), and ``backpressure_config_info``
(value 1, labelled ``hash`` and ``algorithm``, only the running configuration).

>>> m = Metrics("export-worker")
>>> m.set_backoff(0.25)
>>> 'backpressure_backoff_factor{workload="export-worker"} 0.25' in m.encode()
True
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from .controller import Algorithm, Outcome
from .wire import metrics as names

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The content type of :meth:`Metrics.encode` (OpenMetrics text, as the Rust worker serves)."""


def _counter_base(full: str) -> str:
    return full[: -len("_total")] if full.endswith("_total") else full


class Metrics(Collector):
    """The worker's metrics and the registry that exposes them. Thread safe.

    ``registry``: register in this registry (for example to export the application's own
    metrics beside them); by default a registry of their own. The workload label is added to
    these metrics only.
    """

    def __init__(self, workload: str, registry: CollectorRegistry | None = None) -> None:
        self.workload = workload
        self._lock = threading.Lock()
        self._backoff = 0.0
        self._failure_floor = math.nan
        self._permits = 0
        self._in_flight = 0
        self._outcomes = [0, 0, 0]
        self._probes = 0
        self._config: tuple[str, str] | None = None
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.registry.register(self)

    # -- setters -------------------------------------------------------------------------------

    def set_backoff(self, backoff: float) -> None:
        with self._lock:
            self._backoff = float(backoff)

    def set_failure_floor(self, floor: float | None) -> None:
        """NaN while the controller does not know its floor (None)."""
        with self._lock:
            self._failure_floor = math.nan if floor is None else float(floor)

    def set_permits(self, permits: int) -> None:
        with self._lock:
            self._permits = int(permits)

    def set_in_flight(self, in_flight: int) -> None:
        with self._lock:
            self._in_flight = int(in_flight)

    def record_outcome(self, outcome: Outcome) -> None:
        with self._lock:
            self._outcomes[outcome.index] += 1

    def record_probe(self) -> None:
        with self._lock:
            self._probes += 1

    def set_config(self, hash: str, algorithm: Algorithm) -> None:  # noqa: A002 - wire name
        """Replaces the config info series with the running hash and algorithm."""
        with self._lock:
            self._config = (hash, algorithm.value)

    # -- getters (tests, status logs) ----------------------------------------------------------

    def outcome_count(self, outcome: Outcome) -> int:
        with self._lock:
            return self._outcomes[outcome.index]

    def probe_count(self) -> int:
        with self._lock:
            return self._probes

    # -- exposition ----------------------------------------------------------------------------

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            backoff, floor = self._backoff, self._failure_floor
            permits, in_flight = self._permits, self._in_flight
            outcomes, probes, config = list(self._outcomes), self._probes, self._config
        w = [self.workload]
        wl = [names.LABEL_WORKLOAD]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=wl)
            g.add_metric(w, value)
            return g

        yield gauge(
            names.BACKOFF, "Backoff factor of the worker's backpressure controller, in [0,1]", backoff
        )
        yield gauge(
            names.FAILURE_FLOOR,
            "Share of dependency calls the worker found to fail whatever its concurrency, in [0,1]",
            floor,
        )
        yield gauge(names.PERMITS, "Messages the worker may process at once right now", permits)
        yield gauge(names.IN_FLIGHT, "Messages being processed", in_flight)
        oc = CounterMetricFamily(
            _counter_base(names.OUTCOMES_TOTAL),
            "Message outcomes by class",
            labels=[names.LABEL_WORKLOAD, names.LABEL_CLASS],
        )
        for cls, count in zip(names.CLASSES, outcomes, strict=True):
            oc.add_metric([self.workload, cls], count)
        yield oc
        pc = CounterMetricFamily(
            _counter_base(names.PROBES_TOTAL), "Probes sent while fully backed off", labels=wl
        )
        pc.add_metric(w, probes)
        yield pc
        info = GaugeMetricFamily(
            names.CONFIG_INFO,
            "The running worker configuration (value 1)",
            labels=[names.LABEL_WORKLOAD, names.LABEL_HASH, names.LABEL_ALGORITHM],
        )
        if config is not None:
            info.add_metric([self.workload, config[0], config[1]], 1)
        yield info

    def encode(self) -> str:
        """The OpenMetrics text exposition of the registry."""
        text: bytes = generate_latest(self.registry)  # type: ignore[no-untyped-call]
        return text.decode("utf-8")
