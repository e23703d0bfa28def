#!/usr/bin/env bash
# Session 37, call C: Gemma-2-9B served on the FP8 cache in the exact mode (the default), FA4
# first. Prediction (session 36): 1.03-1.07x FLASH_ATTN-FP8.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n37-serve-gemma-exact 560 python3 benchmarks/serving.py throughput --model configs/gemma-2-9b --backends FA4,FLASH_ATTN --cases 7936:48 --extra-args=--kv-cache-dtype=fp8 --budget-s 540 --out $OUT/serve-gemma-exact
