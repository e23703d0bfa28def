"""plan_prefill: fields and the LPT work list (CPU)."""

from __future__ import annotations

import math
import time

import pytest
import torch

from vllm_fa4.kernels.config import KernelKey, tile_shape, tokens_per_tile
from vllm_fa4.paged_prefill import PrefillPlan, plan_prefill


def _plan(specs, hq=32, hkv=8, d=128, page=16, dtype=torch.bfloat16) -> PrefillPlan:
    q_lens = [s[0] for s in specs]
    k_lens = [s[1] for s in specs]
    cu = torch.zeros(len(specs) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int64), 0).to(torch.int32)
    seq = torch.tensor(k_lens, dtype=torch.int32)
    pages = max([math.ceil(k / page) for k in k_lens], default=0) + 1
    table = torch.zeros(len(specs), pages, dtype=torch.int32)
    return plan_prefill(
        cu,
        seq,
        cu_seqlens_q=cu.clone(),
        seqused_k=seq.clone(),
        page_table=table,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        page_size=page,
        dtype=dtype,
        device="cpu",
    )


def _brute_force(specs, hkv, d, qpk):
    tpt = tokens_per_tile(d, qpk)
    tile_n = tile_shape(d)[1]
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
    plan = _plan(SPECS, hq, hkv, d)
    rows = plan.work_tiles_cpu.tolist()
    expect = _brute_force(SPECS, hkv, d, hq // hkv)
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
    assert plan.work_tiles is plan.work_tiles_cpu or torch.equal(
        plan.work_tiles, plan.work_tiles_cpu
    )
    assert plan.work_tiles.dtype == torch.int32 and plan.work_tiles.shape == (len(rows), 4)


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
    assert plan.tokens_per_tile == 42 and plan.key.qhead_per_kvhead == 3
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
    assert (plan.tile_m, plan.tile_n, plan.tokens_per_tile) == (128, 128, 32)
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
    assert plan.qhead_per_kvhead == 4 and plan.dtype == torch.bfloat16


def test_device_tensors_are_passed_through():
    cu = torch.tensor([0, 3], dtype=torch.int32)
    seq = torch.tensor([10], dtype=torch.int32)
    table = torch.zeros(4, 8, dtype=torch.int32)[1:2]  # a row view of a larger block table
    plan = plan_prefill(
        cu,
        seq,
        cu_seqlens_q=cu,
        seqused_k=seq,
        page_table=table,
        num_q_heads=4,
        num_kv_heads=4,
        head_dim=64,
        page_size=16,
        dtype=torch.float16,
        device="cpu",
    )
    assert plan.page_table is table and plan.cu_seqlens_q is cu and plan.seqused_k is seq
    assert plan.key.dtype == "float16" and plan.key.head_dim == 64


def test_empty_and_all_zero_q():
    plan = _plan([(0, 5), (0, 9)])
    assert plan.num_tiles == 0 and plan.num_tokens == 0 and plan.work_tiles.shape == (0, 4)


def test_planning_is_fast():
    big = [(131072, 131072)]
    tiny = [(i % 7 + 1, 200 + i) for i in range(500)]
    _plan(big), _plan(tiny)  # warm up
    for specs, n_tiles in ((big, 4096 * 8), (tiny, 500 * 8)):
        t0 = time.perf_counter()
        plan = _plan(specs)
        dt = time.perf_counter() - t0
        assert plan.num_tiles == n_tiles
        assert dt < 0.05, f"planning {len(specs)} requests took {dt * 1e3:.1f} ms"


def test_validation_errors():
    cu = torch.tensor([0, 3], dtype=torch.int32)
    seq = torch.tensor([10], dtype=torch.int32)
    table = torch.zeros(1, 1, dtype=torch.int32)
    kw = dict(
        cu_seqlens_q=cu,
        seqused_k=seq,
        page_table=table,
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=128,
        page_size=16,
        dtype=torch.bfloat16,
        device="cpu",
    )
    plan_prefill(cu, seq, **kw)  # valid
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        plan_prefill(cu, seq, **{**kw, "num_kv_heads": 3})
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
