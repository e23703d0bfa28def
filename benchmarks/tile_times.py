"""Per-tile times of our kernel from the test-only TileProbe.STAMP_TIMES build: where a
persistent launch's end is uneven, is it the order (the model in schedule_sim.py) or tiles
whose time is not their block count?

Run: python benchmarks/tile_times.py [--model gemma-2-9b] [--pages 16] [--cases 4kx4,16kx1]
                                     [--variants "default default@tail=2"] [--softcap 50]
                                     [--launches 5]

Each contender (variants_ab.py's spelling: a spec or ``default``, ``@l2=MiB``, ``@tail=N``) is
planned as served, then launched with the same config plus the probe, which writes each tile's
SM and %globaltimer_lo (ns) at its end and each CTA's start. Per launch (medians over
--launches, after one warm-up):
  kernel   first CTA start to last tile end, us (the probe's stores included)
  mean/max mean SM load over the busiest one's (ncu's mean / busiest SM active cycles)
  idle     the first SM to finish: its idle time at the end, share of the kernel
  a, b     least-squares fit of a tile's time (its CTA's previous end to its end) on its
           K/V blocks: us a tile, us a block
  resid    residuals' spread (std) over the mean tile time; tiles > +20 %: their share
  late     the busiest SM's last tile: its list index / tiles, its blocks, its time over the fit
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from vllm_fa4.kernels.config import TileProbe
from vllm_fa4.testing.cases import make_paged_case

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MODELS  # noqa: E402
from variants_ab import CASES, _pages, _softcap, _window_left, parse_contender  # noqa: E402

DT = torch.bfloat16


@dataclasses.dataclass
class TileTimes:
    """One launch's stamps: per tile (list order) its blocks, SM and end; per SM its start."""

    cost: np.ndarray  # [tiles] K/V blocks
    sm: np.ndarray  # [tiles]
    end_ns: np.ndarray  # [tiles], from the earliest CTA start
    sm_start_ns: dict[int, int]


def unwrap(stamps: np.ndarray, origin: int) -> np.ndarray:
    """32-bit %globaltimer_lo values as ns after ``origin`` (a kernel is far below 4.29 s)."""
    return (stamps.astype(np.int64) - origin) % (1 << 32)


def read_stamps(buf: torch.Tensor) -> TileTimes:
    rows = buf.cpu().numpy().astype(np.int64)
    starts = rows[:, 6]
    started = starts != 0
    if not started.any():
        raise RuntimeError("no CTA start stamped: was the kernel built with the probe?")
    origin = int(starts[started].min())  # earliest start; wrap-safe below while < 2^31 apart
    ends = unwrap(rows[:, 5], origin)
    sm = rows[:, 4]
    sm_start: dict[int, int] = {}
    for tile in np.flatnonzero(started):  # a CTA's first tile: its start is its SM's
        sm_start[int(sm[tile])] = int(unwrap(starts[tile : tile + 1], origin)[0])
    return TileTimes(cost=rows[:, 3], sm=sm, end_ns=ends, sm_start_ns=sm_start)


