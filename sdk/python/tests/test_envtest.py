"""The config endpoint against a real kube-apiserver (and etcd): real ServiceAccount tokens from
the TokenRequest API, verified by the SDK's own TokenReview client over HTTPS.

Runs when ``$BP_K8S_BIN`` names the directory of the project's cached Kubernetes binaries
(``make k8s-bins``; ``make sdk-test`` passes it); without it these tests are skipped. With it
set, missing binaries or a server that does not start fail the tests.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from backpressure_worker.admin import Admin
from backpressure_worker.config import ConfigState
from backpressure_worker.controller import Settings, build
from backpressure_worker.metrics import Metrics
from backpressure_worker.permits import Gate
from backpressure_worker.token import (
    TokenReviewClient,
    TokenReviewVerifier,
    Unauthenticated,
    Unavailable,
    service_account_username,
)
from backpressure_worker.wire import CONFIG_PATH, WorkerConfig, push_audience

from .conftest import Worker, request, start

BIN = os.environ.get("BP_K8S_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="BP_K8S_BIN is not set (make k8s-bins)")

NS = "shop"
WORKLOAD = "export"
OPERATOR_NS = "bp-system"
OPERATOR_SA = "backpressure-operator"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: Path) -> None:
    """A CA, the API server's certificate for 127.0.0.1, an admin client certificate
    (system:masters) and the ServiceAccount signing key pair."""
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=bp-sdk-python-test-ca",
        "-days",
        "2",
        cwd=d,
    )
    for name, subj, ext in [
        (
            "server",
            "/CN=kube-apiserver",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
        ),
        ("admin", "/O=system:masters/CN=admin", "extendedKeyUsage=clientAuth"),
    ]:
        (d / f"{name}.ext").write_text(ext + "\n")
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            subj,
            cwd=d,
        )
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            cwd=d,
        )
    openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


@dataclass
class Env:
    url: str
    dir: Path

    def _ctx(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        ctx.load_cert_chain(str(self.dir / "admin.crt"), str(self.dir / "admin.key"))
        return ctx

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, context=self._ctx(), timeout=10) as r:
            return json.loads(r.read() or b"null")

    def create(self, path: str, body: Any) -> None:
        """Creates an object; one that exists already is fine."""
        try:
            self.request("POST", path, body)
        except urllib.error.HTTPError as e:
            if e.code != 409:
                raise

    def service_account(self, ns: str, name: str) -> None:
        self.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        self.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": name}})

    def token(self, ns: str, name: str, audience: str | None) -> str:
        spec: dict[str, Any] = {"expirationSeconds": 600}
        if audience is not None:
            spec["audiences"] = [audience]
        answer = self.request(
            "POST",
            f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return str(answer["status"]["token"])

    def bind_auth_delegator(self, ns: str, name: str) -> None:
        self.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": f"{ns}-{name}-auth-delegator"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:auth-delegator",
                },
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
            },
        )


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-3000:]
    except OSError:
        return ""


def _wait_http(url: str, ctx: ssl.SSLContext | None, proc: subprocess.Popen[bytes], seconds: float) -> bool:
    """True once ``url`` answers 200; False if ``proc`` exits or ``seconds`` pass first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    return False


