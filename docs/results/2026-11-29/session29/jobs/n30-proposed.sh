#!/usr/bin/env bash
# Proposed for the next GPU session (written at the end of session 29, not run). On an H100 if
# one is lent (none in sessions 25-29): first session 28's proposed power view
# (session28/jobs/n29-proposed.sh), then the byte's price by TMA on that GPU, then, from branch
# wip/kv-multicast (354ea2a: `git checkout wip/kv-multicast` before sending the tree), the
# multicast on the persistent served picks. Copy to gpu_runs/ with session25/jobs/env.sh.
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
run n30-tma-energy 150 python3 benchmarks/tma_energy.py --seconds 3
L128=queue_with_work+pv_wait_mid+q_tma+v_warp+lazy_max
L16=queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead+lazy_max
if grep -q claim_strided vllm_fa4/kernels/config.py; then  # the branch's tree was sent
  run n30-pre 150 bash -c "python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 128 --configs '$L128 $L128+kv_multicast+claim_strided' & python3 tools/precompile.py --model llama-3.1-8b -j 8 --pages 16 --configs '$L16 $L16+kv_multicast+claim_strided' & wait"
  run n30-ab-pmc-p16 200 python3 benchmarks/variants_ab.py --variants "$L16 $L16+kv_multicast+claim_strided" --pages 16 --cases 4kx4,8kx2,16kx1,2k@64k --rounds 5
  run n30-ab-pmc-p128 200 python3 benchmarks/variants_ab.py --variants "$L128 $L128+kv_multicast+claim_strided" --pages 128 --cases 4kx4,8kx2,16kx1,2k@64k --rounds 5
  run n30-power-pmc 200 python3 benchmarks/power_clocks.py --variants "$L16 $L16+kv_multicast+claim_strided" --pages 16 --cases 8kx2,16kx1 --seconds 3 --rounds 2 --gemm 0
fi
