#!/usr/bin/env bash
# Session 28, job b: session 27's leftovers (the 4k window below page 128 with the TMA store;
# ncu on the capped head-dim-256 page-128 key's 8kx2 with and without it).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L128=one_per_cta+pv_wait_mid+lazy_max
run n28-pre-b 200 python3 tools/precompile.py --model gemma-2-9b -j 14 --pages 16,128 --configs default
run n28-w4095-p16 200 python3 benchmarks/variants_ab.py --rounds 7 --model llama-3.1-8b --window-left 4095 --pages 16 --cases 512x32,1kx16,2kx8 --variants "default default+tma_epilogue"
run n28-ncu-cap50 330 ncu --clock-control none --profile-from-start off -k regex:Sm90PagedPrefill --section SpeedOfLight --section WarpStateStats --section LaunchStats --metrics sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg python3 benchmarks/profile_case.py --model gemma-2-9b --softcap 50 --page 128 --case 8kx2 --contenders "$L128 $L128+tma_epilogue" --no-fa3c