def _start_control_plane(
    bin_dir: Path, d: Path, procs: list[subprocess.Popen[bytes]], logs: list[Any]
) -> Env | str:
    """etcd and a kube-apiserver on free ports: the Env once ready, or why not. A port found
    free can be taken (by another process's outgoing connection) before the child binds it,
    so the caller starts again on new ports."""
    etcd_url = f"http://127.0.0.1:{free_port()}"
    etcd_log, api_log = d / "etcd.log", d / "apiserver.log"
    logs += [open(etcd_log, "wb"), open(api_log, "wb")]  # noqa: SIM115
    etcd = subprocess.Popen(
        [
            str(bin_dir / "etcd"),
            f"--data-dir={d / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{free_port()}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
        stdout=logs[-2],
        stderr=subprocess.STDOUT,
    )
    procs.append(etcd)
    if not _wait_http(etcd_url + "/health", None, etcd, 30):
        return f"etcd not healthy (exit {etcd.poll()}):\n{_tail(etcd_log)}"
    port = free_port()
    api = subprocess.Popen(
        [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={d / 'certs'}",
            f"--tls-cert-file={d / 'server.crt'}",
            f"--tls-private-key-file={d / 'server.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            "--authorization-mode=RBAC",
            "--service-cluster-ip-range=10.0.0.0/24",
            f"--service-account-issuer=https://127.0.0.1:{port}",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            "--disable-admission-plugins=ServiceAccount",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--v=0",
        ],
        stdout=logs[-1],
        stderr=subprocess.STDOUT,
    )
    procs.append(api)
    e = Env(f"https://127.0.0.1:{port}", d)
    if not _wait_http(e.url + "/readyz", e._ctx(), api, 90):
        return (
            f"kube-apiserver not ready (exit {api.poll()}, etcd exit {etcd.poll()}):\n"
            f"{_tail(api_log)}\netcd:\n{_tail(etcd_log)}"
        )
    return e


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in reversed(procs):
        p.terminate()
    for p in reversed(procs):
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    procs.clear()


@pytest.fixture(scope="module")
def env() -> Iterator[Env]:
    assert BIN is not None
    bin_dir = Path(BIN)
    for b in ("etcd", "kube-apiserver"):
        assert (bin_dir / b).is_file(), f"{bin_dir / b} is missing; run `make k8s-bins`"
    assert shutil.which("openssl"), "openssl is needed to make the test PKI"
    d = Path(tempfile.mkdtemp(prefix="bp-sdk-python-envtest-"))
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Any] = []
    try:
        make_pki(d)
        failures: list[str] = []
        for attempt in range(1, 4):
            started = _start_control_plane(bin_dir, d, procs, logs)
            if isinstance(started, Env):
                break
            failures.append(f"attempt {attempt}: {started}")
            _stop(procs)
            shutil.rmtree(d / "etcd", ignore_errors=True)
        else:
            pytest.fail("no kube-apiserver:\n" + "\n".join(failures))
        e = started
        # The RBAC bootstrap roles (system:auth-delegator) come from a post-start hook.
        deadline = time.monotonic() + 90
        while True:
            try:
                e.request("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/system:auth-delegator")
                break
            except urllib.error.HTTPError:
                assert time.monotonic() < deadline, "no system:auth-delegator"
                time.sleep(0.25)
        yield e
    finally:
        _stop(procs)
        for f in logs:
            f.close()
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def worker_client(env: Env) -> TokenReviewClient:
    """The worker's TokenReview client, authenticated with its own ServiceAccount token (bound
    to system:auth-delegator), as in a pod."""
    env.service_account(NS, WORKLOAD)
    env.bind_auth_delegator(NS, WORKLOAD)
    token_file = env.dir / "worker-token"
    token_file.write_text(env.token(NS, WORKLOAD, None))
    return TokenReviewClient(env.url, ca_file=env.dir / "ca.crt", token_file=token_file)


def test_token_review_names_the_operator_for_our_audience_only(
    env: Env, worker_client: TokenReviewClient
) -> None:
    env.service_account(OPERATOR_NS, OPERATOR_SA)
    audience = push_audience(NS, WORKLOAD)
    good = env.token(OPERATOR_NS, OPERATOR_SA, audience)
    identity = worker_client.review(good, audience)
    assert identity.username == service_account_username(OPERATOR_NS, OPERATOR_SA)
    # The same token asked for another target's audience is refused by the API server.
    with pytest.raises(Unauthenticated):
        worker_client.review(good, push_audience("other", WORKLOAD))
    # A forged token (right shape, right claims, no valid signature).
    header, payload, _ = good.split(".")
    with pytest.raises(Unauthenticated):
        worker_client.review(f"{header}.{payload}.c2lnbmF0dXJl", audience)


def test_a_reviewer_without_rights_is_unavailable_not_a_refusal(env: Env) -> None:
    env.service_account(NS, "no-rights")
    token_file = env.dir / "no-rights-token"
    token_file.write_text(env.token(NS, "no-rights", None))
    client = TokenReviewClient(env.url, ca_file=env.dir / "ca.crt", token_file=token_file)
    with pytest.raises(Unavailable, match="403"):
        client.review("x.y.z", push_audience(NS, WORKLOAD))


