#!/usr/bin/env bash
# Proposed for the next GPU session (not run): what session 34 left of issue 30 and the
# VLLM_FA4_FP8_QUERY=e4m3 mode. From the repository root, vllm_fa4.egg-info carried, the
# kit loaded; about 25 device minutes. Run it on an H100 too if one is lent (issue 30 asks for
# both GPUs: every number of session 34 is an H200's).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
R=queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded   # head dim 128's e4m3 long pick
A=queue+overlap+lazy_max+fp8_qk_rounded                       # head dim 256's, both page classes
C=4kx4,8kx2,16kx1,2k@64k
# 1. The kernels against FA3-FP8 (on an H100: issue 30's second GPU)
run n35-e4m3-128 200 python3 benchmarks/fp8_ab.py -j 14 --models llama-3.1-8b --pages 16,128 --rounds 5 --cases $C --fp8-variants "default $R"
run n35-e4m3-256 200 python3 benchmarks/fp8_ab.py -j 14 --models gemma-2-9b --pages 16,128 --rounds 5 --cases $C --fp8-variants "default $A"
# 2. The mode itself served (not R forced on every batch: short batches keep their pick),
#    the kernel cache filled with the mode's picks first (warmup compiles them otherwise)
run n35-pre 120 python3 tools/precompile.py --model llama-3.1-8b -j 14 --pages 16 --configs "default $R" --kv-dtype float8_e4m3fn --lse both
run n35-serve-e4m3-64k 480 env VLLM_FA4_FP8_QUERY=e4m3 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FA4,FLASH_ATTN --cases 65536:10 --extra-args=--kv-cache-dtype=fp8 --budget-s 470 --out $OUT/serve-e4m3-64k
run n35-serve-e4m3-32k 480 env VLLM_FA4_FP8_QUERY=e4m3 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FLASH_ATTN,FA4 --cases 32768:24 --extra-args=--kv-cache-dtype=fp8 --budget-s 470 --out $OUT/serve-e4m3-32k
# 3. The sanitizers over A at page 128 (session 34 ran A at page 16 only), by the tool's own
#    set (launchable_configs: the e4m3 picks included), head dim 256 uncapped
CS="compute-sanitizer --report-api-errors no --error-exitcode 3 --print-limit 20"
run n35-memcheck-256 120 $CS --tool memcheck python3 tools/sanitize_served.py --fp8-only --only 'hd256 p128 12/4'
run n35-racecheck-256 200 $CS --tool racecheck python3 tools/sanitize_served.py --wrap --ctas 16 --fp8-only --only 'hd256 p128 12/4'
# 4. Candidates to widen the mode (predictions to write in docs/perf-notes.md first): head dim
#    128's windowed rows with Q rounded, and the short batches' pick with it
run n35-e4m3-128w 200 python3 benchmarks/fp8_ab.py -j 14 --models llama-3.1-8b --window-left 4095 --pages 16,128 --rounds 5 --cases $C --fp8-variants "default queue+overlap+fp8_qk_rounded queue+pv_wait_mid+lazy_max+fp8_qk_rounded"
run n35-e4m3-short 200 python3 benchmarks/fp8_ab.py -j 14 --models llama-3.1-8b,gemma-2-9b --pages 16,128 --rounds 5 --cases 512x32,1kx16 --fp8-variants "default queue+pv_wait_mid+tma_epilogue+lazy_max+fp8_qk_rounded queue+overlap+tma_epilogue+fp8_qk_rounded"
