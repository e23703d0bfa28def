#!/usr/bin/env bash
# Session 27, job b: head dim 64 with the Q-stage TMA store; the FP8 head-dim-128 short pick
# with the TMA store (staged in sQ, Q by cp.async); sanitizers on the head-dim-128 candidate.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
AB="python3 benchmarks/variants_ab.py"
S128=queue_with_work+pv_wait_mid+q_tma+tma_epilogue+lazy_max
F8S=queue+pv_wait_mid+staged_epilogue+lazy_max
F8T=queue+pv_wait_mid+tma_epilogue+lazy_max
run n27-qtma-hd64 120 $AB --rounds 7 --model llama-3.2-1b --pages 16,128 --cases 512x32,1kx16,4kx4 --variants "default default+tma_epilogue"
run n27-fp8-short 180 python3 benchmarks/fp8_ab.py --rounds 5 -j 14 --models llama-3.1-8b --pages 16,128 --cases 512x32,1kx16,2kx8 --fp8-variants "$F8S $F8T"
run n27-qtma-ok 120 env VLLM_FA4_VARIANT=$S128 python3 tools/sanitize_served.py --only 'hd128 p(16|128) 32/8$'
run n27-qtma-race 150 env VLLM_FA4_VARIANT=$S128 compute-sanitizer --report-api-errors no --tool racecheck python3 tools/sanitize_served.py --wrap --ctas 16 --only 'bfloat16 hd128 p16 32/8$'
