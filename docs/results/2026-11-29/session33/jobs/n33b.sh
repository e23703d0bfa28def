#!/usr/bin/env bash
# Session 33, call 2: head dim 64 page-128 candidates, two runs, contenders swapped in the second
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L=queue_with_work+overlap+q_tma+lazy_max+mma_wgs=3
M=queue_with_work+pv_wait_mid+q_tma+lazy_max+mma_wgs=3
run n33-ab-1b-p128 280 python3 benchmarks/variants_ab.py --rounds 5 --model llama-3.2-1b --pages 128 --cases 4kx4,8kx2,16kx1,2k@64k --variants "default $L+v_warp $L+pages_ahead+v_warp $M"
run n33-ab-1b-p128-r2 280 python3 benchmarks/variants_ab.py --rounds 5 --model llama-3.2-1b --pages 128 --cases 4kx4,8kx2,16kx1,2k@64k --variants "$L+pages_ahead+v_warp $L+v_warp $M default"
