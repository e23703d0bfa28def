#!/usr/bin/env bash
# Proposed for the next GPU session (written at the end of session 26, not run): the first
# runs of the Q-stage TMA store (docs/perf-notes.md, session 26: predictions written), then on
# an H100 the reads of head dim 256's picks adopted in sessions 25-26. Copy to gpu_runs/ with
# session25/jobs/env.sh; each `run` writes $OUT/NAME-$G-$COMMIT.log (at most 8 files come back a call).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
S128=queue_with_work+pv_wait_mid+q_tma+lazy_max   # head dim 128's short pick without its epilogue
L128=queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead+lazy_max
AB="python3 benchmarks/variants_ab.py"
run n27-pre 300 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 14 --pages 16,128 --configs 'default default+tma_epilogue'; python3 tools/precompile.py --model llama-3.2-1b -j 14 --pages 16 --configs 'default default+tma_epilogue'"
run n27-qtma-short 120 $AB --rounds 7 --model llama-3.1-8b --pages 16,128 --cases 512x32,1kx16 --variants "default $S128+staged_epilogue $S128+tma_epilogue"
run n27-qtma-long 150 $AB --rounds 5 --model llama-3.1-8b --pages 16 --cases 4kx4,16kx1,2k@64k --variants "default default+tma_epilogue"
run n27-qtma-hd64 120 $AB --rounds 7 --model llama-3.2-1b --pages 16 --cases 512x32,1kx16,4kx4 --variants "default default+tma_epilogue"
run n27-qtma-ok 150 env VLLM_FA4_VARIANT=$S128+tma_epilogue python3 tools/sanitize_served.py --only 'hd128 p(16|128) 32/8$'
run n27-qtma-race 150 env VLLM_FA4_VARIANT=$S128+tma_epilogue compute-sanitizer --report-api-errors no --tool racecheck python3 tools/sanitize_served.py --wrap --ctas 16 --only 'hd128 p16 32/8$'
# On an H100 (kind permitting): head dim 256's adopted picks against the ones they replaced.
run n27-h100-hd256 200 $AB --rounds 5 --model gemma-2-9b --pages 16 --cases 4kx4,8kx2,16kx1,2k@64k --variants "default queue+overlap_free+lazy_max+pages_ahead"
