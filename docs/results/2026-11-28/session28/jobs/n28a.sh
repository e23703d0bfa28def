#!/usr/bin/env bash
# Session 28, job a: compile what the session times, then clocks and power beside FA3c (issue 32).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L128=one_per_cta+pv_wait_mid+lazy_max
run n28-pre 300 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 6 --pages 16,128 --configs 'default' & python3 tools/precompile.py --model llama-3.1-8b -j 4 --pages 16 --window-left 4095 --configs 'default default+tma_epilogue' & python3 tools/precompile.py --model gemma-2-9b -j 4 --pages 128 --softcap 50 --configs '$L128 $L128+tma_epilogue' & wait"
run n28-power-8b 330 python3 benchmarks/power_clocks.py --model llama-3.1-8b --pages 16,128 --cases 4kx4,8kx2,16kx1 --seconds 3 --rounds 2
