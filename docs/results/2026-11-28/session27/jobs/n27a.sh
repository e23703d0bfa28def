#!/usr/bin/env bash
# Session 27, job a: the Q-stage TMA store's first runs (head dim 128, Llama-3.1-8B heads).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
AB="python3 benchmarks/variants_ab.py"
run n27-pre 240 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 14 --pages 16,128 --configs 'default default+tma_epilogue' & python3 tools/precompile.py --model llama-3.2-1b -j 6 --pages 16,128 --configs 'default default+tma_epilogue' & wait"
run n27-qtma-short 150 $AB --rounds 7 --model llama-3.1-8b --pages 16,128 --cases 512x32,1kx16,2kx8 --variants "default default+tma_epilogue"
run n27-qtma-long 150 $AB --rounds 5 --model llama-3.1-8b --pages 16,128 --cases 4kx4,16kx1,2k@64k --variants "default default+tma_epilogue"
