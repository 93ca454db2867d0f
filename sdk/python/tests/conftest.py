"""Where the golden vectors are (``$BP_VECTORS_python`` or the repository's
``conformance/vectors/``), and the example worker run as a process, as the conformance harness
runs it."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

REPO = Path(__file__).resolve().parents[3]
REPO_VECTORS = REPO / "conformance" / "vectors"


def vectors_dir() -> Path:
    override = os.environ.get("BP_VECTORS_python")
    return Path(override) if override else REPO_VECTORS


def load_vectors(name: str) -> tuple[Path, dict[str, Any] | None, str | None]:
    """The parsed file, or None and why it could not be read (the tests then fail)."""
    path = vectors_dir() / name
    try:
        with path.open("rb") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return path, None, f"cannot read golden vectors {path}: {e}"
    if not isinstance(data, dict):
        return path, None, f"{path}: not a JSON object"
    return path, data, None


@dataclass
class Worker:
    """The example worker as a process, and the lines it logged."""

    proc: subprocess.Popen[str]
    lines: queue.Queue[str]
    log: list[str]

    def wait_for(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log:
                if m := re.search(pattern, line):
                    return m
            try:
                self.log.append(self.lines.get(timeout=0.1))
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
        pytest.fail(f"no {pattern!r} in the worker's log: {''.join(self.log)}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def _pump(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


def start(extra_env: dict[str, str]) -> Worker:
    """The command of the SDK README: this venv's python on the example, from the repository
    root, with nothing but the environment (``sys.executable`` is the venv's python)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BP_")}
    env.update(extra_env)
    proc = subprocess.Popen(
        [sys.executable, "sdk/python/examples/example_worker.py"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stderr, lines), daemon=True).start()
    return Worker(proc, lines, [])


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()


def request(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
