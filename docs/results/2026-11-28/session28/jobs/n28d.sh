#!/usr/bin/env bash
# Session 28, job d: the capped page-128 key's TMA store in the power view (ncu's single launch put it
# 2.7 % ahead at 8kx2 where the A/Bs had it -3.1 / -0.6 %); head dim 64's energy a FLOP (the third
# point of the head-dim model).
set -u; source gpu_runs/env.sh
export VLLM_FA4_CACHE_DIR=/tmp/fa4-kernels PYTHONUNBUFFERED=1; mkdir -p -m 700 $VLLM_FA4_CACHE_DIR
L128=one_per_cta+pv_wait_mid+lazy_max
run n28-pre-d 200 python3 tools/precompile.py --model llama-3.2-1b -j 14 --pages 16,128 --configs default
run n28-power-cap50 200 python3 benchmarks/power_clocks.py --model gemma-2-9b --softcap 50 --pages 128 --cases 8kx2,4kx4 --variants "$L128 $L128+tma_epilogue" --gemm 0 --seconds 3 --rounds 2
run n28-power-1b 200 python3 benchmarks/power_clocks.py --model llama-3.2-1b --pages 16,128 --cases 16kx1 --seconds 3 --rounds 2
run n28-power-fp8-gemma 240 python3 benchmarks/power_clocks.py --fp8 --model gemma-2-9b --pages 16 --cases 4kx4,16kx1 --gemm 0 --seconds 3 --rounds 2
# the GEMM as do_bench times it (variants_ab.py's timer): where does a 796 TFLOP/s ceiling come from?
run n28-gemm-dobench 120 python3 -c "
import torch
from triton.testing import do_bench
for n in (4096, 8192, 16384):
    a = torch.randn(n, n, dtype=torch.bfloat16, device='cuda'); b = torch.randn_like(a); c = torch.empty_like(a)
    for rep in (20, 100, 1000):
        ms = do_bench(lambda: torch.mm(a, b, out=c), rep=rep, return_mode='median')
        print(f'bf16 GEMM {n}^3 do_bench rep={rep} ms: {ms:.3f} ms {2*n**3/ms/1e9:.1f} TFLOP/s', flush=True)
"
