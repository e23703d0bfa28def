"""The PyTorch reference against dense SDPA and an explicit float64 computation (CPU)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vllm_fa4.paged_prefill.reference import paged_attention_reference
from vllm_fa4.testing.cases import make_paged_case


def _dense_kv(case, b):
    """Contiguous K/V [k_len, Hkv, D] of request b, gathered with Python loops."""
    k_len = case.specs[b][1]
    table = case.block_table[b].tolist()
    ks, vs = [], []
    for t in range(k_len):
        blk = table[t // case.page_size]
        ks.append(case.k_cache[blk, t % case.page_size])
        vs.append(case.v_cache[blk, t % case.page_size])
    return torch.stack(ks), torch.stack(vs)


def _float64_ref(case):
    """Explicit per-row float64 attention (loops over heads); out [total_q, Hq, D], lse."""
    hq, hkv = case.num_q_heads, case.num_kv_heads
    out = torch.zeros(case.num_tokens, hq, case.head_dim, dtype=torch.float64)
    lse = torch.full((hq, case.num_tokens), -math.inf, dtype=torch.float64)
    cu = case.query_start_loc_cpu.tolist()
    for b, (q_len, k_len) in enumerate(case.specs):
        if q_len == 0:
            continue
        k, v = (x.double() for x in _dense_kv(case, b))
        for h in range(hq):
            kh, vh = k[:, h // (hq // hkv)], v[:, h // (hq // hkv)]
            for j in range(q_len):
                n = k_len - q_len + j + 1
                s = (case.q[cu[b] + j, h].double() @ kh[:n].T) * case.softmax_scale
                p = torch.softmax(s, 0)
                out[cu[b] + j, h] = p @ vh[:n]
                lse[h, cu[b] + j] = torch.logsumexp(s, 0)
    return out, lse


@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
def test_matches_float64_loops(page_size):
    # GQA 4, a chunk after a prefix, a fresh prefill, q_len 0, a single-token chunk.
    specs = [(5, 40), (0, 7), (17, 17), (1, 130), (33, 100)]
    case = make_paged_case(specs, 8, 2, 32, page_size, torch.float32, "cpu", seed=page_size)
    out, lse = case.reference()
    ref_out, ref_lse = _float64_ref(case)
    assert out.dtype == torch.float32 and out.shape == case.q.shape
    assert lse.shape == (8, case.num_tokens)
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 1), (12, 4)])
def test_matches_sdpa_bottom_right_causal(hq, hkv):
    specs = [(37, 37), (20, 75), (3, 16)]
    case = make_paged_case(specs, hq, hkv, 64, 16, torch.float32, "cpu", seed=hq + hkv)
    out, _ = case.reference()
    cu = case.query_start_loc_cpu.tolist()
    for b, (q_len, k_len) in enumerate(specs):
        k, v = _dense_kv(case, b)
        q = case.q[cu[b] : cu[b + 1]].transpose(0, 1)  # [Hq, q_len, D]
        k = k.transpose(0, 1).repeat_interleave(hq // hkv, 0)
        v = v.transpose(0, 1).repeat_interleave(hq // hkv, 0)
        # bottom-right causal: query j sees keys <= k_len - q_len + j
        mask = torch.ones(q_len, k_len, dtype=torch.bool).tril(diagonal=k_len - q_len)
        expect = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.testing.assert_close(
            out[cu[b] : cu[b + 1]].transpose(0, 1), expect, atol=1e-5, rtol=1e-5
        )


def test_nan_poison_does_not_leak_and_cache_is_poisoned():
    case = make_paged_case([(9, 23), (16, 16)], 4, 2, 32, 16, torch.float32, "cpu")
    assert torch.isnan(case.kv_cache).any()
    out, lse = case.reference()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


def test_rows_without_visible_key_are_zero_and_neg_inf():
    # Hand-built: q_len 4 > k_len 2, so rows 0 and 1 see no key; request 2 has k_len 0.
    case = make_paged_case([(2, 2), (3, 5)], 2, 1, 16, 16, torch.float32, "cpu")
    cu = torch.tensor([0, 4, 4], dtype=torch.int32)
    seqused = torch.tensor([2, 0], dtype=torch.int32)
    q = torch.randn(4, 2, 16)
    out, lse = paged_attention_reference(
        q, case.k_cache, case.v_cache, cu, seqused, case.page_table, 0.25
    )
    assert torch.equal(out[:2], torch.zeros(2, 2, 16))
    assert torch.isneginf(lse[:, :2]).all()
    assert torch.isfinite(lse[:, 2:]).all() and out[2:].abs().sum() > 0
    # row 2 sees exactly key 0 -> its output is V[0]
    blk = int(case.block_table[0, 0])
    torch.testing.assert_close(out[2], case.v_cache[blk, 0].repeat(2, 1))


def test_chunking_is_invisible(monkeypatch):
    import vllm_fa4.paged_prefill.reference as reference

    case = make_paged_case([(50, 90), (7, 7)], 4, 2, 16, 16, torch.float32, "cpu")
    full, full_lse = case.reference()
    monkeypatch.setattr(reference, "_MAX_ROWS_PER_CHUNK", 3)
    chunked, chunked_lse = case.reference()
    torch.testing.assert_close(chunked, full, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(chunked_lse, full_lse, atol=1e-6, rtol=1e-6)


def test_bf16_variant_is_low_precision_but_close():
    case = make_paged_case([(40, 100), (64, 64)], 8, 2, 64, 16, torch.bfloat16, "cpu")
    ref, _ = case.reference()
    lowp, lse = case.reference(compute_dtype=torch.bfloat16)
    assert lowp.dtype == torch.bfloat16 and lse.dtype == torch.float32
    err = (lowp.float() - ref).abs().max().item()
    assert 0 < err < 5e-2  # really computed in bf16, and still right
