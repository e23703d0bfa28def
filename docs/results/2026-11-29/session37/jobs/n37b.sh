#!/usr/bin/env bash
# Session 37, call B: Gemma-2-9B served on the FP8 cache with VLLM_FA4_FP8_QUERY=e4m3, FLASH_ATTN
# first (session 36 ran FA4 first: 1.085x). Prediction (session 36): 1.05-1.10x.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n37-serve-gemma-e4m3-r2 560 env VLLM_FA4_FP8_QUERY=e4m3 python3 benchmarks/serving.py throughput --model configs/gemma-2-9b --backends FLASH_ATTN,FA4 --cases 7936:48 --extra-args=--kv-cache-dtype=fp8 --budget-s 540 --out $OUT/serve-gemma-e4m3-r2
