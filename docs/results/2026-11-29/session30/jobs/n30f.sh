#!/usr/bin/env bash
# Session 30, sixth job: the power view of the served K/V multicast against the previous long
# pick (main at afb8e5e, repository root), pages 16 and 128, 8kx2 and 16kx1.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L128=queue_with_work+pv_wait_mid+q_tma+v_warp+lazy_max
L16=queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead+lazy_max
run n30f-power-p16 100 python3 benchmarks/power_clocks.py --model llama-3.1-8b --variants "$L16 $L16+kv_multicast" --pages 16 --cases 8kx2,16kx1 --rounds 1 --gemm 0
run n30f-power-p128 80 python3 benchmarks/power_clocks.py --model llama-3.1-8b --variants "$L128 $L128+kv_multicast" --pages 128 --cases 8kx2,16kx1 --rounds 1 --gemm 0
