#!/usr/bin/env bash
# Session 27, job e: the new short picks as served (8B 16-bit and FP8), sanitizers on the new
# served set (Qwen2.5-7B's group of 7 included).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
SAN="python3 tools/sanitize_served.py"
CS="compute-sanitizer --report-api-errors no"
ONLY='hd128 p(16|128) (32/8|28/4)'
run n27-pre-e 200 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 14 --pages 16,128 --configs default & $SAN --precompile -j 8 --only '$ONLY' & wait"
run n27-served-8b 200 python3 benchmarks/variants_ab.py --rounds 5 --model llama-3.1-8b --pages 16,128 --cases 512x32,1kx16,2kx8,4kx4,8kx2,16kx1,2k@64k --variants default
run n27-served-fp8 200 python3 benchmarks/fp8_ab.py --rounds 5 -j 14 --models llama-3.1-8b --pages 16,128 --cases 512x32,1kx16,2kx8,4kx4,16kx1,2k@64k
run n27-san-e 240 bash -c "$SAN --only '$ONLY' && $CS --tool memcheck $SAN --only '$ONLY' && $CS --tool synccheck $SAN --short-only --only '$ONLY' && $CS --tool racecheck $SAN --wrap --ctas 16 --only 'hd128 p16 28/4'"
