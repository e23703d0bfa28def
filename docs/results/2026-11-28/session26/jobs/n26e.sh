#!/usr/bin/env bash
# Session 26, job e (32faa17: head dim 256's page-128 long picks with tma_epilogue): the
# sanitizer set's head-dim-256 page-128 shapes with the served picks.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
SAN="python3 tools/sanitize_served.py"
CS="compute-sanitizer --report-api-errors no"
ONLY='hd256 p128'
run s26-san-p128 200 bash -c "$SAN --precompile -j 14 --only '$ONLY' && $SAN --only '$ONLY' && $CS --tool memcheck $SAN --only '$ONLY' && $CS --tool synccheck $SAN --short-only --only '$ONLY'"
run s26-race-p128 120 $CS --tool racecheck $SAN --wrap --ctas 16 --only 'hd256 p128 16/8$|hd256 p128 16/8 cap50 fp8$'
