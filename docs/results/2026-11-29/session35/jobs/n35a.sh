#!/usr/bin/env bash
# Session 35, call A: the kernel cache filled for the served mode; the sanitizers over A at page 128
# (session 34 ran A at page 16 only); two candidates to widen VLLM_FA4_FP8_QUERY=e4m3 (predictions in
# docs/perf-notes.md, session 34's "Next": windowed head dim 128 +10 to +18 %, short batches 0 to +8 %).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
R=queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded   # head dim 128's e4m3 long pick
C=4kx4,8kx2,16kx1,2k@64k
run n35-pre 150 sh -c "python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 16 --configs 'default $R' --kv-dtype float8_e4m3fn --lse both & python3 tools/sanitize_served.py --precompile -j 6 --fp8-only --only 'hd256 p128 12/4' & wait"
CS="compute-sanitizer --report-api-errors no --error-exitcode 3 --print-limit 20"
run n35-memcheck-256p128 120 $CS --tool memcheck python3 tools/sanitize_served.py --fp8-only --only 'hd256 p128 12/4'
run n35-race-256p128 150 $CS --tool racecheck python3 tools/sanitize_served.py --wrap --ctas 16 --fp8-only --only 'hd256 p128 12/4'
run n35-e4m3-128w 150 python3 benchmarks/fp8_ab.py -j 14 --models llama-3.1-8b --window-left 4095 --pages 16,128 --rounds 5 --cases $C --fp8-variants "default queue+overlap+fp8_qk_rounded queue+pv_wait_mid+lazy_max+fp8_qk_rounded"
run n35-e4m3-short 150 python3 benchmarks/fp8_ab.py -j 14 --models llama-3.1-8b,gemma-2-9b --pages 16,128 --rounds 5 --cases 512x32,1kx16 --fp8-variants "default queue+pv_wait_mid+tma_epilogue+lazy_max+fp8_qk_rounded queue+overlap+tma_epilogue+fp8_qk_rounded"
