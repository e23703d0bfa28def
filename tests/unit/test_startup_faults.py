"""Startup faults (CPU): a misspelt environment and a key without a kernel are refused at
startup, with a reason, never served on the slow fp32 reference behind the user's back.

Where they surface: vLLM's backend selection (``FA4AttentionBackend.validate_configuration``,
whose reasons ``CudaPlatform.get_attn_backend_cls`` raises as "Selected backend FA4 is not
valid for this configuration. Reason: [...]", before weights load) for the environment and
for a kernel config that cannot build the head dim; the metadata builder's constructor
(every worker, before the profiling run) for the full kernel key, GQA group included.
"""

from __future__ import annotations

import logging

import pytest
import torch

import vllm_fa4
from vllm_fa4 import envs, warmup
from vllm_fa4.kernels.config import KernelConfig
from vllm_fa4.paged_prefill import route as route_mod

vllm_fa4.register()

from vllm.platforms.interface import DeviceCapability  # noqa: E402

HOPPER = DeviceCapability(9, 0)
SELECT = dict(head_size=128, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16)


@pytest.fixture(autouse=True)
def _clean(monkeypatch, vllm_config):
    for name in (envs.VARIANT, envs.PREFILL_ROUTE, envs.FP8_QUERY):
        monkeypatch.delenv(name, raising=False)
    route_mod.clear_route_cache()
    yield
    route_mod.clear_route_cache()


@pytest.fixture
def fake_hopper(monkeypatch):
    """The builder sees an SM90 "cuda:0"; warmup requests are recorded, not compiled, and
    vLLM's FA3 decode builder (which would allocate on the GPU) is a stub."""
    import vllm_fa4.metadata as metadata

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    requested = []
    monkeypatch.setattr(warmup, "request", lambda key, config: requested.append((key, config)))
    monkeypatch.setattr(metadata, "FlashAttentionMetadataBuilder", lambda *a: object())
    return requested


def validate(**changes):
    from vllm.v1.attention.backend import AttentionType

    from vllm_fa4.backend import FA4AttentionBackend

    args = dict(
        SELECT,
        use_mla=False,
        has_sink=False,
        use_sparse=False,
        use_mm_prefix=False,
        use_per_head_quant_scales=False,
        device_capability=HOPPER,
        attn_type=AttentionType.DECODER,
    )
    return FA4AttentionBackend.validate_configuration(**{**args, **changes})


def make_builder(vllm_config, device="cpu", head_size=128, num_kv_heads=8):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from vllm_fa4.metadata import FA4MetadataBuilder

    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=num_kv_heads, head_size=head_size, dtype=torch.bfloat16
    )
    return FA4MetadataBuilder(spec, ["layer.0"], vllm_config, torch.device(device))


def _valid_spellings() -> list[str]:
    return [s.strip() for s in KernelConfig.spellings().split(",")]


# --- VLLM_FA4_VARIANT / VLLM_FA4_PREFILL_ROUTE misspelt --------------------------------------


def test_nonsense_variant_is_refused_at_backend_selection(monkeypatch):
    """vLLM (``CudaPlatform.get_attn_backend_cls``, not importable without libcuda) turns
    these reasons into ``ValueError: Selected backend FA4 is not valid for this
    configuration. Reason: [...]`` before any weights load."""
    assert validate() == []
    monkeypatch.setenv(envs.VARIANT, "turbo+pingpnog")
    (reason,) = validate()
    assert reason.startswith("FA4: VLLM_FA4_VARIANT='turbo+pingpnog'")
    assert "'turbo'" in reason and "--attention-backend FLASH_ATTN" in reason
    for spelling in _valid_spellings():  # one_per_cta, queue, ..., mma_wgs=N
        assert spelling in reason
    assert "'default'" in reason  # the per-batch defaults' spelling too
    assert "count_visits" not in reason  # test-only instrumentation is not offered


@pytest.mark.parametrize("spec", ["default", " default ", ""])
def test_default_variant_means_the_per_batch_serving_defaults(monkeypatch, vllm_config, spec):
    """``VLLM_FA4_VARIANT=default`` (the docs' and the sweep tools' spelling) is the same
    as unset: each key's serving configs, picked per batch."""
    from vllm_fa4.paged_prefill.policy import configured_config, serving_configs

    monkeypatch.setenv(envs.VARIANT, spec)
    assert configured_config() is None
    assert validate() == []
    builder = make_builder(vllm_config)
    assert builder.kernel_configs == serving_configs(builder.kernel_key)


def test_variant_outside_the_serving_picks_is_warned_at_startup(monkeypatch, vllm_config, caplog):
    """A fixed config the table does not pick for the key builds and serves, but the fuzz
    suite and the sanitizers never ran it: one startup warning says so; the table's own
    picks (or unset) say nothing."""
    from vllm_fa4.paged_prefill.policy import serving_configs

    builder = make_builder(vllm_config)
    picks = serving_configs(builder.kernel_key).all
    for spec in (None, picks[0].spec):
        if spec is not None:
            monkeypatch.setenv(envs.VARIANT, spec)
        with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
            caplog.clear()
            make_builder(vllm_config)
        assert not [r for r in caplog.records if "serving table" in r.getMessage()], spec
    monkeypatch.setenv(envs.VARIANT, "one_per_cta+serial")
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        caplog.clear()
        builder = make_builder(vllm_config)
    (said,) = [r.getMessage() for r in caplog.records if "serving table" in r.getMessage()]
    assert "VLLM_FA4_VARIANT='one_per_cta+serial'" in said and picks[0].spec in said
    assert builder.kernel_configs.all == (KernelConfig.parse("one_per_cta+serial"),)


