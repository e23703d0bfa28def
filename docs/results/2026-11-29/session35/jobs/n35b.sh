#!/usr/bin/env bash
# Session 35, call B: the mode itself served (VLLM_FA4_FP8_QUERY=e4m3: long batches R, short ones their
# exact pick), Llama-3.1-8B dummy weights, CUDA graphs on, FP8 cache, 64k x 10. Prediction 1.06-1.10.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n35-serve-e4m3-64k ${LIMIT:-560} env VLLM_FA4_FP8_QUERY=e4m3 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends ${ORDER:-FA4,FLASH_ATTN} --cases ${CASES:-65536:10} --extra-args=--kv-cache-dtype=fp8 --budget-s ${BUDGET:-550} --out $OUT/serve-e4m3-${TAG:-64k}
