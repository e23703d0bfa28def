#!/usr/bin/env bash
# Session 26, job a: the GQA-group fallback at head dim 256 (ce79faf), fuzz seed 91's two
# out-of-memory batches replayed alone, head dim 256's page-128 long pick with tma_epilogue
# (second runs: no cap, cap 50, the 4k window with cap 50).
set -u; source gpu_runs/env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > "$OUT/gpu-$G.txt"
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L128=one_per_cta+pv_wait_mid+lazy_max
GM="--model gemma-2-9b"
PRE="python3 tools/precompile.py $GM -j 14 --pages 128 --configs '$L128 $L128+tma_epilogue'"
run s26-pre 300 bash -c "$PRE; $PRE --softcap; $PRE --softcap --window-left 4095"
run s26-gqa-256 150 python3 -m pytest tests/gpu/test_kernel.py -q -n 4 -k "gqa and 256"
RP="env VLLM_FA4_TEST_VARIANTS=queue+overlap+tma_epilogue python3 -m pytest tests/gpu/test_fuzz.py -q -x"
run s26-replay1 120 env VLLM_FA4_FUZZ_REPLAY="$(cat gpu_runs/replay1.json)" $RP
run s26-replay2 120 env VLLM_FA4_FUZZ_REPLAY="$(cat gpu_runs/replay2.json)" $RP
AB="python3 benchmarks/variants_ab.py --rounds 5 $GM --pages 128 --cases 4kx4,8kx2,16kx1,2k@64k --variants"
run s26-ab-p128 120 $AB "$L128 $L128+tma_epilogue"
run s26-ab-p128-cap50 120 $AB "$L128 $L128+tma_epilogue" --softcap 50
run s26-ab-p128-w4095-cap50 120 $AB "$L128 $L128+tma_epilogue" --softcap 50 --window-left 4095
