"""GPU correctness of the SM90 paged prefill kernel against the fp32 reference.

Every test runs once per kernel config in VLLM_FA4_TEST_VARIANTS (default: the process config
from VLLM_FA4_VARIANT; ``all`` = testing.variants.ALL_CONFIGS; or a list such as
"one_per_cta+serial queue+overlap").
Example: VLLM_FA4_TEST_VARIANTS=all pytest tests/gpu/test_kernel.py
"""

import pytest
import torch

from vllm_fa4.testing.variants import config_id, sweep_configs

pytestmark = pytest.mark.gpu

CONFIGS = sweep_configs()


@pytest.fixture(params=CONFIGS, ids=[config_id(c) for c in CONFIGS], autouse=True)
def variant(request):
    return request.param


def run_case(
    specs, hq, hkv, hd, page, dtype, variant, seed=0, check_lse=True, q_pad=0, key_ramp=None
):
    """Plan (the planner's own work list) and run one batch with config ``variant``; check it
    against the fp32 reference. Returns (out, lse, (plan, q, case))."""
    from vllm_fa4.testing import cases, checks

    case = cases.make_paged_case(specs, hq, hkv, hd, page, dtype, "cuda", seed=seed)
    if key_ramp is not None:
        case.ramp_keys(key_ramp)
    if variant is not None and (why := variant.unsupported_reason(case.key)):
        pytest.skip(f"{config_id(variant)} does not build this key: {why}")
    q = case.q
    if q_pad:  # token stride > Hq*D, like vLLM's q view of the fused qkv
        big = torch.randn(q.shape[0], hq * hd + q_pad, dtype=dtype, device="cuda")
        big[:, : hq * hd] = q.reshape(q.shape[0], -1)
        q = big[:, : hq * hd].view(q.shape[0], hq, hd)
    plan = case.plan(variant)
    out = torch.full_like(q, float("nan")).contiguous()
    lse = torch.full((hq, q.shape[0]), float("nan"), dtype=torch.float32, device="cuda")
    if plan.num_tiles:
        case.ours(plan, out, q=q, lse=lse if check_lse else None)
    torch.cuda.synchronize()
    ref, ref_lse = case.reference(q)
    lowp, _ = case.reference(q, compute_dtype=dtype)
    checks.assert_attention_close(out, ref, lowp, cu_seqlens_q=case.cu_seqlens_q)
    if check_lse:
        checks.assert_lse_close(lse, ref_lse)
    return out, lse, (plan, q, case)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("page", [16, 32, 64, 128])
def test_dtype_hd_page(dtype, hd, page, variant):
    run_case([(300, 300), (77, 77), (1, 1), (129, 129)], 8, 2, hd, page, dtype, variant)


@pytest.mark.parametrize("hq,hkv", [(8, 8), (16, 4), (32, 4), (12, 4)])  # qpk 1, 4, 8, 3
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_gqa(hq, hkv, hd, variant):
    run_case([(200, 200), (45, 45), (130, 130)], hq, hkv, hd, 16, torch.bfloat16, variant)


@pytest.mark.parametrize("page", [16, 64, 128])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_chunked_prefix(page, hd, variant):
    # q_len < k_len: chunked prefill and prefix-cache hits, partial last pages.
    run_case(
        [(100, 1000), (1, 517), (257, 300), (64, 64 + 128)],
        32,
        8,
        hd,
        page,
        torch.bfloat16,
        variant,
    )


@pytest.mark.parametrize("hd", [64, 128, 256])
def test_rising_row_max(hd, variant):
    # Keys up to 40x larger towards each request's start: while the blocks are visited right
    # to left, row maxima jump by far more than lazy_max's margin (~140 in exp2 units, so a
    # max that failed to move would overflow exp2), and O must be rescaled with them.
    run_case(
        [(700, 2100), (300, 300), (5, 1000)], 16, 4, hd, 16, torch.bfloat16, variant, key_ramp=40.0
    )


def test_tiny_and_many_short(variant):
    run_case([(1, 1)] * 3 + [(2, 5), (3, 3), (1, 17)] * 20, 32, 8, 128, 16, torch.bfloat16, variant)


def test_zero_len_request_skipped(variant):
    run_case([(50, 50), (0, 40), (33, 90)], 32, 8, 128, 16, torch.bfloat16, variant)


def test_big_batch(variant):
    specs = [
        (int(q), int(q) + int(p))
        for q, p in zip(
            torch.randint(1, 700, (48,), generator=torch.Generator().manual_seed(1)),
            torch.randint(0, 900, (48,), generator=torch.Generator().manual_seed(2)),
        )
    ]
    run_case(specs, 32, 8, 128, 16, torch.bfloat16, variant, check_lse=False)


def test_strided_q(variant):
    run_case([(130, 400), (70, 70)], 32, 8, 128, 16, torch.bfloat16, variant, q_pad=8 * 128 * 2)


def test_no_lse(variant):
    run_case([(150, 150)], 16, 4, 128, 16, torch.bfloat16, variant, check_lse=False)


def test_long_context_64k(variant):
    run_case([(512, 65536 + 100), (256, 256)], 16, 2, 128, 16, torch.bfloat16, variant)


@pytest.mark.parametrize("hd", [64, 128])
def test_bit_identical_twice(hd, variant):
    out1, lse1, (plan, q, case) = run_case(
        [(700, 1500), (90, 90)], 32, 8, hd, 16, torch.bfloat16, variant
    )
    out2 = torch.full_like(out1, float("nan"))
    lse2 = torch.full_like(lse1, float("nan"))
    case.ours(plan, out2, q=q, lse=lse2)
    torch.cuda.synchronize()
    assert torch.equal(out1.view(torch.int16), out2.view(torch.int16))
    assert torch.equal(lse1, lse2)
