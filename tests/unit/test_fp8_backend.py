"""FP8 KV cache (issue 30) in the backend: what startup accepts and refuses, the builder's key,
and what ``forward`` hands FA3 (decode rows) and ``run_prefill`` (prefill rows). CPU: FA3 and
run_prefill are stubs that record their arguments."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import vllm_fa4

vllm_fa4.register()

from vllm.platforms.interface import DeviceCapability  # noqa: E402
from vllm.v1.attention.backend import AttentionType  # noqa: E402

from vllm_fa4 import envs, warmup  # noqa: E402
from vllm_fa4.backend import FA4AttentionBackend, FA4AttentionImpl  # noqa: E402
from vllm_fa4.compat import FlashAttentionImpl  # noqa: E402
from vllm_fa4.kernels.config import FP8_E4M3  # noqa: E402
from vllm_fa4.paged_prefill import route as route_mod  # noqa: E402

SELECT = dict(
    head_size=128,
    dtype=torch.bfloat16,
    kv_cache_dtype="fp8",
    block_size=16,
    use_mla=False,
    has_sink=False,
    use_sparse=False,
    use_mm_prefix=False,
    use_per_head_quant_scales=False,
    device_capability=DeviceCapability(9, 0),
    attn_type=AttentionType.DECODER,
)
IMPL_ARGS = dict(
    num_heads=32,
    head_size=128,
    scale=128**-0.5,
    num_kv_heads=8,
    alibi_slopes=None,
    sliding_window=None,
    kv_cache_dtype="fp8",
)
QUANTIZED_NAMES = ["fp8_e5m2", "fp8_inc", "fp8_per_token_head", "int8_per_token_head", "nvfp4"]


@pytest.fixture(autouse=True)
def _clean(monkeypatch, vllm_config):
    for name in (envs.VARIANT, envs.PREFILL_ROUTE, envs.FP8_QUERY):
        monkeypatch.delenv(name, raising=False)
    route_mod.clear_route_cache()
    # vLLM 0.33's FlashAttentionImpl asks FA3 (a GPU probe) whether it takes an fp8 cache
    import vllm.v1.attention.backends.flash_attn as fa

    monkeypatch.setattr(
        fa, "flash_attn_supports_kv_cache_dtype", lambda *a, **k: True, raising=False
    )
    yield
    route_mod.clear_route_cache()


@pytest.fixture
def kernel_reads_fp8(monkeypatch):
    """The kernel side's switch (route.kernel_reads_fp8), on: the FP8 kernel is there."""
    monkeypatch.setattr(route_mod, "kernel_reads_fp8", lambda key: True)


@pytest.fixture
def kernel_skips_fp8(monkeypatch):
    """The switch off: what startup does where the kernel does not read a key's FP8 cache."""
    monkeypatch.setattr(route_mod, "kernel_reads_fp8", lambda key: False)


def reasons(**changes):
    return FA4AttentionBackend.validate_configuration(**{**SELECT, **changes})


# ---- backend selection ------------------------------------------------------------------------


def test_kernel_switch_is_on_for_e4m3_keys():
    """The switch the kernel side flips (route.kernel_reads_fp8): on since the kernel reads
    e4m3 caches (kernels/fp8_kv.py), for FP8 keys only."""
    from vllm_fa4.kernels.config import KernelKey

    assert route_mod.kernel_reads_fp8(KernelKey("bfloat16", 128, 16, 4, kv_dtype=FP8_E4M3))
    assert not route_mod.kernel_reads_fp8(KernelKey("bfloat16", 128, 16, 4))


@pytest.mark.parametrize("name", ["fp8", "fp8_e4m3"])
def test_fp8_is_refused_while_the_kernel_does_not_read_it(kernel_skips_fp8, name):
    (reason,) = reasons(kv_cache_dtype=name)
    assert f"kv_cache_dtype {name!r} at head size 128" in reason
    assert "does not read an FP8 cache" in reason and "FLASH_ATTN" in reason


