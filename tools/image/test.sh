#!/usr/bin/env bash
# `make image-test`: runs the images `make image` built, with podman, and fails if one is broken
# (a missing library, a wrong entrypoint, a root user, missing labels, a process that does not
# start or does not stop cleanly):
#
#   operator    image config: user 65532:65532, entrypoint, OCI labels (version = the tag,
#               revision, source); `--help` and `--version`; `kubectl-wbp --help` (entrypoint
#               override); a real start as the chart runs it (read-only root filesystem, no
#               capabilities, no privilege escalation): with BP_K8S_BIN against an etcd and
#               kube-apiserver started here with the CRDs applied, until /readyz answers 200
#               (its caches synced), with /healthz and /metrics, uid 65532, and SIGTERM exits 0;
#               without BP_K8S_BIN against an API server that refuses connections, where it must
#               serve, then exit non-zero naming the refused connection
#   lab-worker  the same image checks; `worker --help` (the default command); a real start
#               against a Redis started here: /healthz and /metrics answer, a message added to
#               the queue is fetched and its outcome counted in /metrics, SIGTERM stops it with
#               status 0
#   lab-worker-go  (when `make image` built it: GO_WORKER_BIN) the same image checks; `--help`
#               (the default command); a real start against the same Redis with the Lua scripts
#               the image holds (--scripts /usr/share/backpressure-lab/lua): /healthz and
#               /metrics answer, a queued message is fetched and counted, SIGTERM exits 0
#
# The chart's and the kustomize tree's default operator image must be the one `make image`
# builds by default (DEFAULT_REGISTRY and the version): checked here too.
#
#   REGISTRY=ghcr.io/backpressure-dev TAG=0.1.0 VERSION=0.1.0 tools/image/test.sh
#
# Measured on the shared 2-core machine: 6 s, 11 s with BP_K8S_BIN (the API server and the CRDs
# take about 8 s of it). A base without glibc fails it at the first `--help`.
#
# Needs podman and runc, redis-server and redis-cli, curl, python3 (and openssl with
# BP_K8S_BIN). The containers use the
# host's network (`--network host`, loopback ports chosen free) and are removed on exit.
# PODMAN_RUN_OPTS replaces the run options this machine kind needs (runc, and rlimits no higher
# than the host's: raising them is not permitted here).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
: "${VERSION:?VERSION: the workspace version}"
TAG=${TAG:-$VERSION}
DEFAULT_REGISTRY=${DEFAULT_REGISTRY:-ghcr.io/backpressure-dev}
REGISTRY=${REGISTRY:-$DEFAULT_REGISTRY}
REGISTRY=${REGISTRY%/}
read -r -a podman <<<"${PODMAN:-podman}"
for cmd in "${podman[0]}" redis-server redis-cli curl python3; do
  command -v "$cmd" >/dev/null || { echo "image-test: $cmd is required" >&2; exit 1; }
done
if [ -n "${PODMAN_RUN_OPTS+set}" ]; then
  read -r -a run_opts <<<"$PODMAN_RUN_OPTS"
else
  run_opts=(--ulimit "nofile=$(ulimit -Sn):$(ulimit -Hn)" --ulimit nproc=4096:4096)
  command -v runc >/dev/null && run_opts+=(--runtime runc)
fi
# As the chart's securityContext runs the operator.
restricted=(--read-only --cap-drop ALL --security-opt no-new-privileges)

