"""GPU correctness of the kernel on FP8 (e4m3) KV caches (issue 30) against the fp32 reference
on the dequantized cache, with the 16-bit error rule (checks.assert_attention_close against
the model-dtype reference of the same cache; for `fp8_qk_rounded` both references read Q
rounded as that config rounds it, cases.q_as_read_by).

What an fp8 cache adds to the kernel (kernels/fp8_kv.py): TMA into a staging ring, converter
warps, k_scale in the softmax scale and v_scale in the epilogue. The cases below aim at what
that could break: permuted pages with the null block 0 and NaN (byte 0x7f) in every unused
slot, partial last pages, prefix hits (q shorter than k), junk block-table entries, padded
and cross-layer block strides, each head dim and page size, both dtypes, GQA packing, and the
model features (window, soft cap, sinks). Runs once per config of VLLM_FA4_TEST_VARIANTS
(default: the fp8 serving picks, paged_prefill/policy.py's FP8_TABLE).
"""

import pytest
import torch

from vllm_fa4.testing.variants import config_id, sweep_configs

pytestmark = pytest.mark.gpu

CONFIGS = sweep_configs()


@pytest.fixture(params=CONFIGS, ids=[config_id(c) for c in CONFIGS], autouse=True)
def variant(request):
    return request.param


def run_fp8_case(specs, hq, hkv, hd, page, dtype, variant, seed=0, **case_options):
    """Build an fp8 case, run our kernel (scales passed as run_prefill passes them), check
    O and LSE against the references on the dequantized cache. Returns (out, case)."""
    from vllm_fa4.testing import cases, checks

    case = cases.make_paged_case(
        specs, hq, hkv, hd, page, dtype, "cuda", seed=seed, fp8_kv=True, **case_options
    )
    assert case.key.fp8_kv
    if variant is not None and (why := variant.unsupported_reason(case.key)):
        pytest.skip(f"{config_id(variant)} does not build this key: {why}")
    plan = case.plan(variant)
    out = torch.full_like(case.q, float("nan")).contiguous()
    lse = torch.full((hq, case.q.shape[0]), float("nan"), dtype=torch.float32, device="cuda")
    if plan.num_tiles:
        case.ours(plan, out, lse=lse)
    torch.cuda.synchronize()
    # `fp8_qk_rounded` rounds Q to e4m3 by design (its error against FA3-FP8's is measured by
    # benchmarks/fp8_ab.py --accuracy): the references read that Q, so the rule checks the rest
    q = cases.q_as_read_by(variant, case, case.q)
    ref, ref_lse = case.reference(q)
    lowp, _ = case.reference(q, compute_dtype=dtype)
    checks.assert_attention_close(out, ref, lowp, cu_seqlens_q=case.cu_seqlens_q)
    checks.assert_lse_close(lse, ref_lse)
    return out, case


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hd", [64, 128, 256])
@pytest.mark.parametrize("page", [16, 32, 64, 128])
def test_fp8_dtype_hd_page(dtype, hd, page, variant):
    # partial last pages (77, 129, 300 tokens), a one-token request
    run_fp8_case([(300, 300), (77, 77), (1, 1), (129, 129)], 8, 2, hd, page, dtype, variant)


@pytest.mark.parametrize("page", [16, 128])
@pytest.mark.parametrize("hd", [64, 128, 256])
def test_fp8_prefix_hits(page, hd, variant):
    # q_len < k_len: chunked prefill and prefix-cache hits; many blocks per tile
    specs = [(100, 1000), (1, 517), (257, 300), (64, 64 + 128), (700, 2100)]
    run_fp8_case(specs, 32, 8, hd, page, torch.bfloat16, variant, seed=1)


@pytest.mark.parametrize("hq,hkv", [(8, 8), (32, 4), (12, 4)])  # GQA groups 1, 8, 3
def test_fp8_gqa(hq, hkv, variant):
    run_fp8_case([(200, 200), (45, 45), (130, 400)], hq, hkv, 128, 16, torch.bfloat16, variant)


@pytest.mark.parametrize("hd", [128, 256])
def test_fp8_junk_block_table(hd, variant):
    # unused entries: NaN blocks and ids past the cache; none may be dereferenced
    specs = [(33, 33), (1, 250), (200, 513)]
    run_fp8_case(specs, 8, 2, hd, 16, torch.bfloat16, variant, seed=2, junk_table=True)


