#!/usr/bin/env bash
# Session 34, call D: head dim 256's rounded builds again with the contenders in the other order;
# served 8B on an FP8 cache with `fp8_qk_rounded` forced, 32k x 24, FLASH_ATTN first.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
R=queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded
A=queue+overlap+lazy_max+fp8_qk_rounded
B=one_per_cta+overlap+tma_epilogue+fp8_qk_rounded
run n34-r256-r2 120 python3 benchmarks/fp8_ab.py -j 14 --models gemma-2-9b --pages 16,128 --rounds 5 --cases 4kx4,8kx2,16kx1,2k@64k --fp8-variants "$B $A default"
run n34-serve-r-32k 420 env VLLM_FA4_VARIANT=$R python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FLASH_ATTN,FA4 --cases 32768:24 --extra-args=--kv-cache-dtype=fp8 --budget-s 410 --out $OUT/servingr-32k
rm -f $OUT/servingr-32k/*.md
