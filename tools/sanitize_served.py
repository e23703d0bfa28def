#!/usr/bin/env python3
"""Run every kernel config serving can launch on small vLLM-shaped batches, for
compute-sanitizer (memcheck, racecheck, synccheck) to watch.

    python tools/sanitize_served.py --precompile -j 14      # compile into the disk cache first
    compute-sanitizer --tool memcheck python tools/sanitize_served.py
    compute-sanitizer --tool racecheck python tools/sanitize_served.py --short-only --shard 0/8
    compute-sanitizer --tool memcheck python tools/sanitize_served.py --fp8-only   # or --no-fp8
    compute-sanitizer --tool racecheck python tools/sanitize_served.py --wrap --ctas 16 --shard 0/16
    compute-sanitizer --tool memcheck python tools/sanitize_served.py --only 'hd256 p16 .*w'
    VLLM_FA4_VARIANT=SPEC compute-sanitizer ... tools/sanitize_served.py   # one config instead

The set is ``policy.launchable_configs(key)`` over keys that make different code: head dims 64 /
128 / 256, pages 16 and 128, both dtypes at head dim 128, the model features (window, soft
cap, sinks: gpt-oss's and Gemma 2's keys), the same families on an FP8 (e4m3) KV cache
(policy.FP8_TABLE's rows: its converter warps, staging ring and scales), plus each config
refitted to a padded cache (``page_size_padded``, PAD_BYTES after each page), which turns
wide_box into per-chunk boxes. Each (key, config) runs a short batch and a long one through
``run_prefill`` on NaN-poisoned caches (an FP8 cache with its k_scale / v_scale) and checks
the output against the fp32 reference (on the dequantized cache for FP8), so a run that
"passes" the sanitizer also computed the right thing. Prints one line per run and a summary;
exits 1 on a wrong output.

Racecheck runs minutes on a long batch, so the long batches' own hazards (a persistent CTA
moving to its next tile, stage rings wrapping many times) get a cheaper stand-in: ``--wrap``
runs WRAP (the short batch with one request's keys long enough to wrap every stage ring) and
``--ctas N`` caps the persistent grid at N CTAs, so each CTA takes several tiles in turn.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from vllm_fa4.kernels.config import FP8_E4M3, KernelConfig, KernelKey  # noqa: E402
from vllm_fa4.paged_prefill.policy import (  # noqa: E402
    configured_config,
    launchable_configs,
    serving_configs,
)


class Shape(NamedTuple):
    """One attention layer's shape: the model's dtype, head dim, page, heads, features and
    the KV cache's dtype (None: the model's; FP8_E4M3: an e4m3 cache with per-tensor scales)."""

    dtype: str
    head_dim: int
    page: int
    hq: int
    hkv: int
    window: int | None = None  # window_left
    softcap: float | None = None
    sinks: bool = False
    kv_dtype: str | None = None

    @property
    def key(self) -> KernelKey:
        return KernelKey.for_layer(
            self.dtype,
            self.head_dim,
            self.page,
            self.hq,
            self.hkv,
            sliding_window=self.window is not None,
            softcap=self.softcap is not None,
            sinks=self.sinks,
            kv_dtype=self.kv_dtype,
        )

    @property
    def element_size(self) -> int:
        """Bytes per cache element: 1 for an FP8 cache, 2 for a 16-bit one."""
        return getattr(torch, self.kv_dtype or self.dtype).itemsize

    @property
    def label(self) -> str:
        label = f"{self.dtype} hd{self.head_dim} p{self.page} {self.hq}/{self.hkv}"
        label += f" w{self.window}" if self.window is not None else ""
        label += f" cap{self.softcap:g}" if self.softcap is not None else ""
        label += " sinks" if self.sinks else ""
        return label + (" fp8" if self.kv_dtype == FP8_E4M3 else "")


FP8 = FP8_E4M3
SHAPES = (
    Shape("bfloat16", 128, 16, 32, 8),  # Llama-3.1-8B
    Shape("float16", 128, 16, 32, 8),
    Shape("bfloat16", 128, 128, 32, 8),
    Shape("bfloat16", 128, 16, 32, 8, window=4095),
    Shape("bfloat16", 64, 16, 32, 8),  # Llama-3.2-1B
    Shape("bfloat16", 64, 128, 32, 8),
    # GQA group 1 (OPT-1.3B): the one head-dim-64 key whose block loop ran out of registers
    # (the cause found in session 12; session 13's column offsets in the mask removed them)
    Shape("bfloat16", 64, 16, 32, 32),
    Shape("bfloat16", 64, 16, 64, 8, window=127, sinks=True),  # gpt-oss windowed layers
    Shape("bfloat16", 64, 16, 64, 8, sinks=True),  # gpt-oss global layers
    Shape("bfloat16", 256, 16, 16, 8, window=4095, softcap=50.0),  # Gemma 2 local layers
    Shape("bfloat16", 256, 16, 16, 8, softcap=50.0),  # Gemma 2 global layers at page 16
    # Head dim 256 at page 16 without a cap: 80-key blocks with O stored by TMA for long
    # batches (policy.LONG_BY_PAGE; the capped key's without the TMA store); at pages 32 and
    # 64 the table's own long pick.
    Shape("bfloat16", 256, 16, 16, 8),
    Shape("bfloat16", 256, 32, 16, 8),
    # Head dim 256 with a window and no cap below page 128 (Gemma-3-12B's 1k-window local
    # layers): the table's own row, not the capped key's 80-key blocks.
    Shape("bfloat16", 256, 16, 16, 8, window=1023),
    # A GQA group of 3 at head dim 256: its short pick stores O directly (TMA boxes need a
    # warpgroup's 64 rows to be whole tokens; policy._fit_group).
    Shape("bfloat16", 256, 16, 12, 4),
    # Qwen2.5-7B's group of 7 at head dim 128: its short pick stages O in the Q stage and
    # stores rows (staged_epilogue) instead of TMA boxes.
    Shape("bfloat16", 128, 16, 28, 4),
    Shape("bfloat16", 128, 128, 28, 4),  # odd group: the long picks without the multicast
    Shape("bfloat16", 128, 16, 28, 4, kv_dtype=FP8),
    Shape("bfloat16", 256, 128, 16, 8, softcap=50.0),  # Gemma 2 global layers
    # Without the cap at page 128 the long pick stores O by TMA (policy.LONG_BY_PAGE).
    Shape("bfloat16", 256, 128, 16, 8),
    # Windows at page 128 (--block-size 128): rows of their own in policy.TABLE.
    Shape("bfloat16", 64, 128, 64, 8, window=127, sinks=True),
    Shape("bfloat16", 128, 128, 32, 8, window=4095),
    Shape("bfloat16", 256, 128, 16, 8, window=4095, softcap=50.0),
    # FP8 (e4m3) caches, --kv-cache-dtype fp8 (FP8_TABLE): every row serving can launch.
    # Head dim 128: pages_ahead + staged_epilogue, two staging slots (Llama-3.1-8B).
    Shape("bfloat16", 128, 16, 32, 8, kv_dtype=FP8),
    # The fp16 model: the converter's e4m3 -> f16 route (bf16 takes another).
    Shape("float16", 128, 16, 32, 8, kv_dtype=FP8),
    # Page 128: one box a K/V tile, the page-128 row (no pages_ahead).
    Shape("bfloat16", 128, 128, 32, 8, kv_dtype=FP8),
    # fp16 models at page 128: the converted pick (bf16 ones split Q, policy.FP8_BF16_LONG).
    Shape("float16", 128, 128, 32, 8, kv_dtype=FP8),
    # Head dim 128 with a window: its own row (queue+overlap, no q_prefetch for fp8).
    Shape("bfloat16", 128, 16, 32, 8, window=4095, kv_dtype=FP8),
    # Head dim 64: queue_with_work + q_tma + three consumer warpgroups (Llama-3.2-1B).
    Shape("bfloat16", 64, 16, 32, 8, kv_dtype=FP8),
    # gpt-oss: windowed layers (queue+overlap+mma_wgs=3 instead of q_prefetch) and global
    # ones (the head-dim-64 row with sinks).
    Shape("bfloat16", 64, 16, 64, 8, window=127, sinks=True, kv_dtype=FP8),
    Shape("bfloat16", 64, 16, 64, 8, sinks=True, kv_dtype=FP8),
    # Gemma 2 at page 16: head dim 256's single staging slot, soft cap; the local layers'
    # window, the global layers' row (lazy_max for long batches).
    Shape("bfloat16", 256, 16, 16, 8, window=4095, softcap=50.0, kv_dtype=FP8),
    Shape("bfloat16", 256, 16, 16, 8, softcap=50.0, kv_dtype=FP8),
    # Gemma 2 global layers at page 128: one_per_cta (converters without a queue), boxes of
    # half a page (tile_n 64).
    Shape("bfloat16", 256, 128, 16, 8, softcap=50.0, kv_dtype=FP8),
    Shape("bfloat16", 256, 16, 12, 4, kv_dtype=FP8),  # group 3: the short pick stores directly
    Shape("bfloat16", 256, 128, 12, 4, kv_dtype=FP8),  # and the page-128 long pick
    # Page 128 at head dim 64 and the windows at page 128: FP8_TABLE's rows of their own.
    Shape("bfloat16", 64, 128, 32, 8, kv_dtype=FP8),
    Shape("bfloat16", 64, 128, 64, 8, window=127, sinks=True, kv_dtype=FP8),
    Shape("bfloat16", 128, 128, 32, 8, window=4095, kv_dtype=FP8),
    Shape("bfloat16", 256, 128, 16, 8, window=4095, softcap=50.0, kv_dtype=FP8),
)
SHORT = [(70, 300), (130, 130), (1, 40), (0, 9)]
LONG = [(1500, 2600), (777, 777)]
# SHORT with the first request's keys at 1300: 10 K/V tiles of 128 (20 of 64) per work tile, so
# every staging and K/V stage ring wraps several times, at about twice SHORT's racecheck cost.
WRAP = [(70, 1300), (130, 130), (1, 40), (0, 9)]
# Bytes after each page (vLLM's page_size_padded - page bytes): 16-byte aligned (the kernel's
# and startup's rule), a whole number of elements of either cache dtype (64 bf16, 128 e4m3)
# and not a whole wide box, so wide_box refits to per-chunk boxes.
PAD_BYTES = 128


def _wanted(shape: Shape, fp8: bool | None, only: str | None = None) -> bool:
    """``fp8`` None: every shape; True: only FP8 caches; False: only 16-bit ones. ``only``: a
    regular expression the shape's label must contain a match of (``re.search``), e.g.
    ``hd256 p16 .*w`` for head dim 256's windowed page-16 shapes."""
    if only is not None and not re.search(only, shape.label):
        return False
    return fp8 is None or (shape.kv_dtype is not None) == fp8


