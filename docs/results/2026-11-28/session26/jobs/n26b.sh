#!/usr/bin/env bash
# Session 26, job b: CAND+tma_epilogue over the page-16 long pick (second run, 9 rounds); the
# FP8 cache's page-128 long pick with tma_epilogue; sanitizers on the GQA-group-3 shapes and
# on the page-128 long pick with tma_epilogue; fuzz seed 92 (the harness's OOM retries).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
CAND=queue+pv_wait_mid+lazy_max+block_n=80+pages_ahead+tma_epilogue
L128=one_per_cta+pv_wait_mid+lazy_max+tma_epilogue
GM="--model gemma-2-9b"
SAN="python3 tools/sanitize_served.py"
CS="compute-sanitizer --report-api-errors no"
run s26-ab9-cand 240 bash -c "python3 tools/precompile.py $GM -j 14 --pages 16 --configs 'default $CAND' && python3 benchmarks/variants_ab.py --rounds 9 $GM --pages 16 --cases 4kx4,8kx2,16kx1,2k@64k --variants 'default $CAND'"
run s26-fp8-p128 200 python3 benchmarks/fp8_ab.py --models gemma-2-9b --pages 128 --cases 4kx4,8kx2,16kx1,2k@64k --rounds 5 -j 14 --fp8-variants "one_per_cta+overlap one_per_cta+overlap+tma_epilogue"
run s26-san-g3 200 bash -c "$SAN --precompile -j 14 --only 'hd256 p16 12/4' && $SAN --only 'hd256 p16 12/4' && $CS --tool memcheck $SAN --only 'hd256 p16 12/4' && $CS --tool synccheck $SAN --short-only --only 'hd256 p16 12/4'"
run s26-race-g3 150 $CS --tool racecheck $SAN --wrap --ctas 16 --only 'hd256 p16 12/4'
run s26-san-l128 150 bash -c "export VLLM_FA4_VARIANT=$L128; $SAN --precompile -j 14 --only 'hd256 p128' && $SAN --only 'hd256 p128' && $CS --tool memcheck $SAN --only 'hd256 p128' && $CS --tool synccheck $SAN --short-only --only 'hd256 p128' && $CS --tool racecheck $SAN --wrap --ctas 16 --only 'hd256 p128 16/8 cap50\$'"
run s26-fuzz92 200 env VLLM_FA4_FUZZ_SEED=92 python3 -m pytest tests/gpu/test_fuzz.py -q -n 8
