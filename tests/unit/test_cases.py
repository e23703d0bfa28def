"""Invariants of the vLLM-shaped paged test cases."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from vllm_fa4.testing.cases import PagedCase, make_paged_case

SPECS = [(5, 40), (0, 7), (17, 17), (1, 130), (33, 100)]


def _case(**kw) -> PagedCase:
    args = dict(
        specs=SPECS,
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=32,
        page_size=16,
        dtype=torch.bfloat16,
        device="cpu",
        seed=3,
    )
    args.update(kw)
    return make_paged_case(**args)


def test_shapes_and_metadata():
    c = _case()
    total_q = sum(s[0] for s in SPECS)
    assert c.q.shape == (total_q, 8, 32) and c.q.dtype == torch.bfloat16
    assert c.kv_cache.shape[1:] == (16, 2, 64)
    assert c.kv_cache_vllm.shape == (c.num_blocks, 2, 16, 64)
    assert c.cu_seqlens_q.tolist() == [0, 5, 5, 22, 23, 56]
    assert c.seqused_k.tolist() == [40, 7, 17, 130, 100]
    assert c.cu_seqlens_q.dtype == c.seqused_k.dtype == c.page_table.dtype == torch.int32
    assert torch.equal(c.query_start_loc_cpu, c.cu_seqlens_q.cpu())
    assert torch.equal(c.seq_lens_cpu, c.seqused_k.cpu())
    assert c.page_table is c.block_table
    assert c.page_table.shape[0] == 5 and c.page_table.shape[1] > 9  # 130/16 -> 9 + slack
    assert c.softmax_scale == 32**-0.5
    assert c.max_seqlen_q == 33 and c.max_seqlen_k == 130


def test_q_is_a_noncontiguous_view():
    c = _case()
    assert not c.q.is_contiguous()
    assert c.q.stride(2) == 1 and c.q.stride(1) == 32 and c.q.stride(0) > 8 * 32


def test_k_v_are_views_of_the_packed_cache():
    c = _case()
    assert c.k_cache.data_ptr() == c.kv_cache.data_ptr()
    assert c.v_cache.data_ptr() == c.kv_cache.data_ptr() + 32 * c.kv_cache.element_size()
    assert c.k_cache.stride() == (16 * 2 * 64, 2 * 64, 64, 1)


def test_block_ids_null_block_and_permutation():
    c = _case()
    pages = [-(-k // 16) for _, k in SPECS]
    used = []
    for b, n in enumerate(pages):
        row = c.block_table[b].tolist()
        assert all(x > 0 for x in row[:n]), "request blocks must avoid the null block 0"
        assert all(x == 0 for x in row[n:]), "unused table entries must be the null block"
        used += row[:n]
    assert len(set(used)) == len(used) == sum(pages)
    assert used != sorted(used), "block ids should be permuted"
    assert c.num_blocks > 1 + sum(pages), "spare blocks expected"


def test_unused_slots_are_nan_and_used_slots_are_finite():
    c = _case()
    flat = c.kv_cache.view(-1, 2, 64).float()
    used = torch.zeros(flat.shape[0], dtype=torch.bool)
    for b, (_, k_len) in enumerate(SPECS):
        for t in range(k_len):
            used[int(c.block_table[b, t // 16]) * 16 + t % 16] = True
    assert torch.isfinite(flat[used]).all()
    assert torch.isnan(flat[~used]).all()
    assert torch.isnan(c.kv_cache[0]).all(), "null block must be poisoned"
    # partial last page: request 0 has 40 keys -> slots 8..15 of its 3rd page are NaN
    last = int(c.block_table[0, 2])
    assert torch.isfinite(c.kv_cache[last, :8].float()).all()
    assert torch.isnan(c.kv_cache[last, 8:].float()).all()


def test_no_poison_option_and_slot_mapping():
    c = _case(poison_unused=False, extra_blocks=0)
    assert torch.isfinite(c.kv_cache.float()).all()
    assert c.num_blocks == 1 + sum(-(-k // 16) for _, k in SPECS)
    # slot_mapping: cache slot of each new (query) token = the last q_len keys of its request
    assert c.slot_mapping.shape == (c.num_tokens,)
    t = 40 - 5  # first new token of request 0
    assert int(c.slot_mapping[0]) == int(c.block_table[0, t // 16]) * 16 + t % 16


def test_seed_is_deterministic_and_new_out_is_poisoned():
    a, b = _case(seed=7), _case(seed=7)
    assert torch.equal(a.q, b.q) and torch.equal(a.block_table, b.block_table)
    assert torch.isnan(a.new_out()).all() and a.new_out().shape == a.q.shape


def test_features_ride_along_key_plan_reference():
    plain = _case()
    c = _case(window_left=12, softcap=2.0, sinks=True)
    assert (c.window_left, c.softcap) == (12, 2.0)
    key = c.key
    assert key.sliding_window and key.softcap and key.sinks
    assert not (plain.key.sliding_window or plain.key.softcap or plain.key.sinks)
    assert plain.window_left is None and plain.softcap is None and plain.sinks is None
    # the features add nothing to the tensors every case draws
    assert torch.equal(c.q, plain.q) and torch.equal(c.block_table, plain.block_table)
    assert torch.equal(c.kv_cache.nan_to_num(0.0), plain.kv_cache.nan_to_num(0.0))
    # sinks: seeded [Hq] float32 on the case's device, in [-2, 4], exact in bf16 (FA3's s_aux)
    s = c.sinks
    assert s.shape == (8,) and s.dtype == torch.float32 and s.device == c.q.device
    assert (s >= -2).all() and (s <= 4).all() and len(set(s.tolist())) > 4
    assert torch.equal(s.to(torch.bfloat16).float(), s)
    assert torch.equal(_case(sinks=True).sinks, s) and not torch.equal(
        _case(seed=4, sinks=True).sinks, s
    )
    # the plan takes the window (and its key); options still override
    plan = c.plan()
    assert plan.window_left == 12 and plan.key == key
    assert plan.total_work <= plain.plan().total_work
    # the reference uses all three; kwargs override them
    out, lse = c.reference()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    bare, bare_lse = c.reference(window_left=None, softcap=None, sinks=None)
    ref, ref_lse = plain.reference()
    assert torch.equal(bare, ref) and torch.equal(bare_lse, ref_lse)
    assert (out - ref).abs().max() > 1e-2
    assert c.features == dict(window_left=12, softcap=2.0, sinks=c.sinks)


def test_feature_arguments_are_checked():
    with pytest.raises(ValueError, match="window_left"):
        _case(window_left=-1)
    with pytest.raises(ValueError, match="softcap"):
        _case(softcap=0.0)


def test_fa3_gets_the_features_in_its_spelling(monkeypatch):
    """FA3 cannot run here; a stand-in for vllm.vllm_flash_attn records the arguments."""
    calls = []
    fake = types.ModuleType("vllm.vllm_flash_attn")
    fake.flash_attn_varlen_func = lambda *args, **kwargs: calls.append(kwargs)
    monkeypatch.setitem(sys.modules, "vllm.vllm_flash_attn", fake)

    plain = _case()
    plain.fa3(plain.new_out())
    assert calls[-1]["causal"] is True and calls[-1]["fa_version"] == 3
    assert not {"window_size", "softcap", "s_aux"} & calls[-1].keys()

    c = _case(window_left=5, softcap=30.0, sinks=True)
    c.fa3(c.new_out())
    kw = calls[-1]
    assert kw["window_size"] == [5, 0] and kw["causal"] is True
    assert kw["softcap"] == 30.0
    s_aux = kw["s_aux"]
    assert s_aux.dtype == torch.bfloat16 and s_aux.is_contiguous()  # FA3: bf16 [Hq] only
    assert torch.equal(s_aux.float(), c.sinks)


@pytest.mark.parametrize(
    "layout",
    [dict(block_pad=8), dict(block_pad=200), dict(layers=3, layer=0), dict(layers=4, layer=3)],
)
def test_padded_and_cross_layer_layouts(layout):
    """Same values as the contiguous case, through a wider block stride; the pad and the
    other layers' pages are NaN; FA3's NaN-free copy (kv_view) has the same strides."""
    from vllm_fa4.paged_prefill import split_kv_cache

    plain, c = _case(), _case(**layout)
    page = 16 * 2 * 64
    pad, layers, layer = layout.get("block_pad", 0), layout.get("layers", 1), layout.get("layer", 0)
    assert c.block_stride == layers * page + pad
    assert c.kv_cache.stride()[1:] == plain.kv_cache.stride()[1:]
    assert c.kv_cache.storage_offset() == layer * page
    assert c.kv_buffer.numel() == c.num_blocks * c.block_stride
    assert c.kv_cache.data_ptr() == c.kv_buffer.data_ptr() + layer * page * 2
    assert c.page_size_padded == (None if not pad else (page + pad) * 2)
    assert _bits(c.kv_cache).equal(_bits(plain.kv_cache))  # NaN payloads included
    # everything outside the view is NaN: the pad and the other layers
    outside = torch.ones(c.kv_buffer.numel(), dtype=torch.bool)
    idx = torch.arange(c.kv_buffer.numel()).as_strided(
        c.kv_cache.shape, c.kv_cache.stride(), c.kv_cache.storage_offset()
    )
    outside[idx.flatten()] = False
    assert outside.sum() == c.kv_buffer.numel() - c.kv_cache.numel()
    assert torch.isnan(c.kv_buffer[outside].float()).all()
    # vLLM's view of it splits into the case's K/V views (the product reads what the case built)
    k, v = split_kv_cache(c.kv_cache_vllm, 32)
    assert k.stride() == c.k_cache.stride() and k.data_ptr() == c.k_cache.data_ptr()
    assert v.data_ptr() == c.v_cache.data_ptr()
    copy = c.kv_view(c.kv_buffer.clone())
    assert copy.stride() == c.kv_cache.stride() and _bits(copy).equal(_bits(c.kv_cache))
    blocks, offs = c.slot_index(c.slot_mapping)
    gathered = plain.kv_cache.view(-1, 2, 64)[c.slot_mapping]
    assert _bits(c.kv_cache[blocks, offs]).equal(_bits(gathered))
    out, lse = c.reference()
    ref, ref_lse = plain.reference()
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


def _bits(t):
    return t.contiguous().view(torch.int16)


def test_layout_arguments_are_checked():
    for bad in (dict(block_pad=-8), dict(layers=9), dict(layers=2, layer=2), dict(table_slack=-1)):
        with pytest.raises(ValueError):
            _case(**bad)


def test_table_slack_and_junk_entries():
    plain = _case()
    pages = [-(-k // 16) for _, k in SPECS]
    tight = _case(table_slack=0)
    assert tight.block_table.shape[1] == max(pages)
    assert torch.equal(tight.block_table, plain.block_table[:, : max(pages)])
    junk = _case(junk_table=True)
    assert junk.block_table.shape == plain.block_table.shape
    used = torch.zeros_like(plain.block_table, dtype=torch.bool)
    for b, n in enumerate(pages):
        used[b, :n] = True
    assert torch.equal(junk.block_table[used], plain.block_table[used])
    entries = junk.block_table[~used]
    past = entries >= junk.num_blocks
    assert past.any() and (~past).any(), "both kinds of junk expected"
    # the in-range junk points at NaN blocks only: the null block or spare ones
    for blk in entries[~past].tolist():
        assert torch.isnan(junk.kv_cache[blk].float()).all()
    # the junk moves nothing else, and nothing reads it
    assert _bits(junk.kv_cache).equal(_bits(plain.kv_cache)) and torch.equal(junk.q, plain.q)
    assert torch.equal(junk.slot_mapping, plain.slot_mapping)
    assert torch.equal(junk.reference()[0], plain.reference()[0])
    with_sinks = _case(junk_table=True, sinks=True)
    assert torch.equal(with_sinks.sinks, _case(sinks=True).sinks)
    # for FA3: the ids past the cache become the null block, the rest stays
    within = junk.table_within_cache()
    assert torch.equal(within[used], plain.block_table[used])
    unused = within[~used]
    assert bool((within < junk.num_blocks).all()) and torch.equal(unused[~past], entries[~past])
    assert torch.equal(unused[past], torch.zeros_like(entries[past]))
    # vLLM's stale entries are in range: without junk_past_cache, NaN blocks only
    in_range = _case(junk_table=True, junk_past_cache=False)
    assert bool((in_range.block_table < in_range.num_blocks).all())
    assert not torch.equal(in_range.block_table, plain.block_table)