def put(port: int, token: str | None, body: bytes) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{CONFIG_PATH}", data=body, method="PUT", headers=headers
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_pushes_over_http_with_real_tokens(env: Env, worker_client: TokenReviewClient) -> None:
    env.service_account(OPERATOR_NS, OPERATOR_SA)
    env.service_account(OPERATOR_NS, "someone-else")
    metrics = Metrics(WORKLOAD)
    gate = Gate(build(Settings.steady(), 1), metrics=metrics)
    state = ConfigState(gate, WorkerConfig.default(), metrics)
    verifier = TokenReviewVerifier(NS, WORKLOAD, reviewer=worker_client)
    admin = Admin(state, metrics).with_verifier(
        verifier, [service_account_username(OPERATOR_NS, OPERATOR_SA)]
    )
    server = admin.serve("127.0.0.1", 0)
    try:
        audience = push_audience(NS, WORKLOAD)
        cfg = WorkerConfig(generation=int(time.time() * 1000), max_permits=5).with_hash()
        operator = env.token(OPERATOR_NS, OPERATOR_SA, audience)
        status, body = put(server.port, operator, cfg.to_bytes())
        assert status == 200, body
        assert json.loads(body) == {"hash": cfg.hash, "generation": cfg.generation}
        assert gate.snapshot().limit == 5
        # Another target's token, the bare prefix audience, another identity, no token.
        other_target = env.token(OPERATOR_NS, OPERATOR_SA, push_audience("other", WORKLOAD))
        bare = env.token(OPERATOR_NS, OPERATOR_SA, "backpressure.dev")
        someone = env.token(OPERATOR_NS, "someone-else", audience)
        newer = cfg.replace(generation=cfg.generation + 1, max_permits=7).with_hash()
        for token, want in [(other_target, 401), (bare, 401), (someone, 403), (None, 401)]:
            status, body = put(server.port, token, newer.to_bytes())
            assert status == want, body
            assert "error" in json.loads(body)
        assert state.ack().generation == cfg.generation and gate.snapshot().limit == 5
        status, body = put(server.port, operator, newer.to_bytes())
        assert status == 200, body
        assert gate.snapshot().limit == 7
    finally:
        server.shutdown()


def test_the_example_worker_takes_pushes_with_the_conformance_environment(
    env: Env, worker_client: TokenReviewClient, workers: list[Worker]
) -> None:
    """The example worker started as the conformance harness starts it: identity, allowed
    identities and explicit TokenReview credentials from the environment only."""
    env.service_account(OPERATOR_NS, OPERATOR_SA)
    env.service_account(OPERATOR_NS, "someone-else")
    w = start(
        {
            "BP_WORKLOAD": WORKLOAD,
            "BP_NAMESPACE": NS,
            "BP_ADMIN_ADDR": "127.0.0.1:0",
            "BP_ALLOWED_IDENTITIES": f"system:serviceaccount:x:y,{service_account_username(OPERATOR_NS, OPERATOR_SA)}",
            "BP_CONFORMANCE_HOOK": "1",
            "BP_KUBE_API_URL": env.url,
            "BP_KUBE_CA_FILE": str(env.dir / "ca.crt"),
            "BP_KUBE_TOKEN_FILE": str(env.dir / "worker-token"),  # written by worker_client
            "BP_WORK_MS": "5",
        }
    )
    workers.append(w)
    port = int(w.wait_for(r"admin server listening on 127\.0\.0\.1:(\d+)").group(1))
    audience = push_audience(NS, WORKLOAD)
    cfg = WorkerConfig(generation=int(time.time() * 1000), max_permits=5).with_hash()
    status, body = put(port, env.token(OPERATOR_NS, "someone-else", audience), cfg.to_bytes())
    assert status == 403, body
    status, body = put(port, env.token(OPERATOR_NS, OPERATOR_SA, audience), cfg.to_bytes())
    assert status == 200, body
    status, body = request(port, "GET", CONFIG_PATH)
    assert status == 200 and json.loads(body) == {"hash": cfg.hash, "generation": cfg.generation}
    status, body = request(port, "GET", "/metrics")
    assert f'hash="{cfg.hash}"' in body, body
    assert w.stop() == 0, "".join(w.log)
