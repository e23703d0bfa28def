#!/usr/bin/env bash
# Session 25, job g (the short pick adopted): second reads of the rows measured once, the FP8
# cache at pages 16 and 128, fuzz with the short pick forced, the GPU kernel tests at head dim 256.
set -u
source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1
mkdir -p -m 700 "$VLLM_FA4_CACHE_DIR"
GM="--model gemma-2-9b"
AB="python3 benchmarks/variants_ab.py --rounds 7 $GM --cases 512x32,1kx16"
PRE="python3 tools/precompile.py $GM -j 14 --pages 16,128 --configs"
run s25-pre5 200 bash -c "$PRE 'default queue+overlap' --softcap; $PRE 'default queue+overlap' --softcap --window-left 4095"
run s25-short3-cap50-p128 70 $AB --softcap 50 --pages 128 --variants "default queue+overlap"
run s25-short3-w4095-cap50-p16 70 $AB --softcap 50 --window-left 4095 --pages 16 --variants "default queue+overlap"
run s25-short2-fp8 120 python3 benchmarks/fp8_ab.py --models gemma-2-9b --pages 16,128 --cases 512x32,1kx16 --rounds 5 --fp8-variants "queue+overlap queue+overlap+tma_epilogue"
run s25-fuzz91 170 env VLLM_FA4_FUZZ_SEED=91 VLLM_FA4_TEST_VARIANTS=queue+overlap+tma_epilogue python3 -m pytest tests/gpu/test_fuzz.py -q -n 8
run s25-gpu-tests-256 200 python3 -m pytest tests/gpu/test_kernel.py tests/gpu/test_model_features.py -q -n 8 -k 256