@pytest.mark.parametrize(
    "layout",
    [dict(block_pad=32), dict(block_pad=16 * 2 * 2 * 128), dict(layers=3, layer=1)],
    ids=["pad-32B", "pad-one-page", "cross-layer-3"],
)
def test_fp8_padded_layouts(layout, variant):
    # NaN pads and other layers' slices between pages: strides the staging TMA must honour
    run_fp8_case([(150, 150), (60, 331)], 8, 2, 128, 16, torch.bfloat16, variant, **layout)


@pytest.mark.parametrize(
    "hd,features",
    [
        (128, dict(window_left=127)),
        (64, dict(window_left=127, sinks=True)),  # gpt-oss's shape
        (256, dict(window_left=1023, softcap=50.0)),  # Gemma 2's local layers
        (256, dict(softcap=50.0)),  # Gemma 2's global layers
    ],
    ids=["window", "window-sinks", "window-softcap", "softcap"],
)
def test_fp8_model_features(hd, features, variant):
    specs = [(500, 1500), (64, 64), (300, 1100)]
    run_fp8_case(specs, 8, 2, hd, 16, torch.bfloat16, variant, seed=3, **features)


def test_fp8_scales_reach_the_output(variant):
    """v_scale scales O (the epilogue) and k_scale sharpens the softmax: a run whose scales
    differ from the case's must disagree with the reference (guards a dropped scale that
    the reference's own scales would otherwise hide behind a lenient rule)."""
    out, case = run_fp8_case([(256, 256)], 8, 2, 128, 16, torch.bfloat16, variant, seed=4)
    again = torch.full_like(out, float("nan"))
    case.v_scale *= 2.0
    case.ours(case.plan(variant), again)
    torch.cuda.synchronize()
    torch.testing.assert_close(again, out * 2.0, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fp8_computes_on_the_converted_values(variant, dtype):
    """The fp8 kernel's GEMMs run in fp16 on exactly the converted values: with unit
    scales, an fp16 model's 16-bit cache holding the same e4m3 values (exact in fp16) and
    the same Q gives the same bits, the converter's stores and the 16-bit TMA's bytes feeding
    the same GEMMs. A bf16 model's Q is converted to fp16 in the kernel and its O rounded
    to bf16 from fp32: within a bf16 rounding of the fp16 O."""
    from vllm_fa4.testing import cases

    specs = [(300, 700), (77, 77)]
    fp8 = cases.make_paged_case(specs, 8, 2, 128, 16, dtype, "cuda", fp8_kv=True)
    if variant is not None and (why := variant.unsupported_reason(fp8.key)):
        pytest.skip(why)
    wide = cases.make_paged_case(specs, 8, 2, 128, 16, torch.float16, "cuda")
    assert wide.kv_cache.shape == fp8.kv_cache.shape
    wide.kv_cache.copy_(fp8.kv_cache.to(torch.float16))  # NaN slots stay NaN
    # The kernel's Q conversion rounds to nearest as torch's does: exact except for the few
    # values in fp16's subnormal range (|q| < 2^-14), rounded alike on both sides.
    wide.q.copy_(fp8.q.to(torch.float16))
    fp8.k_scale = fp8.v_scale = 1.0
    config = variant if variant is not None else fp8.plan().config  # one config for both
    if config.unsupported_reason(wide.key) is not None:
        pytest.skip(f"{config_id(config)} does not build the 16-bit key")
    outs = []
    for case in (fp8, wide):
        out = torch.full_like(case.q, float("nan")).contiguous()
        case.ours(case.plan(config), out)
        outs.append(out)
    torch.cuda.synchronize()
    assert not outs[0].isnan().any() and not outs[1].isnan().any()
    if dtype is torch.float16:
        assert torch.equal(outs[0], outs[1])
    else:
        ours, fp16 = outs[0].float(), outs[1].float()
        # |bf16(O) - O| <= 2^-9 |O| and |fp16(O) - O| <= 2^-12 |O| (half an ulp each)
        assert ((ours - fp16).abs() <= fp16.abs() * 2.0**-8 + 1e-6).all()
        assert not torch.equal(ours, fp16)  # it is a bf16 output, not the fp16 one
