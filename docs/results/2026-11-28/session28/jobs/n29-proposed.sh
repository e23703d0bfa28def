#!/usr/bin/env bash
# Proposed for the next GPU session (written at the end of session 28, not run). On an H100 if one
# is lent (none in sessions 25-28): the power view of session 28 on that GPU, then the byte prices,
# then session 27's proposed H100 reads (n28-proposed.sh in session27/jobs/). Copy to gpu_runs/
# with session25/jobs/env.sh; each `run` writes $OUT/NAME-$G-$COMMIT.log.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n29-pre 240 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 16,128 --configs default & python3 tools/precompile.py --model gemma-2-9b -j 6 --pages 16,128 --configs default & wait"
# is the H100 capped on long cases too, and do ours and FA3c spend the same energy a FLOP there?
run n29-power-8b 330 python3 benchmarks/power_clocks.py --model llama-3.1-8b --pages 16,128 --cases 4kx4,8kx2,16kx1 --seconds 3 --rounds 2
run n29-power-gemma 200 python3 benchmarks/power_clocks.py --model gemma-2-9b --pages 16,128 --cases 4kx4,16kx1 --seconds 3 --rounds 2
run n29-power-fp8 240 python3 benchmarks/power_clocks.py --fp8 --model llama-3.1-8b --pages 16,128 --cases 4kx4,16kx1 --seconds 3 --rounds 2
# a byte's price from L1 / L2 / HBM on that GPU (session 28's H200: L2 at most 44 pJ over idle)
run n29-byte-energy 120 python3 benchmarks/byte_energy.py --seconds 3
