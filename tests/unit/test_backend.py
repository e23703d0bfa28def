"""Capability checks: what FA4 accepts, and the startup reasons it gives for what it refuses."""

import inspect

import pytest
import torch

import vllm_fa4

vllm_fa4.register()

from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.v1.attention.backend import AttentionType  # noqa: E402

from vllm_fa4.backend import FA4AttentionBackend, FA4AttentionImpl  # noqa: E402
from vllm_fa4.compat import (  # noqa: E402
    KV_CACHE_SHAPE_FROM_BACKEND,
    AttentionBackend,
    FlashAttentionBackend,
)
from vllm_fa4.kernels.config import ModelFeatures  # noqa: E402

HOPPER = DeviceCapability(9, 0)
GOOD = dict(
    head_size=128,
    dtype=torch.bfloat16,
    kv_cache_dtype="auto",
    block_size=16,
    use_mla=False,
    has_sink=False,
    use_sparse=False,
    use_mm_prefix=False,
    use_per_head_quant_scales=False,
    device_capability=HOPPER,
    attn_type=AttentionType.DECODER,
)


@pytest.fixture(autouse=True)
def _config(vllm_config):
    return vllm_config


def reasons(**changes):
    return FA4AttentionBackend.validate_configuration(**{**GOOD, **changes})


_SELECTOR_ASKS = inspect.signature(AttentionBackend.validate_configuration).parameters


def asked_by_selector(changes, words):
    """A refusal case for a question only some vLLM versions' selector asks (0.33 added
    use_dcp, use_rswa and use_adaptive_verification); skipped where it is not asked."""
    (kwarg,) = changes
    missing = pytest.mark.skipif(
        kwarg not in _SELECTOR_ASKS, reason=f"this vLLM's backend selector has no {kwarg}"
    )
    return pytest.param(changes, words, marks=missing, id=kwarg)


def test_name_matches_enum_member():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    assert AttentionBackendEnum[FA4AttentionBackend.get_name()].get_class() is FA4AttentionBackend


@pytest.mark.parametrize("head_size", [64, 128, 256])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32, 64, 128, 256])
def test_supported_configurations_pass(head_size, dtype, block_size):
    assert reasons(head_size=head_size, dtype=dtype, block_size=block_size) == []
    same = str(dtype).removeprefix("torch.")  # a cache dtype spelled as the model's
    assert (
        reasons(head_size=head_size, dtype=dtype, block_size=block_size, kv_cache_dtype=same) == []
    )


@pytest.mark.parametrize(
    "changes, words",
    [  # the refused feature, with the value vLLM asked for where there is one
        (dict(kv_cache_dtype="fp8_e5m2"), "kv_cache_dtype 'fp8_e5m2'"),
        (dict(head_size=96), "head size 96"),
        (dict(dtype=torch.float32), "dtype float32"),
        (dict(block_size=8), "block size 8"),
        (dict(device_capability=DeviceCapability(8, 0)), "compute capability 8.0"),
        (dict(device_capability=DeviceCapability(10, 0)), "compute capability 10.0"),
        (dict(attn_type=AttentionType.ENCODER_ONLY), "attention type"),
        (dict(attn_type=AttentionType.ENCODER_DECODER), "attention type"),
        (dict(use_non_causal=True), "non-causal"),
        (dict(use_mla=True), "MLA"),
        (dict(use_mm_prefix=True), "multimodal"),
        (dict(use_batch_invariant=True), "batch invariance"),
        (dict(kv_cache_dtype="float16"), "kv_cache_dtype float16 with model dtype bfloat16"),
        (dict(dtype=torch.float16, kv_cache_dtype="bfloat16"), "with model dtype float16"),
        asked_by_selector(dict(use_dcp=True), "DCP"),
        asked_by_selector(dict(use_rswa=True), "R-SWA"),
        asked_by_selector(dict(use_adaptive_verification=True), "adaptive verification"),
    ],
)
def test_rejections_name_the_feature_and_the_alternative(changes, words):
    found = reasons(**changes)
    assert len(found) == 1, found
    assert words in found[0] and found[0].startswith("FA4:") and "FLASH_ATTN" in found[0]


