#!/usr/bin/env bash
# Session 37, call E: the needles on Gemma 2's local layers (4k window, cap 50) and Gemma 3's
# 1k window (no cap), the e4m3 rows session 37's first runs left out.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n37-needle-gemma-w4095-cap50 100 python3 benchmarks/fp8_needle.py -j 14 --models gemma-2-9b --softcap 50 --window-left 4095 --contexts 32k,128k
run n37-needle-gemma-w1023 80 python3 benchmarks/fp8_needle.py -j 14 --models gemma-2-9b --window-left 1023 --contexts 32k
