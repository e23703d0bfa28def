"""GPU correctness of the SM90 paged prefill kernel against the fp32 reference.

Every test runs once per kernel variant in VLLM_FA4_TEST_VARIANTS (default: the process
variant from VLLM_FA4_VARIANT; ``all`` = config.ALL_VARIANTS; or a list such as
"base overlap+pingpong"). Example: VLLM_FA4_TEST_VARIANTS=all pytest tests/gpu/test_kernel.py
"""

import os

import pytest
import torch

from vllm_fa4.kernels.config import KernelKey, parse_variants, tile_shape, tokens_per_tile
from vllm_fa4.paged_prefill.plan import build_work_tiles as plan_work_tiles

pytestmark = pytest.mark.gpu


def _test_variants():
    spec = os.environ.get("VLLM_FA4_TEST_VARIANTS")
    if spec:
        return parse_variants(spec)
    from vllm_fa4.kernels.compile import VARIANT

    return (VARIANT,)


VARIANTS = _test_variants()


@pytest.fixture(params=VARIANTS, ids=[v.name for v in VARIANTS], autouse=True)
def variant(request):
    return request.param


DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def build_work_tiles(cu_seqlens_q, seqused_k, num_kv_heads, head_dim, qpk, device):
    """The planner's LPT work list (batch, kv_head, m_block, cost) for this batch."""
    cu, k_lens = cu_seqlens_q.cpu().numpy(), seqused_k.cpu().numpy()
    rows = plan_work_tiles(
        cu[1:] - cu[:-1],
        k_lens,
        num_kv_heads,
        tokens_per_tile(head_dim, qpk),
        tile_shape(head_dim)[1],
    )
    return torch.from_numpy(rows).to(device=device, dtype=torch.int32).reshape(-1, 4)


def run_case(specs, hq, hkv, hd, page, dtype, variant, seed=0, check_lse=True, q_pad=0):
    from vllm_fa4.kernels.compile import prefill_forward
    from vllm_fa4.testing import cases, checks

    case = cases.make_paged_case(specs, hq, hkv, hd, page, dtype, "cuda", seed=seed)
    q = case.q
    if q_pad:  # token stride > Hq*D, like vLLM's q view of the fused qkv
        big = torch.randn(q.shape[0], hq * hd + q_pad, dtype=dtype, device="cuda")
        big[:, : hq * hd] = q.reshape(q.shape[0], -1)
        q = big[:, : hq * hd].view(q.shape[0], hq, hd)
    qpk = hq // hkv
    key = KernelKey(DTYPES[dtype], hd, page, qpk)
    work = build_work_tiles(case.cu_seqlens_q, case.seqused_k, hkv, hd, qpk, "cuda")
    out = torch.full_like(q, float("nan")).contiguous()
    lse = torch.full((hq, q.shape[0]), float("nan"), dtype=torch.float32, device="cuda")
    if work.shape[0]:
        prefill_forward(
            key,
            q,
            case.k_cache,
            case.v_cache,
            out,
            lse if check_lse else None,
            case.cu_seqlens_q,
            case.seqused_k,
            case.page_table,
            work,
            case.softmax_scale,
            variant,
        )
    torch.cuda.synchronize()
    ref, ref_lse = case.reference(q)
    lowp, _ = case.reference(q, compute_dtype=dtype)
    checks.assert_attention_close(out, ref, lowp, cu_seqlens_q=case.cu_seqlens_q)
    if check_lse:
        checks.assert_lse_close(lse, ref_lse)
    return out, lse, (key, q, case, work)


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
@pytest.mark.parametrize("hd", [128, 256])
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


def test_bit_identical_twice(variant):
    out1, lse1, (key, q, case, work) = run_case(
        [(700, 1500), (90, 90)], 32, 8, 128, 16, torch.bfloat16, variant
    )
    from vllm_fa4.kernels.compile import prefill_forward

    out2 = torch.full_like(out1, float("nan"))
    lse2 = torch.full_like(lse1, float("nan"))
    prefill_forward(
        key,
        q,
        case.k_cache,
        case.v_cache,
        out2,
        lse2,
        case.cu_seqlens_q,
        case.seqused_k,
        case.page_table,
        work,
        case.softmax_scale,
        variant,
    )
    torch.cuda.synchronize()
    assert torch.equal(out1.view(torch.int16), out2.view(torch.int16))
    assert torch.equal(lse1, lse2)
