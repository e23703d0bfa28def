#!/usr/bin/env bash
# Session 25, job b: rounds 9 of the uncapped candidate with and without tma_epilogue; the
# capped key with it; sanitizers on the candidate with tma_epilogue.
set -u
source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1
CAND=queue+pv_wait_mid+lazy_max+block_n=80+pages_ahead
SAN="python3 tools/sanitize_served.py"
GM="--model gemma-2-9b"
run s25-pre2 200 bash -c "python3 tools/precompile.py $GM --pages 16 --softcap 50 --configs 'default default+tma_epilogue' -j 14; VLLM_FA4_VARIANT=$CAND+tma_epilogue $SAN --precompile -j 14 --only 'hd256 p16'"
run s25-ab9-gemma-p16 240 python3 benchmarks/variants_ab.py --rounds 9 $GM --pages 16 --cases 1kx16,4kx4,8kx2,16kx1,2k@64k --variants "default $CAND $CAND+tma_epilogue"
run s25-ab-gemma-cap50-p16 120 python3 benchmarks/variants_ab.py --rounds 5 $GM --softcap 50 --pages 16 --cases 1kx16,4kx4,8kx2,16kx1 --variants "default default+tma_epilogue"
run s25-ok-cand-tma 60 env VLLM_FA4_VARIANT=$CAND+tma_epilogue $SAN --only 'hd256 p16'