def shapes(fp8: bool | None = None, only: str | None = None) -> tuple[Shape, ...]:
    """SHAPES, filtered by ``fp8`` and ``only`` (``_wanted``)."""
    return tuple(s for s in SHAPES if _wanted(s, fp8, only))


def padded_layout(shape: Shape):
    """The shape's cache layout with PAD_BYTES after each page (the shape's element size)."""
    from vllm_fa4.paged_prefill.layout import KvCacheLayout

    esize = shape.element_size
    page_bytes = shape.page * shape.hkv * 2 * shape.head_dim * esize + PAD_BYTES
    return KvCacheLayout.packed(shape.page, shape.hkv, shape.head_dim, esize, page_bytes)


def served(shape: Shape) -> list[tuple[KernelConfig, bool]]:
    """(config, padded) for each config serving launches for ``shape``'s key: as served on
    the packed cache, and refitted to the padded one (``fit_config``). Host only.
    ``VLLM_FA4_VARIANT`` replaces the table's picks with one config (a candidate before its
    adoption), as it does in serving; keys it cannot build are left out."""
    from vllm_fa4.paged_prefill.layout import fit_config

    key, layout = shape.key, padded_layout(shape)
    fixed = configured_config()  # unset: VLLM_FA4_FP8_QUERY=e4m3's picks too
    picks = serving_configs(key, fixed).all if fixed else launchable_configs(key)
    picks = tuple(c for c in picks if c.unsupported_reason(key) is None)
    configs = {(c, False) for c in picks}
    configs |= {(fit_config(c, key, layout), True) for c in picks}
    return sorted(configs, key=lambda cp: (cp[0].spec, cp[1]))


