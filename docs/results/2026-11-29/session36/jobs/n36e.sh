#!/usr/bin/env bash
# Session 36, call E (main): Gemma-2-9B served on the FP8 cache with the e4m3 mode, 7936-token
# prompts (the config runs to 8192 positions), FA4 first; one round within the call's budget.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n36-serve-gemma-e4m3 470 env VLLM_FA4_FP8_QUERY=e4m3 python3 benchmarks/serving.py throughput --model configs/gemma-2-9b --backends FA4,FLASH_ATTN --cases 7936:48 --extra-args=--kv-cache-dtype=fp8 --budget-s 440 --out $OUT/serve-gemma-e4m3
