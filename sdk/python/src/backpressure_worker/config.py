"""The config receiver's core: applies a WorkerConfig at runtime, without a restart, from a
mounted file (:class:`FileWatcher`) and from authenticated pushes (:mod:`.admin`).

A port of ``crates/worker/src/config/mod.rs``. :class:`ConfigState` is the single place where
configuration is applied: it validates the payload, checks it against the worker's own
:class:`Limits`, refuses a payload older than the running generation (:class:`Stale`), applies
the controller settings and brake to the :class:`~.permits.Gate`, and updates the config-info
metric. A refused payload leaves the running configuration unchanged. Over-limit values are
refused naming the field, not clamped: the worker acknowledges the hash of what it runs.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .controller import Settings
from .wire import (
    MAX_GENERATION_LEAD_MS,
    ConfigAck,
    ConfigError,
    FieldError,
    WorkerConfig,
)

if TYPE_CHECKING:
    from .metrics import Metrics
    from .permits import Gate

__all__ = [
    "ApplyError",
    "ConfigState",
    "DEFAULT_FILE_POLL_S",
    "FileWatcher",
    "Invalid",
    "Limits",
    "Origin",
    "Stale",
]

log = logging.getLogger(__name__)

DEFAULT_FILE_POLL_S = 1.0
"""Default interval between checks of the mounted file."""


class ApplyError(Exception):
    """Why a configuration was not applied."""


class Invalid(ApplyError):
    """Malformed or invalid (HTTP 400, or 413 for :class:`~.wire.TooLarge`)."""

    def __init__(self, error: ConfigError) -> None:
        super().__init__(str(error))
        self.error = error


class Stale(ApplyError):
    """Older than the running generation (HTTP 409)."""

    def __init__(self, running: int, given: int) -> None:
        super().__init__(f"generation {given} is older than the running generation {running}")
        self.running = running
        self.given = given


class Origin(enum.Enum):
    """Where the running configuration came from."""

    INITIAL = "initial"
    FILE = "file"
    PUSH = "push"


def unix_now() -> int:
    return int(time.time())


@dataclass(frozen=True)
class Limits:
    """The worker's own bounds on a configuration, checked on every update (push or file) on
    top of the wire contract's ranges."""

    max_permits: int = 1024
    max_reaction: int = 100_000
    min_probe_ms: int = 100
    max_probe_ms: int = 3_600_000
    max_generation_lead_ms: int = MAX_GENERATION_LEAD_MS
    max_window_ms: int = 3_600_000
    max_redelivery_ms: int = 43_200_000

    def check(self, cfg: WorkerConfig, now_unix: int) -> None:
        """Checks ``cfg`` at ``now_unix`` (seconds); raises a :class:`~.wire.FieldError`."""
        if cfg.max_permits > self.max_permits:
            raise FieldError(
                "maxPermits",
                f"{cfg.max_permits} exceeds this worker's limit of {self.max_permits}",
            )
        if cfg.reaction > self.max_reaction:
            raise FieldError("reaction", f"{cfg.reaction} exceeds this worker's limit of {self.max_reaction}")
        for name, ms in (("probeInitialMs", cfg.probe_initial_ms), ("probeMaxMs", cfg.probe_max_ms)):
            if ms < self.min_probe_ms or ms > self.max_probe_ms:
                raise FieldError(
                    name,
                    f"{ms} ms is outside this worker's range of {self.min_probe_ms} "
                    f"to {self.max_probe_ms} ms",
                )
        if cfg.initial_permits is not None and cfg.initial_permits > self.max_permits:
            raise FieldError(
                "initialPermits",
                f"{cfg.initial_permits} exceeds this worker's limit of {self.max_permits}",
            )
        for name, opt in (("ratioWindowMs", cfg.ratio_window_ms), ("brakeReleaseMs", cfg.brake_release_ms)):
            if opt is not None and opt > self.max_window_ms:
                raise FieldError(name, f"{opt} ms exceeds this worker's limit of {self.max_window_ms} ms")
        r = cfg.redelivery
        if r is not None and max(r.max_ms, r.base_ms) > self.max_redelivery_ms:
            raise FieldError(
                "redelivery.maxMs",
                f"{max(r.max_ms, r.base_ms)} ms exceeds this worker's limit of {self.max_redelivery_ms} ms",
            )
        check_generation_lead(cfg.generation, now_unix, self.max_generation_lead_ms)


def check_generation_lead(generation: int, now_unix: int, max_lead_ms: int) -> None:
    """Refuses a ``generation`` more than ``max_lead_ms`` ahead of ``now_unix`` (seconds)."""
    if generation > now_unix * 1000 + max_lead_ms:
        raise FieldError(
            "generation",
            f"{generation} is more than {max_lead_ms // 1000} s ahead of this worker's clock "
            f"({now_unix * 1000} ms); generations are Unix milliseconds",
        )


def _with_hash(cfg: WorkerConfig) -> WorkerConfig:
    return cfg if cfg.hash else cfg.with_hash()


