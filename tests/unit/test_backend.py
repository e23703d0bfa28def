"""Capability checks: what FA4 accepts, and the startup reasons it gives for what it refuses."""

import pytest
import torch

import vllm_fa4

vllm_fa4.register()

from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.v1.attention.backend import AttentionType  # noqa: E402

from vllm_fa4.backend import FA4AttentionBackend, FA4AttentionImpl  # noqa: E402
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
    [
        (dict(kv_cache_dtype="fp8"), "kv_cache_dtype"),
        (dict(head_size=96), "head_size"),
        (dict(dtype=torch.float32), "dtype"),
        (dict(block_size=8), "block_size"),
        (dict(device_capability=DeviceCapability(8, 0)), "compute capability"),
        (dict(device_capability=DeviceCapability(10, 0)), "compute capability"),
        (dict(attn_type=AttentionType.ENCODER_ONLY), "attention type"),
        (dict(attn_type=AttentionType.ENCODER_DECODER), "attention type"),
        (dict(use_non_causal=True), "non-causal"),
        (dict(use_mla=True), "MLA"),
        (dict(use_mm_prefix=True), "multimodal"),
        (dict(use_batch_invariant=True), "batch invariance"),
        (dict(kv_cache_dtype="float16"), "kv_cache_dtype float16 with model dtype bfloat16"),
        (dict(dtype=torch.float16, kv_cache_dtype="bfloat16"), "with model dtype float16"),
    ],
)
def test_rejections_name_the_feature_and_the_alternative(changes, words):
    found = reasons(**changes)
    assert len(found) == 1, found
    assert words in found[0] and found[0].startswith("FA4:") and "FLASH_ATTN" in found[0]


def test_kv_cache_shape_is_flash_attn_layout():
    assert FA4AttentionBackend.get_kv_cache_shape(10, 16, 8, 128) == (10, 8, 16, 256)


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
        (dict(kv_cache_dtype="fp8"), "kv_cache_dtype"),
        (dict(attn_type=AttentionType.ENCODER), "attention type"),
    ],
)
def test_impl_refuses_at_construction(changes, words):
    with pytest.raises(NotImplementedError, match=words):
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
