#!/usr/bin/env bash
# Proposed for the next GPU session (not run), written at the end of session 36. On main; the
# kit loaded, vllm_fa4.egg-info carried. Predictions: docs/perf-notes.md, session 36's "Next".
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
A=queue+overlap+lazy_max+fp8_qk_rounded
R=queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded
V=queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk
W=queue+overlap+fp8_qk_rounded
C=4kx4,8kx2,16kx1,2k@64k
# 1. (H100 only) issue 30's second GPU: the exact and e4m3 picks against FA3-FP8, head dims 128
#    (with the window: V over the previous `queue+overlap`) and 256 (Gemma 2 capped)
if [ "$G" = h100 ]; then
  run n37-128 200 python3 benchmarks/fp8_ab.py -j 14 --models llama-3.1-8b --pages 16,128 --rounds 5 --cases $C --fp8-variants "default $R"
  run n37-128w 200 python3 benchmarks/fp8_ab.py -j 14 --models llama-3.1-8b --window-left 4095 --pages 16,128 --rounds 5 --cases $C --fp8-variants "default queue+overlap $W"
  run n37-256cap 200 python3 benchmarks/fp8_ab.py -j 14 --models gemma-2-9b --softcap 50 --pages 16,128 --rounds 5 --cases $C --fp8-variants "default $A"
fi
# 2. (any GPU, one pair a call, ~450 s with the engines' first start) Gemma-2-9B served on the FP8
#    cache at 7936-token prompts (the config runs to 8192 positions): the e4m3 mode in the other
#    order (session 36, FA4 first: 1.085x), then the exact mode
run n37-serve-gemma-e4m3-r2 470 env VLLM_FA4_FP8_QUERY=e4m3 python3 benchmarks/serving.py throughput --model configs/gemma-2-9b --backends FLASH_ATTN,FA4 --cases 7936:48 --extra-args=--kv-cache-dtype=fp8 --budget-s 440 --out $OUT/serve-gemma-e4m3-r2
# next call: run n37-serve-gemma-exact 470 python3 benchmarks/serving.py throughput --model configs/gemma-2-9b --backends FA4,FLASH_ATTN --cases 7936:48 --extra-args=--kv-cache-dtype=fp8 --budget-s 440 --out $OUT/serve-gemma-exact