class ConfigState:
    """The running configuration and where it is applied. Thread safe.

    Starts from ``initial`` (validated; an invalid one is replaced by the defaults), applying it
    to ``gate``. The library-side knobs of the gate's current settings (credit, health-check
    probes, and the application's choice for the optional fields a payload leaves out) are
    kept across updates.
    """

    def __init__(
        self,
        gate: Gate,
        initial: WorkerConfig | None = None,
        metrics: Metrics | None = None,
        limits: Limits | None = None,
    ) -> None:
        if initial is None:
            initial = WorkerConfig.default()
        try:
            initial.validate()
        except ConfigError as e:
            log.warning("invalid initial worker config (%s); using the defaults", e)
            initial = WorkerConfig.default()
        initial = _with_hash(initial)
        self._gate = gate
        self._metrics = metrics
        self._base = gate.settings
        self._limits = limits if limits is not None else Limits()
        self._lock = threading.Lock()
        self._running = initial
        self._origin = Origin.INITIAL
        self._install(initial, unix_now())

    @property
    def limits(self) -> Limits:
        return self._limits

    def with_limits(self, limits: Limits) -> ConfigState:
        """Checks every later update against ``limits`` instead of the defaults."""
        self._limits = limits
        return self

    @property
    def gate(self) -> Gate:
        return self._gate

    def running(self) -> WorkerConfig:
        with self._lock:
            return self._running

    def ack(self) -> ConfigAck:
        """The running hash and generation."""
        with self._lock:
            return ConfigAck(hash=self._running.hash, generation=self._running.generation)

    def origin(self) -> Origin:
        with self._lock:
            return self._origin

    def apply_bytes(self, data: bytes, origin: Origin) -> ConfigAck:
        """Parses, validates and applies a payload. Raises :class:`ApplyError`."""
        try:
            cfg = WorkerConfig.parse(data)
        except ConfigError as e:
            raise Invalid(e) from e
        return self.apply(cfg, origin)

    def apply(self, cfg: WorkerConfig, origin: Origin, now_unix: int | None = None) -> ConfigAck:
        """Validates and applies a configuration (see the module docs)."""
        if now_unix is None:
            now_unix = unix_now()
        try:
            cfg.validate()
            self._limits.check(cfg, now_unix)
        except ConfigError as e:
            raise Invalid(e) from e
        cfg = _with_hash(cfg)
        with self._lock:
            current = self._running.generation
            if cfg.generation < current:
                raise Stale(running=current, given=cfg.generation)
            ack = ConfigAck(hash=cfg.hash, generation=cfg.generation)
            if cfg.hash == self._running.hash and cfg.generation == current:
                return ack
            self._install(cfg, now_unix)
            log.info(
                "worker config applied: hash=%s generation=%d from=%s previous=%s",
                ack.hash,
                ack.generation,
                origin.value,
                self._running.hash,
            )
            self._running = cfg
            self._origin = origin
            return ack

    def _install(self, cfg: WorkerConfig, now_unix: int) -> None:
        b = self._base
        frm = Settings.from_config(cfg)
        # A field the payload carries wins; one it leaves out keeps the application's setting.
        settings = dataclasses.replace(
            frm,
            credit=b.credit,
            health_check_probes=b.health_check_probes,
            ratio_window=frm.ratio_window if cfg.ratio_window_ms is not None else b.ratio_window,
            brake_release=frm.brake_release if cfg.brake_release_ms is not None else b.brake_release,
            initial_permits=frm.initial_permits if cfg.initial_permits is not None else b.initial_permits,
            floor_max=frm.floor_max if cfg.floor_max is not None else b.floor_max,
            redelivery=frm.redelivery if cfg.redelivery is not None else b.redelivery,
        )
        self._gate.apply(settings, cfg.brake, now_unix)
        if self._metrics is not None:
            self._metrics.set_config(cfg.hash, cfg.algorithm)


class FileWatcher:
    """Watches the mounted ``worker-config.json`` and applies it when its content changes.

    It polls the file's content through its path (following symlinks), which handles both a
    file rewritten in place and kubelet's ConfigMap update (an atomic swap of the ``..data``
    symlink). A missing file is waited for; an invalid one is reported once per content and the
    running configuration stays.
    """

    def __init__(self, state: ConfigState, path: str | Path) -> None:
        self.state = state
        self.path = Path(path)
        self._last_digest: bytes | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> ConfigAck | ApplyError | OSError | None:
        """Reads the file once and applies it if its content changed: the ack, the refusal,
        the read error, or None when unchanged (or absent)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            return e
        digest = hashlib.sha256(data).digest()
        if digest == self._last_digest:
            return None
        self._last_digest = digest
        try:
            return self.state.apply_bytes(data, Origin.FILE)
        except ApplyError as e:
            log.warning("config file %s refused; keeping the running one: %s", self.path, e)
            return e

    def run(self, interval: float = DEFAULT_FILE_POLL_S) -> None:
        """Checks the file every ``interval`` seconds until :meth:`stop`."""
        unreadable_reported = False
        while not self._stop.is_set():
            result = self.check()
            if isinstance(result, OSError):
                if not unreadable_reported:
                    log.warning("cannot read the config file %s: %s", self.path, result)
                unreadable_reported = True
            else:
                unreadable_reported = False
            self._stop.wait(interval)

    def start(self, interval: float = DEFAULT_FILE_POLL_S) -> FileWatcher:
        """Runs :meth:`run` in a daemon thread."""
        self._thread = threading.Thread(target=self.run, args=(interval,), name="bp-config-file", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
