#!/usr/bin/env bash
# Session 32, call A: fill the kernel cache, then the 32k served pair (FA4 first).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n32-pre 150 python3 tools/precompile.py --model llama-3.1-8b -j 12 --pages 16 --configs default
run n32-serve-8b-32k 430 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FA4,FLASH_ATTN --cases 32768:24 --budget-s 420 --out $OUT/serving32k
