#!/usr/bin/env bash
# Session 27, job g: the windowed head-dim-128 page-128 short pick with the Q-stage TMA store,
# second run; its sanitizers and a fuzz seed with it forced.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
W=queue_with_work+pv_wait_mid+q_tma+v_warp
SAN="python3 tools/sanitize_served.py"
CS="compute-sanitizer --report-api-errors no"
ONLY='hd128 p128 32/8 w4095$'
run n27-w4095-p128 200 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 14 --pages 128 --window-left 4095 --configs '$W $W+tma_epilogue' && python3 benchmarks/variants_ab.py --rounds 7 --model llama-3.1-8b --window-left 4095 --pages 128 --cases 512x32,1kx16,2kx8 --variants '$W $W+tma_epilogue'"
run n27-san-w 200 env VLLM_FA4_VARIANT=$W+tma_epilogue bash -c "$SAN --precompile -j 8 --only '$ONLY' && $SAN --only '$ONLY' && $CS --tool memcheck $SAN --only '$ONLY' && $CS --tool synccheck $SAN --short-only --only '$ONLY' && $CS --tool racecheck $SAN --wrap --ctas 16 --only '$ONLY'"
run n27-fuzz96 150 env VLLM_FA4_FUZZ_SEED=96 VLLM_FA4_TEST_VARIANTS=$W+tma_epilogue python3 -m pytest tests/gpu/test_fuzz.py -q -n 8
