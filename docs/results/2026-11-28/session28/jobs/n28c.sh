#!/usr/bin/env bash
# Session 28, job c: the power view at head dim 256 and on the FP8 cache; the GEMM in short windows.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
# the power view at head dim 256 (Gemma-2-9B heads, no cap; 16 KV-head-groups a tile) and the GEMM in short windows (do_bench's ~0.1 s)
run n28-power-gemma 200 python3 benchmarks/power_clocks.py --model gemma-2-9b --pages 16,128 --cases 4kx4,16kx1 --seconds 3 --rounds 2
run n28-power-short 120 python3 benchmarks/power_clocks.py --model llama-3.1-8b --pages 128 --cases 16kx1 --seconds 0.3 --rounds 3
run n28-power-fp8 240 python3 benchmarks/power_clocks.py --fp8 --model llama-3.1-8b --pages 16,128 --cases 4kx4,16kx1 --seconds 3 --rounds 2
