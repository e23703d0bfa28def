#!/usr/bin/env bash
# Session 29: where kv_multicast's extra cycles go (ncu, 16kx1 and 4kx4 at page 128 and 16kx1 at 16).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
MC=one_per_cta+pv_wait_mid+lazy_max+kv_multicast
BASE=one_per_cta+pv_wait_mid+lazy_max
run n29-pre2 200 python3 tools/precompile.py --model llama-3.1-8b -j 12 --pages 16,128 --configs "$BASE $MC"
NCU="ncu --clock-control none --profile-from-start off -k regex:Sm90PagedPrefill --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --metrics sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,launch__cluster_dim_x,launch__occupancy_cluster_pct,lts__t_bytes.sum,l1tex__m_xbar2l1tex_read_bytes.sum"
run n29-ncu-mc-16k 200 $NCU python3 benchmarks/profile_case.py --page 128 --case 16kx1 --contenders "$BASE $MC" --no-fa3c
run n29-ncu-mc-16k-p16 200 $NCU python3 benchmarks/profile_case.py --page 16 --case 16kx1 --contenders "$BASE $MC" --no-fa3c
run n29-ab-mc-r2 250 python3 benchmarks/variants_ab.py --variants "$BASE $MC" --pages 128 --cases 4kx4,8kx2,16kx1 --rounds 5
