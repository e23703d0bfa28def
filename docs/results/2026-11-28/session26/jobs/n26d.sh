#!/usr/bin/env bash
# Session 26, job d: tma_epilogue on the page-128 long picks with the cap (FP8 and 16-bit)
# and the 16-bit uncapped third run.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L128=one_per_cta+pv_wait_mid+lazy_max
FP8AB="python3 benchmarks/fp8_ab.py --models gemma-2-9b --pages 128 --cases 4kx4,8kx2,16kx1,2k@64k --rounds 5 -j 14 --fp8-variants"
AB="python3 benchmarks/variants_ab.py --rounds 5 --model gemma-2-9b --pages 128 --cases 4kx4,8kx2,16kx1,2k@64k --variants"
run s26-fp8-p128-cap50 150 $FP8AB "one_per_cta+overlap one_per_cta+overlap+tma_epilogue" --softcap 50
run s26-fp8-p128-w4095-cap50 150 $FP8AB "one_per_cta+overlap one_per_cta+overlap+tma_epilogue" --softcap 50 --window-left 4095
run s26-pre-d 150 bash -c "python3 tools/precompile.py --model gemma-2-9b -j 14 --pages 128 --configs '$L128 $L128+tma_epilogue'; python3 tools/precompile.py --model gemma-2-9b -j 14 --pages 128 --softcap --configs '$L128 $L128+tma_epilogue'"
run s26-ab-p128-r3 100 $AB "$L128 $L128+tma_epilogue"
run s26-ab-p128-cap50-r3 100 $AB "$L128 $L128+tma_epilogue" --softcap 50
