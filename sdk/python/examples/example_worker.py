"""An example worker on backpressure_worker: an in-memory queue, a simulated dependency with an
optional outage and capacity limit, a thread pool, the admin server (``/metrics``,
``/healthz``, ``GET``/``PUT /v1/config``) and an optional hot-reloaded config file.

    python examples/example_worker.py --messages 5000 --outage-at 5 --outage-for 20
    curl -s 127.0.0.1:9464/metrics

It serves until SIGTERM or SIGINT (or ``--duration`` seconds, or ``--exit-when-drained``) and
then stops cleanly, exit status 0. Every flag has an environment variable; the ones of the
table in conformance/README.md ("Starting a worker for a conformance run") are enough to run it
for the conformance suite:

    BP_WORKLOAD=orders BP_NAMESPACE=team-a BP_ADMIN_ADDR=127.0.0.1:9464 \\
    BP_ALLOWED_IDENTITIES=system:serviceaccount:bp-system:backpressure-operator \\
    BP_CONFORMANCE_HOOK=true BP_KUBE_API_URL=https://127.0.0.1:6443 \\
    BP_KUBE_CA_FILE=ca.crt BP_KUBE_TOKEN_FILE=worker-token python examples/example_worker.py

Pushes are accepted only with allowed identities, checked with a TokenReview through the
explicit API server (``BP_KUBE_API_URL``, ``BP_KUBE_CA_FILE``, ``BP_KUBE_TOKEN_FILE``) or the
pod's ServiceAccount.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import FrameType

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
from backpressure_worker.token import SA_DIR, TokenReviewClient

log = logging.getLogger("example-worker")

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off", "")


def env_bool(name: str) -> bool:
    """``true``/``1`` (or ``yes``/``on``) is true; unset, empty, ``false``/``0`` false; anything
    else is an error, so that a typo never turns the conformance hook on or off silently."""
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SystemExit(f"example-worker: {name}={os.environ[name]!r} is not true/1 or false/0")


def env_list(name: str) -> list[str]:
    """A comma-separated list (empty items dropped)."""
    return [x.strip() for x in os.environ.get(name, "").split(",") if x.strip()]


def default_namespace() -> str:
    """``BP_NAMESPACE``, else the pod's (its ServiceAccount's) namespace, else ``default``."""
    ns = os.environ.get("BP_NAMESPACE")
    if ns:
        return ns
    try:
        return (SA_DIR / "namespace").read_text().strip() or "default"
    except OSError:
        return "default"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(
        description=" ".join(doc.split("\n\n")[0].split()),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    env = os.environ.get

    def number(name: str, default: float) -> float:
        try:
            return float(env(name) or default)
        except ValueError:
            p.error(f"{name}={env(name)!r} is not a number")

    p.add_argument("--workload", default=env("BP_WORKLOAD") or "example-worker", help="BP_WORKLOAD")
    p.add_argument("--namespace", default=default_namespace(), help="BP_NAMESPACE")
    p.add_argument("--admin-addr", default=env("BP_ADMIN_ADDR") or "127.0.0.1:9464", help="BP_ADMIN_ADDR")
    p.add_argument("--config-file", default=env("BP_CONFIG_FILE") or None, help="BP_CONFIG_FILE")
    p.add_argument(
        "--allowed-identity",
        action="append",
        default=None,
        help="username allowed to push (repeatable, or comma-separated); BP_ALLOWED_IDENTITIES",
    )
    p.add_argument(
        "--conformance-hook",
        action=argparse.BooleanOptionalAction,
        default=env_bool("BP_CONFORMANCE_HOOK"),
        help="serve POST /v1/conformance/controller, for conformance runs only; BP_CONFORMANCE_HOOK",
    )
    p.add_argument(
        "--kube-api-url", "--api-url", default=env("BP_KUBE_API_URL") or None, help="BP_KUBE_API_URL"
    )
    p.add_argument(
        "--kube-ca-file", "--api-ca", default=env("BP_KUBE_CA_FILE") or None, help="BP_KUBE_CA_FILE"
    )
    p.add_argument(
        "--kube-token-file",
        "--api-token-file",
        default=env("BP_KUBE_TOKEN_FILE") or None,
        help="BP_KUBE_TOKEN_FILE",
    )
    p.add_argument("--messages", type=int, default=int(number("BP_MESSAGES", 1000)), help="BP_MESSAGES")
    p.add_argument(
        "--rate", type=float, default=number("BP_RATE", 0), help="more messages per second; BP_RATE"
    )
    p.add_argument("--work-ms", type=float, default=number("BP_WORK_MS", 50), help="BP_WORK_MS")
    p.add_argument(
        "--capacity",
        type=int,
        default=int(number("BP_CAPACITY", 0)),
        help="concurrent calls the dependency serves (0: unlimited); BP_CAPACITY",
    )
    p.add_argument(
        "--outage-at",
        type=float,
        default=number("BP_OUTAGE_AT", -1),
        help="seconds after start (negative: no outage); BP_OUTAGE_AT",
    )
    p.add_argument("--outage-for", type=float, default=number("BP_OUTAGE_FOR", 0), help="BP_OUTAGE_FOR")
    p.add_argument(
        "--max-attempts", type=int, default=int(number("BP_MAX_ATTEMPTS", 5)), help="BP_MAX_ATTEMPTS"
    )
    p.add_argument(
        "--duration",
        type=float,
        default=number("BP_DURATION", 0),
        help="stop after this many seconds (0: run until SIGTERM/SIGINT); BP_DURATION",
    )
    p.add_argument(
        "--exit-when-drained",
        action=argparse.BooleanOptionalAction,
        default=env_bool("BP_EXIT_WHEN_DRAINED"),
        help="stop once every message is acked or dead-lettered; BP_EXIT_WHEN_DRAINED",
    )
    p.add_argument("--seed", type=int, default=int(number("BP_SEED", 1)), help="BP_SEED")
    args = p.parse_args(argv)
    if args.allowed_identity is None:
        args.allowed_identity = env_list("BP_ALLOWED_IDENTITIES")
    else:
        args.allowed_identity = [x.strip() for a in args.allowed_identity for x in a.split(",") if x.strip()]
    host, sep, port = args.admin_addr.rpartition(":")
    if not sep or not port.isdigit():
        p.error(f"--admin-addr/BP_ADMIN_ADDR {args.admin_addr!r} is not host:port")
    args.admin_host, args.admin_port = host.strip("[]") or "0.0.0.0", int(port)
    return args


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


def main(argv: list[str] | None = None, stop: threading.Event | None = None) -> dict[str, int]:
    """Runs the worker until ``stop`` is set (or ``--duration``, or ``--exit-when-drained``);
    returns its counts."""
    args = parse_args(argv)
    stop = stop if stop is not None else threading.Event()

    metrics = Metrics(args.workload)
    gate = Gate(from_config(WorkerConfig.default(), args.seed), metrics=metrics, seed=args.seed)
    state = ConfigState(gate, WorkerConfig.default(), metrics)
    admin = Admin(state, metrics)
    if args.allowed_identity:
        try:
            client = TokenReviewClient(
                args.kube_api_url, ca_file=args.kube_ca_file, token_file=args.kube_token_file
            )
        except (ValueError, OSError) as e:
            raise SystemExit(
                "example-worker: config pushes need an API server for TokenReview (BP_KUBE_API_URL, "
                f"BP_KUBE_CA_FILE, BP_KUBE_TOKEN_FILE, or a pod's ServiceAccount): {e}"
            ) from None
        verifier = TokenReviewVerifier(args.namespace, args.workload, reviewer=client)
        admin.with_verifier(verifier, args.allowed_identity)
        log.info(
            "config pushes enabled for audience %s, identities %s, reviewed by %s",
            verifier.audience,
            ",".join(args.allowed_identity),
            client.api_url,
        )
    if args.conformance_hook:
        log.warning("conformance hook enabled (POST /v1/conformance/controller): for conformance runs only")
        admin.with_conformance_hook()
    try:
        server = admin.serve(args.admin_host, args.admin_port)
    except OSError as e:
        raise SystemExit(f"example-worker: binding the admin port {args.admin_addr}: {e}") from None
    log.info("admin server listening on %s:%d", args.admin_host, server.port)
    watcher = FileWatcher(state, args.config_file).start() if args.config_file else None

    queue: collections.deque[tuple[int, int]] = collections.deque((i, 1) for i in range(args.messages))
    stats = {"produced": args.messages, "acked": 0, "dead_letters": 0}
    lock = threading.Lock()
    outage = (args.outage_at, args.outage_at + args.outage_for) if args.outage_at >= 0 else None
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
    try:
        with ThreadPoolExecutor(max_workers=64) as pool:
            last_report = started
            while not stop.is_set():
                elapsed = time.monotonic() - started
                with lock:
                    if args.rate > 0:
                        due = args.messages + int(elapsed * args.rate)
                        queue.extend((i, 1) for i in range(stats["produced"], due))
                        stats["produced"] = max(stats["produced"], due)
                    done = stats["acked"] + stats["dead_letters"] == stats["produced"]
                if (args.duration > 0 and elapsed >= args.duration) or (args.exit_when_drained and done):
                    break
                permit = gate.acquire(16, timeout=0.2)  # blocks while backed off
                if permit is not None:
                    with permit:  # permits the poll does not use go back
                        with lock:
                            batch = [queue.popleft() for _ in range(min(permit.granted, len(queue)))]
                        for message in batch:
                            pool.submit(process, message, permit.start())
                    if not batch:
                        stop.wait(0.02)  # an empty queue: poll again shortly
                if time.monotonic() - last_report >= 1:
                    last_report = time.monotonic()
                    s = gate.snapshot()
                    log.info(
                        "backoff=%.3f permits=%d in_flight=%d mode=%s depth=%d acked=%d dlq=%d config=%s",
                        s.backoff,
                        s.limit,
                        s.in_flight,
                        s.mode.value,
                        len(queue),
                        stats["acked"],
                        stats["dead_letters"],
                        state.ack().hash,
                    )
            # Leaving the block waits for the messages in flight.
    finally:
        if watcher is not None:
            watcher.stop()
        server.shutdown()
    log.info("stopped: %s", stats)
    stats["dependency_failures"] = metrics.outcome_count(Outcome.DEPENDENCY_FAILURE)
    return stats


def run() -> None:
    """The command: logs to stderr, stops cleanly (status 0) on SIGTERM or SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    main(stop=stop)
    sys.exit(0)


if __name__ == "__main__":
    run()