@pytest.mark.parametrize("name", ["fp8", "fp8_e4m3"])
def test_fp8_is_accepted_where_the_kernel_reads_it(kernel_reads_fp8, name):
    assert reasons(kv_cache_dtype=name) == []
    assert reasons(kv_cache_dtype=name, head_size=64, block_size=128) == []


def test_fp8_asks_the_switch_about_the_kernel_page(monkeypatch):
    """A 256-token block runs as 128-token kernel pages: the switch is asked about those."""
    asked = []
    monkeypatch.setattr(route_mod, "kernel_reads_fp8", lambda key: asked.append(key) or True)
    assert reasons(block_size=256) == []
    assert asked and {key.page_size for key in asked} == {128}
    assert all(key.fp8_kv and key.head_dim == 128 for key in asked)


def test_fp8_runs_on_the_reference_only_when_asked_for(kernel_skips_fp8, monkeypatch):
    monkeypatch.setenv(envs.PREFILL_ROUTE, "reference")
    assert reasons() == []


def test_fp8_with_an_fp16_model_is_refused(kernel_reads_fp8):
    (reason,) = reasons(dtype=torch.float16)
    assert "with model dtype float16" in reason and "bfloat16 only" in reason
    assert "FLASH_ATTN" in reason


@pytest.mark.parametrize("name", QUANTIZED_NAMES)
@pytest.mark.parametrize("switch", [False, True])
def test_other_quantized_caches_are_refused_naming_what_is_served(monkeypatch, name, switch):
    monkeypatch.setattr(route_mod, "kernel_reads_fp8", lambda key: switch)
    (reason,) = reasons(kv_cache_dtype=name)
    served = "auto, bfloat16, fp8, fp8_e4m3" if switch else "auto, bfloat16"
    assert f"kv_cache_dtype {name!r} is not supported (supported: {served};" in reason
    assert "FLASH_ATTN" in reason


def test_per_head_kv_scales_are_refused(kernel_reads_fp8):
    (reason,) = reasons(use_per_head_quant_scales=True)
    assert reason.startswith("FA4: per-head KV cache scales") and "FLASH_ATTN" in reason


def test_sixteen_bit_cache_unlike_the_model_is_still_refused(kernel_reads_fp8):
    (reason,) = reasons(kv_cache_dtype="float16")
    assert "kv_cache_dtype float16 with model dtype bfloat16" in reason


# ---- impl construction ------------------------------------------------------------------------


@pytest.mark.parametrize("name", QUANTIZED_NAMES)
def test_impl_refuses_other_quantized_caches(kernel_reads_fp8, name):
    with pytest.raises(NotImplementedError, match=f"kv_cache_dtype '{name}'.*FLASH_ATTN"):
        FA4AttentionImpl(**{**IMPL_ARGS, "kv_cache_dtype": name})


def test_impl_refuses_fp8_while_the_kernel_does_not_read_it(kernel_skips_fp8):
    with pytest.raises(NotImplementedError, match="does not read an FP8 cache.*FLASH_ATTN"):
        FA4AttentionImpl(**IMPL_ARGS)


def test_impl_never_asks_the_layer_to_quantize_q(kernel_reads_fp8):
    impl = FA4AttentionImpl(**IMPL_ARGS)
    assert impl.supports_quant_query_input is False  # prefill rows need 16-bit Q
    assert impl._decode_query_quant is not None
    assert FA4AttentionImpl(**{**IMPL_ARGS, "kv_cache_dtype": "auto"})._decode_query_quant is None


# ---- forward: decode rows to FA3 with FP8 Q, prefill rows to run_prefill with fp8 views -------

NUM_DECODE, NUM_PREFILL, HQ, HKV, D, PAGE = 3, 5, 32, 8, 128, 16


class _Recorder:
    def __init__(self):
        self.fa3 = []
        self.prefill = []


@pytest.fixture
def recorded(monkeypatch, kernel_reads_fp8):
    """FA3's forward and run_prefill replaced by recorders (what each was handed)."""
    import vllm_fa4.backend as backend

    rec = _Recorder()

    def fa3(self, layer, query, key, value, kv_cache, metadata, output, *a, **k):
        rec.fa3.append(SimpleNamespace(query=query, says_quantized=self.supports_quant_query_input))
        return output

    def prefill(plan, q, k_cache, v_cache, out, **kwargs):
        rec.prefill.append(SimpleNamespace(q=q, k=k_cache, v=v_cache, kwargs=kwargs))

    monkeypatch.setattr(FlashAttentionImpl, "forward", fa3)
    monkeypatch.setattr(backend, "run_prefill", prefill)
    return rec


