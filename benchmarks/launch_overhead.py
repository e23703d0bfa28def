"""Host-side cost of one prefill attention call: planning (once per step) and launch (per layer).

Host time is what the CPU spends before the GPU is asked to run; it adds up over 32-80 layers
per step and shows for short prefills. Measured as wall time of back-to-back calls without a
sync (the launch queue never fills at these counts), next to vLLM's FA3 call on the same input.

    python3 benchmarks/launch_overhead.py            # on the GPU machine
"""

from __future__ import annotations

import argparse
import time

import torch


def per_call_us(fn, calls: int) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    batches = {
        "1 x 16-token prefill": [(16, 16)],
        "8 x 128 tokens": [(128, 128)] * 8,
        "16k prefill": [(16384, 16384)],
        "500 tiny prefills": [(3, 40)] * 500,
    }
    print(
        f"{'batch':<22} {'plan_prefill':>13} {'run_prefill':>12} {'prefill_forward':>16} "
        f"{'FA3 call':>9}   (host microseconds per call)"
    )
    for name, specs in batches.items():
        plan_us, run_us, direct_us, fa3_us = measure(specs, args.calls)
        print(f"{name:<22} {plan_us:13.1f} {run_us:12.1f} {direct_us:16.1f} {fa3_us:9.1f}")


def measure(specs, calls: int) -> tuple[float, float, float, float]:
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    from vllm_fa4.kernels.launch import prefill_forward
    from vllm_fa4.paged_prefill import run_prefill
    from vllm_fa4.testing.cases import make_paged_case

    case = make_paged_case(specs, 32, 8, 128, 16, torch.bfloat16, "cuda", seed=1)

    plan = case.plan

    p = plan()
    out = torch.empty_like(case.q)

    def run():
        run_prefill(p, case.q, case.k_cache, case.v_cache, out, softmax_scale=case.softmax_scale)

    def direct():
        prefill_forward(
            p.key,
            p.config,
            case.q,
            case.k_cache,
            case.v_cache,
            out,
            None,
            p.args,
            case.softmax_scale,
        )

    def fa3():
        flash_attn_varlen_func(
            case.q,
            case.k_cache,
            case.v_cache,
            max_seqlen_q=p.max_seqlen_q,
            cu_seqlens_q=case.cu_seqlens_q,
            max_seqlen_k=p.max_seqlen_k,
            seqused_k=case.seqused_k,
            block_table=case.page_table,
            softmax_scale=case.softmax_scale,
            causal=True,
            fa_version=3,
            out=out,
        )

    return tuple(per_call_us(fn, calls) for fn in (plan, run, direct, fa3))


if __name__ == "__main__":
    main()
