#!/usr/bin/env bash
# Session 25, job d: compute-sanitizer on the candidate with tma_epilogue (head dim 256, page 16).
set -u
source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1
CAND=queue+pv_wait_mid+lazy_max+block_n=80+pages_ahead
SAN="python3 tools/sanitize_served.py"
export VLLM_FA4_VARIANT=$CAND+tma_epilogue
run s25-memcheck 200 compute-sanitizer --tool memcheck $SAN --only 'hd256 p16 16/8$|hd256 p16 16/8 cap50$'
run s25-racecheck 200 compute-sanitizer --tool racecheck $SAN --wrap --ctas 16 --only 'hd256 p16 16/8$'
run s25-synccheck 100 compute-sanitizer --tool synccheck $SAN --short-only --only 'hd256 p16 16/8$'
