#!/usr/bin/env bash
# Session 25, job c: the probe on the candidates; ncu's source page on the epilogue (no cap, 4kx4).
set -u
source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1
CAND=queue+pv_wait_mid+lazy_max+block_n=80+pages_ahead
GM="--model gemma-2-9b"
TT="python3 benchmarks/tile_times.py"
run s25-tt-cand 60 $TT $GM --pages 16 --cases 1kx16,4kx4,16kx1 --variants "$CAND $CAND+tma_epilogue"
run s25-tt-cap50 60 $TT $GM --softcap 50 --pages 16 --cases 1kx16,4kx4,16kx1 --variants "default default+tma_epilogue"
run s25-ncu 300 ncu --clock-control none --profile-from-start off -k regex:Sm90PagedPrefill --section SourceCounters --section WarpStateStats --section SpeedOfLight -o $OUT/ncu-epi -f python3 benchmarks/profile_case.py $GM --case 4kx4 --page 16 --contenders "default default+tma_epilogue" --no-fa3c
ncu -i $OUT/ncu-epi.ncu-rep --page source --csv --print-source sass 2>/dev/null | xz -1 > $OUT/ncu-epi-source-$G-$COMMIT.csv.xz
ncu -i $OUT/ncu-epi.ncu-rep 2>/dev/null | xz -1 > $OUT/ncu-epi-details-$G-$COMMIT.txt.xz
rm -f $OUT/ncu-epi.ncu-rep