operator=$REGISTRY/backpressure-operator:$TAG
worker=$REGISTRY/backpressure-lab-worker:$TAG
worker_go=$REGISTRY/backpressure-lab-worker-go:$TAG
tmp=$(mktemp -d)
containers=()
pids=()
cleanup() {
  for c in "${containers[@]}"; do "${podman[@]}" rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  # The servers started here hold nothing worth a graceful stop (kube-apiserver's takes long).
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "image-test: FAIL: $*" >&2; exit 1; }
ok() { echo "image-test: ok: $*"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
run() { "${podman[@]}" run --rm --network none "${run_opts[@]}" "${restricted[@]}" "$@"; }

# wait_http URL STATUS NAME: until URL answers STATUS (30 s), while container NAME runs.
wait_http() {
  local url=$1 want=$2 name=$3 got=""
  for _ in $(seq 1 150); do
    got=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$url" || true)
    [ "$got" = "$want" ] && return 0
    [ "$("${podman[@]}" inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" = true ] ||
      { "${podman[@]}" logs "$name" >&2 || true; fail "$name exited before $url answered $want"; }
    sleep 0.2
  done
  "${podman[@]}" logs "$name" >&2 || true
  fail "$url answered ${got:-nothing}, not $want, within 30 s"
}

# wait_counted PORT NAME: until /metrics on PORT counts an outcome of workload image-test (20 s).
wait_counted() {
  local port=$1 name=$2
  for _ in $(seq 1 100); do
    curl -sf --max-time 2 "http://127.0.0.1:$port/metrics" >"$tmp/metrics" || true
    grep -Eq '^backpressure_outcomes_total\{[^}]*workload="image-test"[^}]*\} [1-9]' "$tmp/metrics" && return 0
    sleep 0.2
  done
  "${podman[@]}" logs "$name" >&2 || true
  fail "$name: no outcome counted in /metrics 20 s after a message was queued"
}

# check_config IMAGE TITLE ENTRYPOINT: the image's user, entrypoint and OCI labels.
check_config() {
  local image=$1 title=$2 entrypoint=$3 user label
  "${podman[@]}" image exists "$image" || fail "$image is not in podman's storage: run \`make image\` first"
  user=$("${podman[@]}" image inspect -f '{{.Config.User}}' "$image")
  [ "$user" = 65532:65532 ] || fail "$image runs as user '$user', not 65532:65532"
  [ "$("${podman[@]}" image inspect -f '{{json .Config.Entrypoint}}' "$image")" = "[\"$entrypoint\"]" ] ||
    fail "$image: entrypoint is not $entrypoint"
  label() { "${podman[@]}" image inspect -f "{{index .Config.Labels \"org.opencontainers.image.$1\"}}" "$image"; }
  [ "$(label title)" = "$title" ] || fail "$image: label title is '$(label title)'"
  [ "$(label version)" = "$TAG" ] || fail "$image: label version is '$(label version)', not $TAG"
  [ "$(label licenses)" = Apache-2.0 ] || fail "$image: label licenses is '$(label licenses)'"
  for l in revision created source; do
    label=$(label "$l")
    case $label in "" | unknown | "<no value>") fail "$image: label org.opencontainers.image.$l is missing" ;; esac
  done
  ok "$image: user 65532:65532, entrypoint $entrypoint, OCI labels (version $TAG, revision $(label revision))"
}

# check_running NAME: the container runs, as uid 65532 (the host's view of its process).
check_running() {
  local name=$1 pid uid
  pid=$("${podman[@]}" inspect -f '{{.State.Pid}}' "$name")
  [ "$pid" -gt 0 ] || fail "$name is not running"
  uid=$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status")
  [ "$uid" = 65532 ] || fail "$name runs as uid $uid, not 65532"
}

# stop NAME: SIGTERM, and the exit status the process chose (not 137: it must not need a kill).
stop() {
  local name=$1 status
  "${podman[@]}" stop -t 20 "$name" >/dev/null
  status=$("${podman[@]}" inspect -f '{{.State.ExitCode}}' "$name")
  [ "$status" = 0 ] || { "${podman[@]}" logs "$name" >&2 || true; fail "$name exited with $status after SIGTERM"; }
}

# --- the chart and the kustomize tree default to what `make image` builds ---------------------
default_ref=$DEFAULT_REGISTRY/backpressure-operator:$VERSION
grep -q "^ *image: \"$default_ref\"$" config/manager/manager.yaml ||
  fail "config/manager/manager.yaml (the chart rendered with its defaults) does not run $default_ref"
app_version=$(sed -n 's/^appVersion: "\(.*\)"$/\1/p' charts/backpressure-operator/Chart.yaml)
[ "$app_version" = "$VERSION" ] || fail "the chart's appVersion $app_version is not the version $VERSION"
tr -d '\n' <config/manager/kustomization.yaml |
  grep -q "images:  - name: $DEFAULT_REGISTRY/backpressure-operator    newTag: $VERSION" ||
  fail "config/manager/kustomization.yaml's images: is not $default_ref"
ok "the chart and config/ default to $default_ref"

# --- operator ---------------------------------------------------------------------------------
check_config "$operator" backpressure-operator /usr/local/bin/backpressure-operator
run "$operator" --help >"$tmp/out" || fail "$operator --help failed"
grep -q '^Usage: backpressure-operator' "$tmp/out" || fail "$operator --help printed no usage"
run "$operator" --version >"$tmp/out" || fail "$operator --version failed"
grep -qx "backpressure-operator $VERSION" "$tmp/out" || fail "$operator --version: $(cat "$tmp/out")"
run --entrypoint /usr/local/bin/kubectl-wbp "$operator" --help >"$tmp/out" ||
  fail "kubectl-wbp --help failed in $operator"
grep -q '^Usage: kubectl-wbp' "$tmp/out" || fail "kubectl-wbp --help printed no usage"
ok "$operator: backpressure-operator --help, --version; kubectl-wbp --help"

