#!/usr/bin/env bash
# Session 25, job e: tma_epilogue on short batches at head dim 256 (the short pick), a second
# read of the uncapped candidate with it, memcheck without the host-API noise.
set -u
source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1
mkdir -p -m 700 "$VLLM_FA4_CACHE_DIR"
CAND=queue+pv_wait_mid+lazy_max+block_n=80+pages_ahead
SAN="python3 tools/sanitize_served.py"
GM="--model gemma-2-9b"
AB="python3 benchmarks/variants_ab.py"
PRE="python3 tools/precompile.py $GM -j 14"
run s25-pre3 300 bash -c "$PRE --pages 16,128 --configs 'default default+tma_epilogue $CAND $CAND+tma_epilogue'; $PRE --pages 16,128 --softcap --configs 'default default+tma_epilogue'; VLLM_FA4_VARIANT=$CAND+tma_epilogue $SAN --precompile -j 14 --only 'hd256 p16 16/8$|hd256 p16 16/8 cap50$'; VLLM_FA4_VARIANT=queue+overlap+tma_epilogue $SAN --precompile -j 14 --only 'hd256 p16 16/8$|hd256 p16 16/8 cap50$'"
run s25-short-p16 100 $AB --rounds 7 $GM --pages 16 --cases 512x32,1kx16,2kx8 --variants "default default+tma_epilogue"
run s25-short-p128 100 $AB --rounds 7 $GM --pages 128 --cases 512x32,1kx16,2kx8 --variants "default default+tma_epilogue"
run s25-short-cap50-p16 100 $AB --rounds 7 $GM --softcap 50 --pages 16 --cases 512x32,1kx16,2kx8 --variants "default default+tma_epilogue"
run s25-ab9b-gemma-p16 150 $AB --rounds 9 $GM --pages 16 --cases 1kx16,4kx4,8kx2,16kx1,2k@64k --variants "default $CAND $CAND+tma_epilogue"
run s25-memcheck2 60 env VLLM_FA4_VARIANT=$CAND+tma_epilogue compute-sanitizer --report-api-errors no --tool memcheck $SAN --only 'hd256 p16 16/8$|hd256 p16 16/8 cap50$'
run s25-memcheck3 60 env VLLM_FA4_VARIANT=queue+overlap+tma_epilogue compute-sanitizer --report-api-errors no --tool memcheck $SAN --only 'hd256 p16 16/8$|hd256 p16 16/8 cap50$'
