#!/usr/bin/env bash
# Proposed for the next session (not run): head dim 64's page-128 long cases, below paged FA3
# on session 32's H200 (Llama-3.2-1B 16kx1 0.981x, 2k after 64k 0.998x). Prediction in
# docs/perf-notes.md, session 32 ("Next"). From the repository root, vllm_fa4.egg-info carried.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L=queue_with_work+overlap+q_tma+lazy_max+mma_wgs=3   # HD64_LONG, the page-128 long pick
run n33-pre 150 python3 tools/precompile.py --model llama-3.2-1b -j 12 --pages 128 --configs "default $L+v_warp $L+pages_ahead+v_warp queue_with_work+pv_wait_mid+q_tma+lazy_max+mma_wgs=3"
# Where the page-128 long kernel's time goes, ours beside paged FA3 and FA3c (one launch each)
NCU="ncu --clock-control base --profile-from-start off -k regex:Sm90PagedPrefill|FlashAttnFwd --section SpeedOfLight --section WarpStateStats --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum"
run n33-ncu-1b-16k-p128 240 $NCU python3 benchmarks/profile_case.py --model llama-3.2-1b --case 16kx1 --page 128 --contenders default
# The candidates, two runs, contenders swapped in the second
run n33-ab-1b-p128 200 python3 benchmarks/variants_ab.py --rounds 5 --model llama-3.2-1b --pages 128 --cases 4kx4,8kx2,16kx1,2k@64k --variants "default $L+v_warp $L+pages_ahead+v_warp queue_with_work+pv_wait_mid+q_tma+lazy_max+mma_wgs=3"
run n33-ab-1b-p128-r2 200 python3 benchmarks/variants_ab.py --rounds 5 --model llama-3.2-1b --pages 128 --cases 4kx4,8kx2,16kx1,2k@64k --variants "$L+pages_ahead+v_warp $L+v_warp queue_with_work+pv_wait_mid+q_tma+lazy_max+mma_wgs=3 default"
