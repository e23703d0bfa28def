#!/usr/bin/env bash
# Session 35, call C: head dim 128's windowed FP8 rows with Q rounded (W = the exact window pick +
# fp8_qk_rounded): the A/B again with the order swapped, fuzz seed 101 with W forced, memcheck and
# racecheck with W forced on the windowed head-dim-128 FP8 shapes.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
W=queue+overlap+fp8_qk_rounded
C=4kx4,8kx2,16kx1,2k@64k
run n35-e4m3-128w-r2 150 python3 benchmarks/fp8_ab.py -j 14 --models llama-3.1-8b --window-left 4095 --pages 16,128 --rounds 5 --cases $C --fp8-variants "queue+pv_wait_mid+lazy_max+fp8_qk_rounded $W default"
run n35-pre-san 100 env VLLM_FA4_VARIANT=$W python3 tools/sanitize_served.py --precompile -j 8 --fp8-only --only 'bfloat16 hd128.*w'
run n35-fuzz101 200 env VLLM_FA4_FUZZ_SEED=101 VLLM_FA4_FUZZ_COUNT=300 VLLM_FA4_TEST_VARIANTS="$W" timeout -s INT 190 python3 -m pytest tests/gpu/test_fuzz.py -m gpu -n 8 -q -p no:cacheprovider
CS="compute-sanitizer --report-api-errors no --error-exitcode 3 --print-limit 20"
run n35-memcheck-w128 100 env VLLM_FA4_VARIANT=$W $CS --tool memcheck python3 tools/sanitize_served.py --fp8-only --only 'bfloat16 hd128.*w'
run n35-race-w128 150 env VLLM_FA4_VARIANT=$W $CS --tool racecheck python3 tools/sanitize_served.py --wrap --ctas 16 --fp8-only --only 'bfloat16 hd128 p16.*w'