def test_gpu_other_than_sm90_is_refused_naming_the_gpu(monkeypatch):
    """vLLM asks ``supports_compute_capability`` inside ``validate_configuration`` and would
    say only "compute capability not supported": the refusal names the GPU vLLM found, its
    capability, what FA4 needs and FLASH_ATTN, and is the only reason given."""
    from vllm.platforms import current_platform

    monkeypatch.setattr(
        type(current_platform),
        "get_device_name",
        classmethod(lambda cls, device_id=0: "NVIDIA A100-SXM4-80GB"),
    )
    (reason,) = reasons(device_capability=DeviceCapability(8, 0))
    assert "found NVIDIA A100-SXM4-80GB with compute capability 8.0" in reason
    assert "SM90" in reason and "--attention-backend FLASH_ATTN" in reason
    assert "compute capability not supported" not in reason
    # without a name from the platform (NVML unavailable), still the capability
    monkeypatch.setattr(
        type(current_platform), "get_device_name", classmethod(lambda cls, device_id=0: 1 / 0)
    )
    (reason,) = reasons(device_capability=DeviceCapability(12, 0))
    assert "found a GPU with compute capability 12.0" in reason


@pytest.mark.skipif(not KV_CACHE_SHAPE_FROM_BACKEND, reason="vLLM 0.26's shape hooks")
def test_kv_cache_shape_is_flash_attn_layout():
    assert FA4AttentionBackend.get_kv_cache_shape(10, 16, 8, 128) == (10, 8, 16, 256)
    for with_layers in (False, True):
        assert FA4AttentionBackend.get_kv_cache_stride_order(
            with_layers
        ) == FlashAttentionBackend.get_kv_cache_stride_order(with_layers)


@pytest.mark.skipif(KV_CACHE_SHAPE_FROM_BACKEND, reason="vLLM 0.33's spec and layout hooks")
def test_kv_cache_spec_and_layout_are_flash_attn_defaults():
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    assert FA4AttentionBackend.customize_spec(spec) == FlashAttentionBackend.customize_spec(spec)
    # vLLM resolves one layout for all backends of a model: with FA4 alone, or beside
    # FLASH_ATTN (a model with layers on both), it is the one FLASH_ATTN gets by itself.
    alone = get_supported_kv_cache_layouts([FlashAttentionBackend])[0]
    assert get_supported_kv_cache_layouts([FA4AttentionBackend])[0] == alone
    assert get_supported_kv_cache_layouts([FlashAttentionBackend, FA4AttentionBackend])[0] == alone
    for layout in FA4AttentionBackend.supported_kv_cache_layouts():  # all NHD per layer
        assert layout.layer_view_order == (0, 2, 1, 3), layout


@pytest.fixture
def kv_cache_layout(monkeypatch):
    """Sets VLLM_KV_CACHE_LAYOUT; skips a layout name this vLLM does not have (0.26: NHD, HND)."""
    from vllm.v1.attention.backends import utils

    from vllm_fa4.compat import NHD_KV_CACHE_LAYOUTS

    cached_lookup = getattr(utils, "get_kv_cache_layout", None)  # vLLM 0.26 caches its answer

    def set_layout(name):
        if name not in ("NHD", "HND") and NHD_KV_CACHE_LAYOUTS is None:
            pytest.skip(f"this vLLM has no KV cache layout {name}")
        monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", name)
        if cached_lookup is not None:
            cached_lookup.cache_clear()

    yield set_layout
    if cached_lookup is not None:
        cached_lookup.cache_clear()


@pytest.mark.parametrize("layout", ["HND", "LBHNC", "BLHNC"])
def test_kv_cache_layout_other_than_nhd_is_refused(kv_cache_layout, layout):
    kv_cache_layout(layout)
    (found,) = reasons()
    assert f"KV cache layout {layout}" in found and "FLASH_ATTN" in found


@pytest.mark.parametrize("layout", ["NHD", "LBNHC", "BLNHC"])
def test_nhd_kv_cache_layouts_pass(kv_cache_layout, layout):
    kv_cache_layout(layout)
    assert reasons() == []


IMPL_ARGS = dict(
    num_heads=32,
    head_size=128,
    scale=128**-0.5,
    num_kv_heads=8,
    alibi_slopes=None,
    sliding_window=None,
    kv_cache_dtype="auto",
)


def test_sinks_and_sliding_window_pass_backend_selection():
    assert reasons(has_sink=True) == []
    assert reasons(has_sink=True, head_size=64, block_size=128) == []
    assert reasons(has_sliding_window=True) == []
    assert reasons(has_sliding_window=True, has_sink=True, head_size=256, block_size=16) == []


