#!/usr/bin/env bash
# The Go SDK's checks: module download (the Go module proxy, cached in Go's own module cache
# outside the repository), gofmt, go vet, the example's build (build/example-worker), and the
# tests with the race detector, golden vectors included (../../conformance/vectors, or
# BP_VECTORS_go).
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"
fi
command -v go >/dev/null 2>&1 || { echo "sdk/go: the Go toolchain (go 1.26+) is not installed" >&2; exit 1; }
# Use the installed toolchain; never download another one.
export GOTOOLCHAIN=local
export GOFLAGS="${GOFLAGS:-} -mod=readonly"

echo "sdk/go: $(go version)"
go mod download
go mod verify >/dev/null

unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then
  echo "sdk/go: not gofmt-formatted:" >&2
  echo "$unformatted" >&2
  exit 1
fi
go vet ./...
# The example worker, as the conformance harness starts it (from the repository root:
# sdk/go/build/example-worker with the environment of conformance/README.md). A built binary,
# not `go run`: SIGTERM to `go run` leaves its child running.
go build -o build/example-worker ./examples/worker

# -race needs cgo; without a C compiler the tests run without it.
race=-race
if ! command -v "${CC:-gcc}" >/dev/null 2>&1; then
  echo "sdk/go: no C compiler: running the tests without -race"
  race=
fi
go test $race -count=1 ./...
