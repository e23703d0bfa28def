#!/usr/bin/env bash
# Session 27, job c: second runs of the short picks with the TMA store (16-bit Q-stage form, FP8
# staged in sQ); the windowed head-dim-128 rows with it; sanitizers on the FP8 candidate.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
AB="python3 benchmarks/variants_ab.py"
F8S=queue+pv_wait_mid+staged_epilogue+lazy_max
F8T=queue+pv_wait_mid+tma_epilogue+lazy_max
SAN="python3 tools/sanitize_served.py"
CS="compute-sanitizer --report-api-errors no"
run n27-qtma-short-r2 150 $AB --rounds 7 --model llama-3.1-8b --pages 16,128 --cases 512x32,1kx16,2kx8 --variants "default default+tma_epilogue"
run n27-fp8-short-r2 150 python3 benchmarks/fp8_ab.py --rounds 5 -j 14 --models llama-3.1-8b --pages 16,128 --cases 512x32,1kx16,2kx8 --fp8-variants "$F8S $F8T"
run n27-w4095 200 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 14 --pages 16,128 --window-left 4095 --configs 'default default+tma_epilogue' && $AB --rounds 5 --model llama-3.1-8b --window-left 4095 --pages 16,128 --cases 512x32,1kx16,4kx4,16kx1 --variants 'default default+tma_epilogue'"
run n27-fp8-w4095 150 python3 benchmarks/fp8_ab.py --rounds 5 -j 14 --models llama-3.1-8b --window-left 4095 --pages 16,128 --cases 512x32,1kx16,4kx4,16kx1 --fp8-variants "queue+overlap queue+overlap+tma_epilogue"
run n27-san-fp8 200 env VLLM_FA4_VARIANT=$F8T bash -c "$SAN --precompile -j 14 --fp8-only --only 'hd128 p(16|128) 32/8' && $SAN --fp8-only --only 'hd128 p(16|128) 32/8' && $CS --tool memcheck $SAN --fp8-only --only 'hd128 p(16|128) 32/8' && $CS --tool synccheck $SAN --short-only --fp8-only --only 'hd128 p(16|128) 32/8' && $CS --tool racecheck $SAN --wrap --ctas 16 --fp8-only --only 'hd128 p16 32/8'"
