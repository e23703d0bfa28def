#!/usr/bin/env bash
# Session 30, fourth job: the served kv_multicast tree (gpu_runs/kvmc): backend against
# FLASH_ATTN, memcheck / synccheck over head dim 128's served set, the picks against the old.
set -u; source gpu_runs/env.sh
cd gpu_runs/kvmc; COMMIT=$(cat COMMIT)
export PYTHONPATH=$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L128=queue_with_work+pv_wait_mid+q_tma+v_warp+lazy_max
L16=queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead+lazy_max
run n30d-backend 120 python3 -m pytest tests/gpu/test_backend_gpu.py tests/gpu/test_accuracy_tail.py -m gpu -q -p no:cacheprovider
tail -2 $OUT/n30d-backend-$G-$COMMIT.log
run n30d-memcheck 100 compute-sanitizer --tool memcheck python3 tools/sanitize_served.py --no-fp8 --only 'hd128'
tail -3 $OUT/n30d-memcheck-$G-$COMMIT.log
run n30d-synccheck 80 compute-sanitizer --tool synccheck python3 tools/sanitize_served.py --no-fp8 --only 'hd128'
tail -3 $OUT/n30d-synccheck-$G-$COMMIT.log
run n30d-ab-p16 100 python3 benchmarks/variants_ab.py --variants "default $L16" --pages 16 --cases "4kx4,8kx2,16kx1,16k@48k,512x32" --rounds 3
run n30d-ab-p128 90 python3 benchmarks/variants_ab.py --variants "default $L128" --pages 128 --cases "4kx4,8kx2,16kx1,2k@64k,512x32" --rounds 3
