#!/usr/bin/env bash
# Session 31, first job: served Llama-3.1-8B (dummy weights), 64k x 10 prompts, CUDA graphs on,
# FA4 (kv_multicast served since session 30) against FLASH_ATTN, from the repository root.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
python3 -c "import vllm_fa4, sys; print('plugin from', vllm_fa4.__file__)"
python3 -c "from importlib.metadata import entry_points as e; print([x for x in e(group='vllm.general_plugins')])"
run n31a-serve-8b-64k 580 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FA4,FLASH_ATTN --cases 65536:10 --budget-s 560 --out $OUT/serving64k
tail -14 $OUT/n31a-serve-8b-64k-$G-$COMMIT.log | head -8
