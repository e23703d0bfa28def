"""GPU correctness of the model features (issue 11): sliding window, logit soft cap and
attention sinks, alone and together, against the fp32 reference, for every config the plan
can pick for the key (``serving_configs(key).all``); the window tests also run ``DEBUG_BASELINE``
(the serial step's loop, whose block range the window changes too).

Each case also runs vLLM's FA3 with the same settings and holds it to the same bound: that
ties the reference's semantics (window edges, cap, sink units) to what vLLM serves today.
Each feature test first checks that the feature changes the reference output, so a kernel
that ignored it could not pass.
"""

import pytest
import torch

from vllm_fa4.kernels.config import DEBUG_BASELINE
from vllm_fa4.paged_prefill.policy import serving_configs

pytestmark = pytest.mark.gpu


def _configs(key, with_base=False):
    extra = (DEBUG_BASELINE,) if with_base else ()
    return tuple(dict.fromkeys((*serving_configs(key).all, *extra)))


def _make(specs, page, hq=32, hkv=8, hd=128, dtype=torch.bfloat16, seed=0, **features):
    from vllm_fa4.testing import cases

    return cases.make_paged_case(specs, hq, hkv, hd, page, dtype, "cuda", seed=seed, **features)


def _fa3(case):
    kv = case.kv_cache.clone().nan_to_num_(0.0)  # FA3 reads the unused slots of a page
    out = torch.empty_like(case.q).contiguous()
    return case.fa3(out, k_cache=kv[..., : case.head_dim], v_cache=kv[..., case.head_dim :])


def _check(case, with_base=False, fa3_known_wrong=False):
    """Every config on ``case`` (plan_prefill + run_prefill) and FA3, against the reference
    (``fa3_known_wrong``: FA3 is measured to miss on this case; it is not asked to pass)."""
    from vllm_fa4.paged_prefill.run import run_prefill
    from vllm_fa4.testing import checks

    ref, ref_lse = case.reference()
    lowp, _ = case.reference(compute_dtype=case.dtype)
    try:  # say which side missed: FA3 (then the reference's semantics are in question) or us
        if not fa3_known_wrong:
            checks.assert_attention_close(_fa3(case), ref, lowp, cu_seqlens_q=case.cu_seqlens_q)
    except AssertionError as e:
        raise AssertionError(f"FA3 with the same settings: {e}") from None
    hq = case.num_q_heads
    for config in _configs(case.key, with_base):
        plan = case.plan(config)
        out = case.new_out()
        lse = torch.full((hq, case.num_tokens), float("nan"), device="cuda")
        run_prefill(
            plan,
            case.q,
            case.k_cache,
            case.v_cache,
            out,
            softmax_scale=case.softmax_scale,
            lse=lse,
            softcap=case.softcap,
            sinks=case.sinks,
        )
        torch.cuda.synchronize()
        try:
            checks.assert_attention_close(out, ref, lowp, cu_seqlens_q=case.cu_seqlens_q)
            checks.assert_lse_close(lse, ref_lse)
        except AssertionError as e:
            raise AssertionError(f"config {config.spec}: {e}") from None


def _changes_reference(case, **off):
    """The feature matters on this case: the reference without it differs clearly."""
    with_feature, _ = case.reference()
    without, _ = case.reference(**off)
    assert float((with_feature - without).abs().max()) > 0.05


@pytest.mark.parametrize("page", [16, 128])
@pytest.mark.parametrize(
    "window_left",
    [0, 37, 127, 200, 999, 5000],  # diagonal only, mid-page, tile edge, mid-tile, >= context
)
def test_sliding_window(page, window_left):
    case = _make([(1000, 1000), (333, 333), (77, 1300)], page, window_left=window_left)
    if window_left < 999:
        _changes_reference(case, window_left=None)
    # vLLM 0.26's FA3 misses on request 2 (77 queries after 1,223 keys) at window 999: the first
    # 24 rows of each 32-row group are off by 2-7e-2 (bound 2.6e-2), fitting no window at all,
    # while ours matches the reference to 8e-4 (H100, tools/diag_window.py --fit-request 2;
    # docs/results/2026-11-23/h100-fa3-window-999.log). Windows 0-200 and 5000 pass for both.
    _check(case, with_base=True, fa3_known_wrong=window_left == 999)


@pytest.mark.parametrize("page", [16, 128])
@pytest.mark.parametrize("window_left", [127, 4095])
def test_sliding_window_chunk_after_long_prefix(page, window_left):
    # 2k chunks after 16k and 40k of context: the window skips most of the prefix.
    case = _make(
        [(2048, 2048 + 16384), (2048, 2048 + 40000), (300, 301)], page, window_left=window_left
    )
    _changes_reference(case, window_left=None)
    _check(case, with_base=True)


@pytest.mark.parametrize("hq,hkv,hd", [(12, 4, 64), (16, 2, 256)])
def test_sliding_window_gqa_head_dims(hq, hkv, hd):
    case = _make([(700, 900), (129, 129)], 16, hq=hq, hkv=hkv, hd=hd, window_left=100)
    _check(case)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("softcap", [2.0, 50.0])
def test_softcap(dtype, softcap):
    case = _make([(600, 600), (256, 2000)], 16, dtype=dtype, softcap=softcap)
    if softcap < 10:  # at 50 the cap barely bends N(0, 1) logits; it must still be right
        _changes_reference(case, softcap=None)
    _check(case)


@pytest.mark.parametrize("page", [16, 128])
@pytest.mark.parametrize("hq,hkv", [(32, 8), (12, 4)])
def test_sinks(page, hq, hkv):
    case = _make([(500, 500), (64, 3000), (1, 1)], page, hq=hq, hkv=hkv, sinks=True)
    _changes_reference(case, sinks=None)
    _check(case)


@pytest.mark.parametrize("page", [16, 128])
def test_all_features_together(page):
    case = _make(
        [(1500, 1500), (2048, 2048 + 9000), (5, 40)],
        page,
        window_left=511,
        softcap=5.0,
        sinks=True,
    )
    _check(case)


@pytest.mark.parametrize("page", [16, 128])
def test_gpt_oss_windowed_layer(page):
    """gpt-oss's windowed layers exactly: head dim 64, 64/8 heads, sinks, a 128-key window."""
    case = _make(
        [(1500, 1500), (700, 700 + 5000), (3, 90)],
        page,
        hq=64,
        hkv=8,
        hd=64,
        window_left=127,
        sinks=True,
    )
    _changes_reference(case, window_left=None)
    _check(case)


@pytest.mark.parametrize("page", [16, 128])
@pytest.mark.parametrize("window_left", [4095, None])  # Gemma 2 alternates windowed / global
def test_gemma2_layers(page, window_left):
    """Gemma-2-9B's layers exactly: head dim 256, 16/8 heads, cap 50, a 4k window or none."""
    case = _make(
        [(2048, 2048 + 6000), (900, 900), (1, 5000)],
        page,
        hq=16,
        hkv=8,
        hd=256,
        window_left=window_left,
        softcap=50.0,
    )
    if window_left is not None:
        _changes_reference(case, window_left=None)
    _check(case)
