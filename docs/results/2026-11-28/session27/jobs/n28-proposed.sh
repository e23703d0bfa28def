#!/usr/bin/env bash
# Proposed for the next GPU session (written at the end of session 27, not run). First, on an
# H100 (kind permitting; sessions 25-27 had H200s only), the picks adopted since session 24
# against the ones they replaced; then session 26's item 2 under ncu (the probe cannot time one
# tile per CTA). Copy to gpu_runs/ with session25/jobs/env.sh; each `run` writes
# $OUT/NAME-$G-$COMMIT.log (at most 8 files come back a call).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
AB="python3 benchmarks/variants_ab.py"
L128=one_per_cta+pv_wait_mid+lazy_max
run n28-pre 300 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 14 --pages 16,128 --configs 'default default+staged_epilogue'; python3 tools/precompile.py --model gemma-2-9b -j 14 --pages 16,128 --configs 'default queue+overlap_free+lazy_max+pages_ahead $L128'"
# head dim 128's short picks (session 27) against the staged row stores they replaced
run n28-h100-hd128-short 150 $AB --rounds 7 --model llama-3.1-8b --pages 16,128 --cases 512x32,1kx16,2kx8 --variants "default default+staged_epilogue"
run n28-h100-fp8-short 150 python3 benchmarks/fp8_ab.py --rounds 5 -j 14 --models llama-3.1-8b --pages 16,128 --cases 512x32,1kx16,2kx8 --fp8-variants "queue+pv_wait_mid+staged_epilogue+lazy_max queue+pv_wait_mid+tma_epilogue+lazy_max"
# head dim 256's long picks (sessions 25-26): page 16 uncapped, page 128 uncapped
run n28-h100-hd256-p16 200 $AB --rounds 5 --model gemma-2-9b --pages 16 --cases 4kx4,8kx2,16kx1,2k@64k --variants "default queue+overlap_free+lazy_max+pages_ahead"
run n28-h100-hd256-p128 200 $AB --rounds 5 --model gemma-2-9b --pages 128 --cases 4kx4,8kx2,16kx1,2k@64k --variants "default $L128"
run n28-h100-fp8-p128 200 python3 benchmarks/fp8_ab.py --rounds 5 -j 14 --models gemma-2-9b --pages 128 --cases 4kx4,8kx2,16kx1,2k@64k --fp8-variants "one_per_cta+overlap one_per_cta+overlap+tma_epilogue"
# session 26's item 2: the capped page-128 key's 8kx2 with and without the TMA store, ncu
run n28-ncu-cap50 300 ncu --clock-control none --profile-from-start off -k regex:Sm90PagedPrefill --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis_Tables python3 benchmarks/profile_case.py --model gemma-2-9b --softcap 50 --page 128 --case 8kx2 --contenders "$L128 $L128+tma_epilogue" --no-fa3c
