#!/usr/bin/env bash
# Session 33, call D: the FP8 cache's served pair at 64k on an H200, FLASH_ATTN first
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n33-serve-fp8-64k 580 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FLASH_ATTN,FA4 --cases 65536:10 --extra-args=--kv-cache-dtype=fp8 --budget-s 570 --out $OUT/servingfp8-64k
