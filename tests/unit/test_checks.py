"""The accuracy bar itself: it must pass good outputs and catch bad ones."""

from __future__ import annotations

import pytest
import torch

from vllm_fa4.testing.cases import make_paged_case
from vllm_fa4.testing.checks import (
    ABS_ERROR_C,
    assert_attention_close,
    assert_lse_close,
    assert_rows_within_absolute_bound,
    error_eps,
    row_error_scores,
)


@pytest.fixture(scope="module")
def outs():
    case = make_paged_case([(20, 60), (30, 30)], 4, 2, 64, 16, torch.bfloat16, "cpu", seed=5)
    ref, lse = case.reference()
    lowp, _ = case.reference(compute_dtype=torch.bfloat16)
    return case, ref, lowp, lse


def test_passes_for_rounded_reference(outs):
    case, ref, lowp, _ = outs
    res = assert_attention_close(ref.to(torch.bfloat16), ref, lowp, cu_seqlens_q=case.cu_seqlens_q)
    assert res.max_err <= res.max_bound and res.mean_err <= res.mean_bound
    assert res.lowp_max_err > 0 and res.floor > 0


def test_catches_nan_zero_and_large_errors(outs):
    case, ref, lowp, _ = outs
    out = ref.to(torch.bfloat16)
    bad = out.clone()
    bad[25, 1, 3] = float("nan")
    with pytest.raises(AssertionError, match=r"1 of .* NaN/Inf.*\(25, 1, 3\).*request 1"):
        assert_attention_close(bad, ref, lowp, cu_seqlens_q=case.cu_seqlens_q)
    zero = out.clone()
    zero[20:] = 0
    with pytest.raises(AssertionError, match="request 1 .* all zero"):
        assert_attention_close(zero, ref, lowp, cu_seqlens_q=case.cu_seqlens_q)
    off = out.clone()
    off[3, 0, 0] += 3 * (lowp.float() - ref).abs().max()
    with pytest.raises(AssertionError, match="max error"):
        assert_attention_close(off, ref, lowp)
    # small errors everywhere: max is fine, mean is not
    noisy = ref + 1.9 * (lowp.float() - ref).abs().max() * torch.sign(torch.randn_like(ref))
    with pytest.raises(AssertionError, match="mean error"):
        assert_attention_close(noisy, ref, lowp)
    with pytest.raises(AssertionError, match="shape mismatch"):
        assert_attention_close(out[:-1], ref, lowp)


def test_lse_check(outs):
    _, _, _, lse = outs
    assert assert_lse_close(lse + 1e-4, lse) <= 2e-4
    with pytest.raises(AssertionError, match="lse error"):
        assert_lse_close(lse + 0.1, lse)
    ninf = lse.clone()
    ninf[0, 0] = float("-inf")
    with pytest.raises(AssertionError, match="-inf pattern"):
        assert_lse_close(lse, ninf)


# ---------------------------------------------------------------------------------------------
# the absolute, per-row bound (issue 27)


def _flash_numerics(q, k, v, dtype, lazy: bool, block: int = 128) -> torch.Tensor:
    """What a FlashAttention-style kernel computes, in fp32 on the CPU: blocks of keys right to
    left, a running row max (exact, or lazy: moved only when a block raises it by more than
    2^8 in exp2 units), P rounded to ``dtype`` before P V, the row sum from unrounded P, O
    rounded to ``dtype`` once."""
    s = (q.float() @ k.float().T) * q.shape[-1] ** -0.5
    rows, n = s.shape
    m = torch.full((rows, 1), float("-inf"))
    total = torch.zeros(rows, 1)
    o = torch.zeros(rows, v.shape[1])
    for b0 in reversed(range(0, n, block)):
        sb = s[:, b0 : b0 + block]
        bm = sb.amax(1, keepdim=True)
        new = torch.maximum(m, bm)
        if lazy:
            new = torch.where(torch.isinf(m) | (bm > m + 8 * 0.6931471805599453), new, m)
        f = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(m - new))
        p = torch.exp(sb - new)
        total = total * f + p.sum(1, keepdim=True)
        o = o * f + p.to(dtype).float() @ v[b0 : b0 + block].float()
        m = new
    return (o / total).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("keys, scale", [(2, 1.0), (7, 5.9), (300, 1.0), (1500, 5.9)])
def test_absolute_bound_holds_for_flash_numerics(dtype, keys, scale):
    """The derivation of ABS_ERROR_C, small: the emulated kernel against an fp64 reference
    scores under half the bound (the fuzz's ratio rule allows twice FA3's error)."""
    gen = torch.Generator().manual_seed(keys)
    d, rows = 128, 3000
    q = (torch.randn(rows, d, generator=gen) * scale).to(dtype)
    k, v = torch.randn(keys, d, generator=gen).to(dtype), torch.randn(keys, d, generator=gen)
    v = v.to(dtype)
    ref = torch.softmax((q.double() @ k.double().T) * d**-0.5, -1) @ v.double()
    for lazy in (False, True):
        out = _flash_numerics(q, k, v, dtype, lazy)
        res = assert_rows_within_absolute_bound(out[:, None], ref[:, None], dtype)
        assert res.worst_score < ABS_ERROR_C / 2, res


def test_absolute_bound_catches_row_sized_errors(outs):
    case, ref, _, _ = outs
    out = ref.to(torch.bfloat16)
    res = assert_rows_within_absolute_bound(out, ref, torch.bfloat16)
    assert res.worst_score <= 0.5  # rounding alone: at most half an eps of the row's max
    # a sliding window the kernel got wrong: rows far from the start see other keys
    windowed, _ = case.reference(window_left=3)
    with pytest.raises(AssertionError, match=r"row \(token .*score"):
        assert_rows_within_absolute_bound(windowed.to(torch.bfloat16), ref, torch.bfloat16)
    # one row 5 % off (e.g. a missed rescale; the bound is 3 eps = 2.3 % of the row in bf16)
    off = out.clone()
    off[33, 2] = (ref[33, 2] * 1.05).to(torch.bfloat16)
    with pytest.raises(AssertionError, match=r"token 33, head 2"):
        assert_rows_within_absolute_bound(off, ref, torch.bfloat16)
    rows = torch.ones(out.shape[0], dtype=torch.bool)
    rows[33] = False
    assert assert_rows_within_absolute_bound(off, ref, torch.bfloat16, rows=rows).worst_score < 1
    nan = out.clone()
    nan[4, 0, 7] = float("nan")
    with pytest.raises(AssertionError, match="token 4, head 0"):
        assert_rows_within_absolute_bound(nan, ref, torch.bfloat16)
    # report only
    res = assert_rows_within_absolute_bound(off, ref, torch.bfloat16, raise_on_failure=False)
    assert res.worst_row == (33, 2) and res.worst_score > ABS_ERROR_C


def test_absolute_bound_eps():
    assert error_eps(torch.bfloat16) == 2**-7 and error_eps(torch.float16) == 2**-10
    assert error_eps(torch.float16, softcap=True) == 2**-7  # tanh.approx: bf16-sized
    ref = torch.zeros(2, 1, 4)
    scores = row_error_scores(torch.full((2, 1, 4), 2.0**-26), ref, torch.float16)
    assert bool((scores <= ABS_ERROR_C).all())  # the floor: rows of zeros, subnormal error
