#!/usr/bin/env bash
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
MC=one_per_cta+pv_wait_mid+lazy_max+kv_multicast
BASE=one_per_cta+pv_wait_mid+lazy_max
# Session 29: kv_multicast against the same config without it and the served pick
# (Llama-3.1-8B heads), then the power view at page 128.
run n29-ab-mc 330 python3 benchmarks/variants_ab.py --variants "default $BASE $MC" --pages 16,128 --cases 4kx4,8kx2,16kx1 --rounds 3
run n29-power-mc 250 python3 benchmarks/power_clocks.py --variants "$BASE $MC" --pages 128 --cases 4kx4,16kx1 --seconds 3 --rounds 1 --gemm 0
