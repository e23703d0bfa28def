#!/usr/bin/env bash
# Session 29: the multicast's tile shape alone (kv_split_heads), page 128, and where the cycles go (ncu stalls).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
MC=one_per_cta+pv_wait_mid+lazy_max+kv_multicast
BASE=one_per_cta+pv_wait_mid+lazy_max
SPLIT=$BASE+kv_split_heads
run n29-pre4 200 python3 tools/precompile.py --model llama-3.1-8b -j 12 --pages 128 --configs "default default+kv_split_heads $BASE $SPLIT $MC"
run n29-test-split 200 env VLLM_FA4_TEST_VARIANTS="$SPLIT queue_with_work+pv_wait_mid+q_tma+v_warp+lazy_max+kv_split_heads" python3 -m pytest tests/gpu/test_kernel.py -m gpu -n 14 -q -x -p no:cacheprovider
run n29-ab-split 200 python3 benchmarks/variants_ab.py --variants "default default+kv_split_heads $BASE $SPLIT $MC" --pages 128 --cases 4kx4,8kx2,16kx1 --rounds 3
NCU="ncu --clock-control base --profile-from-start off -k regex:Sm90PagedPrefill --metrics sm__cycles_active.avg,smsp__cycles_active.avg,smsp__inst_executed.sum,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum"
run n29-ncu-split 200 $NCU python3 benchmarks/profile_case.py --page 128 --case 16kx1 --contenders "$BASE $SPLIT $MC" --no-fa3c
