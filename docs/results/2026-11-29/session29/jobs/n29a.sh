#!/usr/bin/env bash
# Session 29: the price of a K/V byte by TMA, plain and with a two-CTA cluster's multicast.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n29-tma-energy 150 python3 benchmarks/tma_energy.py --seconds 3
run n29-tma-energy-r2 150 python3 benchmarks/tma_energy.py --seconds 3
run n29-tma-energy-s2 150 python3 benchmarks/tma_energy.py --seconds 3 --stages 2
run n29-tma-energy-hbm 150 python3 benchmarks/tma_energy.py --seconds 3 --mib 4096 --tiles 400
run n29-byte-energy 120 python3 benchmarks/byte_energy.py --seconds 3
