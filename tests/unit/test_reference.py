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


@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
def test_matches_naive_float64(page_size):
    # GQA 4, a chunk after a prefix, a fresh prefill, q_len 0, a single-token chunk.
    specs = [(5, 40), (0, 7), (17, 17), (1, 130), (33, 100)]
    case = make_paged_case(specs, 8, 2, 32, page_size, torch.float32, "cpu", seed=page_size)
    out, lse = case.reference()
    ref_out, ref_lse = _naive_features(case)  # no window, cap or sinks: plain causal
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


# --- model features (issue 11): sliding window, logit soft cap, attention sinks ---------------


def _naive_features(case, window_left=None, softcap=None, sinks=None):
    """Dense float64 attention per request and head, written independently of the reference:
    full [q_len, k_len] scores, a boolean mask, and torch.softmax over the scores with the
    sink appended as one more column (dropped before P·V). out [total_q, Hq, D], lse [Hq, T]."""
    hq, hkv = case.num_q_heads, case.num_kv_heads
    out = torch.zeros(case.num_tokens, hq, case.head_dim, dtype=torch.float64)
    lse = torch.full((hq, case.num_tokens), -math.inf, dtype=torch.float64)
    cu = case.query_start_loc_cpu.tolist()
    for b, (q_len, k_len) in enumerate(case.specs):
        if q_len == 0:
            continue
        k, v = (x.double() for x in _dense_kv(case, b))
        i = torch.arange(q_len)[:, None] + (k_len - q_len)  # key position of each query row
        t = torch.arange(k_len)[None, :]
        mask = t <= i
        if window_left is not None:
            mask &= t >= i - window_left
        for h in range(hq):
            kh, vh = k[:, h // (hq // hkv)], v[:, h // (hq // hkv)]
            s = (case.q[cu[b] : cu[b + 1], h].double() @ kh.T) * case.softmax_scale
            if softcap is not None:
                s = softcap * torch.tanh(s / softcap)
            s = s.masked_fill(~mask, -math.inf)
            sink_col = torch.full((q_len, 1), -math.inf, dtype=torch.float64)
            if sinks is not None:
                sink_col.fill_(float(sinks[h]))
            full = torch.cat([s, sink_col], dim=1)
            p = torch.softmax(full, dim=1)[:, :k_len]
            out[cu[b] : cu[b + 1], h] = p @ vh
            lse[h, cu[b] : cu[b + 1]] = torch.logsumexp(full, dim=1)
    return out, lse


# GQA 4; chunks after a prefix, a fresh prefill, q_len 0, a single-token chunk; partial pages.
FEATURE_SPECS = [(5, 40), (0, 7), (17, 17), (1, 130), (33, 100), (60, 61)]
FEATURES = {
    "window": dict(window_left=13),
    "window_page": dict(window_left=16),
    "softcap": dict(softcap=2.0),
    "sinks": dict(sinks=True),
    "window_softcap": dict(window_left=9, softcap=1.5),
    "window_sinks": dict(window_left=20, sinks=True),
    "softcap_sinks": dict(softcap=3.0, sinks=True),
    "all": dict(window_left=31, softcap=1.0, sinks=True),
    "window0_sinks": dict(window_left=0, sinks=True),
}


@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("name", list(FEATURES))
def test_features_match_naive_float64(name, page_size):
    features = FEATURES[name]
    case = make_paged_case(
        FEATURE_SPECS, 8, 2, 32, page_size, torch.float32, "cpu", seed=7, **features
    )
    assert torch.isnan(case.kv_cache).any(), "unused slots must be poisoned"
    assert case.block_table[3, :9].tolist() != sorted(case.block_table[3, :9].tolist())
    out, lse = case.reference(compute_dtype=torch.float64)
    ref_out, ref_lse = _naive_features(case, case.window_left, case.softcap, case.sinks)
    assert out.dtype == lse.dtype == torch.float64
    torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(lse, ref_lse, atol=1e-10, rtol=1e-10)
    # the fp32 ground truth agrees too, and every feature changes the result
    out32, lse32 = case.reference()
    torch.testing.assert_close(out32.double(), ref_out, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse32.double(), ref_lse, atol=2e-5, rtol=2e-5)
    plain, _ = case.reference(window_left=None, softcap=None, sinks=None)
    assert (plain - out32).abs().max() > 1e-3


def test_features_with_wider_gqa_and_odd_groups():
    specs = [(70, 300), (45, 45), (3, 129)]
    for hq, hkv in ((12, 4), (8, 1), (6, 6)):
        case = make_paged_case(
            specs, hq, hkv, 16, 32, torch.float32, "cpu", seed=hq, window_left=50, sinks=True
        )
        out, lse = case.reference(compute_dtype=torch.float64)
        ref_out, ref_lse = _naive_features(case, 50, None, case.sinks)
        torch.testing.assert_close(out, ref_out, atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(lse, ref_lse, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("extra", [0, 1, 1000])
def test_window_covering_the_context_is_no_window(extra):
    case = make_paged_case(FEATURE_SPECS, 8, 2, 32, 16, torch.float32, "cpu", seed=1)
    full, full_lse = case.reference()
    # max k_len - 1 is the widest window that can still matter: row i sees [i - w, i]
    w = case.max_seqlen_k - 1 + extra
    windowed, windowed_lse = case.reference(window_left=w)
    assert torch.equal(windowed, full) and torch.equal(windowed_lse, full_lse)
    narrower, _ = case.reference(window_left=case.max_seqlen_k - 2)
    assert not torch.equal(narrower, full)


@pytest.mark.parametrize("softcap", [None, 0.5])
def test_window_zero_sees_only_the_diagonal_key(softcap):
    case = make_paged_case(FEATURE_SPECS, 8, 2, 32, 16, torch.float32, "cpu", seed=2)
    out, lse = case.reference(compute_dtype=torch.float64, window_left=0, softcap=softcap)
    cu = case.query_start_loc_cpu.tolist()
    for b, (q_len, k_len) in enumerate(case.specs):
        k, v = (x.double() for x in _dense_kv(case, b))
        for j in range(q_len):
            diag = k_len - q_len + j
            for h in range(8):
                torch.testing.assert_close(out[cu[b] + j, h], v[diag, h // 4])
                s = float(case.q[cu[b] + j, h].double() @ k[diag, h // 4]) * case.softmax_scale
                if softcap is not None:
                    s = softcap * math.tanh(s / softcap)
                assert lse[h, cu[b] + j].item() == pytest.approx(s, abs=1e-12)


@pytest.mark.parametrize("big", [60.0, 1000.0])  # 1000: exp(sink) overflows unless shifted
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_huge_sinks_swallow_the_row_and_tiny_sinks_vanish(dtype, big):
    case = make_paged_case(FEATURE_SPECS, 8, 2, 32, 16, torch.float32, "cpu", seed=3)
    out, lse = case.reference(compute_dtype=dtype, sinks=torch.full((8,), big))
    assert out.abs().max() < 1e-15  # scores are O(1): exp(s - big) vanishes
    torch.testing.assert_close(lse, torch.full_like(lse, big))
    plain, plain_lse = case.reference(compute_dtype=dtype)
    tiny, tiny_lse = case.reference(compute_dtype=dtype, sinks=torch.full((8,), -1e4))
    torch.testing.assert_close(tiny, plain, atol=0, rtol=0)
    torch.testing.assert_close(tiny_lse, plain_lse, atol=0, rtol=0)
    # one head's sink dominates, the others' do not touch their rows
    mixed = torch.full((8,), -1e4)
    mixed[5] = big
    out, lse = case.reference(compute_dtype=dtype, sinks=mixed)
    assert out[:, 5].abs().max() < 1e-15 and (lse[5] == big).all()
    keep = [h for h in range(8) if h != 5]
    assert torch.equal(out[:, keep], plain[:, keep])


def test_sink_adds_its_exp_to_the_denominator():
    """out_with_sink = out_without * Z / (Z + exp(sink)), lse = logaddexp(lse_plain, sink)."""
    case = make_paged_case(FEATURE_SPECS, 8, 2, 32, 16, torch.float32, "cpu", seed=4)
    plain, plain_lse = case.reference(compute_dtype=torch.float64, window_left=7)
    sinks = torch.linspace(-2, 4, 8)
    out, lse = case.reference(compute_dtype=torch.float64, window_left=7, sinks=sinks)
    expect_lse = torch.logaddexp(plain_lse, sinks.double()[:, None])
    torch.testing.assert_close(lse, expect_lse, atol=1e-12, rtol=1e-12)
    ratio = torch.exp(plain_lse - expect_lse).T[..., None]  # [T, Hq, 1]
    torch.testing.assert_close(out, plain * ratio, atol=1e-12, rtol=1e-12)


def _check_empty_rows(case, cu, seqused, q, sinks):
    for window_left in (None, 0, 1):
        out, lse = paged_attention_reference(
            q,
            case.k_cache,
            case.v_cache,
            cu,
            seqused,
            case.page_table,
            0.25,
            window_left=window_left,
            sinks=sinks,
        )
        empty = [0, 1, 4, 5]
        assert torch.equal(out[empty], torch.zeros(4, 2, 16))
        assert torch.equal(lse[:, empty], sinks[:, None].expand(2, 4))
        assert torch.isneginf(lse[:, 6]).all() and torch.equal(out[6], torch.zeros(2, 16))
        assert (lse[:, 2:4] >= sinks[:, None]).all()  # a key joined the sink
        assert torch.isfinite(out).all()


def test_rows_without_a_key_with_sinks_are_zero_and_the_sink():
    # q_len 4 > k_len 2: rows 0 and 1 see no key; request 1 has k_len 0 (all rows empty).
    case = make_paged_case([(2, 2), (3, 5)], 2, 1, 16, 16, torch.float32, "cpu")
    cu = torch.tensor([0, 4, 6], dtype=torch.int32)
    seqused = torch.tensor([2, 0], dtype=torch.int32)
    q = torch.randn(7, 2, 16)  # row 6 belongs to no request
    for sinks in (torch.tensor([1.5, -0.5]), torch.tensor([1000.0, -1000.0])):
        _check_empty_rows(case, cu, seqused, q, sinks)
    sinks = torch.tensor([1.5, -0.5])
    # row 2 sees only key 0 (causal): out = V[0] * e^s / (e^s + e^sink)
    out, lse = paged_attention_reference(
        q, case.k_cache, case.v_cache, cu, seqused, case.page_table, 0.25, sinks=sinks
    )
    blk = int(case.block_table[0, 0])
    s = (q[2] * case.k_cache[blk, 0]).sum(-1) * 0.25  # [2]
    weight = torch.exp(s) / (torch.exp(s) + torch.exp(sinks))
    torch.testing.assert_close(out[2], case.v_cache[blk, 0] * weight[:, None])
    torch.testing.assert_close(lse[:, 2], torch.logaddexp(s, sinks))


def test_chunking_is_invisible_with_features(monkeypatch):
    import vllm_fa4.paged_prefill.reference as reference

    features = dict(window_left=11, softcap=2.5, sinks=True)
    case = make_paged_case(
        [(50, 90), (7, 7), (40, 300)], 4, 2, 16, 16, torch.float32, "cpu", **features
    )
    full, full_lse = case.reference()
    monkeypatch.setattr(reference, "_MAX_ROWS_PER_CHUNK", 3)
    chunked, chunked_lse = case.reference()
    torch.testing.assert_close(chunked, full, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(chunked_lse, full_lse, atol=1e-6, rtol=1e-6)
    monkeypatch.setattr(reference, "_MAX_ROWS_PER_CHUNK", 1024)
    monkeypatch.setattr(reference, "_SCORE_BYTES_BUDGET", 1)  # one row per chunk
    one_row, one_row_lse = case.reference()
    torch.testing.assert_close(one_row, full, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(one_row_lse, full_lse, atol=1e-6, rtol=1e-6)


def test_window_chunks_stay_within_the_score_budget(monkeypatch):
    """A long context with a small window reads only the window's keys per chunk: with a
    budget too small for the whole context the rows per chunk still come from the window."""
    import vllm_fa4.paged_prefill.reference as reference

    seen = []
    real_matmul = torch.matmul

    def spy(a, b):
        seen.append(a.shape[-2] * b.shape[-1])
        return real_matmul(a, b)

    case = make_paged_case([(64, 4096)], 4, 2, 16, 64, torch.float32, "cpu", window_left=31)
    full, _ = case.reference()
    # A budget for exactly 64 rows of fp32 scores over the window's 31 + 64 keys (4 heads);
    # sized by the 4096-key context it would allow one row per chunk.
    monkeypatch.setattr(reference, "_MAX_ROWS_PER_CHUNK", 64)
    monkeypatch.setattr(reference, "_SCORE_BYTES_BUDGET", 4 * (31 + 64) * 4 * 64)
    monkeypatch.setattr(reference.torch, "matmul", spy)
    out, _ = case.reference()
    torch.testing.assert_close(out, full, atol=1e-6, rtol=1e-6)
    # one chunk (Q K^T and P V): 2 GQA heads x 64 rows x (31 + 64) keys, not 4096 keys
    assert len(seen) == 2 and seen[0] == 2 * 64 * (31 + 64)


def test_bf16_variant_with_features_is_low_precision_but_close():
    features = dict(window_left=24, softcap=1.5, sinks=True)
    case = make_paged_case([(40, 100), (64, 64)], 8, 2, 64, 16, torch.bfloat16, "cpu", **features)
    ref, ref_lse = case.reference()
    lowp, lse = case.reference(compute_dtype=torch.bfloat16)
    assert lowp.dtype == torch.bfloat16 and lse.dtype == torch.float32
    err = (lowp.float() - ref).abs().max().item()
    assert 0 < err < 5e-2
    torch.testing.assert_close(lse, ref_lse, atol=5e-2, rtol=1e-2)


def test_feature_argument_errors():
    case = make_paged_case([(4, 9)], 4, 2, 16, 16, torch.float32, "cpu")
    with pytest.raises(ValueError, match="window_left"):
        case.reference(window_left=-1)
    with pytest.raises(ValueError, match="softcap"):
        case.reference(softcap=0.0)
    with pytest.raises(ValueError, match="sinks"):
        case.reference(sinks=torch.zeros(2))
