#!/usr/bin/env bash
# Install (into .venv, once) and run the tests.
#   scripts/test.sh                      # the README suite: CPU unit tests and one kernel compile
#                                        # per config family serving launches (about 5-7 min on 2
#                                        # cores once installed); an SM90 GPU also runs tests/gpu
#   scripts/test.sh FILE... [OPTIONS]    # only those files, folders or test ids
#   scripts/test.sh -k plan              # options alone apply to the README suite
#   scripts/test.sh -m compile_matrix    # the full kernel compile matrix (CI runs it too)
#   scripts/test.sh -m compile_variants  # the configs serving never launches (not in CI)
# Options go to pytest. The README suite runs on 2 workers (pytest-xdist) where no SM90 GPU is
# visible (GPU tests stay serial); TEST_WORKERS=N overrides, 0 runs in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="[dev]" source scripts/_venv.sh
source scripts/_gpu.sh
export CUTE_DSL_ARCH="${CUTE_DSL_ARCH:-sm_90a}"  # compile-only kernel tests target Hopper
unset PYTHONDONTWRITEBYTECODE  # keep .pyc files: else each test process compiles vLLM again
if [ $# -gt 0 ] && [[ "$1" != -* ]]; then
  workers=${TEST_WORKERS:-0}
else
  set -- tests "$@"
  workers=${TEST_WORKERS:-$([ -n "$GPU_PROBLEM" ] && echo 2 || echo 0)}
  echo "== the README suite on $workers workers: collecting takes ~40 s, then about 5-7 min on 2" \
    "idle cores (longer when the machine is busy)"
fi
exec "$VENV/bin/python" -m pytest -q -n "$workers" "$@"
