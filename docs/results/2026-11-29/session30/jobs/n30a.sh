#!/usr/bin/env bash
# Session 30: kv_multicast with claim_cluster (rank 0's atomic handed to rank 1 by st.async) on
# the served persistent picks, against the served pick and claim_strided (Llama-3.1-8B heads).
# Runs the branch's tree (gpu_runs/kvmc, wip/kv-multicast at a1b746d).
set -u; source gpu_runs/env.sh
cd gpu_runs/kvmc; COMMIT=$(cat COMMIT)
export PYTHONPATH=$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L128=queue_with_work+pv_wait_mid+q_tma+v_warp+lazy_max
L16=queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead+lazy_max
run n30-pre 150 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 128 --configs '$L128 $L128+kv_multicast+claim_strided $L128+kv_multicast+claim_cluster' & python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 16 --configs '$L16 $L16+kv_multicast+claim_strided $L16+kv_multicast+claim_cluster' & wait"
run n30-smoke 90 env VLLM_FA4_TEST_VARIANTS="$L16+kv_multicast+claim_cluster" python3 -m pytest tests/gpu/test_kernel.py -m gpu -q -x -p no:cacheprovider -k "test_big_batch or test_long_context_64k"
tail -3 $OUT/n30-smoke-$G-$COMMIT.log
run n30-test-cc 240 env VLLM_FA4_TEST_VARIANTS="$L128+kv_multicast+claim_cluster $L16+kv_multicast+claim_cluster" python3 -m pytest tests/gpu/test_kernel.py -m gpu -n 14 -q -x -p no:cacheprovider
tail -2 $OUT/n30-test-cc-$G-$COMMIT.log
for r in 1 2; do
run n30-ab-cc-p16-r$r 200 python3 benchmarks/variants_ab.py --variants "$L16 $L16+kv_multicast+claim_strided $L16+kv_multicast+claim_cluster" --pages 16 --cases "4kx4,8kx2,16kx1,16k@48k" --rounds 3
run n30-ab-cc-p128-r$r 200 python3 benchmarks/variants_ab.py --variants "$L128 $L128+kv_multicast+claim_strided $L128+kv_multicast+claim_cluster" --pages 128 --cases 4kx4,8kx2,16kx1 --rounds 3
done
