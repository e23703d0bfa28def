#!/usr/bin/env python3
"""Run every kernel config serving can launch on small vLLM-shaped batches, for
compute-sanitizer (memcheck, racecheck, synccheck) to watch.

    python tools/sanitize_served.py --precompile            # compile into the disk cache first
    compute-sanitizer --tool memcheck python tools/sanitize_served.py
    compute-sanitizer --tool racecheck python tools/sanitize_served.py --short-only --shard 0/8

The set is ``serving_configs(key).all`` over keys that make different code: head dims 64 /
128 / 256, pages 16 and 128, both dtypes at head dim 128, the model features (window, soft
cap, sinks: gpt-oss's and Gemma 2's keys), plus each config refitted to a padded cache
(``page_size_padded``), which turns wide_box into per-chunk boxes. Each (key, config) runs
a short batch and a long one through ``run_prefill`` on NaN-poisoned caches and checks the
output against the fp32 reference (so a run that "passes" the sanitizer also computed the
right thing). Prints one line per run and a summary; exits 1 on a wrong output.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from vllm_fa4.kernels.config import KernelKey  # noqa: E402
from vllm_fa4.paged_prefill.policy import serving_configs  # noqa: E402

# (dtype, head dim, page, Hq, Hkv, window_left, softcap, sinks)
SHAPES = (
    ("bfloat16", 128, 16, 32, 8, None, None, False),  # Llama-3.1-8B
    ("float16", 128, 16, 32, 8, None, None, False),
    ("bfloat16", 128, 128, 32, 8, None, None, False),
    ("bfloat16", 128, 16, 32, 8, 4095, None, False),
    ("bfloat16", 64, 16, 32, 8, None, None, False),  # Llama-3.2-1B
    ("bfloat16", 64, 128, 32, 8, None, None, False),
    ("bfloat16", 64, 16, 64, 8, 127, None, True),  # gpt-oss windowed layers
    ("bfloat16", 64, 16, 64, 8, None, None, True),  # gpt-oss global layers
    ("bfloat16", 256, 16, 16, 8, 4095, 50.0, False),  # Gemma 2 local layers
    ("bfloat16", 256, 128, 16, 8, None, 50.0, False),  # Gemma 2 global layers
)
SHORT = [(70, 300), (130, 130), (1, 40), (0, 9)]
LONG = [(1500, 2600), (777, 777)]
PAD_ELEMS = 64  # 128 bytes per block: 16-byte aligned, not a whole wide box


def _cases(shape, seed, batches):
    from vllm_fa4.testing.cases import make_paged_case

    dtype, hd, page, hq, hkv, window, cap, sinks = shape
    for specs in batches:
        yield make_paged_case(
            specs,
            hq,
            hkv,
            hd,
            page,
            getattr(torch, dtype),
            "cuda",
            seed=seed,
            window_left=window,
            softcap=cap,
            sinks=sinks,
        )


def _padded_views(case, pad: int):
    """The case's cache copied into a padded-page layout (vLLM's page_size_padded)."""
    from vllm_fa4.paged_prefill import split_kv_cache

    nb, page, hkv, packed = case.kv_cache.shape
    block = page * hkv * packed + pad
    raw = torch.full((nb * block,), float("nan"), dtype=case.dtype, device=case.kv_cache.device)
    phys = raw.as_strided(case.kv_cache.shape, (block, hkv * packed, packed, 1))
    phys.copy_(case.kv_cache)
    return split_kv_cache(phys.permute(0, 2, 1, 3), case.head_dim)


def runs(batches=(SHORT, LONG)):
    """(label, key, config, case, padded) for every served config on each shape."""
    from vllm_fa4.paged_prefill.layout import KvCacheLayout, fit_config

    for i, shape in enumerate(SHAPES):
        dtype, hd, page, hq, hkv, window, cap, sinks = shape
        key = KernelKey.for_layer(
            dtype,
            hd,
            page,
            hq,
            hkv,
            sliding_window=window is not None,
            softcap=cap is not None,
            sinks=sinks,
        )
        esize = 2
        padded = KvCacheLayout.packed(page, hkv, hd, esize, (page * hkv * 2 * hd + PAD_ELEMS) * 2)
        configs = {(c, False) for c in serving_configs(key).all}
        configs |= {(fit_config(c, key, padded), True) for c in serving_configs(key).all}
        for case in _cases(shape, 100 + i, batches):
            for config, pad in sorted(configs, key=lambda cp: (cp[0].spec, cp[1])):
                label = f"{dtype} hd{hd} p{page} {hq}/{hkv}"
                label += f" w{window}" if window is not None else ""
                label += f" cap{cap:g}" if cap is not None else ""
                label += " sinks" if sinks else ""
                yield label, key, config, case, pad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precompile", action="store_true", help="only compile into the cache")
    ap.add_argument(
        "--short-only", action="store_true", help="only the short batch (racecheck is slow)"
    )
    ap.add_argument(
        "--shard",
        default="0/1",
        help="I/N: every N-th run from the I-th (racecheck: N processes side by side)",
    )
    args = ap.parse_args(argv)
    index, shards = (int(x) for x in args.shard.split("/"))
    os.environ["VLLM_FA4_PREFILL_ROUTE"] = "kernel"
    from vllm_fa4.kernels.compile import compile_keys
    from vllm_fa4.paged_prefill import run_prefill

    seen, bad, count, t0 = set(), 0, 0, time.perf_counter()
    batches = (SHORT,) if args.short_only else (SHORT, LONG)
    for n, (label, key, config, case, pad) in enumerate(runs(batches)):
        if n % shards != index:
            continue
        if (key, config) not in seen:
            seen.add((key, config))
            compile_keys([key], config, progress=False)
        if args.precompile:
            continue
        plan = case.plan(config)
        k, v = _padded_views(case, PAD_ELEMS) if pad else (case.k_cache, case.v_cache)
        out = case.new_out()
        run_prefill(
            plan,
            case.q,
            k,
            v,
            out,
            softmax_scale=case.softmax_scale,
            softcap=case.softcap,
            sinks=case.sinks,
        )
        torch.cuda.synchronize()
        ref, _ = case.reference()
        err = float((out.float() - ref).abs().max())
        ok = bool(torch.isfinite(out).all()) and err < 0.02 * max(1.0, float(ref.abs().max()))
        bad += not ok
        count += 1
        layout = "padded" if pad else "packed"
        print(f"{'ok ' if ok else 'BAD'} {label:<36} {layout:<6} {config.spec}  max err {err:.2e}")
    what = "compiled" if args.precompile else f"ran {count} batches,"
    print(f"{what} {len(seen)} (key, config) pairs, {bad} wrong, {time.perf_counter() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
