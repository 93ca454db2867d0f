#!/usr/bin/env bash
# Installs moto's server (PyPI `moto[server]`, an SQS-compatible HTTP server among others) into a
# venv cached by version outside the repository, and prints the path of `moto_server` on its last
# line. A second run with the venv present is a no-op. Needs a Python >= 3.9 on PATH ($PYTHON
# overrides) with its venv module, and PyPI.
#
#   tools/sqs/moto.sh            # prints .../moto-<version>/bin/moto_server
#   BP_CACHE=/some/dir tools/sqs/moto.sh
set -euo pipefail

version=${BP_MOTO_VERSION:-5.1.22}
cache=${BP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/backpressure-operator}
venv="$cache/moto-$version"
out="$venv/bin/moto_server"

if [ -x "$out" ] && [ -f "$venv/.complete" ]; then
  echo "moto: up to date ($venv)" >&2
  echo "$out"
  exit 0
fi

py=${PYTHON:-}
if [ -z "$py" ]; then
  for c in python3 python; do
    if command -v "$c" >/dev/null; then py=$c; break; fi
  done
fi
[ -n "$py" ] || { echo "moto: a Python 3 is required (set PYTHON)" >&2; exit 1; }

start=$(date +%s)
echo "moto: installing moto[server]==$version into $venv" >&2
# A half-made venv (an interrupted run) is made anew: `.complete` is written last.
rm -rf "$venv"
mkdir -p "$cache"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-input "moto[server]==$version" >&2
[ -x "$out" ] || { echo "moto: $out missing after install" >&2; exit 1; }
touch "$venv/.complete"
echo "moto: installed in $(( $(date +%s) - start ))s" >&2
echo "$out"
