"""plan_prefill: fields and the LPT work list (CPU)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from vllm_fa4.kernels.config import KernelConfig, KernelKey, TileGeometry, tile_geometry
from vllm_fa4.paged_prefill import PrefillPlan, plan_prefill
from vllm_fa4.paged_prefill.policy import ServingConfigs, serving_configs


def _plan(
    specs, hq=32, hkv=8, d=128, page=16, dtype=torch.bfloat16, config=None, **options
) -> PrefillPlan:
    """plan_prefill of ``specs``; ``config``: one KernelConfig for every batch, or the
    ServingConfigs to pick from (None: the key's serving configs)."""
    q_lens = [s[0] for s in specs]
    k_lens = [s[1] for s in specs]
    cu = torch.zeros(len(specs) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int64), 0).to(torch.int32)
    seq = torch.tensor(k_lens, dtype=torch.int32)
    pages = max([math.ceil(k / page) for k in k_lens], default=0) + 1
    table = torch.zeros(len(specs), pages, dtype=torch.int32)
    key = KernelKey.for_layer(
        dtype, d, page, hq, hkv, sliding_window=options.get("window_left") is not None
    )
    if not isinstance(config, ServingConfigs):
        config = serving_configs(key, config)
    return plan_prefill(
        cu,
        seq,
        key=key,
        configs=config,
        num_kv_heads=hkv,
        cu_seqlens_q=cu.clone(),
        seqused_k=seq.clone(),
        page_table=table,
        **options,
    )


def _brute_force(specs, hkv, d, qpk, mma_wgs=2, geometry=None):
    """Every work tile's K/V tile count; ``geometry``: the plan's (else the key's default)."""
    geometry = geometry or tile_geometry(KernelKey("bfloat16", d, 16, qpk), mma_wgs)
    tpt, tile_n = geometry.tokens_per_tile, geometry.tile_n
    tiles = {}
    for b, (q_len, k_len) in enumerate(specs):
        ctx = k_len - q_len
        for h in range(hkv):
            for m in range(math.ceil(q_len / tpt)):
                last = min((m + 1) * tpt, q_len) - 1
                tiles[(b, h, m)] = math.ceil(min(k_len, ctx + last + 1) / tile_n)
    return tiles


SPECS = [(5, 40), (0, 7), (300, 300), (1, 130), (700, 3000), (129, 129), (64, 5000)]


