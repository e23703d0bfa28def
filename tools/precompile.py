#!/usr/bin/env python3
"""Fill the kernel disk cache ($VLLM_FA4_CACHE_DIR) for a benchmark run, several compiles at
once, so a timed GPU session does not spend its minutes compiling one kernel after another.

    python tools/precompile.py --model llama-3.2-1b --pages 16,128 \\
        --configs "default queue+overlap+mma_wgs=3" [--window-left 127] [--sinks] \\
        [--lse no|yes|both] [-j 8]

``default`` stands for the key's serving configs (every config the plan can pick),
``default+values`` for them with ``values`` set (variants_ab.py's overlay). Each
(key, config, lse) is compiled in its own worker process and written to the disk cache, where
variants_ab.py, the tests and vLLM find it. Prints one line per kernel as it finishes.

The cache must be private to the user who runs the server; to share kernels across a fleet, fill
each user's own cache, or run this as root into a directory that is then made read-only
(`chmod -R go+rX`; docs/reliability.md, "Kernel cache threat model").
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))


def _build(key, config, has_lse):
    from vllm_fa4.kernels.compile import get_kernel

    t0 = time.perf_counter()
    get_kernel(key, config, has_lse)
    return time.perf_counter() - t0


def jobs(args) -> list:
    """The (key, config, has_lse) triples the options name (unsupported configs dropped)."""
    from _common import MODELS

    from vllm_fa4.kernels.config import KernelConfig, KernelKey
    from vllm_fa4.paged_prefill.policy import serving_configs

    shape = MODELS[args.model]
    lse = {"no": (False,), "yes": (True,), "both": (False, True)}[args.lse]
    out = []
    for page in (int(p) for p in args.pages.split(",")):
        key = KernelKey.for_layer(
            args.dtype,
            shape.head_dim,
            page,
            shape.num_q_heads,
            shape.num_kv_heads,
            sliding_window=args.window_left is not None,
            softcap=args.softcap,
            sinks=args.sinks,
            kv_dtype=args.kv_dtype,
        )
        for spec in args.configs.split():
            if spec == "default" or spec.startswith("default+"):
                overlay = spec.removeprefix("default")  # "" or "+values" (variants_ab.py's)
                configs = [c.overlaid(overlay) for c in serving_configs(key).all]
            else:
                configs = (KernelConfig.parse(spec),)
            for config in configs:
                if config.unsupported_reason(key) is None:
                    out += [(key, config, has_lse) for has_lse in lse]
    return list(dict.fromkeys(out))


def main(argv=None) -> int:
    from _common import MODELS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="llama-3.1-8b", choices=list(MODELS))
    ap.add_argument("--pages", default="16,128")
    ap.add_argument("--configs", default="default")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--window-left", type=int, default=None)
    ap.add_argument("--softcap", action="store_true", help="keys with the soft-cap flag")
    ap.add_argument("--sinks", action="store_true", help="keys with the sinks flag")
    ap.add_argument(
        "--kv-dtype", default=None, help="keys of an FP8 cache: float8_e4m3fn (default: dtype's)"
    )
    ap.add_argument("--lse", choices=("no", "yes", "both"), default="no")
    ap.add_argument("-j", type=int, default=8, help="compiles at once")
    args = ap.parse_args(argv)
    build_all(jobs(args), args.j)
    return 0


def build_all(todo: list, workers: int) -> float:
    """Compile every (key, config, has_lse) of ``todo`` into the disk cache, ``workers`` at
    once, one line per kernel as it finishes; returns the wall time in seconds."""
    print(f"{len(todo)} kernels, {workers} at a time", flush=True)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        futures = {pool.submit(_build, *job): job for job in todo}
        for fut in as_completed(futures):
            key, config, has_lse = futures[fut]
            print(f"{fut.result():6.1f} s  {key} {config.spec} lse={has_lse}", flush=True)
    wall = time.perf_counter() - t0
    print(f"done in {wall:.0f} s", flush=True)
    return wall


if __name__ == "__main__":
    sys.exit(main())
