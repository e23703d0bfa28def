#!/usr/bin/env bash
# Session 37, call A: the needle retrieval on the FP8 cache (issue 30's long-context check):
# the tool at 32k and 128k on Llama-3.1-8B heads and Gemma-2-9B heads (cap 50), then its GPU test.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n37-needle-8b 240 python3 benchmarks/fp8_needle.py -j 14 --models llama-3.1-8b --contexts 32k,128k
run n37-needle-gemma-cap50 200 python3 benchmarks/fp8_needle.py -j 14 --models gemma-2-9b --softcap 50 --contexts 32k,128k
run n37-needle-test 110 python3 -m pytest tests/gpu/test_fp8_needle.py -m gpu -q -p no:cacheprovider
