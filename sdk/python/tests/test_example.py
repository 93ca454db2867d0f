"""The example worker: it drains its queue against a capacity-limited dependency, and, started
as the conformance harness starts it (a process with only the environment of
conformance/README.md), it serves the admin port and the hook until SIGTERM, then exits 0."""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from backpressure_worker.conformance import HOOK_PATH
from backpressure_worker.wire import WorkerConfig

from .conftest import Worker, request, start

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "example_worker.py"


def test_example_worker_drains_its_queue_against_a_limited_dependency() -> None:
    spec = importlib.util.spec_from_file_location("example_worker", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["example_worker"] = module
    spec.loader.exec_module(module)
    stats = module.main(
        [
            "--admin-addr",
            "127.0.0.1:0",
            "--messages",
            "300",
            "--work-ms",
            "5",
            "--capacity",
            "4",
            "--exit-when-drained",
        ]
    )
    assert stats["acked"] + stats["dead_letters"] == 300, stats
    assert stats["acked"] >= 290, stats
    assert stats["dependency_failures"] > 0, "the capacity limit was never hit"


CONFORMANCE_ENV = {
    "BP_WORKLOAD": "orders",
    "BP_NAMESPACE": "team-a",
    "BP_ADMIN_ADDR": "127.0.0.1:0",
    "BP_CONFORMANCE_HOOK": "true",
    "BP_WORK_MS": "5",
    "BP_MESSAGES": "200",
}


def test_started_with_the_conformance_environment_it_serves_until_sigterm(workers: list[Worker]) -> None:
    w = start(CONFORMANCE_ENV)
    workers.append(w)
    port = int(w.wait_for(r"admin server listening on 127\.0\.0\.1:(\d+)").group(1))
    assert request(port, "GET", "/healthz")[0] == 200
    status, body = request(port, "GET", "/v1/config")
    assert status == 200 and json.loads(body) == {"hash": WorkerConfig.default().hash, "generation": 0}
    case: dict[str, Any] = {
        "seed": 7,
        "brakeOffsetNs": 0,
        "config": WorkerConfig.default().to_json(),
        "steps": [{"t": 1_000_000_000, "op": "permits", "inFlight": 0}],
    }
    status, body = request(port, "POST", HOOK_PATH, json.dumps(case).encode())
    assert status == 200, body
    assert json.loads(body)["observations"][0]["permits"] == 2
    # It keeps serving after its initial messages are done (BP_DURATION unset: until SIGTERM).
    w.wait_for(r"acked=200 ")
    time.sleep(0.5)
    assert w.proc.poll() is None, "exited on its own"
    status, metrics = request(port, "GET", "/metrics")
    assert status == 200
    assert re.search(
        r'^backpressure_outcomes_total\{class="success",workload="orders"\} 200(\.0)?$', metrics, re.M
    ), metrics
    assert w.stop(signal.SIGTERM) == 0, "".join(w.log)
    w.wait_for(r"SIGTERM: stopping")
    w.wait_for(r"stopped: ")


def test_without_the_hook_variable_the_hook_is_404_and_sigint_stops_it(workers: list[Worker]) -> None:
    w = start({k: v for k, v in CONFORMANCE_ENV.items() if k != "BP_CONFORMANCE_HOOK"})
    workers.append(w)
    port = int(w.wait_for(r"admin server listening on 127\.0\.0\.1:(\d+)").group(1))
    assert request(port, "POST", HOOK_PATH, b"{}")[0] == 404
    assert w.stop(signal.SIGINT) == 0, "".join(w.log)


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"BP_CONFORMANCE_HOOK": "yes please"}, "BP_CONFORMANCE_HOOK"),
        ({"BP_ADMIN_ADDR": "nowhere"}, "BP_ADMIN_ADDR"),
        # Pushes need an API server: neither BP_KUBE_API_URL nor a pod's environment.
        ({"BP_ALLOWED_IDENTITIES": "system:serviceaccount:a:b"}, "API server"),
    ],
)
def test_a_bad_environment_is_refused_at_start(
    workers: list[Worker], extra: dict[str, str], why: str
) -> None:
    env = dict(CONFORMANCE_ENV, **extra)
    w = start(env | {"KUBERNETES_SERVICE_HOST": ""})
    workers.append(w)
    assert w.proc.wait(20) != 0
    w.wait_for(re.escape(why))
