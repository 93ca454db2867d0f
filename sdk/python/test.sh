#!/usr/bin/env bash
# Lint, type-check and test the Python SDK: `sdk/python/test.sh` (run by `make sdk-test`).
#
# Needs only a Python >= 3.11 on PATH (python3.11 preferred; $PYTHON overrides). Makes a venv in
# ~/.cache/backpressure-operator/ (keyed by pyproject.toml and this checkout's path; $BP_PY_VENV
# overrides), installs the package and its test tools from PyPI into it once, then runs
# ruff, mypy --strict and pytest. The golden vectors are read from ../../conformance/vectors/
# ($BP_VECTORS_python overrides); a missing vectors file fails the tests.
#
# It also links sdk/python/.venv to the venv (unless .venv is a directory of its own), so the
# example worker runs from the repository root with
#   sdk/python/.venv/bin/python sdk/python/examples/example_worker.py
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

pick_python() {
  local candidates=("${PYTHON:-}" python3.11 python3 python)
  for py in "${candidates[@]}"; do
    [ -n "$py" ] || continue
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$py"
      return 0
    fi
  done
  echo "sdk/python: no Python >= 3.11 found (set PYTHON)" >&2
  return 1
}

py="$(pick_python)"
key="$( { cat pyproject.toml; echo "$here"; "$py" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-16)"
venv="${BP_PY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/backpressure-operator/sdk-python-venv-$key}"

if [ ! -f "$venv/.installed" ]; then
  echo "sdk/python: creating $venv"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test]"
  touch "$venv/.installed"
fi

# The example worker's interpreter at a fixed path (see the README: "Conformance runs").
if [ -L .venv ] || [ ! -e .venv ]; then
  ln -sfn "$venv" .venv
fi

export PYTHONDONTWRITEBYTECODE=1
echo "sdk/python: ruff"
"$venv/bin/ruff" check --no-cache .
"$venv/bin/ruff" format --no-cache --check .
echo "sdk/python: mypy --strict"
"$venv/bin/mypy" --strict --cache-dir "$venv/.mypy_cache" src tests examples
echo "sdk/python: pytest"
"$venv/bin/python" -m pytest -p no:cacheprovider -q tests
