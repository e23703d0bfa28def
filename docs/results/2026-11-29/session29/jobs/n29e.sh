#!/usr/bin/env bash
# Session 29: kv_multicast with a third K/V stage (page 128) and with wide boxes (page 16).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
MC=one_per_cta+pv_wait_mid+lazy_max+kv_multicast
BASE=one_per_cta+pv_wait_mid+lazy_max
run n29-pre3 200 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 128 --configs '$BASE $BASE+kv_stages=3 $MC $MC+kv_stages=3' & python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 16 --configs '$BASE $BASE+wide_box $MC $MC+wide_box $MC+wide_box+kv_stages=3' & wait"
run n29-test-mc2 300 env VLLM_FA4_TEST_VARIANTS="$MC+kv_stages=3 $MC+wide_box" python3 -m pytest tests/gpu/test_kernel.py -m gpu -n 14 -q -x -p no:cacheprovider
run n29-ab-mc-p128 200 python3 benchmarks/variants_ab.py --variants "$BASE $BASE+kv_stages=3 $MC $MC+kv_stages=3" --pages 128 --cases 4kx4,8kx2,16kx1 --rounds 3
run n29-ab-mc-p16 200 python3 benchmarks/variants_ab.py --variants "$BASE $BASE+wide_box $MC $MC+wide_box $MC+wide_box+kv_stages=3" --pages 16 --cases 4kx4,8kx2,16kx1 --rounds 3
