#!/usr/bin/env bash
# `make test` after `make deps`: every test against real components. Cold, KEDA's build (about
# 8 of CI's minutes) runs in the background at the lowest CPU and I/O priority (nice 19, ionice
# idle) while the tests that do not need it run: they mostly wait on timers.
#
#   1. build   the Go-built binaries but KEDA's (tools/k8s/build.sh node: kube-apiserver, etcd,
#              kubectl, helm, Prometheus, redis_exporter, KEDA's CRDs, the real node's kubelet,
#              kube-scheduler, kube-proxy and pause image; the kstatus checker),
#              lint, the workspace's test build, the manifests, the container images from the
#              test build's binaries with a run of each (make image-test PROFILE=debug), the
#              SDKs' tests (against the real API server) and the lab's Go worker's tests
#   2. test    every workspace test but real KEDA's,  ║ KEDA's build, niced
#              the integration suite (tests/it) in two shards side by side, each on a control
#              plane of its own (its tests take one lock per control plane and mostly wait;
#              measured in fresh-clone rehearsals: phase 2 cold 1,308 -> 685 s, warm
#              1,175 -> 612 s)
#   3. KEDA    the real-KEDA integration test, then the lab's end-to-end scenarios (make e2e: as
#              root on the real node, the chart installed with helm and the images of phase 1)
#
# Measured, not assumed: running the CPU-bound builds side by side (Go beside cargo) was slower
# on 2 cores than one after the other (the control plane's Go build took 979 s beside clippy
# against 473 s alone), so only KEDA's build, beside tests that leave the cores idle, is
# overlapped. Warm, the Go builds are no-ops. The background lane's output is prefixed with
# [keda]; it fails the run when it is waited for; on any exit it is killed with its children.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CARGO=${CARGO:-cargo}
MAKE=${MAKE:-make}
tmp=$(mktemp -d)
lanes=()
cleanup() {
  for pid in "${lanes[@]}"; do kill -- "-$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
t0=$(date +%s)
phase() { echo "==> test [$(( $(date +%s) - t0 ))s]: $*"; }

# lane NAME COMMAND...: COMMAND in the background, in a process group of its own (so that
# cleanup can stop its children), stdout and stderr prefixed with [NAME]. Sets $lane_pid.
lane() {
  local name=$1
  shift
  setsid bash -c 'set -o pipefail; name=$1; shift; "$@" 2>&1 | sed -u "s/^/[$name] /"' \
    lane "$name" "$@" &
  lane_pid=$!
  lanes+=("$lane_pid")
}

# await NAME PID: waits for a lane and fails the run if it failed.
await() {
  local started
  started=$(date +%s)
  if ! wait "$2"; then
    echo "test: the $1 lane failed (its output is above, prefixed with [$1])" >&2
    exit 1
  fi
  echo "test: the $1 lane is done (waited $(( $(date +%s) - started ))s for it)"
}

# The integration tests that run real KEDA (tests/it/keda.rs), left to phase 3.
keda_tests=keda::real_keda
# The modules of the integration suite (tests/it) that phase 2 runs in a second shard, beside
# the first, on a control plane of their own: about half of the suite's time (measured: faults
# 212 s, conformance 136 s, presets 93 s, tenancy 105 s of about 1,030 s, warm).
it_shard_b='^(faults|conformance|presets|tenancy)::'

phase "1/3 build: the Go-built binaries but KEDA's, lint, the test build, manifests, images, the SDKs' tests"
tools/k8s/build.sh node >"$tmp/bin"
bin=$(tail -n1 "$tmp/bin")
[ -d "$bin" ] || { echo "test: tools/k8s/build.sh printed no bin directory" >&2; exit 1; }
tools/kstatus/build.sh >/dev/null
$MAKE --no-print-directory lint
$CARGO test --workspace --locked --no-run
$MAKE --no-print-directory K8S_BIN="$bin" manifests
# The images from the test build's binaries (podman, no daemon, no pull), each run once.
BP_K8S_BIN="$bin" $MAKE --no-print-directory PROFILE=debug image-test
BP_K8S_BIN="$bin" $MAKE --no-print-directory sdk-test lab-worker-go-test

phase "2/3 test: every workspace test but real KEDA's, while KEDA builds at the lowest priority"
# The real node's tests (crates/envtest/tests/node.rs, tests/it/node.rs) need root: as root a
# node that cannot start fails them; otherwise they say why and pass.
if [ "$(id -u)" = 0 ]; then export BP_REQUIRE_NODE=1; else echo "test: not root: the real-node tests will be skipped"; fi
lane keda nice -n 19 ionice -c3 bash -c 'tools/k8s/build.sh keda >/dev/null'
keda_pid=$lane_pid
# Every test by name and binary ("Running tests/it/main.rs (...)" precedes each list), then the
# exact names of the suite's second shard and of the KEDA tests. Exact names, because the module
# names of tests/it recur in the crates' unit tests (presets::tests, tenancy::query::tests).
$CARGO test --workspace --locked --tests -- --list 2>&1 |
  awk '/^ *Running /{bin = $2} / test$/{sub(/: test$/, ""); print bin "\t" $0}' >"$tmp/tests"
awk -F'\t' -v re="$it_shard_b" '$1 == "tests/it/main.rs" && $2 ~ re {print $2}' "$tmp/tests" >"$tmp/shard-b"
awk -F'\t' -v re="^$keda_tests" '$1 == "tests/it/main.rs" && $2 ~ re {print $2}' "$tmp/tests" >"$tmp/keda"
[ -s "$tmp/shard-b" ] && [ -s "$tmp/keda" ] || { echo "test: no tests/it test matched $it_shard_b or $keda_tests" >&2; exit 1; }
# An exact name that another binary has too would be skipped there as well.
dup=$(cut -f2 "$tmp/tests" | sort | uniq -d | grep -Fxf "$tmp/shard-b" || true)
[ -z "$dup" ] || { echo "test: names of the second shard recur in another binary: $dup" >&2; exit 1; }
mapfile -t shard_b <"$tmp/shard-b"
skip=()
while read -r t; do skip+=(--skip "$t"); done < <(cat "$tmp/shard-b" "$tmp/keda")
echo "test: tests/it in two shards, ${#shard_b[@]} of its tests in the second"
lane it-b env BP_K8S_BIN="$bin" $CARGO test --workspace --locked --tests --no-fail-fast -- --exact "${shard_b[@]}"
it_b_pid=$lane_pid
main_rc=0
BP_K8S_BIN="$bin" $CARGO test --workspace --locked --no-fail-fast -- --exact "${skip[@]}" || main_rc=$?
await it-b "$it_b_pid"
[ "$main_rc" = 0 ] || { echo "test: the workspace's tests failed (above)" >&2; exit "$main_rc"; }

phase "3/3 KEDA: the real-KEDA integration test, then the lab's end-to-end scenarios"
await keda "$keda_pid"
# `--workspace --tests`, the selection of every other cargo command here: `-p` or `--test it`
# alone unify features differently and rebuild ring, rustls, kube and the operator, and the
# workspace build after them rebuilds them back (about 2 minutes, cold or warm, measured).
BP_K8S_BIN="$bin" $CARGO test --workspace --locked --tests -- "$keda_tests" \
  | tee "$tmp/keda.out"
# A filter that matches nothing passes: make sure the tests phase 2 skipped did run.
grep -Eq '^test result: ok\. [1-9][0-9]* passed' "$tmp/keda.out" ||
  { echo "test: no test matched $keda_tests" >&2; exit 1; }
$MAKE --no-print-directory K8S_BIN="$bin" e2e
phase "done"
