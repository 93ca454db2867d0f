#!/usr/bin/env bash
# The TypeScript SDK's checks: installs its dependencies from the npm registry (`npm ci` from
# the committed package-lock.json; the npm cache lives outside the repository, node_modules/
# and build/ are git-ignored), then the format check (prettier), the strict type check and
# build (tsc), and the tests (node --test), golden vectors included. Needs Node >= 20 and npm.
#
# BP_VECTORS_typescript overrides the vectors directory (default: ../../conformance/vectors).
# BP_K8S_BIN (the directory `make k8s-bins` prints) enables the TokenReview test against a real
# kube-apiserver; without it that test is skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "sdk/typescript: node and npm are needed (Node 20 or later)" >&2
  exit 1
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then
  echo "sdk/typescript: Node $(node --version) is too old; 20 or later is needed" >&2
  exit 1
fi

export npm_config_cache="${npm_config_cache:-${XDG_CACHE_HOME:-$HOME/.cache}/backpressure-operator/npm}"
export npm_config_update_notifier=false

# Install only when the lockfile changed since the last install (npm ci starts from scratch).
lock_sum="$(sha256sum package-lock.json | cut -d' ' -f1)"
stamp=node_modules/.bp-installed
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$lock_sum" ]; then
  npm ci --no-audit --no-fund --prefer-offline
  echo "$lock_sum" >"$stamp"
fi

npx --no-install prettier --check "src/**/*.ts" "test/**/*.ts" "examples/**/*.ts"
rm -rf build
npx --no-install tsc -p tsconfig.json
node --test build/test/*.test.js
