#!/usr/bin/env bash
# Session 25, job a: O by TMA stores (`tma_epilogue`) at head dim 256: compile, correctness
# against the fp32 reference (sanitize_served.py without the sanitizer), A/B, the probe.
set -u
source gpu_runs/env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > "$OUT/gpu-$G.txt"
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1
mkdir -p -m 700 "$VLLM_FA4_CACHE_DIR"
TMA16=queue+overlap_free+lazy_max+pages_ahead+tma_epilogue
TMA128=one_per_cta+pv_wait_mid+lazy_max+tma_epilogue
TMAG=queue+overlap+lazy_max+tma_epilogue
CAND=queue+pv_wait_mid+lazy_max+block_n=80+pages_ahead
SAN="python3 tools/sanitize_served.py"
GM="--model gemma-2-9b"
run s25-pre 270 bash -c "python3 tools/precompile.py $GM --pages 16 --configs 'default default+tma_epilogue $CAND $CAND+tma_epilogue' -j 14 && python3 tools/precompile.py $GM --pages 128 --configs 'default default+tma_epilogue' -j 14 && VLLM_FA4_VARIANT=$TMA16 $SAN --precompile -j 14 --only 'hd256 p16' && VLLM_FA4_VARIANT=$TMA128 $SAN --precompile -j 14 --only 'hd256 p128' && VLLM_FA4_VARIANT=$TMAG $SAN --precompile -j 14 --only 'hd128 p16 32/8$|hd64 p16'"
run s25-ab-gemma-p16 150 python3 benchmarks/variants_ab.py --rounds 5 $GM --pages 16 --cases 1kx16,4kx4,8kx2,16kx1 --variants "default default+tma_epilogue $CAND $CAND+tma_epilogue"
run s25-ok-tma16 120 env VLLM_FA4_VARIANT=$TMA16 $SAN --only 'hd256 p16'
run s25-ab-gemma-p128 90 python3 benchmarks/variants_ab.py --rounds 5 $GM --pages 128 --cases 1kx16,4kx4,8kx2,16kx1 --variants "default default+tma_epilogue"
run s25-ok-tma128 60 env VLLM_FA4_VARIANT=$TMA128 $SAN --only 'hd256 p128'
run s25-ok-tmag 80 env VLLM_FA4_VARIANT=$TMAG $SAN --only 'hd128 p16 32/8$|hd64 p16'
run s25-tt-gemma 50 python3 benchmarks/tile_times.py $GM --pages 16 --cases 1kx16,4kx4,16kx1 --variants "default default+tma_epilogue"