def _layer(q_scale=0.37, k_scale=0.021, v_scale=0.013):
    return SimpleNamespace(
        _q_scale=torch.tensor(q_scale), _k_scale_float=k_scale, _v_scale_float=v_scale
    )


def _metadata(num_decode=NUM_DECODE, num_prefill=NUM_PREFILL):
    from vllm_fa4.metadata import FA4Metadata

    return FA4Metadata(
        num_actual_tokens=num_decode + num_prefill,
        num_decodes=num_decode,
        num_decode_tokens=num_decode,
        num_prefills=1 if num_prefill else 0,
        num_prefill_tokens=num_prefill,
        decode=SimpleNamespace(num_actual_tokens=num_decode) if num_decode else None,
        prefill=SimpleNamespace(num_tokens=num_prefill, window_left=None) if num_prefill else None,
        slot_mapping=torch.zeros(num_decode + num_prefill, dtype=torch.int64),
    )


def _forward(impl, layer, metadata):
    tokens = metadata.num_actual_tokens
    # vLLM's views: Q of a wider qkv buffer; the cache uint8 [blocks, Hkv, page, 2D] over NHD
    qkv = torch.randn(tokens, (HQ + 2 * HKV) * D, generator=torch.Generator().manual_seed(0))
    query = qkv.to(torch.bfloat16)[:, : HQ * D].view(tokens, HQ, D) * 40  # some beyond 448*s
    kv_cache = torch.randint(0, 255, (4, PAGE, HKV, 2 * D), dtype=torch.uint8).transpose(1, 2)
    output = torch.zeros(tokens, HQ, D, dtype=torch.bfloat16)
    impl.forward(layer, query, None, None, kv_cache, metadata, output)
    return query, kv_cache


def test_decode_rows_reach_fa3_as_fp8_q_with_the_descale_flag(recorded):
    impl, layer = FA4AttentionImpl(**IMPL_ARGS), _layer()
    query, _ = _forward(impl, layer, _metadata())
    (call,) = recorded.fa3
    assert call.says_quantized is True  # FlashAttentionImpl then passes q_descale=_q_scale
    assert impl.supports_quant_query_input is False  # ... for that call only
    assert call.query.dtype == torch.float8_e4m3fn and call.query.shape == (NUM_DECODE, HQ, D)
    # vLLM's static per-tensor quantization: x * (1 / scale), clamped to e4m3's range
    rows = query[:NUM_DECODE].float() * torch.tensor(0.37).reciprocal()
    expect = rows.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    assert torch.equal(call.query.view(torch.uint8), expect.view(torch.uint8))
    assert (rows.abs() > 448).any()  # the clamp was exercised


def test_prefill_rows_get_16_bit_q_fp8_views_and_the_layers_float_scales(recorded):
    impl, layer = FA4AttentionImpl(**IMPL_ARGS), _layer()
    query, kv_cache = _forward(impl, layer, _metadata())
    (call,) = recorded.prefill
    assert call.q.dtype == torch.bfloat16 and torch.equal(call.q, query[NUM_DECODE:])
    assert call.k.dtype == call.v.dtype == torch.float8_e4m3fn
    assert call.k.data_ptr() == kv_cache.data_ptr() and call.k.shape == (4, PAGE, HKV, D)
    assert torch.equal(call.k.view(torch.uint8), kv_cache.transpose(1, 2)[..., :D])
    assert torch.equal(call.v.view(torch.uint8), kv_cache.transpose(1, 2)[..., D:])
    assert call.kwargs["k_scale"] == 0.021 and call.kwargs["v_scale"] == 0.013
    # scales that change after startup (0.26's calculate_kv_scales) are read every step
    layer._k_scale_float = 0.5
    _forward(impl, layer, _metadata())
    assert recorded.prefill[-1].kwargs["k_scale"] == 0.5


