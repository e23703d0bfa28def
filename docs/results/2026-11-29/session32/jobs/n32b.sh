#!/usr/bin/env bash
# Session 32, call B: issue 32's served 64k target, a second pair, FLASH_ATTN first.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n32-serve-8b-64k-r2 585 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FLASH_ATTN,FA4 --cases 65536:10 --budget-s 570 --out $OUT/serving64k
