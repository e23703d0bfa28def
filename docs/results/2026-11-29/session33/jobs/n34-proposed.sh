#!/usr/bin/env bash
# Proposed for the next GPU session (not run): what making `fp8_qk_rounded` the FP8 cache's
# head-dim-128 long pick would need (docs/perf-notes.md, session 33). From the repository root,
# vllm_fa4.egg-info carried; about 15 device minutes.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
R=queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded
run n34-pre 150 python3 tools/precompile.py --model llama-3.1-8b -j 14 --pages 16,128 --configs "default $R" --kv-dtype float8_e4m3fn --lse both
# The fuzz suite with it forced (its prefill level reads the rounded Q, testing.cases.q_as_read_by)
run n34-fuzz100 300 env VLLM_FA4_FUZZ_SEED=100 VLLM_FA4_FUZZ_COUNT=200 VLLM_FA4_TEST_VARIANTS=$R python3 -m pytest tests/gpu/test_fuzz.py -m gpu -n 14 -q -p no:cacheprovider
# Sanitizers over the FP8 head-dim-128 keys, ring wraps on 16 CTAs for racecheck
CS="compute-sanitizer --report-api-errors no"
run n34-memcheck 200 env VLLM_FA4_VARIANT=$R $CS --tool memcheck python3 tools/sanitize_served.py --fp8-only --only 'hd128'
run n34-synccheck 200 env VLLM_FA4_VARIANT=$R $CS --tool synccheck python3 tools/sanitize_served.py --fp8-only --only 'hd128'
run n34-racecheck 300 env VLLM_FA4_VARIANT=$R $CS --tool racecheck python3 tools/sanitize_served.py --wrap --ctas 16 --fp8-only --only 'hd128'
# Served, FP8 cache, every batch on it (VLLM_FA4_VARIANT), against the served picks and FLASH_ATTN
run n34-serve-fp8-64k 590 env VLLM_FA4_VARIANT=$R python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b --backends FA4,FLASH_ATTN --cases 65536:10 --extra-args=--kv-cache-dtype=fp8 --budget-s 580 --out $OUT/rounded-64k
# Head dim 256 (apply docs/results/2026-11-29/session33/jobs/fp8_qk_rounded-hd256.diff first;
# the prediction is in docs/perf-notes.md, session 33), then head dim 128 again with it:
# run n34-rounded-256 300 python3 benchmarks/fp8_ab.py --models gemma-2-9b --pages 16,128 --rounds 5 --cases 4kx4,8kx2,16kx1,2k@64k --fp8-variants "default queue+overlap+lazy_max+fp8_qk_rounded one_per_cta+overlap+fp8_qk_rounded"
# run n34-rounded-128 200 python3 benchmarks/fp8_ab.py --models llama-3.1-8b --pages 16,128 --rounds 5 --cases 4kx4,8kx2,16kx1,2k@64k --fp8-variants "default $R"
