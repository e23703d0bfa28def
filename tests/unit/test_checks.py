"""The accuracy bar itself: it must pass good outputs and catch bad ones."""

from __future__ import annotations

import pytest
import torch

from vllm_fa4.testing.cases import make_paged_case
from vllm_fa4.testing.checks import assert_attention_close, assert_lse_close


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
