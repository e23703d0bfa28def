#!/usr/bin/env bash
# Session 33, call 1: precompile the 1B page-128 candidates; ncu of 16kx1 page 128 (ours, paged FA3, FA3c)
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L=queue_with_work+overlap+q_tma+lazy_max+mma_wgs=3   # HD64_LONG, the page-128 long pick
M=queue_with_work+pv_wait_mid+q_tma+lazy_max+mma_wgs=3
run n33-pre 150 python3 tools/precompile.py --model llama-3.2-1b -j 12 --pages 128 --configs "default $L+v_warp $L+pages_ahead+v_warp $M"
NCU="ncu --clock-control base --profile-from-start off -k regex:Sm90PagedPrefill|FlashAttnFwd"
run n33-ncu-1b-16k-p128 200 $NCU --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum python3 benchmarks/profile_case.py --model llama-3.2-1b --case 16kx1 --page 128 --contenders "default $M"
run n33-ncu-src-1b 200 $NCU --section SourceCounters -f -o $OUT/n33-src python3 benchmarks/profile_case.py --model llama-3.2-1b --case 16kx1 --page 128 --contenders default --no-fa3c
ncu -i $OUT/n33-src.ncu-rep --page source --csv --print-source sass > $OUT/n33-src-sass.csv 2> $OUT/n33-src-sass.err; ls -la $OUT
