"""Per-tile times of our kernel from the test-only TileProbe.STAMP_TIMES build: where a
persistent launch's end is uneven, is it the order (the model in schedule_sim.py) or tiles
whose time is not their block count?

Run: python benchmarks/tile_times.py [--model gemma-2-9b] [--pages 16] [--cases 4kx4,16kx1]
                                     [--variants "default default@tail=2"] [--softcap 50]
                                     [--fp8] [--launches 5]

Each contender (variants_ab.py's spelling: a spec or ``default``, ``@l2=MiB``, ``@tail=N``) is
planned as served, then launched with the same config plus the probe, which writes each tile's
SM and %globaltimer_lo (ns) at its start and end. Per launch (medians over
--launches, after one warm-up):
  kernel   first CTA start to last tile end, us (the probe's stores included)
  mean/max mean SM load over the busiest one's (ncu's mean / busiest SM active cycles)
  idle     the first SM to finish: its idle time at the end, share of the kernel
  a, b     least-squares fit of a tile's time (its CTA's previous end to its end) on its
           K/V blocks: us a tile, us a block
  a in     the same fit's us a tile for the time inside the tile (its start to its end)
  gap      mean time from a tile's start back to its SM's previous end, us (the queue's hand-off)
  resid    residuals' spread (std) over the mean tile time; tiles > +20 %: their share
  late     the busiest SM's last tile: its list index / tiles, its blocks, its time over the fit
  phases   a tile's mean time in each part of consume: Q landed (Q by TMA: 0, it lands with the
           first K), the first block, the other blocks (and the last P V), the epilogue's
           normalization and conversion, its stores; the other blocks' time per block
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
PHASES = ("q", "first", "loop", "epi_math", "epi_store")


@dataclasses.dataclass
class TileTimes:
    """One launch's stamps, per tile in list order: its blocks, SM, start and end (ns from
    the earliest start)."""

    cost: np.ndarray  # [tiles] K/V blocks
    sm: np.ndarray  # [tiles]
    start_ns: np.ndarray  # [tiles] the consumers begin the tile (before its TileWork and Q)
    end_ns: np.ndarray  # [tiles] after its epilogue
    # [CTAs, 5] ns summed over a CTA's tiles: consume's start to Q landed, to the first block
    # done, to the block loop (and the last P V) done, to O normalized and converted, to O
    # (and the LSE) stored
    phase_sums: np.ndarray


def unwrap(stamps: np.ndarray, origin: int) -> np.ndarray:
    """32-bit %globaltimer_lo values as ns after ``origin`` (a kernel is far below 4.29 s)."""
    return (stamps.astype(np.int64) - origin) % (1 << 32)


def read_stamps(buf: torch.Tensor) -> TileTimes:
    rows = buf.cpu().numpy().astype(np.int64)
    if not rows[:, 6].any():
        raise RuntimeError("no tile start stamped: was the kernel built with the probe?")
    # The earliest start is the origin. One launch's low words lie within far less than 2^31
    # ns of each other, so each start's signed offset from the first row's is exact.
    first = int(rows[0, 6])
    offsets = (rows[:, 6] - first + (1 << 31)) % (1 << 32) - (1 << 31)
    origin = first + int(offsets.min())
    return TileTimes(
        cost=rows[:, 3],
        sm=rows[:, 4],
        start_ns=unwrap(rows[:, 6], origin),
        end_ns=unwrap(rows[:, 5], origin),
        phase_sums=rows[:, 7:12] if rows.shape[1] >= 12 else None,  # zero past the CTAs
    )


def _fit(cost: np.ndarray, times: np.ndarray) -> tuple[float, float]:
    """Least squares times = a + b * cost."""
    design = np.stack((np.ones(len(cost)), cost.astype(np.float64)), axis=1)
    a, b = np.linalg.lstsq(design, times.astype(np.float64), rcond=None)[0]
    return float(a), float(b)


def analyse(t: TileTimes) -> dict[str, float]:
    """The columns of the module doc for one launch."""
    durations = np.zeros(len(t.cost), dtype=np.float64)  # previous end on the SM to end
    loads, last_end = {}, []
    for s in np.unique(t.sm):
        tiles = np.flatnonzero(t.sm == s)
        tiles = tiles[np.argsort(t.end_ns[tiles], kind="stable")]
        sm_start = t.start_ns[tiles].min()
        prev = np.concatenate(([sm_start], t.end_ns[tiles][:-1]))
        durations[tiles] = t.end_ns[tiles] - prev
        loads[int(s)] = t.end_ns[tiles][-1] - sm_start
        last_end.append(t.end_ns[tiles][-1])
    kernel = float(t.end_ns.max())
    load = np.array(list(loads.values()), dtype=np.float64)
    a, b = _fit(t.cost, durations)
    inside = t.end_ns - t.start_ns
    a_in, _ = _fit(t.cost, inside)
    predicted = a + b * t.cost
    resid = durations - predicted
    phases = {}
    if t.phase_sums is not None:
        ctas = t.phase_sums[t.phase_sums.any(axis=1)]  # the CTAs that ran a tile
        phases = {p: float(ctas[:, i].sum() / len(t.cost) / 1e3) for i, p in enumerate(PHASES)}
        # the loop's time per block after each tile's first
        phases["loop_blk"] = float(ctas[:, 2].sum() / max((t.cost - 1).clip(0).sum(), 1) / 1e3)
    busiest = max(loads, key=loads.get)
    on_busiest = np.flatnonzero(t.sm == busiest)
    last = on_busiest[np.argmax(t.end_ns[on_busiest])]
    return {
        "kernel_us": kernel / 1e3,
        "mean_over_max": float(load.mean() / load.max()),
        "idle": float((kernel - min(last_end)) / kernel),
        "a_us": a / 1e3,
        "b_us": b / 1e3,
        "a_in_us": a_in / 1e3,
        "gap_us": float((durations - inside).mean() / 1e3),
        "resid": float(resid.std() / durations.mean()),
        "over20": float((resid > 0.2 * predicted).mean()),
        "late_index": float(last) / len(t.cost),
        "late_blocks": float(t.cost[last]),
        "late_over_fit": float(durations[last] / predicted[last]),
        **phases,
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
    buf = torch.zeros((work.shape[0], 12), dtype=torch.int32, device=work.device)
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
    ap.add_argument("--fp8", action="store_true", help="an FP8 (e4m3) cache and its picks")
    args = ap.parse_args(argv)
    shape = MODELS[args.model]
    print(
        f"device={torch.cuda.get_device_name()} model={args.model} window_left="
        f"{args.window_left} softcap={args.softcap} kv={'fp8_e4m3' if args.fp8 else 'bf16'} "
        f"launches={args.launches}"
    )
    print(
        f"{'case':<14} {'contender':<22} {'tiles':>5} {'kernel':>8} {'mean/max':>8} {'idle':>6} "
        f"{'a us':>6} {'b us':>6} {'a in':>6} {'gap':>5} {'resid':>6} {'>20%':>6} "
        f"{'late at':>7} {'blocks':>6} {'/fit':>5} | phases a tile, us: "
        f"{'q':>5} {'first':>5} {'loop':>6} {'epi m':>5} {'epi s':>5} {'loop/blk':>8}"
    )
    for name in args.cases.split(","):
        for page in args.pages:
            case = make_paged_case(
                CASES[name][1],
                *(shape.num_q_heads, shape.num_kv_heads, shape.head_dim, page, DT, "cuda"),
                seed=0,
                window_left=args.window_left,
                softcap=args.softcap,
                fp8_kv=args.fp8,
            )
            for text in args.variants.split():
                r = time_case(case, text, args.launches)
                print(
                    f"{name + ' p' + str(page):<14} {text:<22} {r['tiles']:>5} "
                    f"{r['kernel_us']:8.1f} {r['mean_over_max']:8.3f} {r['idle']:6.1%} "
                    f"{r['a_us']:6.2f} {r['b_us']:6.3f} {r['a_in_us']:6.2f} {r['gap_us']:5.2f} "
                    f"{r['resid']:6.1%} {r['over20']:6.1%} "
                    f"{r['late_index']:7.3f} {r['late_blocks']:6.0f} {r['late_over_fit']:5.2f} | "
                    f"{'':>18} {r['q']:5.2f} {r['first']:5.2f} {r['loop']:6.2f} "
                    f"{r['epi_math']:5.2f} {r['epi_store']:5.2f} {r['loop_blk']:8.3f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
