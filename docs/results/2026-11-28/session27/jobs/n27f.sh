#!/usr/bin/env bash
# Session 27, job f: GPU tests at head dim 128 with the served picks; the probe's phases for the
# capped page-128 key's 8kx2 with the TMA store, and for the FP8 window's loss with it.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L128=one_per_cta+pv_wait_mid+lazy_max
run n27-tt-cap50 150 python3 benchmarks/tile_times.py --model gemma-2-9b --pages 128 --softcap 50 --cases 4kx4,8kx2 --variants "$L128 $L128+tma_epilogue"
run n27-tt-fp8w 120 python3 benchmarks/tile_times.py --fp8 --model llama-3.1-8b --pages 16 --window-left 4095 --cases 512x32,4kx4 --variants "queue+overlap queue+overlap+tma_epilogue"
run n27-gpu-tests-128 240 python3 -m pytest tests/gpu/test_kernel.py tests/gpu/test_kernel_fp8.py -q -n 8 -k 128
