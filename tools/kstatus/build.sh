#!/usr/bin/env bash
# Builds the kstatus checker (main.go: sigs.k8s.io/cli-utils kstatus status.Compute over JSON
# objects on stdin) into a cache directory outside the repository, keyed by the cli-utils
# version. A second run with the binary present is a no-op. Cold build: about 30 s.
#
#   tools/kstatus/build.sh            # prints the binary's path on its last line
#   BP_CACHE=/some/dir tools/kstatus/build.sh
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=$(sed -n 's/^[[:space:]]*\(require \)\{0,1\}sigs.k8s.io\/cli-utils v\([^ ]*\).*/\2/p' "$here/go.mod")
[ -n "$version" ] || { echo "kstatus: no sigs.k8s.io/cli-utils version in $here/go.mod" >&2; exit 1; }
# The key also covers main.go, so an edit rebuilds.
sum=$(cat "$here/main.go" "$here/go.sum" | sha256sum | cut -c1-12)
key="kstatus-${version}-${sum}"
cache=${BP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/backpressure-operator}
out="$cache/$key/bin/kstatus"

if [ -x "$out" ]; then
  echo "kstatus: up to date ($key)" >&2
  echo "$out"
  exit 0
fi

command -v go >/dev/null || { echo "kstatus: Go is required (https://go.dev/dl) to build the kstatus checker" >&2; exit 1; }

export GOWORK=off GOFLAGS=-mod=mod CGO_ENABLED=0
tmp="$cache/$key/tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "kstatus: building $key into $(dirname "$out")" >&2
(cd "$here" && go build -trimpath -ldflags "-s -w" -o "$tmp/kstatus" .)
mkdir -p "$(dirname "$out")"
mv "$tmp/kstatus" "$out"
echo "kstatus: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
