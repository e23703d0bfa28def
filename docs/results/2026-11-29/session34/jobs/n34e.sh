#!/usr/bin/env bash
# Session 34, call E: VLLM_FA4_FP8_QUERY=e4m3 end to end through the backend (tests/gpu/test_fp8.py).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
R=queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded
A=queue+overlap+lazy_max+fp8_qk_rounded
run n34-pre-mode 90 sh -c "python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 16 --configs 'default $R' --kv-dtype float8_e4m3fn --lse both & python3 tools/precompile.py --model gemma-2-9b -j 8 --pages 16 --configs 'default $A' --kv-dtype float8_e4m3fn --lse both & wait"
run n34-mode-test 120 python3 -m pytest tests/gpu/test_fp8.py -m gpu -k e4m3 -q -p no:cacheprovider
