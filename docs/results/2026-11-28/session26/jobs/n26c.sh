#!/usr/bin/env bash
# Session 26, job c (the uncapped page-16 long pick adopted, 5f4a488): fuzz seed 93 with it
# forced, the GPU kernel tests at head dim 256, the sanitizers on the uncapped page-16/32
# shapes, the FP8 page-128 long pick with tma_epilogue (second run), the uncapped 4k window's
# long pick against the capped one's with and without the TMA store, the row as served.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
BN80=queue+pv_wait_mid+lazy_max+block_n=80+pages_ahead
GM="--model gemma-2-9b"
SAN="python3 tools/sanitize_served.py"
CS="compute-sanitizer --report-api-errors no"
ONLY='hd256 p(16|32) 16/8$'
run s26-w4095-p16 200 bash -c "python3 tools/precompile.py $GM -j 14 --pages 16 --window-left 4095 --configs 'default $BN80 $BN80+tma_epilogue' && python3 benchmarks/variants_ab.py --rounds 7 $GM --window-left 4095 --pages 16 --cases 4kx4,8kx2,16kx1,2k@64k --variants 'default $BN80 $BN80+tma_epilogue'"
run s26-served-p16 150 bash -c "python3 tools/precompile.py $GM -j 14 --pages 16 --configs default && python3 benchmarks/variants_ab.py --rounds 5 $GM --pages 16 --cases 512x32,1kx16,4kx4,8kx2,16kx1,2k@64k --variants default"
run s26-san-bn80 200 bash -c "$SAN --precompile -j 14 --only '$ONLY' && $SAN --only '$ONLY' && $CS --tool memcheck $SAN --only '$ONLY' && $CS --tool synccheck $SAN --short-only --only '$ONLY' && $CS --tool racecheck $SAN --wrap --ctas 16 --only 'hd256 p16 16/8$'"
run s26-fp8-p128-b 150 python3 benchmarks/fp8_ab.py --models gemma-2-9b --pages 128 --cases 4kx4,8kx2,16kx1,2k@64k --rounds 5 -j 14 --fp8-variants "one_per_cta+overlap one_per_cta+overlap+tma_epilogue"
run s26-gpu-tests-256 200 python3 -m pytest tests/gpu/test_kernel.py tests/gpu/test_model_features.py -q -n 8 -k 256
run s26-fuzz93 200 env VLLM_FA4_FUZZ_SEED=93 VLLM_FA4_TEST_VARIANTS=$BN80+tma_epilogue python3 -m pytest tests/gpu/test_fuzz.py -q -n 8
