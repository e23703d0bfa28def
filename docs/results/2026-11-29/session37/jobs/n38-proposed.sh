#!/usr/bin/env bash
# Proposed for the next GPU session (not run), written at the end of session 37. On main; the kit
# loaded, vllm_fa4.egg-info carried. On an H100 first run session 36's n37-proposed.sh part 1.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
# Served gpt-oss-20b with more prompts, so the last ones weigh less (session 37: 0.997 / 1.068 at
# 24 prompts, the running rates within 1.4 %). Prediction: 1.00-1.02x in each order.
run n38-serve-gptoss-32k48 580 python3 benchmarks/serving.py throughput --model configs/gpt-oss-20b --backends FA4,FLASH_ATTN --cases 32768:48 --budget-s 560 --out $OUT/serve-gptoss-32k48
# next call: the same with --backends FLASH_ATTN,FA4
