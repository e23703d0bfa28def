#!/usr/bin/env bash
# Session 30, third job: the tree with kv_multicast served (wip/kv-multicast, gpu_runs/kvmc):
# the GPU tests over every key's serving picks, the scheduler's exactly-once test.
set -u; source gpu_runs/env.sh
cd gpu_runs/kvmc; COMMIT=$(cat COMMIT)
export PYTHONPATH=$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n30c-pre 150 python3 tools/sanitize_served.py --precompile -j 14
tail -2 $OUT/n30c-pre-$G-$COMMIT.log
run n30c-kernel 170 python3 -m pytest tests/gpu/test_kernel.py tests/gpu/test_cache_layouts.py tests/gpu/test_model_features.py -m gpu -n 14 -q -p no:cacheprovider
tail -2 $OUT/n30c-kernel-$G-$COMMIT.log
run n30c-sched 120 python3 -m pytest tests/gpu/test_tile_scheduler.py -m gpu -n 14 -q -p no:cacheprovider
tail -2 $OUT/n30c-sched-$G-$COMMIT.log
run n30c-fuzz 130 env VLLM_FA4_FUZZ_SEED=99 VLLM_FA4_FUZZ_COUNT=200 python3 -m pytest tests/gpu/test_fuzz.py -m gpu -n 14 -q -p no:cacheprovider
tail -2 $OUT/n30c-fuzz-$G-$COMMIT.log
