#!/usr/bin/env bash
# Session 29: the second run of kv_multicast on the persistent picks (5 rounds, with 2k after
# 64k) and its power view at page 16, run as one command on the warm machine after n29h.sh.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1
L128=queue_with_work+pv_wait_mid+q_tma+v_warp+lazy_max
L16=queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead+lazy_max
run n29-ab-pmc2-p16 150 python3 benchmarks/variants_ab.py --variants "$L16 $L16+kv_multicast+claim_strided" --pages 16 --cases 4kx4,8kx2,16kx1,2k@64k --rounds 5
run n29-ab-pmc2-p128 150 python3 benchmarks/variants_ab.py --variants "$L128 $L128+kv_multicast+claim_strided" --pages 128 --cases 4kx4,8kx2,16kx1,2k@64k --rounds 5
run n29-power-pmc 150 python3 benchmarks/power_clocks.py --variants "$L16 $L16+kv_multicast+claim_strided" --pages 16 --cases 8kx2,16kx1 --seconds 3 --rounds 1 --gemm 0
