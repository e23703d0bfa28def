#!/usr/bin/env bash
# Session 31, second job: served 8B, 128k x 6 prompts (131,039 tokens), FLASH_ATTN first.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n31b-serve-8b-128k 590 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FLASH_ATTN,FA4 --cases 131072:6 --budget-s 580 --out $OUT/serving128k
tail -14 $OUT/n31b-serve-8b-128k-$G-$COMMIT.log | head -8
