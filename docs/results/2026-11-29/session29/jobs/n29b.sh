#!/usr/bin/env bash
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
MC=one_per_cta+pv_wait_mid+lazy_max+kv_multicast
BASE=one_per_cta+pv_wait_mid+lazy_max
# Session 29: kv_multicast's correctness (GPU matrix, 12 workers), the A/B kernels compiled.
run n29-pre 200 python3 tools/precompile.py --model llama-3.1-8b -j 12 --pages 16,128 --configs "default $BASE $MC"
run n29-test-mc 380 env VLLM_FA4_TEST_VARIANTS=$MC python3 -m pytest tests/gpu/test_kernel.py -m gpu -n 12 -q -x -p no:cacheprovider
