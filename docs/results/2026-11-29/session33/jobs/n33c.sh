#!/usr/bin/env bash
# Session 33, call C: the FP8 cache's served pair at 32k on an H200 (issue 30; H100 only so far)
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n33-pre-fp8 150 python3 tools/precompile.py --model llama-3.1-8b -j 12 --pages 16 --configs default --kv-dtype float8_e4m3fn --lse both
run n33-serve-fp8-32k 560 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FA4,FLASH_ATTN --cases 32768:24 --extra-args=--kv-cache-dtype=fp8 --budget-s 540 --out $OUT/servingfp8-32k
