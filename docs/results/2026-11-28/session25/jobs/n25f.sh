#!/usr/bin/env bash
# Session 25, job f: second read of tma_epilogue on head dim 256's short pick (with cap, window,
# page 128, FP8 cache); correctness and sanitizers of queue+overlap+tma_epilogue on every
# head-dim-256 shape.
set -u
source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1
mkdir -p -m 700 "$VLLM_FA4_CACHE_DIR"
SHORT=queue+overlap+tma_epilogue
SAN="python3 tools/sanitize_served.py"
GM="--model gemma-2-9b"
AB="python3 benchmarks/variants_ab.py --rounds 7 $GM --cases 512x32,1kx16"
PRE="python3 tools/precompile.py $GM -j 14 --pages 16,128 --configs"
run s25-pre4 300 bash -c "$PRE 'default default+tma_epilogue'; $PRE 'default default+tma_epilogue' --softcap; $PRE 'default default+tma_epilogue' --softcap --window-left 4095; VLLM_FA4_VARIANT=$SHORT $SAN --precompile -j 14 --only 'hd256'"
run s25-short2-p16 80 $AB --pages 16 --variants "default default+tma_epilogue"
run s25-short2-p128 80 $AB --pages 128 --variants "default default+tma_epilogue"
run s25-short2-cap50-p16 80 $AB --softcap 50 --pages 16 --variants "default default+tma_epilogue"
run s25-short2-cap50-p128 80 $AB --softcap 50 --pages 128 --variants "default default+tma_epilogue"
run s25-short2-w4095-cap50-p16 80 $AB --softcap 50 --window-left 4095 --pages 16 --variants "default default+tma_epilogue"
run s25-short-fp8-p16 120 python3 benchmarks/fp8_ab.py --models gemma-2-9b --pages 16 --cases 512x32,1kx16 --rounds 5 --fp8-variants "queue+overlap queue+overlap+tma_epilogue"
run s25-ok-short 120 env VLLM_FA4_VARIANT=$SHORT $SAN --only 'hd256'
run s25-racecheck-short 150 env VLLM_FA4_VARIANT=$SHORT compute-sanitizer --tool racecheck $SAN --wrap --ctas 16 --only 'hd256 p16 16/8$|hd256 p16 16/8 cap50 fp8'
run s25-synccheck-short 60 env VLLM_FA4_VARIANT=$SHORT compute-sanitizer --tool synccheck $SAN --short-only --only 'hd256'
run s25-memcheck-short 90 env VLLM_FA4_VARIANT=$SHORT compute-sanitizer --report-api-errors no --tool memcheck $SAN --only 'hd256'
