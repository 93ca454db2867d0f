"""An example worker on backpressure_worker: an in-memory queue, a simulated dependency with an
optional outage and capacity limit, a thread pool, the admin server (``/metrics``,
``/healthz``, ``GET``/``PUT /v1/config``) and an optional hot-reloaded config file.

    python examples/example_worker.py --messages 5000 --outage-at 5 --outage-for 20
    curl -s 127.0.0.1:9464/metrics

Pushes are accepted only with ``--allowed-identity`` (checked with a TokenReview through the
pod's ServiceAccount, or ``--api-url``/``--api-ca``/``--api-token-file``).
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from backpressure_worker import (
    Admin,
    ConfigState,
    FileWatcher,
    Gate,
    Metrics,
    Outcome,
    TokenReviewVerifier,
    WorkerConfig,
    from_config,
)
from backpressure_worker.permits import InFlight
from backpressure_worker.token import TokenReviewClient

log = logging.getLogger("example-worker")


class Dependency:
    """A dependency that serves ``capacity`` calls at once (0: unlimited) and is down from
    ``outage_at`` for ``outage_for`` seconds."""

    def __init__(self, work_s: float, capacity: int, outage: tuple[float, float] | None) -> None:
        self.started = time.monotonic()
        self.work_s, self.capacity, self.outage = work_s, capacity, outage
        self.busy = 0
        self.lock = threading.Lock()

    def call(self) -> Outcome:
        with self.lock:
            self.busy += 1
            over = self.capacity > 0 and self.busy > self.capacity
        elapsed = time.monotonic() - self.started
        down = self.outage is not None and self.outage[0] <= elapsed < self.outage[1]
        try:
            if down or over:
                time.sleep(self.work_s / 4)
                return Outcome.DEPENDENCY_FAILURE  # a timeout, a 503: drives backoff
            time.sleep(self.work_s)
            return Outcome.SUCCESS
        finally:
            with self.lock:
                self.busy -= 1


def main(argv: list[str] | None = None) -> dict[str, int]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    env = os.environ.get
    p.add_argument("--workload", default=env("BP_WORKLOAD", "example-worker"))
    p.add_argument("--namespace", default=env("BP_NAMESPACE", "default"))
    p.add_argument("--admin-addr", default=env("BP_ADMIN_ADDR", "127.0.0.1:9464"))
    p.add_argument("--config-file", default=env("BP_CONFIG_FILE"))
    p.add_argument("--allowed-identity", action="append", default=[])
    p.add_argument("--api-url", default=None)
    p.add_argument("--api-ca", default=None)
    p.add_argument("--api-token-file", default=None)
    p.add_argument("--messages", type=int, default=1000)
    p.add_argument("--work-ms", type=float, default=50)
    p.add_argument("--capacity", type=int, default=0)
    p.add_argument("--outage-at", type=float, default=None)
    p.add_argument("--outage-for", type=float, default=0)
    p.add_argument("--max-attempts", type=int, default=5)
    p.add_argument("--duration", type=float, default=0, help="stop after this many seconds")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)

    metrics = Metrics(args.workload)
    gate = Gate(from_config(WorkerConfig.default(), args.seed), metrics=metrics, seed=args.seed)
    state = ConfigState(gate, WorkerConfig.default(), metrics)
    admin = Admin(state, metrics)
    if args.allowed_identity:
        client = TokenReviewClient(args.api_url, ca_file=args.api_ca, token_file=args.api_token_file)
        verifier = TokenReviewVerifier(args.namespace, args.workload, reviewer=client)
        admin.with_verifier(verifier, args.allowed_identity)
        log.info("config pushes enabled for audience %s", verifier.audience)
    host, _, port = args.admin_addr.rpartition(":")
    server = admin.serve(host, int(port))
    log.info("admin server on %s:%d", host, server.port)
    watcher = FileWatcher(state, args.config_file).start() if args.config_file else None

    queue: collections.deque[tuple[int, int]] = collections.deque((i, 1) for i in range(args.messages))
    stats = {"acked": 0, "dead_letters": 0}
    lock = threading.Lock()
    outage = (args.outage_at, args.outage_at + args.outage_for) if args.outage_at is not None else None
    dependency = Dependency(args.work_ms / 1000, args.capacity, outage)

    def process(message: tuple[int, int], slot: InFlight) -> None:
        outcome = dependency.call()
        slot.finish(outcome)
        with lock:
            if outcome == Outcome.SUCCESS:
                stats["acked"] += 1
            elif message[1] >= args.max_attempts:
                stats["dead_letters"] += 1
            else:
                queue.append((message[0], message[1] + 1))  # redelivered later

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=64) as pool:
        last_report = started
        while True:
            elapsed = time.monotonic() - started
            with lock:
                done = stats["acked"] + stats["dead_letters"] == args.messages
            if (args.duration and elapsed >= args.duration) or (not args.duration and done):
                break
            permit = gate.acquire(16, timeout=0.2)  # blocks while backed off
            if permit is not None:
                with permit:  # permits the poll does not use go back
                    with lock:
                        batch = [queue.popleft() for _ in range(min(permit.granted, len(queue)))]
                    for message in batch:
                        pool.submit(process, message, permit.start())
                if not batch:
                    time.sleep(0.01)
            if time.monotonic() - last_report >= 1:
                last_report = time.monotonic()
                s = gate.snapshot()
                log.info(
                    "backoff=%.3f permits=%d in_flight=%d mode=%s depth=%d acked=%d dlq=%d config=%s",
                    s.backoff,
                    s.limit,
                    s.in_flight,
                    s.mode,
                    len(queue),
                    stats["acked"],
                    stats["dead_letters"],
                    state.ack().hash,
                )
    if watcher is not None:
        watcher.stop()
    server.shutdown()
    log.info("stopped: %s", stats)
    stats["dependency_failures"] = metrics.outcome_count(Outcome.DEPENDENCY_FAILURE)
    return stats


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main()
