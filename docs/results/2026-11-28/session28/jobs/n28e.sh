#!/usr/bin/env bash
# Session 28, job e: fuzz seed 97 on the served picks (no variant forced); the power view of short batches.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n28-fuzz97 330 env VLLM_FA4_FUZZ_SEED=97 python3 -m pytest tests/gpu/test_fuzz.py -q -n 8
run n28-pre-e 120 python3 tools/precompile.py --model llama-3.1-8b -j 14 --pages 16,128 --configs default
run n28-power-short-cases 150 python3 benchmarks/power_clocks.py --model llama-3.1-8b --pages 16,128 --cases 512x32,2kx8 --seconds 2 --rounds 2
