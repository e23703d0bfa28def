#!/usr/bin/env bash
# Session 36, call A (branch wip/e4m3-softcap): correctness first for fp8_qk_rounded with a soft cap.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
A=queue+overlap+lazy_max+fp8_qk_rounded
R=queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded
run n36-kfp8 200 env VLLM_FA4_TEST_VARIANTS="$A $R" python3 -m pytest tests/gpu/test_kernel_fp8.py -m gpu -q -p no:cacheprovider -n 14
run n36-fuzz102 200 env VLLM_FA4_FUZZ_SEED=102 VLLM_FA4_FUZZ_COUNT=300 VLLM_FA4_TEST_VARIANTS="$A $R" timeout -s INT 190 python3 -m pytest tests/gpu/test_fuzz.py -m gpu -n 8 -q -p no:cacheprovider
CS="compute-sanitizer --report-api-errors no --error-exitcode 3 --print-limit 20"
run n36-memcheck-cap 100 env VLLM_FA4_VARIANT=$A $CS --tool memcheck python3 tools/sanitize_served.py --fp8-only --only 'hd256 .*cap50'
run n36-race-cap 90 env VLLM_FA4_VARIANT=$A $CS --tool racecheck python3 tools/sanitize_served.py --wrap --ctas 16 --fp8-only --only 'hd256 p16 .*cap50'
