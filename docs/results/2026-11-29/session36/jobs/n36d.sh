#!/usr/bin/env bash
# Session 36, call D: head dim 128's exact window pick -> the unwindowed exact long pick (fp8_qk).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
V=queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk
A=queue+overlap+lazy_max+fp8_qk_rounded
C=4kx4,8kx2,16kx1,2k@64k
CS="compute-sanitizer --report-api-errors no --error-exitcode 3 --print-limit 20"
run n36-memcheck-128w 80 env VLLM_FA4_VARIANT=$V $CS --tool memcheck python3 tools/sanitize_served.py --fp8-only --only 'hd128 .*w4095'
run n36-race-128w 80 env VLLM_FA4_VARIANT=$V $CS --tool racecheck python3 tools/sanitize_served.py --wrap --ctas 16 --fp8-only --only 'hd128 p16 .*w4095'
run n36-fuzz103 150 env VLLM_FA4_FUZZ_SEED=103 VLLM_FA4_FUZZ_COUNT=300 VLLM_FA4_TEST_VARIANTS="$V" timeout -s INT 140 python3 -m pytest tests/gpu/test_fuzz.py -m gpu -n 8 -q -p no:cacheprovider
run n36-fp8-tests 200 python3 -m pytest tests/gpu/test_fp8.py -m gpu -q -p no:cacheprovider -k "not e4m3" -n 4
run n36-e4m3-256w1k-r2 100 python3 benchmarks/fp8_ab.py -j 14 --models gemma-2-9b --window-left 1023 --pages 16,128 --rounds 5 --cases $C --fp8-variants "$A default"