# A real start. With BP_K8S_BIN (tools/k8s/build.sh's directory: etcd, kube-apiserver, kubectl),
# against an API server started here with the CRDs applied: /readyz (its caches synced),
# /healthz and /metrics answer 200. Without, against an API server that refuses connections: it
# serves /healthz, then exits non-zero naming the connection it could not make.
api_port=$(free_port)
metrics_port=$(free_port)
token="image-test"
if [ -n "${BP_K8S_BIN:-}" ]; then
  for b in etcd kube-apiserver kubectl; do
    [ -x "$BP_K8S_BIN/$b" ] || fail "$BP_K8S_BIN/$b is missing (BP_K8S_BIN: tools/k8s/build.sh's directory)"
  done
  command -v openssl >/dev/null || fail "openssl is required (the API server's service-account key)"
  etcd_port=$(free_port)
  peer_port=$(free_port)
  mkdir -p "$tmp/etcd" "$tmp/certs"
  "$BP_K8S_BIN/etcd" --data-dir "$tmp/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --unsafe-no-fsync --log-level warn >"$tmp/etcd.log" 2>&1 &
  pids+=($!)
  openssl genrsa -out "$tmp/sa.key" 2048 2>/dev/null
  token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  echo "$token,image-test,image-test,system:masters" >"$tmp/tokens.csv"
  "$BP_K8S_BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --cert-dir "$tmp/certs" --token-auth-file "$tmp/tokens.csv" --authorization-mode RBAC \
    --service-cluster-ip-range 10.0.0.0/24 --service-account-issuer "https://127.0.0.1:$api_port" \
    --service-account-key-file "$tmp/sa.key" --service-account-signing-key-file "$tmp/sa.key" \
    --disable-admission-plugins ServiceAccount >"$tmp/kube-apiserver.log" 2>&1 &
  pids+=($!)
fi
cat >"$tmp/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: image-test
    cluster: {server: "https://127.0.0.1:$api_port", insecure-skip-tls-verify: true}
users:
  - name: image-test
    user: {token: "$token"}
contexts:
  - name: image-test
    context: {cluster: image-test, user: image-test, namespace: default}
current-context: image-test
EOF
chmod 0644 "$tmp/kubeconfig"
if [ -n "${BP_K8S_BIN:-}" ]; then
  kubectl=("$BP_K8S_BIN/kubectl" --kubeconfig "$tmp/kubeconfig")
  started=$(date +%s)
  for _ in $(seq 1 300); do "${kubectl[@]}" get --raw /readyz >/dev/null 2>&1 && break; sleep 0.2; done
  "${kubectl[@]}" get --raw /readyz >/dev/null 2>&1 ||
    { tail -20 "$tmp/kube-apiserver.log" >&2; fail "kube-apiserver was not ready within 60 s"; }
  "${kubectl[@]}" apply --server-side -k crds >/dev/null
  "${kubectl[@]}" wait --for condition=established --timeout 60s crd --all >/dev/null
  echo "image-test: an API server with the CRDs in $(( $(date +%s) - started )) s"
fi
name=bp-image-test-operator-$$
containers+=("$name")
"${podman[@]}" run -d --name "$name" --network host "${run_opts[@]}" "${restricted[@]}" \
  -v "$tmp/kubeconfig:/etc/bp/kubeconfig:ro" -e KUBECONFIG=/etc/bp/kubeconfig \
  -e POD_NAMESPACE=default -e SERVICE_ACCOUNT_NAME=backpressure-operator \
  "$operator" --metrics-bind-address "127.0.0.1:$metrics_port" >/dev/null
if [ -n "${BP_K8S_BIN:-}" ]; then
  wait_http "http://127.0.0.1:$metrics_port/readyz" 200 "$name"
  curl -sf --max-time 2 "http://127.0.0.1:$metrics_port/healthz" >/dev/null ||
    fail "$name: /healthz did not answer 200"
  curl -sf --max-time 2 "http://127.0.0.1:$metrics_port/metrics" >"$tmp/metrics" ||
    fail "$name: /metrics did not answer"
  grep -q '^# TYPE ' "$tmp/metrics" || fail "$name: /metrics is not Prometheus text"
  check_running "$name"
  stop "$name"
  ok "$operator: a real start against an API server (read-only, no capabilities): /readyz, /healthz and /metrics 200, uid 65532, SIGTERM exits 0"
else
  status=$("${podman[@]}" wait "$name")
  "${podman[@]}" logs "$name" >"$tmp/log" 2>&1 || true
  [ "$status" != 0 ] || fail "$name exited 0 without an API server"
  if ! grep -q "serving /metrics, /healthz, /readyz" "$tmp/log" || ! grep -q "Connection refused" "$tmp/log"; then
    cat "$tmp/log" >&2
    fail "$name did not serve, then fail on the unreachable API server"
  fi
  ok "$operator: a start without an API server (read-only, no capabilities): served, then exited $status on the refused connection (BP_K8S_BIN=<tools/k8s/build.sh's directory> starts it against a real one)"
