#!/usr/bin/env bash
# Session 30, fifth job: served Llama-3.1-8B (dummy weights), 64k prompts, CUDA graphs on, the
# tree with kv_multicast served (gpu_runs/kvmc) against FLASH_ATTN.
set -u; source gpu_runs/env.sh
cd gpu_runs/kvmc; COMMIT=$(cat COMMIT)
export PYTHONPATH=$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n30e-serve-8b-64k 570 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FA4,FLASH_ATTN --cases 65536:10 --budget-s 550 --out $OUT/serving
tail -8 $OUT/n30e-serve-8b-64k-$G-$COMMIT.log