@pytest.mark.parametrize(
    "changes, features",
    [
        ({}, ModelFeatures()),
        (dict(logits_soft_cap=30.0), ModelFeatures(softcap=30.0)),
        (dict(logits_soft_cap=0.0), ModelFeatures()),  # vLLM's "no cap"
        (dict(sinks=torch.zeros(32)), ModelFeatures(sinks=True)),
        (
            dict(logits_soft_cap=50.0, sinks=torch.zeros(32)),
            ModelFeatures(softcap=50.0, sinks=True),
        ),
        (dict(sliding_window=4096), ModelFeatures(window_left=4095)),
        (dict(sliding_window=1), ModelFeatures(window_left=0)),  # the diagonal only
        (
            dict(sliding_window=128, sinks=torch.zeros(32)),  # gpt-oss's windowed layers
            ModelFeatures(window_left=127, sinks=True),
        ),
    ],
)
def test_impl_takes_model_features_for_both_paths(monkeypatch, changes, features):
    # FA3's sink support is probed from the GPU; this machine has none.
    import vllm.v1.attention.backends.flash_attn as fa

    monkeypatch.setattr(fa, "flash_attn_supports_sinks", lambda: True, raising=False)
    impl = FA4AttentionImpl(**{**IMPL_ARGS, **changes})
    assert impl.model_features == features
    # decode (FA3) sees the same settings: its (left, right) window and the cap
    window = changes.get("sliding_window")
    assert impl.sliding_window == ((-1, -1) if window is None else (window - 1, 0))
    assert impl.logits_soft_cap == (changes.get("logits_soft_cap") or 0)
    assert (impl.sinks is None) == ("sinks" not in changes)


def test_bf16_sinks_are_converted_once_per_weight_version(monkeypatch):
    import vllm.v1.attention.backends.flash_attn as fa

    monkeypatch.setattr(fa, "flash_attn_supports_sinks", lambda: True, raising=False)
    sinks = torch.nn.Parameter(torch.zeros(32, dtype=torch.bfloat16), requires_grad=False)
    impl = FA4AttentionImpl(**{**IMPL_ARGS, "sinks": sinks})
    first = impl._sinks_fp32()
    assert first.dtype == torch.float32 and not first.any()
    assert impl._sinks_fp32() is first  # the next layer call reuses the copy
    with torch.no_grad():
        sinks.copy_(torch.arange(32, dtype=torch.bfloat16))  # weights (re)loaded in place
    again = impl._sinks_fp32()
    assert again is not first and torch.equal(again, torch.arange(32, dtype=torch.float32))


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(alibi_slopes=[0.5] * 32), "ALiBi"),
        (dict(kv_cache_dtype="fp8_e5m2"), "kv_cache_dtype 'fp8_e5m2'"),
        (dict(attn_type=AttentionType.ENCODER), "attention type"),
    ],
)
def test_impl_refuses_at_construction(changes, words):
    with pytest.raises(NotImplementedError, match=f"{words}.*FLASH_ATTN"):
        FA4AttentionImpl(**{**IMPL_ARGS, **changes})


def test_fa3_decode_gets_bf16_sinks_whatever_the_model_dtype(monkeypatch):
    """FA3's s_aux takes bf16 only; vLLM makes a layer's sinks in the model's dtype, so an
    fp16 model's would fail at its first decode. The decode path reads a bf16 copy, remade
    when the weights change; the prefill kernel an fp32 one."""
    import vllm.v1.attention.backends.flash_attn as fa

    monkeypatch.setattr(fa, "flash_attn_supports_sinks", lambda: True, raising=False)
    weights = torch.nn.Parameter(torch.zeros(32, dtype=torch.float16), requires_grad=False)
    impl = FA4AttentionImpl(**{**IMPL_ARGS, "sinks": weights})
    assert impl.sinks.dtype == torch.bfloat16 and impl.sinks is impl.sinks
    with torch.no_grad():
        weights.copy_(torch.linspace(-2, 4, 32, dtype=torch.float16))
    assert torch.equal(impl.sinks, weights.to(torch.bfloat16))
    assert torch.equal(impl._sinks_fp32(), weights.float())
    bf16 = torch.nn.Parameter(torch.ones(32, dtype=torch.bfloat16), requires_grad=False)
    assert FA4AttentionImpl(**{**IMPL_ARGS, "sinks": bf16}).sinks is bf16  # no copy


def test_sinks_with_more_query_heads_than_fa3_takes_are_refused_at_construction(monkeypatch):
    import vllm.v1.attention.backends.flash_attn as fa

    monkeypatch.setattr(fa, "flash_attn_supports_sinks", lambda: True, raising=False)
    args = {**IMPL_ARGS, "num_heads": 128, "num_kv_heads": 8}
    FA4AttentionImpl(**args)  # without sinks: fine
    with pytest.raises(NotImplementedError, match="sinks with 128 query heads.*at most 64"):
        FA4AttentionImpl(**args, sinks=torch.zeros(128, dtype=torch.bfloat16))