def analyse(t: TileTimes) -> dict[str, float]:
    """The columns of the module doc for one launch."""
    durations = np.zeros(len(t.cost), dtype=np.float64)
    loads, last_end = {}, []
    for s in np.unique(t.sm):
        tiles = np.flatnonzero(t.sm == s)
        tiles = tiles[np.argsort(t.end_ns[tiles], kind="stable")]
        prev = np.concatenate(([t.sm_start_ns.get(int(s), 0)], t.end_ns[tiles][:-1]))
        durations[tiles] = t.end_ns[tiles] - prev
        loads[int(s)] = t.end_ns[tiles][-1] - t.sm_start_ns.get(int(s), 0)
        last_end.append(t.end_ns[tiles][-1])
    kernel = float(t.end_ns.max())
    load = np.array(list(loads.values()), dtype=np.float64)
    fit = np.linalg.lstsq(
        np.stack((np.ones(len(t.cost)), t.cost.astype(np.float64)), axis=1), durations, rcond=None
    )[0]
    predicted = fit[0] + fit[1] * t.cost
    resid = durations - predicted
    busiest = max(loads, key=loads.get)
    on_busiest = np.flatnonzero(t.sm == busiest)
    last = on_busiest[np.argmax(t.end_ns[on_busiest])]
    return {
        "kernel_us": kernel / 1e3,
        "mean_over_max": float(load.mean() / load.max()),
        "idle": float((kernel - min(last_end)) / kernel),
        "a_us": fit[0] / 1e3,
        "b_us": fit[1] / 1e3,
        "resid": float(resid.std() / durations.mean()),
        "over20": float((resid > 0.2 * predicted).mean()),
        "late_index": float(last) / len(t.cost),
        "late_blocks": float(t.cost[last]),
        "late_over_fit": float(durations[last] / predicted[last]),
    }


def time_case(case, text: str, launches: int) -> dict[str, float]:
    config, options = parse_contender(text)
    plan = case.plan(config, **options)
    if not plan.config.persistent:
        raise SystemExit(
            f"{text}: {plan.config.spec} launches a CTA a tile; the probe's loads "
            "assume one persistent CTA an SM"
        )
    stamped = dataclasses.replace(plan.config, tile_probe=TileProbe.STAMP_TIMES)
    work = plan.args.work_tiles
    buf = torch.zeros((work.shape[0], 8), dtype=torch.int32, device=work.device)
    buf[:, :4] = work
    plan = dataclasses.replace(plan, config=stamped, args=plan.args._replace(work_tiles=buf[:, :4]))
    out = case.new_out()
    runs = []
    for i in range(launches + 1):
        buf[:, 4:] = 0
        case.ours(plan, out)
        torch.cuda.synchronize()
        if i:  # the first launch compiles and warms up
            runs.append(analyse(read_stamps(buf)))
    if torch.isnan(out).any():
        raise RuntimeError(f"{text}: NaN in the output (a tile did not run)")
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]} | {
        "config": plan.config.spec,
        "tiles": work.shape[0],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", choices=list(MODELS), default="gemma-2-9b")
    ap.add_argument("--pages", type=_pages, default=(16,))
    ap.add_argument("--cases", default="4kx4,8kx2,16kx1")
    ap.add_argument("--variants", default="default")
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--window-left", type=_window_left, default=None)
    ap.add_argument("--softcap", type=_softcap, default=None)
    args = ap.parse_args(argv)
    shape = MODELS[args.model]
    print(
        f"device={torch.cuda.get_device_name()} model={args.model} window_left="
        f"{args.window_left} softcap={args.softcap} launches={args.launches}"
    )
    print(
        f"{'case':<14} {'contender':<22} {'tiles':>5} {'kernel':>8} {'mean/max':>8} {'idle':>6} "
        f"{'a us':>6} {'b us':>6} {'resid':>6} {'>20%':>6} {'late at':>7} {'blocks':>6} "
        f"{'/fit':>5}"
    )
    for name in args.cases.split(","):
        for page in args.pages:
            case = make_paged_case(
                CASES[name][1],
                *(shape.num_q_heads, shape.num_kv_heads, shape.head_dim, page, DT, "cuda"),
                seed=0,
                window_left=args.window_left,
                softcap=args.softcap,
            )
            for text in args.variants.split():
                r = time_case(case, text, args.launches)
                print(
                    f"{name + ' p' + str(page):<14} {text:<22} {r['tiles']:>5} "
                    f"{r['kernel_us']:8.1f} {r['mean_over_max']:8.3f} {r['idle']:6.1%} "
                    f"{r['a_us']:6.2f} {r['b_us']:6.3f} {r['resid']:6.1%} {r['over20']:6.1%} "
                    f"{r['late_index']:7.3f} {r['late_blocks']:6.0f} {r['late_over_fit']:5.2f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
