#!/usr/bin/env bash
# Session 28, job f: variants_ab.py --clocks, its first run (8B heads, 4kx4 and 16kx1 at page 128).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n28-pre-f 120 python3 tools/precompile.py --model llama-3.1-8b -j 14 --pages 128 --configs default
run n28-ab-clocks 150 python3 benchmarks/variants_ab.py --clocks --rounds 3 --model llama-3.1-8b --pages 128 --cases 4kx4,16kx1 --variants default
