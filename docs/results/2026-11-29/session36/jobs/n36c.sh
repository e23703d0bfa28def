#!/usr/bin/env bash
# Session 36, call C (branch: FP8_E4M3_Q_LONG gains head dim 256's capped and windowed rows).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
A=queue+overlap+lazy_max+fp8_qk_rounded
C=4kx4,8kx2,16kx1,2k@64k
run n36-mode-test 240 python3 -m pytest tests/gpu/test_fp8.py -m gpu -q -p no:cacheprovider -k e4m3 -rs
run n36-e4m3-256w1k 120 python3 benchmarks/fp8_ab.py -j 14 --models gemma-2-9b --window-left 1023 --pages 16,128 --rounds 5 --cases $C --fp8-variants "default $A"
run n36-cap-256-r2 120 python3 benchmarks/fp8_ab.py -j 14 --models gemma-2-9b --softcap 50 --pages 16,128 --rounds 5 --cases $C --fp8-variants "$A default"
run n36-exact-128w-r2 120 python3 benchmarks/fp8_ab.py -j 14 --models llama-3.1-8b --window-left 4095 --pages 16,128 --rounds 5 --cases $C --fp8-variants "queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk default"
