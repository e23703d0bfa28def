#!/usr/bin/env bash
# Session 27, job d: fuzz with each short candidate forced (16-bit Q-stage TMA store; FP8 staged in sQ).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n27-fuzz94 240 env VLLM_FA4_FUZZ_SEED=94 VLLM_FA4_TEST_VARIANTS=queue_with_work+pv_wait_mid+q_tma+tma_epilogue+lazy_max python3 -m pytest tests/gpu/test_fuzz.py -q -n 8
run n27-fuzz95 240 env VLLM_FA4_FUZZ_SEED=95 VLLM_FA4_TEST_VARIANTS=queue+pv_wait_mid+tma_epilogue+lazy_max python3 -m pytest tests/gpu/test_fuzz.py -q -n 8
