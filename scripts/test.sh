#!/usr/bin/env bash
# Install (into .venv, once) and run the test suite. CPU machines run the unit and compile-only
# tests; an SM90 GPU also runs tests/gpu. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="[dev]" source scripts/_venv.sh
export CUTE_DSL_ARCH="${CUTE_DSL_ARCH:-sm_90a}"  # compile-only kernel tests target Hopper
exec "$VENV/bin/python" -m pytest tests -q "$@"
