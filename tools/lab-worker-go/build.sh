#!/usr/bin/env bash
# Builds the lab's Go worker (crates/lab/workers/go: the lab worker on the Go SDK) into a cache
# directory outside the repository, keyed by the Go version and the content of the worker and
# of the Go SDK it builds against. A second run with the binary present is a no-op (0.06 s).
# Measured on the shared 2-core machine: 125 s wall (62 s CPU) with an empty Go build cache;
# the first run also downloads go-redis and the Prometheus client from the Go module proxy.
#
#   tools/lab-worker-go/build.sh            # prints the binary's path on its last line
#   BP_CACHE=/some/dir tools/lab-worker-go/build.sh
#
# The lab (`backpressure-lab`, `make demo`, `make e2e`) takes the binary from $BP_LAB_GO_WORKER
# and otherwise runs this script itself when a scenario has a `polyglot` section.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
src="$root/crates/lab/workers/go"
sdk="$root/sdk/go"
command -v go >/dev/null || { echo "lab-worker-go: Go is required (https://go.dev/dl) to build the lab's Go worker" >&2; exit 1; }
goversion=$(go env GOVERSION)
# The key covers the worker's and the SDK's Go files and module files, so an edit rebuilds.
sum=$( { echo "$goversion"; cd "$root" && find crates/lab/workers/go sdk/go -maxdepth 1 -type f \
  \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' \) ! -name '*_test.go' | LC_ALL=C sort | xargs cat; } \
  | sha256sum | cut -c1-12)
key="lab-worker-go-${goversion}-${sum}"
cache=${BP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/backpressure-operator}
out="$cache/$key/bin/lab-worker-go"

if [ -x "$out" ]; then
  echo "lab-worker-go: up to date ($key)" >&2
  echo "$out"
  exit 0
fi

export GOWORK=off CGO_ENABLED=0
tmp="$cache/$key/tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "lab-worker-go: building $key into $(dirname "$out")" >&2
(cd "$src" && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/lab-worker-go" .)
mkdir -p "$(dirname "$out")"
mv "$tmp/lab-worker-go" "$out"
echo "lab-worker-go: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
