#!/usr/bin/env python3
"""CPU model of how evenly a prefill batch's work tiles spread over the SMs.

Costs come from the real planner (`build_work_tiles`, LPT-sorted, cost = KV blocks) plus a
per-tile fixed cost; two assignments are compared by makespan / mean CTA load (1.0 = ideal):
  stride  a static persistent grid, CTA c takes tiles c, c+G, c+2G, ... (removed from the
          kernel: it lost 6-9 % on long batches, docs/perf-notes.md)
  greedy  the next tile in list order goes to the first free CTA: what the hardware does with
          one CTA per tile (`base`) and what the persistent grid's atomic tile queue does

    python3 benchmarks/schedule_sim.py [--sms 132] [--overhead 0.5]
"""

from __future__ import annotations

import argparse
import heapq
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_fa4.paged_prefill.plan import build_work_tiles  # noqa: E402

# name -> (q_lens, k_lens); Llama-3.1-8B heads (8 KV heads, GQA 4, hd 128: 32 tokens x 128 keys)
CASES = {
    "512x32": ([512] * 32, [512] * 32),
    "4k x4": ([4096] * 4, [4096] * 4),
    "16k x1": ([16384], [16384]),
    "2k after 4k x8": ([2048] * 8, [6144] * 8),
    "2k after 16k x2": ([2048] * 2, [18432] * 2),
    "16k + 31 x 512": ([16384] + [512] * 31, [16384] + [512] * 31),
}


def balance(costs: np.ndarray, sms: int) -> dict[str, float]:
    mean = costs.sum() / min(sms, len(costs))
    stride = [costs[c::sms].sum() for c in range(sms)]
    free_at = [0.0] * sms
    for x in costs:
        heapq.heappush(free_at, heapq.heappop(free_at) + x)
    return {"stride": max(stride) / mean, "greedy": max(free_at) / mean}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--overhead", type=float, default=0.5, help="per-tile fixed cost, in blocks")
    args = ap.parse_args()
    print(f"makespan / mean CTA load, {args.sms} SMs, +{args.overhead} block per tile")
    print(f"{'case':<18} {'tiles':>6} {'stride':>8} {'greedy':>8}")
    for name, (q, k) in CASES.items():
        tiles = build_work_tiles(np.array(q), np.array(k), 8, 32, 128).reshape(-1, 4)
        r = balance(tiles[:, 3].astype(float) + args.overhead, args.sms)
        print(f"{name:<18} {len(tiles):>6} {r['stride']:8.3f} {r['greedy']:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
