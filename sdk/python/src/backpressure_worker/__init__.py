"""Worker-side backpressure for queue workers managed by backpressure-operator.

A queue worker records the outcome of every message; a controller turns the outcomes into a
*backoff factor* in [0, 1] against a *set point* and into *permits*: how many messages the
worker may process at once. The operator configures the workers (``PUT /v1/config`` on the
admin port, or a mounted file) and reads their Prometheus metrics.

- :mod:`.controller`: the SetPoint, RatioThrottle, Fixed and Off controllers (time passed in);
- :mod:`.permits`: the :class:`Gate` passed before each poll (threads and asyncio);
- :mod:`.wire`: the WorkerConfig payload, its validation and its RFC 8785 content hash;
- :mod:`.config`: applies configurations at runtime (:class:`ConfigState`, :class:`FileWatcher`);
- :mod:`.admin` and :mod:`.token`: the admin HTTP server and TokenReview authentication;
- :mod:`.metrics`: the ``backpressure_*`` metrics with ``prometheus_client``;
- :mod:`.conformance`: the conformance hook's executor (one golden-vector case on a fresh
  controller), for conformance runs only.

This package is a port of the Rust worker library (``crates/worker``) and is checked against
the golden vectors generated from it (``conformance/vectors/``).
"""

from .admin import Admin, AdminServer, FailureLimit
from .config import ConfigState, FileWatcher, Limits, Origin
from .controller import Algorithm, Controller, Mode, Outcome, Settings, build, from_config
from .metrics import Metrics
from .permits import Gate, InFlight, PollPermit
from .token import TokenReviewVerifier, service_account_username
from .wire import ConfigAck, ConfigError, WorkerConfig

__version__ = "0.1.0"

__all__ = [
    "Admin",
    "AdminServer",
    "Algorithm",
    "ConfigAck",
    "ConfigError",
    "ConfigState",
    "Controller",
    "FailureLimit",
    "FileWatcher",
    "Gate",
    "InFlight",
    "Limits",
    "Metrics",
    "Mode",
    "Origin",
    "Outcome",
    "PollPermit",
    "Settings",
    "TokenReviewVerifier",
    "WorkerConfig",
    "build",
    "from_config",
    "service_account_username",
]
