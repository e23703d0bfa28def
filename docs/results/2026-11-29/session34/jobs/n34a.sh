#!/usr/bin/env bash
# Session 34, call A: `fp8_qk_rounded` at head dim 256 (Gemma-2-9B heads, no cap) over the served
# FP8 picks and FA3-FP8, both pages; its error; head dim 128's rounded build again (its Q buffer
# now holds one part).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
R=queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded
A=queue+overlap+lazy_max+fp8_qk_rounded
B=one_per_cta+overlap+tma_epilogue+fp8_qk_rounded
C=4kx4,8kx2,16kx1,2k@64k
run n34-r256 300 python3 benchmarks/fp8_ab.py -j 14 --models gemma-2-9b --pages 16,128 --rounds 5 --cases $C --fp8-variants "default $A $B"
run n34-r256-acc 100 python3 benchmarks/fp8_ab.py -j 14 --accuracy --models gemma-2-9b --pages 16,128 --fp8-variants "default $A $B"
run n34-r128 200 python3 benchmarks/fp8_ab.py -j 14 --models llama-3.1-8b --pages 16,128 --rounds 5 --cases $C --fp8-variants "default $R"
