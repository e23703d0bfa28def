"""FP8 KV cache (issue 30) on the GPU: the prefill kernel on e4m3 caches, and the whole backend
(vLLM's quantizing cache write, build, forward) with ``--kv-cache-dtype fp8``.

Prefill rows are held to the project's error rule (``testing.checks.assert_attention_close``)
against the fp32 reference on the dequantized cache (K = k8 * k_scale, V = v8 * v_scale): FP8
storage, 16-bit attention. Decode rows are FA3's FP8 kernel as FLASH_ATTN runs it: bit for bit
what FLASH_ATTN computes for the same decode batch. FLASH_ATTN's FP8 prefill (Q and P in FP8)
is the yardstick our prefill rows must beat.

Kernel cases skip while ``route.kernel_reads_fp8`` says the prefill kernel does not read the
key's FP8 cache; the backend cases also run with ``VLLM_FA4_PREFILL_ROUTE=reference`` (the
plumbing: cache write, Q quantization, decode rows, with prefill on the fp32 reference).
"""

from __future__ import annotations

import random

import pytest
import torch
from helpers.vllm_configs import current_shaped_configs
from helpers.vllm_layers import common_metadata, register_layer

from vllm_fa4.kernels.config import SUPPORTED_HEAD_DIMS, SUPPORTED_PAGE_SIZES, KernelKey
from vllm_fa4.paged_prefill.policy import serving_configs
from vllm_fa4.paged_prefill.route import kernel_reads_fp8

pytestmark = pytest.mark.gpu

FP8 = torch.float8_e4m3fn
HQ, HKV = 16, 4
SPECS = [(77, 77), (1500, 1500 + 3000), (300, 4096), (1, 2000), (0, 40)]


def _skip_unless_the_kernel_reads(key: KernelKey) -> None:
    if not kernel_reads_fp8(key):
        pytest.skip(f"route.kernel_reads_fp8 is False for {key}: no FP8 prefill kernel yet")


# ---- the prefill kernel on FP8 caches ---------------------------------------------------------


@pytest.mark.parametrize("layout", ["contiguous", "pad-token", "cross-layer-2"])
@pytest.mark.parametrize("page", SUPPORTED_PAGE_SIZES)
@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_every_served_config_reads_fp8(head_dim, page, layout):
    from vllm_fa4.paged_prefill import run_prefill
    from vllm_fa4.testing import cases, checks

    layouts = {
        "contiguous": {},
        "pad-token": dict(block_pad=HKV * 2 * head_dim),
        "cross-layer-2": dict(layers=2, layer=1),
    }
    key = KernelKey.for_layer(torch.bfloat16, head_dim, page, HQ, HKV, kv_dtype=FP8)
    _skip_unless_the_kernel_reads(key)
    case = cases.make_paged_case(
        SPECS,
        HQ,
        HKV,
        head_dim,
        page,
        torch.bfloat16,
        "cuda",
        seed=head_dim + page,
        fp8_kv=True,
        **layouts[layout],
    )
    assert case.key == key
    before = case.kv_buffer.view(torch.uint8).clone()
    ref, _ = case.reference()
    lowp, _ = case.reference(compute_dtype=torch.bfloat16)
    for config in serving_configs(key).all:
        out = case.new_out()
        run_prefill(
            case.plan(config),
            case.q,
            case.k_cache,
            case.v_cache,
            out,
            softmax_scale=case.softmax_scale,
            **case.kv_scales,
        )
        torch.cuda.synchronize()
        try:
            checks.assert_attention_close(out, ref, lowp, cu_seqlens_q=case.cu_seqlens_q)
        except AssertionError as e:
            raise AssertionError(f"config {config.spec}, {layout}: {e}") from None
        assert torch.equal(case.kv_buffer.view(torch.uint8), before), config.spec


# ---- the whole backend ------------------------------------------------------------------------

Q_SCALE = 1 / 48  # N(0, 1) queries * 48 stay inside e4m3's range (448)


@pytest.fixture
def fp8_vllm_config(tmp_path):
    """A vLLM config for ``--kv-cache-dtype fp8`` whose model has the case's attention shape."""
    with current_shaped_configs(tmp_path, device="cuda", cache_dtype="fp8") as make:
        yield make


