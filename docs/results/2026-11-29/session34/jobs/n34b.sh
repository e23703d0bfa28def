#!/usr/bin/env bash
# Session 34, call B: adoption checks for `fp8_qk_rounded` (head dim 128's R, head dim 256's A
# at page 16 and B at page 128): fuzz seed 100 forced, memcheck / synccheck / racecheck (WRAP on
# 16 CTAs) over the FP8 keys each builds.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
R=queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded
A=queue+overlap+lazy_max+fp8_qk_rounded
B=one_per_cta+overlap+tma_epilogue+fp8_qk_rounded
B2=one_per_cta+overlap+fp8_qk_rounded  # the sanitizer set's page-128 key has 3 heads a group (no TMA epilogue)
run n34-fuzz100 200 env VLLM_FA4_FUZZ_SEED=100 VLLM_FA4_FUZZ_COUNT=300 VLLM_FA4_TEST_VARIANTS="$R $A $B" timeout -s INT 190 python3 -m pytest tests/gpu/test_fuzz.py -m gpu -n 8 -q -p no:cacheprovider
run n34-pre-san 120 sh -c "VLLM_FA4_VARIANT=$R python3 tools/sanitize_served.py --precompile -j 6 --fp8-only --only 'bfloat16 hd128' & VLLM_FA4_VARIANT=$A python3 tools/sanitize_served.py --precompile -j 4 --fp8-only --only 'hd256 p16 12/4' & VLLM_FA4_VARIANT=$B2 python3 tools/sanitize_served.py --precompile -j 4 --fp8-only --only 'hd256 p128 12/4' & wait"
CS="compute-sanitizer --report-api-errors no --error-exitcode 3 --print-limit 20"
for t in memcheck synccheck; do
  run n34-$t-r128 100 env VLLM_FA4_VARIANT=$R $CS --tool $t python3 tools/sanitize_served.py --fp8-only --only 'bfloat16 hd128'
  run n34-$t-r256 100 env VLLM_FA4_VARIANT=$A $CS --tool $t python3 tools/sanitize_served.py --fp8-only --only 'hd256 p16 12/4'
  run n34-$t-r256p128 100 env VLLM_FA4_VARIANT=$B2 $CS --tool $t python3 tools/sanitize_served.py --fp8-only --only 'hd256 p128 12/4'
done
run n34-race-r128 200 env VLLM_FA4_VARIANT=$R $CS --tool racecheck python3 tools/sanitize_served.py --wrap --ctas 16 --fp8-only --only 'bfloat16 hd128 p16 32/8 fp8' &
run n34-race-r256 200 env VLLM_FA4_VARIANT=$A $CS --tool racecheck python3 tools/sanitize_served.py --wrap --ctas 16 --fp8-only --only 'hd256 p16 12/4' &
run n34-race-r256p128 200 env VLLM_FA4_VARIANT=$B2 $CS --tool racecheck python3 tools/sanitize_served.py --wrap --ctas 16 --fp8-only --only 'hd256 p128 12/4' &
wait
