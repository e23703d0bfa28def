#!/usr/bin/env python3
"""CPU model of how evenly a prefill batch's work tiles spread over the SMs.

Costs come from the real planner (`build_work_tiles`, cost = KV blocks, in the served order:
L2 sections of `--l2-mib`, LPT inside each; 0 = plain LPT) plus a per-tile fixed cost; three
assignments are compared by makespan / mean CTA load (1.0 = ideal):
  stride  a static persistent grid, CTA c takes tiles c, c+G, c+2G, ... (removed from the
          kernel: it lost 6-9 % on long batches, docs/perf-notes.md)
  greedy  the next tile in list order goes to the first free CTA: what the hardware does with
          one CTA per tile (`one_per_cta`), and a queue claimed as a CTA becomes free
  ahead   the kernel's tile queue: a CTA's producer claims its next tile as it starts the
          current one, so the next tile is bound a whole tile early. With L2 sections whose
          last one begins with long tiles, head dim 256 leaves 3-4 % of the SMs' cycles idle
          at the end (ncu agreed at 16kx1; docs/perf-notes.md, session 22)

    python3 benchmarks/schedule_sim.py [--model gemma-2-9b] [--l2-mib 16] [--overhead 1]
"""

from __future__ import annotations

import argparse
import heapq
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vllm_fa4.paged_prefill.plan import L2_SECTION_BYTES, build_work_tiles  # noqa: E402

# name -> (q_lens, k_lens)
CASES = {
    "512x32": ([512] * 32, [512] * 32),
    "1k x16": ([1024] * 16, [1024] * 16),
    "4k x4": ([4096] * 4, [4096] * 4),
    "8k x2": ([8192] * 2, [8192] * 2),
    "16k x1": ([16384], [16384]),
    "2k after 4k x8": ([2048] * 8, [6144] * 8),
    "2k after 16k x2": ([2048] * 2, [18432] * 2),
    "2k after 64k": ([2048], [67584]),
    "16k + 31 x 512": ([16384] + [512] * 31, [16384] + [512] * 31),
}
# model -> (KV heads, query tokens a 128-row tile, keys a block, K+V bytes a key of one head)
HEADS = {
    "llama-3.1-8b": (8, 32, 128, 512),  # GQA 4, head dim 128
    "gemma-2-9b": (8, 64, 64, 1024),  # GQA 2, head dim 256
}


def balance(costs: np.ndarray, sms: int) -> dict[str, float]:
    mean = costs.sum() / min(sms, len(costs))
    stride = [costs[c::sms].sum() for c in range(sms)]
    free_at = [0.0] * sms
    for x in costs:
        heapq.heappush(free_at, heapq.heappop(free_at) + x)
    return {
        "stride": max(stride) / mean,
        "greedy": max(free_at) / mean,
        "ahead": claim_ahead_makespan(costs, sms) / mean,
    }


def claim_ahead_makespan(costs: np.ndarray, sms: int) -> float:
    """CTA c starts on tile c; each CTA claims the next tile in list order as it starts a
    tile (the first claims in CTA order), and runs it when the current one ends."""
    n = len(costs)
    claimed = {c: sms + c for c in range(min(sms, n)) if sms + c < n}
    nxt = 2 * sms
    ends = [(float(costs[c]), c) for c in range(min(sms, n))]
    heapq.heapify(ends)
    finish = 0.0
    while ends:
        t, c = heapq.heappop(ends)
        finish = max(finish, t)
        tile = claimed.pop(c, None)
        if tile is None:
            continue
        heapq.heappush(ends, (t + float(costs[tile]), c))
        if nxt < n:
            claimed[c] = nxt
            nxt += 1
    return finish


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--overhead", type=float, default=0.5, help="per-tile fixed cost, in blocks")
    ap.add_argument("--model", choices=list(HEADS), default="llama-3.1-8b")
    ap.add_argument(
        "--l2-mib",
        type=int,
        default=L2_SECTION_BYTES >> 20,
        help="L2 section of the tile order, MiB (the planner's default; 0: plain LPT)",
    )
    ap.add_argument(
        "--tail-sections",
        type=int,
        default=1,
        help="the last N L2 sections as one LPT stretch (the planner's tail_sections)",
    )
    args = ap.parse_args()
    kv_heads, tokens, tile_n, kv_bytes = HEADS[args.model]
    section = args.l2_mib << 20 or None
    print(
        f"makespan / mean CTA load, {args.model} heads, {args.sms} SMs, L2 sections "
        f"{args.l2_mib or 'none'} MiB (the last {args.tail_sections} as one), "
        f"+{args.overhead} block per tile"
    )
    print(f"{'case':<18} {'tiles':>6} {'stride':>8} {'greedy':>8} {'ahead':>8}")
    for name, (q, k) in CASES.items():
        tiles = build_work_tiles(
            np.array(q),
            np.array(k),
            kv_heads,
            tokens,
            tile_n,
            kv_bytes_per_token=kv_bytes,
            l2_section_bytes=section,
            tail_sections=args.tail_sections,
        ).reshape(-1, 4)
        r = balance(tiles[:, 3].astype(float) + args.overhead, args.sms)
        print(f"{name:<18} {len(tiles):>6} {r['stride']:8.3f} {r['greedy']:8.3f} {r['ahead']:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
