#!/usr/bin/env bash
# Session 31, third job: 70B at TP 8 (group 8, one KV head a GPU: the multicast pick) against
# FA3 and FA3c; then served 8B 32k x 24.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n31c-70b-tp8 150 python3 benchmarks/variants_ab.py --variants default --model llama-3.1-70b-tp8 --pages 16,128 --cases 4kx4,8kx2,16kx1,2k@64k --rounds 3
grep -E "ours|FA3" $OUT/n31c-70b-tp8-$G-$COMMIT.log | tail -12
run n31c-serve-8b-32k 420 python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FA4,FLASH_ATTN --cases 32768:24 --budget-s 400 --out $OUT/serving32k
tail -14 $OUT/n31c-serve-8b-32k-$G-$COMMIT.log | head -8
