#!/usr/bin/env bash
# Session 29: kv_multicast on the served persistent picks with strided claims (Llama-3.1-8B heads).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L128=queue_with_work+pv_wait_mid+q_tma+v_warp+lazy_max
L16=queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead+lazy_max
run n29-pre5 120 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 128 --configs '$L128 $L128+claim_strided $L128+kv_split_heads+claim_strided $L128+kv_multicast+claim_strided' & python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 16 --configs '$L16 $L16+claim_strided $L16+kv_split_heads+claim_strided $L16+kv_multicast+claim_strided' & wait"
run n29-test-pmc 240 env VLLM_FA4_TEST_VARIANTS="$L128+kv_multicast+claim_strided $L16+kv_multicast+claim_strided" python3 -m pytest tests/gpu/test_kernel.py -m gpu -n 14 -q -x -p no:cacheprovider
run n29-ab-pmc-p128 150 python3 benchmarks/variants_ab.py --variants "$L128 $L128+claim_strided $L128+kv_split_heads+claim_strided $L128+kv_multicast+claim_strided" --pages 128 --cases 4kx4,8kx2,16kx1 --rounds 3
run n29-ab-pmc-p16 150 python3 benchmarks/variants_ab.py --variants "$L16 $L16+claim_strided $L16+kv_split_heads+claim_strided $L16+kv_multicast+claim_strided" --pages 16 --cases 4kx4,8kx2,16kx1 --rounds 3
