#!/usr/bin/env bash
# Session 29, last diagnostic (branch only): where the persistent multicast's cycles go.
# Prediction (written before the run): at a locked clock, L16+kv_multicast+claim_strided takes
# 3-5 % more SM cycles than L16+kv_split_heads+claim_strided at 16kx1 page 16, and the extra
# shows in the consumers' waits on the K/V stages (the top stall sources are the mbarrier
# try_wait loops), not in issued instructions (+2 % or less).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L16=queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead+lazy_max
run n29-pre6 120 python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 16 --configs "$L16+kv_split_heads+claim_strided $L16+kv_multicast+claim_strided"
run n29-ncu-pmc 240 ncu --clock-control base --profile-from-start off -k regex:Sm90PagedPrefill --section WarpStateStats --section SourceCounters --metrics sm__cycles_active.avg,smsp__inst_executed.sum,lts__t_bytes.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,gpu__time_duration.sum python3 benchmarks/profile_case.py --page 16 --case 16kx1 --contenders "$L16+kv_split_heads+claim_strided $L16+kv_multicast+claim_strided" --no-fa3c
