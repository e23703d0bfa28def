#!/usr/bin/env bash
# Session 33, call F: Q rounded once to e4m3 (`fp8_qk_rounded`) against the served FP8 long pick
# (`fp8_qk`) and FA3-FP8, Llama-3.1-8B heads; then the error rule (--accuracy).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
R=queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded
run n33-pre-rounded 120 python3 tools/precompile.py --model llama-3.1-8b -j 14 --pages 16,128 --configs "default $R" --kv-dtype float8_e4m3fn
run n33-rounded-ab 200 python3 benchmarks/fp8_ab.py --models llama-3.1-8b --pages 16,128 --rounds 5 --cases 4kx4,8kx2,16kx1,2k@64k --fp8-variants "default $R"
run n33-rounded-acc 150 python3 benchmarks/fp8_ab.py --accuracy --models llama-3.1-8b --pages 16,128 --fp8-variants "default $R"