@pytest.mark.parametrize(
    "hq,hkv,d", [(32, 8, 128), (24, 8, 128), (8, 8, 64), (16, 2, 256), (32, 1, 128)]
)
def test_work_list_is_brute_force_lpt(hq, hkv, d):
    plan = _plan(SPECS, hq, hkv, d, l2_section_bytes=None)
    rows = plan.work_tiles_cpu.tolist()
    expect = _brute_force(SPECS, hkv, d, hq // hkv, geometry=plan.geometry)
    got = {(b, h, m): c for b, h, m, c in rows}
    assert len(got) == len(rows), "a tile appears twice"
    assert got == expect, "tiles or costs differ from the brute-force enumeration"
    costs = [r[3] for r in rows]
    assert costs == sorted(costs, reverse=True), "costs must be non-increasing"
    # ties keep (batch, kv_head, m_block) order
    for a, b in zip(rows, rows[1:]):
        if a[3] == b[3]:
            assert tuple(a[:3]) < tuple(b[:3])
    assert plan.num_tiles == len(rows) and plan.total_work == sum(costs)
    assert plan.args.work_tiles is plan.work_tiles_cpu or torch.equal(
        plan.args.work_tiles, plan.work_tiles_cpu
    )
    assert plan.args.work_tiles.dtype == torch.int32 and plan.args.work_tiles.shape == (
        len(rows),
        4,
    )


@pytest.mark.parametrize("hq,hkv", [(32, 8), (64, 8), (9, 3)])
def test_three_warpgroups_tile_192_rows(hq, hkv):
    """mma_wgs=3 (head dim 64): the plan tiles 192 packed rows, 192 // group tokens."""
    config = KernelConfig.parse("queue+overlap+mma_wgs=3")
    plan = _plan(SPECS, hq, hkv, 64, config=config, l2_section_bytes=None)
    group = hq // hkv
    assert plan.geometry == TileGeometry(192, 128, 192 // group)
    assert plan.config == config
    got = {(b, h, m): c for b, h, m, c in plan.work_tiles_cpu.tolist()}
    assert got == _brute_force(SPECS, hkv, 64, group, mma_wgs=3)


def test_serving_configs_must_share_the_m_tile():
    two = KernelConfig.parse("queue+overlap")
    three = KernelConfig.parse("queue+overlap+mma_wgs=3")
    with pytest.raises(ValueError, match="differ in mma_wgs"):
        ServingConfigs(long=two, short=three)
    assert ServingConfigs(long=three, short=three).geometry(
        KernelKey("bfloat16", 64, 16, 4)
    ) == TileGeometry(192, 128, 48)


def test_a_short_pick_with_another_n_tile_is_tiled_again():
    """Configs may differ in block_n: the plan picks with the long config's tiles, and a
    short pick's work list is built again with its own N tile (costs and LPT order)."""
    from vllm_fa4.paged_prefill.plan import build_work_tiles

    long = KernelConfig.parse("queue+overlap_free+lazy_max+block_n=80")
    short = KernelConfig.parse("queue+overlap")
    configs = ServingConfigs(long=long, short=short)
    hq, hkv = 16, 8
    for specs, config, tile_n in (
        ([(4096, 4096)] * 2, long, 80),
        ([(512, 512)] * 8, short, 64),
    ):
        plan = _plan(specs, hq, hkv, 256, config=configs, l2_section_bytes=None)
        assert plan.config == config and plan.geometry.tile_n == tile_n
        q = np.array([s[0] for s in specs])
        k = np.array([s[1] for s in specs])
        want = build_work_tiles(q, k, hkv, plan.geometry.tokens_per_tile, tile_n)
        assert np.array_equal(plan.work_tiles_cpu.numpy(), want)
        assert plan.total_work == int(want[:, 3].sum())


def test_kv_multicast_pairs_each_tile_as_two_virtual_heads():
    """`kv_multicast`: tiles of half the group's heads (twice the tokens), each row twice in
    a row as virtual KV heads 2h and 2h + 1, in the unpaired list's order."""
    from vllm_fa4.paged_prefill.plan import build_work_tiles

    config = KernelConfig.parse("queue_with_work+pv_wait_mid+q_tma+v_warp+lazy_max+kv_multicast")
    configs = ServingConfigs(long=config, short=config)
    hq, hkv, specs = 32, 8, [(3000, 5000), (700, 700)]
    plan = _plan(specs, hq, hkv, 128, config=configs, l2_section_bytes=None)
    assert plan.geometry.tokens_per_tile == 64  # 128 rows of 2 heads
    single = build_work_tiles(np.array([3000, 700]), np.array([5000, 700]), hkv, 64, 128)
    rows = plan.work_tiles_cpu.numpy()
    assert plan.num_tiles == rows.shape[0] == 2 * single.shape[0]
    assert np.array_equal(rows[0::2, [0, 2, 3]], single[:, [0, 2, 3]])
    assert np.array_equal(rows[1::2, [0, 2, 3]], single[:, [0, 2, 3]])
    assert np.array_equal(rows[0::2, 1], 2 * single[:, 1])
    assert np.array_equal(rows[1::2, 1], 2 * single[:, 1] + 1)


def test_chunk_after_long_context_ranks_before_fresh_prefill():
    plan = _plan([(2048, 2048), (2048, 16384 + 2048)])
    rows = plan.work_tiles_cpu.tolist()
    first_fresh = next(i for i, r in enumerate(rows) if r[0] == 0)
    last_chunk = max(i for i, r in enumerate(rows) if r[0] == 1)
    assert last_chunk < first_fresh
    assert rows[0][0] == 1 and rows[0][3] == math.ceil(18432 / 128)


def test_tokens_per_tile_qpk3():
    # qpk 3 -> tpt = 128 // 3 = 42 tokens per M tile (126 of 128 rows used)
    plan = _plan([(100, 100)], hq=6, hkv=2, d=128)
    assert plan.geometry.tokens_per_tile == 42 and plan.key.qhead_per_kvhead == 3
    rows = sorted(plan.work_tiles_cpu.tolist())
    assert [r[2] for r in rows] == [0, 1, 2, 0, 1, 2]  # ceil(100 / 42) = 3 per kv head
    # last token of tile 0 is 41 -> 42 keys -> 1 KV tile; all tiles here need 1 KV tile
    assert {r[3] for r in rows} == {1}


def test_fields_hand_computed():
    # d 128, qpk 4 -> tpt 32, tile_n 128. Requests: (40, 300) and (0, 16) and (32, 32).
    plan = _plan([(40, 300), (0, 16), (32, 32)], hq=8, hkv=2, d=128, page=16)
    assert plan.key == KernelKey("bfloat16", 128, 16, 4, True)
    assert (plan.num_reqs, plan.num_tokens, plan.max_seqlen_q, plan.max_seqlen_k) == (
        3,
        72,
        40,
        300,
    )
    assert plan.geometry == TileGeometry(tile_m=128, tile_n=128, tokens_per_tile=32)
    # req 0: ctx 260; m0 covers tokens 0..31 -> 292 keys -> 3 tiles; m1 tokens 32..39 -> 300 -> 3
    # req 2: ctx 0; m0 tokens 0..31 -> 32 keys -> 1 tile
    assert plan.work_tiles_cpu.tolist() == [
        [0, 0, 0, 3],
        [0, 0, 1, 3],
        [0, 1, 0, 3],
        [0, 1, 1, 3],
        [2, 0, 0, 1],
        [2, 1, 0, 1],
    ]
    assert plan.num_tiles == 6 and plan.total_work == 14
    assert plan.num_q_heads == 8 and plan.key.dtype == "bfloat16"


def test_device_tensors_are_passed_through():
    cu = torch.tensor([0, 3], dtype=torch.int32)
    seq = torch.tensor([10], dtype=torch.int32)
    table = torch.zeros(4, 8, dtype=torch.int32)[1:2]  # a row view of a larger block table
    config = KernelConfig.parse("queue+serial")
    plan = plan_prefill(
        cu,
        seq,
        key=KernelKey("float16", 64, 16, 1),
        configs=serving_configs(KernelKey("float16", 64, 16, 1), config),
        num_kv_heads=4,
        cu_seqlens_q=cu,
        seqused_k=seq,
        page_table=table,
    )
    args = plan.args
    assert args.page_table is table and args.cu_seqlens_q is cu and args.seqused_k is seq
    assert plan.key.dtype == "float16" and plan.key.head_dim == 64 and plan.config is config


def test_empty_and_all_zero_q():
    plan = _plan([(0, 5), (0, 9)])
    assert plan.num_tiles == 0 and plan.num_tokens == 0 and plan.args.work_tiles.shape == (0, 4)


def test_planning_is_fast():
    big = [(131072, 131072)]
    tiny = [(i % 7 + 1, 200 + i) for i in range(500)]
    _plan(big), _plan(tiny)  # warm up
    for specs, n_tiles in ((big, 4096 * 8), (tiny, 500 * 8)):
        # The best of 5: a busy CI machine (xdist workers on 2 cores) can stall any one run;
        # what this guards against (work growing faster than the batch) slows every run.
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            plan = _plan(specs)
            times.append(time.perf_counter() - t0)
        assert plan.num_tiles == n_tiles
        dt = min(times)
        assert dt < 0.05, f"planning {len(specs)} requests took {dt * 1e3:.1f} ms (best of 5)"


def test_validation_errors():
    cu = torch.tensor([0, 3], dtype=torch.int32)
    seq = torch.tensor([10], dtype=torch.int32)
    table = torch.zeros(1, 1, dtype=torch.int32)
    kw = dict(
        key=KernelKey("bfloat16", 128, 16, 4),
        configs=serving_configs(KernelKey("bfloat16", 128, 16, 4)),
        num_kv_heads=2,
        cu_seqlens_q=cu,
        seqused_k=seq,
        page_table=table,
    )
    plan_prefill(cu, seq, **kw)  # valid
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        KernelKey.for_layer(torch.bfloat16, 128, 16, 8, 3)
    with pytest.raises(ValueError, match="num_kv_heads must be positive"):
        plan_prefill(cu, seq, **{**kw, "num_kv_heads": 0})
    with pytest.raises(ValueError, match="int32"):
        plan_prefill(cu.long(), seq, **kw)
    with pytest.raises(ValueError, match="start at 0"):
        plan_prefill(cu + 2, seq, **kw)
    with pytest.raises(ValueError, match="seq_len 2 < query length 3"):
        plan_prefill(cu, torch.tensor([2], dtype=torch.int32), **kw)
    with pytest.raises(ValueError, match="too few"):
        plan_prefill(cu, torch.tensor([17], dtype=torch.int32), **kw)
    with pytest.raises(ValueError, match="page_table must be"):
        plan_prefill(cu, seq, **{**kw, "page_table": torch.zeros(2, 1, dtype=torch.int32)})


def _pairs(rows):
    return [(r[0], r[1]) for r in rows]


@pytest.mark.parametrize(
    "specs",
    [
        [(16384, 16384)],
        [(8192, 8192)] * 2,
        [(2048, 2048 + 65536)],
        [(16384, 16384)] + [(512, 512)] * 31,
        [(5, 40), (0, 7), (300, 300), (64, 5000), (2048, 70000)],
    ],
)
def test_l2_sections_reorder_lpt_without_losing_a_tile(specs):
    """The L2-sectioned order holds exactly the LPT list's tiles; each section's K/V fits
    the budget (or is one pair), sections run longest pair first, LPT inside each."""
    from vllm_fa4.paged_prefill.plan import build_work_tiles

    q = [s[0] for s in specs]
    k = [s[1] for s in specs]
    hkv, per_token, budget = 8, 512, 16 << 20
    lpt = build_work_tiles(q, k, hkv, 32, 128)
    l2 = build_work_tiles(q, k, hkv, 32, 128, per_token, budget)
    assert sorted(map(tuple, lpt.tolist())) == sorted(map(tuple, l2.tolist()))
    # Cut the order where a new pair appears after its section's pairs are all seen: walk
    # and rebuild sections as maximal runs in which cost never rises.
    sections, current = [], [l2[0]]
    for row in l2[1:]:
        if row[3] > current[-1][3]:
            sections.append(current)
            current = []
        current.append(row)
    sections.append(current)
    seen = set()
    for rows in sections:
        pairs = set(_pairs(rows))
        assert not pairs & seen, "a pair's tiles are split across sections"
        seen |= pairs
        bytes_ = sum(k[b] * per_token for b, _ in pairs)
        assert len(pairs) == 1 or bytes_ <= budget + max(k) * per_token
    firsts = [max(r[3] for r in rows) for rows in sections]
    assert firsts == sorted(firsts, reverse=True)


def test_l2_sections_keep_fewer_pairs_in_flight():
    from vllm_fa4.paged_prefill.plan import build_work_tiles

    args = ([2048], [2048 + 65536], 8, 32, 128)
    lpt = build_work_tiles(*args)
    l2 = build_work_tiles(*args, 512, 16 << 20)
    assert len(set(_pairs(lpt[:132]))) == 8 and len(set(_pairs(l2[:132]))) <= 3


def test_tail_sections_merge_the_last_sections_into_one_lpt_stretch():
    """``tail_sections=N``: the same tiles; every section before the last N keeps its place,
    and the last N run as one stretch, longest tile first."""
    import numpy as np

    from vllm_fa4.paged_prefill.plan import build_work_tiles

    args = ([16384], [16384], 8, 64, 64, 1024, 16 << 20)  # Gemma-2-9B heads: 8 sections
    one = build_work_tiles(*args)
    two = build_work_tiles(*args, tail_sections=2)
    assert sorted(map(tuple, one.tolist())) == sorted(map(tuple, two.tolist()))
    tail = 2 * len(one) // 8  # one KV head a section, the same tile count each
    assert (one[:-tail] == two[:-tail]).all()
    assert (np.diff(two[-tail:, 3]) <= 0).all() and not (np.diff(one[-tail:, 3]) <= 0).all()
    assert len(set(_pairs(two[-tail:]))) == 2
    # more tail sections than sections: plain LPT over everything
    assert (np.diff(build_work_tiles(*args, tail_sections=99)[:, 3]) <= 0).all()


def test_plan_uses_sections_and_picks_the_config_per_batch():
    """The plan runs each key's long config on batches whose tiles visit more than
    short_max_blocks K/V tiles on average and its short one on the others, at every head dim
    and page regime (which configs those are is the policy's business, not the plan's)."""
    plan = _plan([(16384, 16384)], page=128)
    pair = 2 if plan.config.paired_heads else 1  # `kv_multicast`: virtual heads 2h, 2h + 1
    heads_first = {r[1] // pair for r in plan.work_tiles_cpu[:132].tolist()}
    assert len(heads_first) <= 2  # 8 MB of K/V per head, 16 MiB sections
    long_batches = ([(16384, 16384)], [(2048, 65536 + 2048)])
    short_batch = [(512, 512)] * 8  # tiles visit 1-4 K/V tiles
    picked_both = False
    for d in (64, 128, 256):
        for page in (16, 128):
            configs = serving_configs(KernelKey("bfloat16", d, page, 4))
            for specs in long_batches:
                plan = _plan(specs, d=d, page=page)
                assert plan.total_work > configs.short_max_blocks * plan.num_tiles
                assert plan.config == configs.long
            plan = _plan(short_batch, d=d, page=page)
            assert plan.config == configs.short
            # a short pick with another N tile is tiled again with its own (plan.py)
            assert plan.geometry == configs.short.geometry(plan.key)
            assert plan.geometry.tile_m == (192 if d == 64 else 128)
            picked_both |= configs.long != configs.short
    assert picked_both  # some key's batches really are picked between two configs


# --- sliding window (issue 11) -------------------------------------------------------------


def _brute_force_window(specs, hkv, d, qpk, window_left, mma_wgs=2, page=None, block_n=0):
    """Per tile, the set of K/V tiles holding a key that some row of the tile sees. With
    ``page`` below the K/V tile (and a window), the tile's grid starts at the page of its
    first row's leftmost key (config.grid_shift_keys), as the kernel's does."""
    geometry = tile_geometry(KernelKey("bfloat16", d, 16, qpk), mma_wgs, block_n)
    tpt, tile_n = geometry.tokens_per_tile, geometry.tile_n
    shift = page if page and window_left is not None and page < tile_n else 0
    tiles = {}
    for b, (q_len, k_len) in enumerate(specs):
        for m in range(math.ceil(q_len / tpt)):
            visited = set()
            first_lo = max(0, k_len - q_len + m * tpt - (window_left or 0))
            offset = (first_lo - first_lo % shift) % tile_n if shift else 0
            for j in range(m * tpt, min((m + 1) * tpt, q_len)):
                i = k_len - q_len + j  # the row's diagonal key
                lo = 0 if window_left is None else max(0, i - window_left)
                visited |= {(t - offset) // tile_n for t in range(lo, i + 1, 1)}
            for h in range(hkv):
                tiles[(b, h, m)] = len(visited)
    return tiles


@pytest.mark.parametrize("seed", range(6))
def test_windowed_costs_are_brute_force_counts(seed):
    import random

    rng = random.Random(seed)
    hq, hkv, d = rng.choice([(8, 2, 128), (6, 2, 128), (4, 4, 64), (4, 1, 256), (16, 2, 128)])
    page = rng.choice([16, 32, 64, 128])
    specs = []
    for _ in range(rng.randint(1, 6)):
        k_len = rng.randint(1, 1500)
        q_len = rng.choice([k_len, rng.randint(0, k_len), 1, min(k_len, rng.randint(1, 200))])
        specs.append((q_len, k_len))
    for window_left in (0, 1, rng.randint(0, 300), rng.randint(100, 2000), 127, 128):
        plan = _plan(specs, hq, hkv, d, page=page, window_left=window_left)
        rows = plan.work_tiles_cpu.tolist()
        got = {(b, h, m): c for b, h, m, c in rows}
        assert len(got) == len(rows)
        expect = _brute_force_window(
            specs,
            *(hkv, d, hq // hkv, window_left, plan.config.mma_wgs, page),
            plan.config.block_n,
        )
        assert got == expect, (
            specs,
            window_left,
        )
        costs = [r[3] for r in rows]
        assert costs == sorted(costs, reverse=True)  # LPT on the windowed costs
        assert plan.total_work == sum(costs) and plan.window_left == window_left


def test_build_work_tiles_window_matches_brute_force():
    from vllm_fa4.paged_prefill.plan import build_work_tiles

    specs = [(300, 300), (64, 5000), (1, 130), (0, 9), (700, 3000)]
    q, k = [s[0] for s in specs], [s[1] for s in specs]
    for window_left in (0, 40, 255, 1000):
        rows = build_work_tiles(q, k, 2, 32, 128, window_left=window_left)
        assert rows.dtype == np.int64
        got = {(b, h, m): c for b, h, m, c in rows.tolist()}
        assert got == _brute_force_window(specs, 2, 128, 4, window_left)
        # L2 sections hold the same tiles with the same costs
        l2 = build_work_tiles(q, k, 2, 32, 128, 512, 1 << 20, window_left=window_left)
        assert sorted(map(tuple, l2.tolist())) == sorted(map(tuple, rows.tolist()))


def test_window_wider_than_the_context_is_no_window():
    plain = _plan(SPECS)
    for window_left in (max(k for _, k in SPECS), max(k for _, k in SPECS) - 1, 10**9):
        windowed = _plan(SPECS, window_left=window_left)
        assert torch.equal(windowed.work_tiles_cpu, plain.work_tiles_cpu)
        assert windowed.total_work == plain.total_work
        # the config is picked per key (windowed keys have their own picks); the tiling is not
        assert windowed.geometry == plain.geometry
        assert windowed.config in serving_configs(windowed.key).all
        assert windowed.window_left == window_left and plain.window_left is None
    narrower = _plan(SPECS, window_left=max(k for _, k in SPECS) - 200)
    assert narrower.total_work < plain.total_work


def test_window_key_mismatch_and_bad_window_raise():
    cu = torch.tensor([0, 3], dtype=torch.int32)
    seq = torch.tensor([10], dtype=torch.int32)
    kw = dict(num_kv_heads=2, cu_seqlens_q=cu, seqused_k=seq, page_table=torch.zeros(1, 1).int())
    kw["configs"] = serving_configs(KernelKey("bfloat16", 128, 16, 4))
    plain = KernelKey("bfloat16", 128, 16, 4)
    windowed = KernelKey("bfloat16", 128, 16, 4, sliding_window=True)
    with pytest.raises(ValueError, match=r"key.sliding_window=False but window_left=5"):
        plan_prefill(cu, seq, key=plain, window_left=5, **kw)
    with pytest.raises(ValueError, match=r"key.sliding_window=True but window_left=None"):
        plan_prefill(cu, seq, key=windowed, **kw)
    with pytest.raises(ValueError, match="window_left must be an int >= 0"):
        plan_prefill(cu, seq, key=windowed, window_left=-1, **kw)
    assert plan_prefill(cu, seq, key=windowed, window_left=0, **kw).window_left == 0
    assert plan_prefill(cu, seq, key=plain, **kw).window_left is None


def test_window_makes_a_chunk_after_a_long_prefix_short_work():
    """A 2k chunk after a 128k prefix with a 4k window visits ~33 K/V tiles per tile, not
    ~1040; the per-batch config pick sees the windowed work."""
    specs = [(2048, 131072 + 2048)]
    plain = _plan(specs)
    windowed = _plan(specs, window_left=4095)  # vLLM sliding_window 4096
    assert windowed.num_tiles == plain.num_tiles == 64 * 8
    costs = windowed.work_tiles_cpu[:, 3]
    assert int(costs.max()) <= 34 and int(costs.min()) >= 32  # 4096 + 32 keys at tile_n 128
    assert int(plain.work_tiles_cpu[:, 3].min()) >= 1024
    assert windowed.total_work == int(costs.sum()) < plain.total_work // 30
    # the pick uses the windowed total ...
    key = windowed.key
    assert windowed.config == serving_configs(key).pick(windowed.num_tiles, windowed.total_work)
    a, b = KernelConfig.parse("queue+serial"), KernelConfig.parse("one_per_cta+overlap")
    configs = ServingConfigs(long=a, short=b, short_max_blocks=34)
    assert _plan(specs, config=configs, window_left=4095).config == b
    assert _plan(specs, config=configs).config == a
    # ... and with the default configs a 1k window is a short batch, no window a long one
    short = serving_configs(key).short
    assert _plan(specs, window_left=1023).config == short
    assert plain.config == serving_configs(plain.key).long != short
    # still planned quickly: a 128k fresh prefill with a window
    t0 = time.perf_counter()
    big = _plan([(131072, 131072)], window_left=4095)
    assert time.perf_counter() - t0 < 0.05 and int(big.work_tiles_cpu[:, 3].max()) <= 34


def test_head_dim_64_windows_pick_by_width():
    """Head dim 64 with a window (policy.TABLE): gpt-oss's 128-key window makes every batch
    short (two or three K/V tiles a work tile) and gets 64-key blocks; a 4k window makes long
    prompts long batches and keeps 128-key blocks (64-key ones lost 8-11 % there, session 12)."""
    gpt_oss = dict(hq=64, hkv=8, d=64)
    narrow = [(16384, 16384)], [(2048, 65536 + 2048)], [(512, 512)] * 32
    for page in (16, 128):
        for specs in narrow:
            plan = _plan(specs, page=page, window_left=127, **gpt_oss)
            assert plan.config == serving_configs(plan.key).short, specs
            assert plan.config.block_n == 64 and plan.geometry.tile_n == 64
        wide = _plan([(16384, 16384)], page=page, window_left=4095, **gpt_oss)
        assert wide.config == serving_configs(wide.key).long
        assert wide.config.block_n == 0 and wide.geometry.tile_n == 128


def test_windowed_grid_starts_at_the_first_keys_page():
    """Pages below the K/V tile: a windowed work tile's block grid starts at its leftmost
    key's page (config.grid_shift_keys). gpt-oss's 24-token tiles with a 128-key window span
    151 keys: 3 blocks of 64 from that page at page 16, against 3 or 4 from a multiple of 64
    (page 128 keeps the aligned grid: a block is one box inside a page)."""
    gpt_oss = dict(hq=64, hkv=8, d=64)
    specs = [(16384, 16384)]
    p16 = _plan(specs, page=16, window_left=127, **gpt_oss)
    p128 = _plan(specs, page=128, window_left=127, **gpt_oss)
    assert p16.geometry.tile_n == p128.geometry.tile_n == 64
    inner = p16.work_tiles_cpu[:, 2] >= 8  # tiles whose window is past the first key
    assert set(p16.work_tiles_cpu[inner, 3].tolist()) == {3}
    assert set(p128.work_tiles_cpu[p128.work_tiles_cpu[:, 2] >= 8, 3].tolist()) == {3, 4}
    assert p16.total_work < 0.93 * p128.total_work  # 7.6 % fewer blocks