def test_sixteen_bit_cache_forward_is_unchanged(recorded):
    impl = FA4AttentionImpl(**{**IMPL_ARGS, "kv_cache_dtype": "auto"})
    kv = torch.zeros(4, PAGE, HKV, 2 * D, dtype=torch.bfloat16).transpose(1, 2)
    query = torch.randn(NUM_DECODE + NUM_PREFILL, HQ, D, dtype=torch.bfloat16)
    output = torch.zeros_like(query)
    impl.forward(_layer(), query, None, None, kv, _metadata(), output)
    (fa3,) = recorded.fa3
    assert fa3.query is query and fa3.says_quantized is False
    (prefill,) = recorded.prefill
    assert prefill.k.dtype == torch.bfloat16 and "k_scale" not in prefill.kwargs


# ---- the builder ------------------------------------------------------------------------------


def _builder(vllm_config, monkeypatch, cache_dtype="fp8", device="cpu"):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from vllm_fa4.metadata import FA4MetadataBuilder

    monkeypatch.setattr(vllm_config.cache_config, "cache_dtype", cache_dtype)
    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.uint8)
    return FA4MetadataBuilder(spec, ["layer.0"], vllm_config, torch.device(device))


@pytest.fixture
def fake_hopper(monkeypatch):
    import vllm_fa4.metadata as metadata

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    requested = []
    monkeypatch.setattr(warmup, "request", lambda key, config: requested.append((key, config)))
    monkeypatch.setattr(metadata, "FlashAttentionMetadataBuilder", lambda *a: object())
    return requested


@pytest.mark.parametrize("name", ["fp8", "fp8_e4m3"])
def test_builder_keys_an_fp8_cache(vllm_config, monkeypatch, name):
    builder = _builder(vllm_config, monkeypatch, name)
    assert builder.kernel_key.kv_dtype == FP8_E4M3 and builder.kernel_key.dtype == "bfloat16"
    assert builder.prefill_route == "reference"  # CPU


def test_builder_on_gpu_refuses_fp8_while_the_kernel_does_not_read_it(
    vllm_config, monkeypatch, fake_hopper, kernel_skips_fp8
):
    with pytest.raises(RuntimeError, match="FP8 KV cache.*FLASH_ATTN"):
        _builder(vllm_config, monkeypatch, device="cuda:0")
    assert fake_hopper == []


def test_builder_on_gpu_compiles_the_fp8_key_at_startup(
    vllm_config, monkeypatch, fake_hopper, kernel_reads_fp8
):
    builder = _builder(vllm_config, monkeypatch, device="cuda:0")
    assert builder.prefill_route == "kernel"
    assert fake_hopper and {key for key, _ in fake_hopper} == {builder.kernel_key}
    assert builder.kernel_key.fp8_kv


@pytest.mark.parametrize("name", ["fp8_e5m2", "fp8_per_token_head"])
def test_builder_refuses_other_one_byte_caches(vllm_config, monkeypatch, kernel_reads_fp8, name):
    with pytest.raises(NotImplementedError, match=f"kv_cache_dtype '{name}'.*FLASH_ATTN"):
        _builder(vllm_config, monkeypatch, name)


def test_cache_write_is_flash_attns_quantizing_one(kernel_reads_fp8, monkeypatch):
    """vLLM writes new K/V through the impl's do_kv_cache_update (FLASH_ATTN's, inherited):
    reshape_and_cache_flash with the cache dtype name and the layer's device scales, which
    quantizes to e4m3 (a CUDA op: recorded here)."""
    import vllm.v1.attention.backends.flash_attn as fa

    calls = []
    # (imported there only where FA is built: on a GPU machine)
    monkeypatch.setattr(
        fa, "reshape_and_cache_flash", lambda *args: calls.append(args), raising=False
    )
    impl = FA4AttentionImpl(**IMPL_ARGS)
    assert type(impl).do_kv_cache_update is FlashAttentionImpl.do_kv_cache_update
    assert not FA4AttentionBackend.forward_includes_kv_cache_update
    layer = SimpleNamespace(_k_scale=torch.tensor(0.021), _v_scale=torch.tensor(0.013))
    kv_cache = torch.zeros(4, PAGE, HKV, 2 * D, dtype=torch.uint8).transpose(1, 2)
    key = torch.zeros(2, HKV, D, dtype=torch.bfloat16)
    impl.do_kv_cache_update(layer, key, key, kv_cache, torch.arange(2))
    (args,) = calls
    assert args[5] == "fp8" and args[6] is layer._k_scale and args[7] is layer._v_scale
    assert args[2].shape == (4, PAGE, HKV, D) and args[2].dtype == torch.uint8


