#!/usr/bin/env bash
# Session 28, job h: the energy of a byte from L2 and from HBM (benchmarks/byte_energy.py).
set -u; source gpu_runs/env.sh
export PYTHONUNBUFFERED=1
run n28-byte-energy 120 python3 benchmarks/byte_energy.py --seconds 3