def test_test_only_flag_is_refused_for_serving(monkeypatch, vllm_config):
    """count_visits instruments the kernel for tests/gpu (an atomic per tile): serving it
    would be slower and write into the work list, so it has no spelling the environment (or
    anything parsing a spec) could select."""
    monkeypatch.setenv(envs.VARIANT, "queue+count_visits")
    (reason,) = validate()
    assert "VLLM_FA4_VARIANT='queue+count_visits'" in reason
    assert "unknown kernel config value 'count_visits'" in reason and "FLASH_ATTN" in reason
    with pytest.raises(ValueError, match="'count_visits'.*FLASH_ATTN"):
        make_builder(vllm_config)


def test_nonsense_variant_is_refused_by_the_builder(monkeypatch, vllm_config):
    monkeypatch.setenv(envs.VARIANT, "fastest")
    with pytest.raises(
        ValueError, match="VLLM_FA4_VARIANT='fastest'.*valid: one_per_cta, queue.*FLASH_ATTN"
    ):
        make_builder(vllm_config)


def test_nonsense_route_is_refused_at_startup(monkeypatch, vllm_config):
    monkeypatch.setenv(envs.PREFILL_ROUTE, "fallback")
    monkeypatch.setenv(envs.VARIANT, "nonsense")
    reasons = validate()
    assert len(reasons) == 2  # both named at once
    assert "VLLM_FA4_PREFILL_ROUTE='fallback'" in reasons[0]
    assert "auto, kernel, reference" in reasons[0]
    assert all("--attention-backend FLASH_ATTN" in r for r in reasons)
    monkeypatch.delenv(envs.VARIANT)
    with pytest.raises(ValueError, match="expected one of auto, kernel, reference.*FLASH_ATTN"):
        make_builder(vllm_config)


# --- a key without a kernel ------------------------------------------------------------------


def test_config_that_cannot_build_the_head_dim_is_refused_at_backend_selection(monkeypatch):
    monkeypatch.setenv(envs.VARIANT, "q_tma")
    assert validate(head_size=128) == []  # two Q stages fit at head dim 128
    (reason,) = validate(head_size=256)
    assert "q_tma cannot build the prefill kernel" in reason and "shared memory" in reason
    monkeypatch.setenv(envs.PREFILL_ROUTE, "reference")  # asked for: no kernel needed
    assert validate(head_size=256) == []


@pytest.fixture(scope="module")
def gqa256_config(tmp_path_factory):
    """A model with 256 query heads on one KV head: vLLM's checks pass (head dim 128), but
    the GQA group does not fit the kernel's 128-row tile, so no kernel exists for it."""
    from helpers.vllm_configs import make_vllm_config, write_tiny_llama
    from vllm.config import set_current_vllm_config

    model = write_tiny_llama(
        tmp_path_factory.mktemp("gqa256"),
        num_attention_heads=256,
        num_key_value_heads=1,
        hidden_size=256 * 128,
    )
    config = make_vllm_config(model)
    with set_current_vllm_config(config):
        yield config


def test_key_without_kernel_is_refused_by_the_builder_on_gpu(gqa256_config, fake_hopper):
    with pytest.raises(RuntimeError, match="no prefill kernel") as err:
        make_builder(gqa256_config, device="cuda:0", num_kv_heads=1)
    msg = str(err.value)
    assert "GQA group size 256" in msg and "FLASH_ATTN" in msg
    assert "VLLM_FA4_PREFILL_ROUTE=reference" in msg
    assert fake_hopper == []  # nothing compiled, nothing served


def test_config_without_kernel_is_refused_by_the_builder_on_gpu(
    vllm_config, fake_hopper, monkeypatch
):
    monkeypatch.setenv(envs.VARIANT, "q_tma")
    with pytest.raises(RuntimeError, match="no prefill kernel.*shared memory"):
        make_builder(vllm_config, device="cuda:0", head_size=256)
    assert fake_hopper == []


def test_supported_key_on_gpu_is_compiled_at_startup(vllm_config, fake_hopper):
    builder = make_builder(vllm_config, device="cuda:0")
    assert builder.prefill_route == "kernel"
    assert fake_hopper and {key for key, _ in fake_hopper} == {builder.kernel_key}


def test_reference_route_only_when_asked_for(gqa256_config, fake_hopper, monkeypatch):
    monkeypatch.setenv(envs.PREFILL_ROUTE, "reference")
    builder = make_builder(gqa256_config, device="cuda:0", num_kv_heads=1)
    assert builder.prefill_route == "reference" and fake_hopper == []


def test_cpu_builder_takes_the_reference_route(vllm_config):
    """CPU tests (no CUDA device) keep the fp32 reference as their route."""
    builder = make_builder(vllm_config)
    assert builder.prefill_route == "reference"


def test_unparsable_check_and_cache_age_are_refused_at_backend_selection(monkeypatch):
    """VLLM_FA4_CHECK and VLLM_FA4_CACHE_MAX_AGE_DAYS are read at the first build and the
    first kernel-cache use; a value that does not parse is named before weights load."""
    monkeypatch.setenv(envs.CHECK, "yes")
    monkeypatch.setenv(envs.CACHE_MAX_AGE_DAYS, "a month")
    reasons = validate()
    assert len(reasons) == 2, reasons
    assert "VLLM_FA4_CHECK='yes'" in reasons[0] and "VLLM_FA4_CACHE_MAX_AGE_DAYS" in reasons[1]
    assert all("--attention-backend FLASH_ATTN" in r for r in reasons)