class _Layer(torch.nn.Module):
    """What the impls read from vLLM's attention layer: the scales, on the device and as host
    floats."""

    def __init__(self, k_scale: float, v_scale: float):
        super().__init__()
        for name, value in (("_q", Q_SCALE), ("_k", k_scale), ("_v", v_scale)):
            setattr(self, f"{name}_scale", torch.tensor(value, dtype=torch.float32, device="cuda"))
            setattr(self, f"{name}_scale_float", float(value))


class _Backend:
    """One layer of a backend with an fp8 cache: impl, builder, the layer's Q quantization
    (vLLM's Attention layer does it when the impl says ``supports_quant_query_input``)."""

    def __init__(self, backend_cls, config, case, layer_name="layer.0"):
        from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
        from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape
        from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

        window = None if case.window_left is None else case.window_left + 1  # vLLM's spelling
        self.impl = backend_cls.get_impl_cls()(
            case.num_q_heads,
            case.head_dim,
            case.softmax_scale,
            case.num_kv_heads,
            None,
            window,
            "fp8",
            logits_soft_cap=case.softcap,
        )
        register_layer(config, layer_name, self.impl)
        shape = dict(
            block_size=case.page_size,
            num_kv_heads=case.num_kv_heads,
            head_size=case.head_dim,
            dtype=torch.uint8,  # vLLM's fp8 cache tensor
            **_fp8_quant_mode(),
        )
        if window is None:
            spec = FullAttentionSpec(**shape)
        else:
            spec = SlidingWindowSpec(**shape, sliding_window=window)
        self.builder = backend_cls.get_builder_cls()(
            spec, [layer_name], config, torch.device("cuda")
        )
        self.layer = _Layer(case.k_scale, case.v_scale)
        self.query_quant = QuantFP8(static=True, group_shape=GroupShape.PER_TENSOR)

    def forward(self, cm, q, kv_cache, new_k=None, new_v=None):
        md = self.builder.build(0, cm)
        if new_k is not None:
            self.impl.do_kv_cache_update(self.layer, new_k, new_v, kv_cache, cm.slot_mapping)
        if self.impl.supports_quant_query_input:  # the layer's step, as Attention.forward
            q = self.query_quant(q.reshape(q.shape[0], -1), self.layer._q_scale)[0].view(q.shape)
        out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
        self.impl.forward(self.layer, q, new_k, new_v, kv_cache, md, out)
        torch.cuda.synchronize()
        return out, md


def _fp8_quant_mode() -> dict:
    """The spec's kv_quant_mode where this vLLM has it (0.26 and 0.33 do)."""
    import dataclasses

    from vllm.v1.kv_cache_interface import FullAttentionSpec

    if "kv_quant_mode" not in {f.name for f in dataclasses.fields(FullAttentionSpec)}:
        return {}
    from vllm.v1.kv_cache_interface import KVQuantMode

    return dict(kv_quant_mode=KVQuantMode.FP8_PER_TENSOR)


def _random_specs(rng, num_decodes, num_prefills):
    decodes = [(1, rng.randint(1, 3000)) for _ in range(num_decodes)]
    prefills = []
    for _ in range(num_prefills):
        q_len = rng.choice([2, 17, 128, 300, 1000, 2048])
        prefills.append((q_len, q_len + rng.choice([0, 0, 5, 700, 4096])))
    return decodes + prefills


SHAPES = [(32, 8, 128), (32, 8, 64), (16, 2, 128), (8, 1, 256)]
BATCHES = [  # (page, decodes, prefills): mixed, prefill only, decode only
    (16, 3, 2),
    (16, 0, 3),
    (32, 5, 1),
    (64, 6, 0),
    (128, 2, 2),
    (16, 8, 1),
]