fi

# --- lab worker -------------------------------------------------------------------------------
check_config "$worker" backpressure-lab-worker /usr/local/bin/backpressure-lab
run "$worker" >"$tmp/out" || fail "$worker (its default command, worker --help) failed"
grep -q '^Usage: backpressure-lab worker' "$tmp/out" || fail "$worker printed no worker usage"
run "$worker" --version >"$tmp/out" || fail "$worker --version failed"
grep -qx "backpressure-lab $VERSION" "$tmp/out" || fail "$worker --version: $(cat "$tmp/out")"
ok "$worker: worker --help (the default command), --version"

# A real start against a Redis of its own; the dependency is a closed port, so the message's
# outcome is a dependency failure: it was fetched, handled and counted.
redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$tmp" >"$tmp/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$redis_port" ping >/dev/null || fail "redis-server did not start: $(cat "$tmp/redis.log")"
redis-cli -p "$redis_port" XGROUP CREATE image-test:stream workers 0 MKSTREAM >/dev/null
cat >"$tmp/worker.json" <<'EOF'
{"version": "backpressure.dev/worker-config/v1", "generation": 1, "algorithm": "SetPoint",
 "setPoint": 0.05, "reaction": 20, "maxPermits": 4, "probeInitialMs": 1000, "probeMaxMs": 10000}
EOF
chmod 0644 "$tmp/worker.json"
admin_port=$(free_port)
dependency_port=$(free_port)
name=bp-image-test-worker-$$
containers+=("$name")
"${podman[@]}" run -d --name "$name" --network host "${run_opts[@]}" "${restricted[@]}" \
  -v "$tmp/worker.json:/etc/bp/worker.json:ro" \
  "$worker" worker --listen "127.0.0.1:$admin_port" --redis "redis://127.0.0.1:$redis_port" \
  --queue image-test --consumer image-test-0 --dependency "http://127.0.0.1:$dependency_port" \
  --workload image-test --namespace default --processing 1ms --visibility-timeout 30s \
  --max-deliveries 3 --config /etc/bp/worker.json >/dev/null
wait_http "http://127.0.0.1:$admin_port/healthz" 200 "$name"
redis-cli -p "$redis_port" XADD image-test:stream '*' body image-test >/dev/null
wait_counted "$admin_port" "$name"
check_running "$name"
stop "$name"
ok "$worker: a real start (read-only, no capabilities): /healthz 200, a queued message fetched from Redis and counted in /metrics, uid 65532, SIGTERM exits 0"

# --- Go lab worker (built when GO_WORKER_BIN was set) -----------------------------------------
if "${podman[@]}" image exists "$worker_go"; then
  check_config "$worker_go" backpressure-lab-worker-go /usr/local/bin/lab-worker-go
  run "$worker_go" >"$tmp/out" 2>&1 || fail "$worker_go (its default command, --help) failed: $(cat "$tmp/out")"
  grep -q '^Usage of lab-worker-go' "$tmp/out" && grep -q -- '-scripts' "$tmp/out" ||
    fail "$worker_go printed no usage: $(cat "$tmp/out")"
  ok "$worker_go: --help (the default command)"

  # A real start on the Redis above, with the scripts of the image: it reads fetch, ack and
  # nack.lua at start (and fails without them), then fetches with fetch.lua.
  redis-cli -p "$redis_port" XGROUP CREATE image-test-go:stream workers 0 MKSTREAM >/dev/null
  admin_port=$(free_port)
  name=bp-image-test-worker-go-$$
  containers+=("$name")
  "${podman[@]}" run -d --name "$name" --network host "${run_opts[@]}" "${restricted[@]}" \
    -v "$tmp/worker.json:/etc/bp/worker.json:ro" \
    "$worker_go" --listen "127.0.0.1:$admin_port" --redis "redis://127.0.0.1:$redis_port" \
    --queue image-test-go --consumer image-test-go-0 --dependency "http://127.0.0.1:$dependency_port" \
    --workload image-test --namespace default --processing 1ms --visibility-timeout 30s \
    --max-deliveries 3 --config /etc/bp/worker.json --seed 7 \
    --scripts /usr/share/backpressure-lab/lua >/dev/null
  wait_http "http://127.0.0.1:$admin_port/healthz" 200 "$name"
  redis-cli -p "$redis_port" XADD image-test-go:stream '*' body image-test >/dev/null
  wait_counted "$admin_port" "$name"
  check_running "$name"
  stop "$name"
  ok "$worker_go: a real start (read-only, no capabilities) with the image's Lua scripts: /healthz 200, a queued message fetched from Redis and counted in /metrics, uid 65532, SIGTERM exits 0"
else
  echo "image-test: $worker_go is not in podman's storage (built with GO_WORKER_BIN): not tested"
fi
echo "image-test: passed"
