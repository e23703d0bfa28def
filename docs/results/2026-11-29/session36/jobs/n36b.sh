#!/usr/bin/env bash
# Session 36, call B (branch wip/e4m3-softcap; uncapped kernels identical to main's): speed and error.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
A=queue+overlap+lazy_max+fp8_qk_rounded
C=4kx4,8kx2,16kx1,2k@64k
run n36-cap-256 150 python3 benchmarks/fp8_ab.py -j 14 --models gemma-2-9b --softcap 50 --pages 16,128 --rounds 5 --cases $C --fp8-variants "default $A"
run n36-cap-256w 150 python3 benchmarks/fp8_ab.py -j 14 --models gemma-2-9b --softcap 50 --window-left 4095 --pages 16,128 --rounds 5 --cases $C --fp8-variants "default $A"
run n36-cap-acc 100 python3 benchmarks/fp8_ab.py -j 14 --accuracy --models gemma-2-9b --softcap 50 --pages 16,128 --fp8-variants "default $A"
run n36-exact-128w 150 python3 benchmarks/fp8_ab.py -j 14 --models llama-3.1-8b --window-left 4095 --pages 16,128 --rounds 5 --cases $C --fp8-variants "default queue+overlap+fp8_qk queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk"
