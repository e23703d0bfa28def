#!/usr/bin/env bash
# Proposed for the next session (not run): what session 31 left. Run from the repository root
# with vllm_fa4.egg-info carried (vLLM finds the plugin through it); about 20 minutes.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
# Fill the kernel cache first so the 32k pair fits one call (a cold cache cut session 31's).
run n32-pre 120 python3 tools/precompile.py --model llama-3.1-8b -j 12 --pages 16 --configs default
# Issue 32's served 64k target: a second pair, FLASH_ATTN first (session 31: 1.067, FA4 first).
run n32-serve-8b-64k-r2 580 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FLASH_ATTN,FA4 --cases 65536:10 --budget-s 560 --out $OUT/serving64k
# The 32k pair (session 31 measured FA4 alone: 30,773 tok/s).
run n32-serve-8b-32k 500 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FA4,FLASH_ATTN --cases 32768:24 --budget-s 480 --out $OUT/serving32k