@pytest.mark.parametrize("route", ["kernel", "reference"])
@pytest.mark.parametrize("seed", range(len(BATCHES)))
def test_backend_with_fp8_cache(fp8_vllm_config, monkeypatch, seed, route):
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    from vllm_fa4 import envs
    from vllm_fa4.backend import FA4AttentionBackend
    from vllm_fa4.compat import decode_slice
    from vllm_fa4.paged_prefill import route as route_mod
    from vllm_fa4.testing.cases import FP8_NAN_BYTE, make_paged_case
    from vllm_fa4.testing.checks import assert_attention_close

    hq, hkv, d = SHAPES[seed % len(SHAPES)]
    page, num_decodes, num_prefills = BATCHES[seed]
    if route == "kernel":
        _skip_unless_the_kernel_reads(
            KernelKey.for_layer(torch.bfloat16, d, page, hq, hkv, kv_dtype=FP8)
        )
    else:
        monkeypatch.setenv(envs.PREFILL_ROUTE, "reference")
    route_mod.clear_route_cache()
    specs = _random_specs(random.Random(seed), num_decodes, num_prefills)
    config = fp8_vllm_config(hq, hkv, d, page)
    case = make_paged_case(specs, hq, hkv, d, page, torch.bfloat16, "cuda", seed=seed, fp8_kv=True)
    # The new tokens' K/V as the model makes them (bf16: e4m3 * scale is exact there); their
    # slots start as e4m3 NaN, so the cache write must put back exactly the case's bytes.
    written = case.kv_cache.view(torch.uint8).clone()
    flat = case.dequantized_kv_cache().view(-1, hkv, 2 * d)
    new_k = flat[case.slot_mapping, :, :d].to(torch.bfloat16)
    new_v = flat[case.slot_mapping, :, d:].to(torch.bfloat16)
    case.kv_cache.view(torch.uint8).view(-1, hkv, 2 * d)[case.slot_mapping] = FP8_NAN_BYTE
    cm = common_metadata(case)
    q = case.q.contiguous()

    def vllm_view(cache):  # vLLM's logical (blocks, Hkv, page, 2D) uint8 view
        return cache.view(torch.uint8).permute(0, 2, 1, 3)

    fa4 = _Backend(FA4AttentionBackend, config, case)
    assert fa4.impl.supports_quant_query_input is False
    cache_fa4 = case.kv_cache.clone()
    out_fa4, md = fa4.forward(cm, q, vllm_view(cache_fa4), new_k, new_v)
    assert torch.equal(cache_fa4.view(torch.uint8), written), "vLLM's fp8 cache write differs"
    assert md.num_decodes == num_decodes
    assert (md.prefill is not None) == bool(num_prefills)
    if md.prefill is not None:
        assert md.prefill.key.fp8_kv and md.prefill.route == route

    flash = _Backend(FlashAttentionBackend, config, case, layer_name="layer.1")
    assert flash.impl.supports_quant_query_input is True
    cache_fa3 = case.kv_cache.clone()
    out_fa3, _ = flash.forward(cm, q, vllm_view(cache_fa3), new_k, new_v)
    assert torch.equal(cache_fa3.view(torch.uint8), written)

    case.kv_cache.view(torch.uint8).copy_(written)  # the reference reads the written cache
    ref, _ = case.reference()
    nd = md.num_decode_tokens
    if nd:
        # FA4's decode rows are FLASH_ATTN's on the same decode batch, bit for bit
        decodes = decode_slice(cm, md.num_decodes, nd)
        only_decodes, _ = flash.forward(decodes, q[:nd], vllm_view(cache_fa3))
        # (NaN included: FA3 may read an unused slot's NaN, flash-attention #2374)
        same = torch.equal(out_fa4[:nd].view(torch.int16), only_decodes.view(torch.int16))
        assert same, "decode rows differ from FLASH_ATTN's (Q quantization: fp8_decode.py)"
    if md.prefill is not None:
        lowp, _ = case.reference(compute_dtype=torch.bfloat16)
        rows = slice(nd, None)
        cu = case.cu_seqlens_q[md.num_decodes :] - nd
        assert_attention_close(out_fa4[rows], ref[rows], lowp[rows], cu_seqlens_q=cu)
        # FP8 storage with 16-bit attention beats FLASH_ATTN's FP8 attention (Q, P in FP8)
        # (where FLASH_ATTN is finite: FA3 may read an unused slot's NaN, flash-attention #2374)
        finite = torch.isfinite(out_fa3[rows].float()).all(dim=-1)
        ours = (out_fa4[rows][finite].float() - ref[rows][finite]).abs().max()
        theirs = (out_fa3[rows][finite].float() - ref[rows][finite]).abs().max()
        assert ours <= theirs, (float(ours), float(theirs))


