#!/usr/bin/env python3
"""Issue 27's accuracy tail: ours and FA3 against an fp64 reference on the four reported
batches, for kernel builds that differ in the lazy-max margin (softmax.LAZY_MAX_MARGIN_LOG2,
baked in at trace time) and in config flags; then the same builds timed against FA3 and
FA3-contiguous on long Llama-8B batches, interleaved in one process.

    python tools/lazy_margin_probe.py --margins 8,0 --seeds 5 [--time]

Each build is compiled outside the disk cache (the margin is not part of the cache key).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from vllm_fa4.kernels import softmax  # noqa: E402
from vllm_fa4.paged_prefill import paged_attention_reference  # noqa: E402
from vllm_fa4.testing.cases import make_paged_case  # noqa: E402

# name: (dtype, hd, Hq, Hkv, page, prefill (q_len, k_len) list, query scale)
CASES = {
    "A hd128 32/8 p16 x5.9": (128, 32, 8, 16, [(3, 64), (83, 6128)], 5.9),
    "B hd64 32/32 p128 x4.8": (64, 32, 32, 128, [(320, 7423)], 4.8),
    "C hd128 28/4 p64 x1": (128, 28, 4, 64, [(2364, 2560), (896, 6912), (18, 2561)], 1.0),
    "D hd64 40/8 p32 x1": (64, 40, 8, 32, [(7, 578)], 1.0),
}


_BUILDS: dict = {}


def build(key, config, margin):
    """Compile ``config`` for ``key`` with the given lazy-max margin (outside the disk cache:
    the margin is not part of its key; memoized here)."""
    from vllm_fa4.kernels.compile import compile_kernel

    if (key, config, margin) in _BUILDS:
        return _BUILDS[key, config, margin]

    old = softmax.LAZY_MAX_MARGIN_LOG2
    softmax.LAZY_MAX_MARGIN_LOG2 = float(margin)
    try:
        fn = _BUILDS[key, config, margin] = compile_kernel(key, config, has_lse=False)
        return fn
    finally:
        softmax.LAZY_MAX_MARGIN_LOG2 = old


def launch(fn, case, plan, out):
    from vllm_fa4.kernels.launch import _sm_count, _tile_counters

    a = plan.args
    n = min(a.work_tiles.shape[0], _sm_count(case.q.device))
    fn(
        case.q,
        case.k_cache,
        case.v_cache,
        out,
        None,
        a.cu_seqlens_q,
        a.seqused_k,
        a.page_table,
        a.work_tiles,
        _tile_counters(case.q.device) if plan.config.persistent else None,
        None,
        case.softmax_scale,
        n,
        0,
        1.0,
    )
    return out


def builds_for(config, margins):
    """(label, config, margin): the batch's serving pick at each margin, and without lazy_max."""
    out = [(f"m{m:g}", config, m) for m in margins]
    if config.lazy_max:
        out.append(("no-lazy", dataclasses.replace(config, lazy_max=False), 0.0))
    return out


def accuracy(margins, seeds):
    print("case | build (the batch's serving pick) | worst ours/FA3 | ours max err | FA3 max err")
    for name, (hd, hq, hkv, page, specs, qscale) in CASES.items():
        cases = []
        for seed in range(seeds):
            c = make_paged_case(specs, hq, hkv, hd, page, torch.bfloat16, "cuda", seed=seed)
            c.q.mul_(qscale)
            ref, _ = paged_attention_reference(
                c.q,
                c.k_cache,
                c.v_cache,
                c.cu_seqlens_q,
                c.seqused_k,
                c.page_table,
                c.softmax_scale,
                compute_dtype=torch.float64,
            )
            kv0 = c.kv_cache.nan_to_num(0.0)
            fa3 = c.fa3(c.new_out(), k_cache=kv0[..., :hd], v_cache=kv0[..., hd:])
            cases.append((c, ref, float((fa3.double() - ref).abs().max())))
        key, pick = cases[0][0].key, cases[0][0].plan().config
        for label, cfg, m in builds_for(pick, margins):
            fn = build(key, cfg, m)
            worst = (0.0, 0.0, 0.0)
            for c, ref, fa3_err in cases:
                plan = c.plan(cfg)
                out = launch(fn, c, plan, c.new_out())
                torch.cuda.synchronize()
                err = float((out.double() - ref).abs().max())
                if err / fa3_err > worst[0]:
                    worst = (err / fa3_err, err, fa3_err)
            print(f"{name} | {label} | {worst[0]:.2f} | {worst[1]:.4f} | {worst[2]:.4f}")


def timing(margins, rounds):
    from triton.testing import do_bench
    from variants_ab import fa3_contiguous_call

    print("case | build | TFLOP/s | /FA3 | /FA3c")
    for name, specs in (
        ("4kx4", [(4096, 4096)] * 4),
        ("8kx2", [(8192, 8192)] * 2),
        ("16kx1", [(16384, 16384)]),
        ("2k@16k x2", [(2048, 16384 + 2048)] * 2),
        ("512x32", [(512, 512)] * 32),
    ):
        for page in (16, 128):
            c = make_paged_case(specs, 32, 8, 128, page, torch.bfloat16, "cuda", seed=0)
            key = c.key
            fa3_out = c.new_out(False)
            fns = {"FA3": lambda c=c, o=fa3_out: c.fa3(o), "FA3c": fa3_contiguous_call(c)}
            plan = c.plan()
            out = c.new_out()
            cfg = plan.config
            for m in margins:
                fn = build(key, cfg, m)
                fns[f"m{m}"] = lambda fn=fn, c=c, plan=plan, out=out: launch(fn, c, plan, out)
            times = {n: [] for n in fns}
            names = list(fns)
            for r in range(rounds):
                for n in names[r % len(names) :] + names[: r % len(names)]:
                    times[n].append(do_bench(fns[n], return_mode="median"))
            med = {n: statistics.median(t) for n, t in times.items()}
            flops = 4 * sum(q * (k - q) + q * (q + 1) / 2 for q, k in specs) * 32 * 128
            for n in names[2:]:
                t = med[n] * 1e-3
                print(
                    f"{name} p{page} | {n} | {flops / t / 1e12:.1f} | "
                    f"{med['FA3'] / med[n]:.3f} | {med['FA3c'] / med[n]:.3f}"
                )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--margins", default="8,0")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    margins = [float(m) for m in args.margins.split(",")]
    print(f"device={torch.cuda.get_device_name()}")
    accuracy(margins, args.seeds)
    if args.time:
        timing(margins, args.rounds)


if __name__ == "__main__":
    main()