def pairs(
    fp8: bool | None = None, only: str | None = None
) -> Iterator[tuple[str, KernelKey, KernelConfig, bool]]:
    """(label, key, config, padded) of every run, without a GPU (``runs`` minus the cases)."""
    for shape in shapes(fp8, only):
        for config, pad in served(shape):
            yield shape.label, shape.key, config, pad


def _cases(shape: Shape, seed, batches):
    from vllm_fa4.testing.cases import make_paged_case

    for specs in batches:
        yield make_paged_case(
            specs,
            shape.hq,
            shape.hkv,
            shape.head_dim,
            shape.page,
            getattr(torch, shape.dtype),
            "cuda",
            seed=seed,
            window_left=shape.window,
            softcap=shape.softcap,
            sinks=shape.sinks,
            fp8_kv=shape.kv_dtype == FP8_E4M3,
        )


def _padded_views(case, pad_bytes: int):
    """The case's cache copied into a padded-page layout (vLLM's page_size_padded: pad_bytes
    after each page), in the cache's own dtype; the pads are NaN (e4m3: its byte 0x7f)."""
    from vllm_fa4.paged_prefill import split_kv_cache
    from vllm_fa4.testing.cases import FP8_NAN_BYTE

    cache = case.kv_cache
    nb, page, hkv, packed = cache.shape
    block = page * hkv * packed + pad_bytes // cache.element_size()
    if case.fp8_kv:  # torch has no NaN fill for e4m3: its bit pattern
        raw = torch.full((nb * block,), FP8_NAN_BYTE, dtype=torch.uint8, device=cache.device)
        raw = raw.view(cache.dtype)
    else:
        raw = torch.full((nb * block,), float("nan"), dtype=cache.dtype, device=cache.device)
    phys = raw.as_strided(cache.shape, (block, hkv * packed, packed, 1))
    phys.copy_(cache)
    return split_kv_cache(phys.permute(0, 2, 1, 3), case.head_dim)


