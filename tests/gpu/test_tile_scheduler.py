"""Every work tile runs exactly once, under both tile schedulers: one CTA per tile, and the
persistent grid whose CTAs claim tiles from the atomic counter (tile_scheduler.TileQueue).

The configs: a hand list of scheduler variants, plus every config serving can pick
(``testing.variants.served_configs``: the serving picks of each head dim at pages 16 and 128,
with and without a window, with a 16-bit and an FP8 cache, run at that head dim, page, window
and cache dtype: an FP8 cache's converter warps walk the tiles too; tests/unit/test_variants.py
checks that these cover every supported key's picks).

The kernels are built with the test-only ``TileProbe.COUNT_VISITS`` probe (no spec sets it): after
a tile's epilogue one consumer thread adds 1 to the tile's cost column of ``work_tiles``, so
after a launch every row's cost must have grown by exactly 1. The outputs are checked against
the fp32 reference too (a skipped tile leaves NaN rows), and the tile counter must be back at
zero, so the next launch on the stream (the next layer) starts fresh; the second launch checks
that.
"""

import dataclasses

import pytest
import torch

from vllm_fa4.kernels.config import KernelConfig, TileProbe
from vllm_fa4.testing.variants import served_configs

pytestmark = pytest.mark.gpu

SCHEDULERS = [
    "one_per_cta+serial",
    "queue+serial",
    "queue+overlap",
    "queue+serial+q_prefetch",
    "queue+overlap+q_prefetch",
    # three consumer warpgroups (head dim 64 only): three turns, 192-row tiles
    "queue+overlap+q_prefetch+mma_wgs=3",
    # Q by the producer's TMA into a two-stage ring, a tile ahead of the consumers
    "queue+serial+q_tma",
    "queue+overlap+q_tma+lazy_max",
    # tiles handed over with their TileWork (the CTA's first tile through the queue too)
    "queue_with_work+serial+q_tma",
    "queue_with_work+overlap+q_tma+lazy_max",
    # V loads by a second producer warp that takes the tiles from the queue too
    "queue_with_work+serial+q_tma+v_warp",
    "queue_with_work+overlap+q_tma+v_warp+lazy_max",
]

WINDOW_LEFT = 300  # the window of the served configs picked for windowed keys


def _run_params():
    """(head dim, page, window_left, fp8 cache, config) per config: the hand list at head dim
    128 (64 for three warpgroups), page 16, no window, 16-bit cache; the served configs at
    their key's."""
    runs = []
    for spec in SCHEDULERS:
        config = KernelConfig.parse(spec)
        hd = 64 if config.mma_wgs == 3 else 128
        runs.append(pytest.param(hd, 16, None, False, config, id=spec))
    for key, config in served_configs():
        window = WINDOW_LEFT if key.sliding_window else None
        name = f"served-hd{key.head_dim}-page{key.page_size}{'-window' if window else ''}"
        name += "-fp8" if key.fp8_kv else ""
        values = (key.head_dim, key.page_size, window, key.fp8_kv, config)
        runs.append(pytest.param(*values, id=f"{name}-{config.spec}"))
    return runs


RUNS = _run_params()

# (specs, Hq, Hkv, num_ctas: None = min(tiles, SMs)); every shape's GQA group is 4, the
# representative keys' (testing.variants.representative_keys)
SHAPES = {
    # ~3000 one-block tiles: 132 CTAs hammer the counter
    "many_tiny": ([(1 + i % 7, 1 + i % 7 + (i * 37) % 60) for i in range(380)], 32, 8, None),
    # 8 tiles on 300 CTAs: most CTAs find the list exhausted before their first claim
    "more_ctas_than_tiles": ([(5, 5), (40, 100), (1, 17)], 8, 2, 300),
    "single_tile": ([(9, 30)], 4, 1, None),
    "single_tile_many_ctas": ([(9, 30)], 4, 1, 8),
    # long and short tiles mixed: the claim order must not depend on tile cost
    "mixed": ([(2048, 4096), (3, 3), (700, 700)] + [(17, 40)] * 40, 32, 8, None),
}


def _launch(plan, case, q, num_ctas):
    out = case.ours(plan, torch.full_like(q, float("nan")), q=q, num_ctas=num_ctas)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("head_dim,page,window_left,fp8_kv,config", RUNS)
def test_every_tile_runs_exactly_once(head_dim, page, window_left, fp8_kv, config, shape):
    from vllm_fa4.kernels import launch as kernel_launch
    from vllm_fa4.testing import cases, checks

    specs, hq, hkv, num_ctas = SHAPES[shape]
    config = dataclasses.replace(config, tile_probe=TileProbe.COUNT_VISITS)
    case = cases.make_paged_case(
        *(specs, hq, hkv, head_dim, page, torch.bfloat16, "cuda"),
        seed=3,
        window_left=window_left,
        fp8_kv=fp8_kv,
    )
    plan = case.plan(config)
    if not config.persistent:
        num_ctas = None  # one CTA per tile, whatever the test asks
    work = plan.args.work_tiles
    costs_before = work[:, 3].clone()

    ref, _ = case.reference(case.q)
    lowp, _ = case.reference(case.q, compute_dtype=torch.bfloat16)
    outs = []
    for launch in (1, 2):
        outs.append(_launch(plan, case, case.q, num_ctas))
        visits = (work[:, 3] - costs_before) / launch
        missed = (visits < 1).nonzero().flatten().tolist()
        repeated = (visits > 1).nonzero().flatten().tolist()
        assert not missed and not repeated, (
            f"launch {launch}: {len(missed)} tiles never ran (first {missed[:8]}), "
            f"{len(repeated)} ran more than once (first {repeated[:8]}) of {work.shape[0]}"
        )
        checks.assert_attention_close(outs[-1], ref, lowp, cu_seqlens_q=case.cu_seqlens_q)
        if config.persistent:
            counters = [c for (dev, _), c in kernel_launch._TILE_COUNTERS.items()]
            assert counters and all(int(c.abs().sum()) == 0 for c in counters), (
                "the tile counter was not reset by the last CTA"
            )
    assert torch.equal(outs[0], outs[1]), "reruns differ"