def test_fp8_serving_says_once_that_its_prefill_is_slower(kernel_reads_fp8, monkeypatch, caplog):
    """FP8 is served but its prefill kernel is not yet fast (issue 30): the first FP8 impl
    logs it with the measured ratio and FLASH_ATTN as the faster choice, once per process."""
    import vllm_fa4.backend as backend_mod

    monkeypatch.setattr(backend_mod, "_fp8_warned", False)
    with caplog.at_level("WARNING", logger="vllm_fa4"):
        FA4AttentionImpl(**IMPL_ARGS)
        FA4AttentionImpl(**IMPL_ARGS)
    said = [r.getMessage() for r in caplog.records if "FP8 prefill" in r.getMessage()]
    assert len(said) == 1 and "FLASH_ATTN" in said[0] and "0.97x" in said[0]
    assert f"{envs.FP8_QUERY}=e4m3" in said[0]  # the faster opt-in, named with its price


def test_fp8_e4m3_query_says_once_what_it_trades(kernel_reads_fp8, monkeypatch, caplog):
    """VLLM_FA4_FP8_QUERY=e4m3: the startup warning names the rounding of Q and its error
    instead of the speed gap, once per process."""
    import vllm_fa4.backend as backend_mod

    monkeypatch.setattr(backend_mod, "_fp8_warned", False)
    monkeypatch.setenv(envs.FP8_QUERY, "e4m3")
    with caplog.at_level("WARNING", logger="vllm_fa4"):
        FA4AttentionImpl(**IMPL_ARGS)
        FA4AttentionImpl(**IMPL_ARGS)
    said = [r.getMessage() for r in caplog.records if envs.FP8_QUERY in r.getMessage()]
    assert len(said) == 1 and "rounded to e4m3" in said[0] and "0.87-0.90x" in said[0]
    assert "0.97x" not in said[0]


@pytest.mark.parametrize("value", ["fast", "fp8", "E4M3x"])
def test_misspelt_fp8_query_is_refused_at_backend_selection(kernel_reads_fp8, monkeypatch, value):
    monkeypatch.setenv(envs.FP8_QUERY, value)
    (reason,) = reasons()
    assert f"{envs.FP8_QUERY}={value.lower()!r}" in reason
    assert "exact, e4m3" in reason and "--attention-backend FLASH_ATTN" in reason


@pytest.mark.parametrize("value", ["e4m3", " E4M3 "])
def test_builder_on_gpu_compiles_the_e4m3_query_pick_at_startup(
    vllm_config, monkeypatch, fake_hopper, kernel_reads_fp8, value
):
    """VLLM_FA4_FP8_QUERY=e4m3 reaches the builder: its long pick rounds Q (fp8_qk_rounded),
    the short one is unchanged, and warmup compiles both; unset, the split (fp8_qk)."""
    from vllm_fa4.kernels.config import Fp8Qk

    exact = _builder(vllm_config, monkeypatch, device="cuda:0").kernel_configs
    assert exact.long.fp8_qk is Fp8Qk.SPLIT_Q
    fake_hopper.clear()
    monkeypatch.setenv(envs.FP8_QUERY, value)
    assert reasons() == []
    rounded = _builder(vllm_config, monkeypatch, device="cuda:0").kernel_configs
    assert rounded.long.fp8_qk is Fp8Qk.ROUNDED_Q and rounded.short == exact.short
    assert {config for _, config in fake_hopper} == set(rounded.all)