def runs(batches=(SHORT, LONG), fp8: bool | None = None, only: str | None = None):
    """(label, key, config, case, padded) for every served config on each shape (each
    shape's seed is its place in SHAPES, whatever the filters)."""
    for i, shape in enumerate(SHAPES):
        if not _wanted(shape, fp8, only):
            continue
        configs = served(shape)
        for case in _cases(shape, 100 + i, batches):
            assert case.key == shape.key, (case.key, shape.key)
            for config, pad in configs:
                yield shape.label, shape.key, config, case, pad


def _cap_persistent_grid(ctas: int) -> None:
    """Launch persistent configs on at most ``ctas`` CTAs: ``prefill_forward`` sizes their grid
    as min(tiles, SM count) from launch's per-device SM count, which is seeded here."""
    from vllm_fa4.kernels import launch

    launch._SM_COUNT[torch.device("cuda", torch.cuda.current_device())] = ctas


def precompile(fp8: bool | None, workers: int, only: str | None = None) -> int:
    """Fill the disk cache with every (key, config) of the set, ``workers`` compiles at once
    (tools/precompile.py's pool; one process compiling them in turn takes about 6 minutes of
    a GPU session). The runs launch without LSE, as compile_keys builds them."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from precompile import build_all

    todo = list(dict.fromkeys((key, config, False) for _, key, config, _ in pairs(fp8, only)))
    wall = build_all(todo, workers)
    print(f"compiled {len(todo)} (key, config) pairs, 0 wrong, {wall:.0f} s")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precompile", action="store_true", help="only compile into the cache")
    ap.add_argument("-j", type=int, default=1, help="--precompile: compiles at once")
    batch = ap.add_mutually_exclusive_group()
    batch.add_argument(
        "--short-only", action="store_true", help="only the short batch (racecheck is slow)"
    )
    ap.add_argument(
        "--shard",
        default="0/1",
        help="I/N: every N-th run from the I-th (racecheck: N processes side by side)",
    )
    batch.add_argument(
        "--wrap", action="store_true", help="only WRAP (racecheck's stand-in for the long batch)"
    )
    ap.add_argument(
        "--ctas",
        type=int,
        default=None,
        help="cap the persistent grid at N CTAs, so each CTA runs several tiles in turn",
    )
    kv = ap.add_mutually_exclusive_group()
    kv.add_argument(
        "--fp8-only", dest="fp8", action="store_const", const=True, help="only FP8-cache shapes"
    )
    kv.add_argument(
        "--no-fp8", dest="fp8", action="store_const", const=False, help="only 16-bit caches"
    )
    ap.add_argument(
        "--only",
        metavar="REGEX",
        help="only the shapes whose label (as printed, e.g. 'bfloat16 hd256 p16 16/8 w4095 "
        "cap50') contains a match of REGEX",
    )
    args = ap.parse_args(argv)
    if args.only is not None and not shapes(args.fp8, args.only):
        ap.error(f"--only {args.only!r} matches no shape: {[s.label for s in shapes(args.fp8)]}")
    if args.precompile and args.j > 1:
        return precompile(args.fp8, args.j, args.only)
    index, shards = (int(x) for x in args.shard.split("/"))
    os.environ["VLLM_FA4_PREFILL_ROUTE"] = "kernel"
    from vllm_fa4.kernels.compile import compile_keys
    from vllm_fa4.paged_prefill import run_prefill
    from vllm_fa4.testing.cases import q_as_read_by

    if args.ctas is not None:
        _cap_persistent_grid(args.ctas)
    seen, bad, count, t0 = set(), 0, 0, time.perf_counter()
    batches = (WRAP,) if args.wrap else (SHORT,) if args.short_only else (SHORT, LONG)
    for n, (label, key, config, case, pad) in enumerate(runs(batches, args.fp8, args.only)):
        if n % shards != index:
            continue
        if (key, config) not in seen:
            seen.add((key, config))
            compile_keys([key], config, progress=False)
        if args.precompile:
            continue
        t_run = time.perf_counter()
        plan = case.plan(config)
        k, v = _padded_views(case, PAD_BYTES) if pad else (case.k_cache, case.v_cache)
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
            **case.kv_scales,  # an FP8 cache's k_scale / v_scale (1.0 for 16-bit)
        )
        torch.cuda.synchronize()
        # fp32, on the dequantized cache for FP8, with Q as the config reads it (the GPU tests')
        ref, _ = case.reference(q_as_read_by(config, case, case.q))
        err = float((out.float() - ref).abs().max())
        ok = bool(torch.isfinite(out).all()) and err < 0.02 * max(1.0, float(ref.abs().max()))
        bad += not ok
        count += 1
        layout = "padded" if pad else "packed"
        print(
            f"{'ok ' if ok else 'BAD'} {label:<40} {layout:<6} {config.spec}  max err {err:.2e}"
            f"  {time.perf_counter() - t_run:.0f} s"
        )
    what = "compiled" if args.precompile else f"ran {count} batches,"
    print(f"{what} {len(seen)} (key, config) pairs, {bad} wrong, {time.perf_counter() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
