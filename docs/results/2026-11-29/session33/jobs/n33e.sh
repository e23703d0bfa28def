#!/usr/bin/env bash
# Session 33, call E: the P V wait after the row maxima (`pv_wait_early`, FA3's order) over the
# served picks, head dims 64 and 128, pages 16 and 128; then ncu's source page, ours beside FA3.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n33-pre-early 200 sh -c 'python3 tools/precompile.py --model llama-3.2-1b -j 14 --pages 16,128 --configs "default default+pv_wait_early" && python3 tools/precompile.py --model llama-3.1-8b -j 14 --pages 16,128 --configs "default default+pv_wait_early"'
C=4kx4,8kx2,16kx1,2k@64k,1kx16
run n33-early-1b 200 python3 benchmarks/variants_ab.py --rounds 5 --model llama-3.2-1b --pages 16,128 --cases $C --variants "default default+pv_wait_early"
run n33-early-8b 200 python3 benchmarks/variants_ab.py --rounds 5 --model llama-3.1-8b --pages 16,128 --cases $C --variants "default default+pv_wait_early"
run n33-early-1b-r2 200 python3 benchmarks/variants_ab.py --rounds 5 --model llama-3.2-1b --pages 16,128 --cases $C --variants "default+pv_wait_early default"
NCU="ncu --clock-control base --profile-from-start off -k regex:Sm90PagedPrefill|device_kernel"
run n33-ncu-src-early 150 $NCU --section SourceCounters --section SpeedOfLight --section WarpStateStats -f -o $OUT/n33-src2 python3 benchmarks/profile_case.py --model llama-3.2-1b --case 16kx1 --page 128 --contenders "default+pv_wait_early" --no-fa3c
ncu -i $OUT/n33-src2.ncu-rep --page source --csv --print-source sass > $OUT/n33-src2-sass.csv 2>&1
ncu -i $OUT/n33-src2.ncu-rep > $OUT/n33-src2-details.txt 2>&1; rm -f $OUT/n33-src2.ncu-rep; ls -la $OUT
