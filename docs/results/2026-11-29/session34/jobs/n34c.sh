#!/usr/bin/env bash
# Session 34, call C: served Llama-3.1-8B on an FP8 cache with `fp8_qk_rounded` on every prefill
# batch (VLLM_FA4_VARIANT) against FLASH_ATTN, 64k x 10, CUDA graphs on.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
R=queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded
run n34-pre-serve 100 python3 tools/precompile.py --model llama-3.1-8b -j 14 --pages 16 --configs "$R" --kv-dtype float8_e4m3fn --lse both
run n34-serve-r-64k 480 env VLLM_FA4_VARIANT=$R python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FA4,FLASH_ATTN --cases 65536:10 --extra-args=--kv-cache-dtype=fp8 --budget-s 470 --out $OUT/servingr-64k
