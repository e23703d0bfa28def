"""Quick timing: our SM90 paged prefill (one or more compile-time variants) vs vLLM's FA3
on Llama-3.1-8B shapes (Hq 32, Hkv 8, D 128, bf16, causal), in one process.

Run: python tests/gpu/bench_kernel_quick.py [--variants "base pingpong overlap+pingpong"|all]
                                            [--pages 16,128] [--cases 512x32,16kx1] [--rounds 3]
Default variants: $VLLM_FA4_VARIANTS, else the process variant (VLLM_FA4_VARIANT).
Times: median over --rounds interleaved rounds of triton's do_bench median; spread is
(max - min) / median over the rounds. TFLOP/s counts causal FLOPs only.
"""

import argparse
import math
import os
import statistics

import torch
from triton.testing import do_bench
from vllm.vllm_flash_attn import flash_attn_varlen_func

from vllm_fa4.kernels.compile import VARIANT, prefill_forward
from vllm_fa4.kernels.config import KernelKey, parse_variants, tile_shape, tokens_per_tile

HQ, HKV, HD, DT = 32, 8, 128, torch.bfloat16

# name -> (page sizes it runs at, [(q_len, k_len)] * batch)
CASES = {
    "512x32": ((16,), [(512, 512)] * 32),
    "1kx16": ((16,), [(1024, 1024)] * 16),
    "2kx8": ((16,), [(2048, 2048)] * 8),
    "4kx4": ((16,), [(4096, 4096)] * 4),
    "16kx1": ((16, 128), [(16384, 16384)]),
    "2k@4k x8": ((16,), [(2048, 4096 + 2048)] * 8),
    "2k@8k x4": ((128,), [(2048, 8192 + 2048)] * 4),
    "2k@16k x2": ((16,), [(2048, 16384 + 2048)] * 2),
    "16k+31x512": ((16,), [(16384, 16384)] + [(512, 512)] * 31),
}


def work_tiles(specs, qpk):
    _, tile_n = tile_shape(HD)
    tpt = tokens_per_tile(HD, qpk)
    rows = []
    for b, (q_len, k_len) in enumerate(specs):
        for m in range(math.ceil(q_len / tpt)):
            last = min((m + 1) * tpt, q_len) - 1
            cost = math.ceil((k_len - q_len + last + 1) / tile_n)
            rows += [(b, h, m, cost) for h in range(HKV)]
    rows.sort(key=lambda r: -r[3])
    return torch.tensor(rows, dtype=torch.int32, device="cuda")


def run(name, specs, page, variants, rounds=1):
    dev = "cuda"
    pages = [math.ceil(k / page) for _, k in specs]
    nblocks = sum(pages) + 1
    kv = torch.randn(nblocks, page, HKV, 2 * HD, dtype=DT, device=dev)
    k_cache, v_cache = kv[..., :HD], kv[..., HD:]
    perm = torch.randperm(nblocks - 1, device=dev).to(torch.int32) + 1
    pt = torch.zeros(len(specs), max(pages), dtype=torch.int32, device=dev)
    off = 0
    for b, n in enumerate(pages):
        pt[b, :n] = perm[off : off + n]
        off += n
    total_q = sum(q for q, _ in specs)
    q = torch.randn(total_q, HQ, HD, dtype=DT, device=dev)
    cu = torch.tensor(
        [0] + list(torch.tensor([s[0] for s in specs]).cumsum(0)), dtype=torch.int32, device=dev
    )
    seqk = torch.tensor([k for _, k in specs], dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    scale = HD**-0.5
    key = KernelKey("bfloat16", HD, page, HQ // HKV)
    wt = work_tiles(specs, HQ // HKV)
    flops = sum(4 * HQ * HD * sum(k - q_len + j + 1 for j in range(q_len)) for q_len, k in specs)

    def fa3():
        flash_attn_varlen_func(
            q,
            k_cache,
            v_cache,
            max_seqlen_q=max(s[0] for s in specs),
            cu_seqlens_q=cu,
            max_seqlen_k=max(s[1] for s in specs),
            seqused_k=seqk,
            softmax_scale=scale,
            causal=True,
            block_table=pt,
            fa_version=3,
        )

    fns = {"FA3": fa3}
    for v in variants:
        fns[v.name] = lambda v=v: prefill_forward(
            key, q, k_cache, v_cache, out, None, cu, seqk, pt, wt, scale, v
        )
    # Interleave: every round times each contender once, in a rotated order, so clock or power
    # drift over the run hits all of them alike; report the median round.
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            times[n].append(do_bench(fns[n], return_mode="median") * 1e-3)
    med = {n: statistics.median(ts) for n, ts in times.items()}
    label = f"{name} p{page}"
    for i, n in enumerate(names):
        t = med[n]
        spread = (max(times[n]) - min(times[n])) / t if rounds > 1 else 0.0
        ratio = "" if n == "FA3" else f"  ours/FA3 {med['FA3'] / t:.3f}"
        print(
            f"{label if i == 0 else '':>16} | {n:<28} {flops / t / 1e12:6.1f} TFLOP/s "
            f"{t * 1e3:8.3f} ms  spread {spread:5.1%}{ratio}"
        )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=os.environ.get("VLLM_FA4_VARIANTS"))
    ap.add_argument("--pages", default="16,128")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per case")
    args = ap.parse_args()
    variants = parse_variants(args.variants) if args.variants else (VARIANT,)
    variants = list({v.name: v for v in variants}.values())  # each once; rounds repeat them
    pages = {int(p) for p in args.pages.split(",")}
    print(f"device={torch.cuda.get_device_name()} variants={[v.name for v in variants]}")
    for name in args.cases.split(","):
        case_pages, specs = CASES[name]
        for page in case_pages:
            if page in pages:
                run(name, specs, page, variants, args.rounds)


if __name__ == "__main__":
    main()
