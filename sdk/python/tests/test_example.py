"""The example worker runs: a capacity-limited dependency, every message acked or
dead-lettered, the admin port answering meanwhile."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "example_worker.py"


def test_example_worker_drains_its_queue_against_a_limited_dependency() -> None:
    spec = importlib.util.spec_from_file_location("example_worker", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["example_worker"] = module
    spec.loader.exec_module(module)
    stats = module.main(
        ["--admin-addr", "127.0.0.1:0", "--messages", "300", "--work-ms", "5", "--capacity", "4"]
    )
    assert stats["acked"] + stats["dead_letters"] == 300, stats
    assert stats["acked"] >= 290, stats
    assert stats["dependency_failures"] > 0, "the capacity limit was never hit"