@pytest.mark.parametrize(
    "head_dim,hq,hkv,window_left,softcap",
    [
        (128, 32, 8, None, None),
        (128, 32, 8, 4095, None),
        (256, 16, 8, None, None),
        (256, 16, 8, None, 50.0),  # Gemma 2's global layers
        (256, 16, 8, 4095, 50.0),  # and its local ones
        (256, 16, 8, 1023, None),  # Gemma 3's local layers
    ],
)
def test_backend_e4m3_query_serves_q_rounded_on_long_batches(
    fp8_vllm_config, monkeypatch, head_dim, hq, hkv, window_left, softcap
):
    """``VLLM_FA4_FP8_QUERY=e4m3`` end to end (environment, builder, plan, kernel): a long
    prefill batch (head dim 128 with and without a 4k window; 256 with and without a window
    and Gemma 2's soft cap) runs the rounded-Q pick (`fp8_qk_rounded`); its rows meet the
    error rule against the reference that reads Q as the kernel rounds it, and its mean error
    against the 16-bit reference is no larger than FLASH_ATTN-FP8's (its measured price:
    0.875x, docs/perf-notes.md session 34)."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    from vllm_fa4 import envs
    from vllm_fa4.backend import FA4AttentionBackend
    from vllm_fa4.kernels.config import Fp8Qk
    from vllm_fa4.paged_prefill import route as route_mod
    from vllm_fa4.testing.cases import make_paged_case, q_rounded_to_e4m3
    from vllm_fa4.testing.checks import assert_attention_close

    page = 16
    window = window_left is not None
    _skip_unless_the_kernel_reads(
        KernelKey.for_layer(
            torch.bfloat16,
            head_dim,
            page,
            hq,
            hkv,
            sliding_window=window,
            softcap=softcap is not None,
            kv_dtype=FP8,
        )
    )
    monkeypatch.setenv(envs.FP8_QUERY, "e4m3")
    route_mod.clear_route_cache()
    config = fp8_vllm_config(hq, hkv, head_dim, page)
    specs = [(2048, 2048 + 4096), (1000, 1000 + 3000)]  # long: ~40 key blocks a tile
    case = make_paged_case(
        specs,
        hq,
        hkv,
        head_dim,
        page,
        torch.bfloat16,
        "cuda",
        seed=7,
        fp8_kv=True,
        window_left=window_left,
        softcap=softcap,
    )
    cm = common_metadata(case)
    q = case.q.contiguous()
    cache = case.kv_cache.view(torch.uint8).permute(0, 2, 1, 3)  # vLLM's logical view

    fa4 = _Backend(FA4AttentionBackend, config, case)
    assert fa4.builder.kernel_key.sliding_window is window
    assert fa4.builder.kernel_key.softcap is (softcap is not None)
    assert fa4.builder.kernel_configs.long.fp8_qk is Fp8Qk.ROUNDED_Q
    out_fa4, md = fa4.forward(cm, q, cache)
    assert md.prefill.route == "kernel" and md.prefill.config.fp8_qk is Fp8Qk.ROUNDED_Q
    flash = _Backend(FlashAttentionBackend, config, case, layer_name="layer.1")
    out_fa3, _ = flash.forward(cm, q, cache)

    rounded = q_rounded_to_e4m3(case.q)
    ref_rounded, _ = case.reference(q=rounded)
    lowp_rounded, _ = case.reference(q=rounded, compute_dtype=torch.bfloat16)
    assert_attention_close(out_fa4, ref_rounded, lowp_rounded, cu_seqlens_q=case.cu_seqlens_q)
    ref, _ = case.reference()
    finite = torch.isfinite(out_fa3.float()).all(dim=-1)  # flash-attention #2374, as above
    ours = (out_fa4[finite].float() - ref[finite]).abs().mean()
    theirs = (out_fa3[finite].float() - ref[finite]).abs().mean()
    assert ours <= theirs, (float(ours), float(theirs))
