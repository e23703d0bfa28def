#!/usr/bin/env bash
# Session 35, call D: the widened mode through the backend (head dim 128 with the 4k window added to
# tests/gpu/test_fp8.py's e4m3 test) and the windowed rows' error with Q rounded.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
W=queue+overlap+fp8_qk_rounded
run n35-mode-test 240 python3 -m pytest tests/gpu/test_fp8.py -m gpu -k e4m3 -q -p no:cacheprovider
run n35-w128-acc 80 python3 benchmarks/fp8_ab.py -j 14 --accuracy --models llama-3.1-8b --window-left 4095 --pages 16,128 --fp8-variants "default $W"
