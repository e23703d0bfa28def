#!/usr/bin/env bash
# Session 29: per-tile times (STAMP_TIMES probe) of kv_split_heads and kv_multicast, page 128.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
MC=one_per_cta+pv_wait_mid+lazy_max+kv_multicast
SPLIT=one_per_cta+pv_wait_mid+lazy_max+kv_split_heads
run n29-tiles-mc 400 python3 benchmarks/tile_times.py --model llama-3.1-8b --pages 128 --cases 4kx4,16kx1 --variants "$SPLIT $MC" --launches 5
