"""Startup compilation: a builder's key is compiled once, at creation, and listed for vLLM."""

import pytest

from vllm_fa4 import warmup
from vllm_fa4.kernels.config import DEFAULT_CONFIG, KernelConfig, KernelKey

KEY = KernelKey("bfloat16", 128, 16, 4)
CONFIG = DEFAULT_CONFIG


@pytest.fixture
def fresh_provider(monkeypatch):
    compiled, registered = [], []
    monkeypatch.setattr(warmup, "PROVIDER", warmup._PrefillWarmupProvider())
    monkeypatch.setattr(warmup, "device_unsupported_reason", lambda: None)
    import vllm.model_executor.warmup.cutedsl_warmup as vllm_warmup

    monkeypatch.setattr(vllm_warmup, "register_cutedsl_warmup_provider", registered.append)
    import sys
    import types

    fake_compile = types.ModuleType("vllm_fa4.kernels.compile")
    fake_compile.compile_keys = lambda keys, config, progress=True: compiled.extend(
        (key, config) for key in keys
    )
    monkeypatch.setitem(sys.modules, "vllm_fa4.kernels.compile", fake_compile)
    return compiled, registered


def test_key_compiled_once_at_request_and_listed(fresh_provider):
    compiled, registered = fresh_provider
    warmup.request(KEY, CONFIG)
    warmup.request(KEY, CONFIG)  # every layer group's builder asks; one compile
    assert compiled == [(KEY, CONFIG)]
    assert registered == [warmup.PROVIDER]
    (unit,) = warmup.PROVIDER.get_cutedsl_warmup_compile_units()
    assert unit.name == "vllm_fa4.prefill" and unit.key == ("vllm_fa4", KEY, CONFIG)
    unit.compile()  # vLLM's warmup stage: a cache hit in real runs
    assert compiled == [(KEY, CONFIG), (KEY, CONFIG)]


def test_each_config_is_its_own_kernel(fresh_provider):
    compiled, _ = fresh_provider
    other = KernelConfig.parse("one_per_cta+serial")
    warmup.request(KEY, CONFIG)
    warmup.request(KEY, other)
    assert compiled == [(KEY, CONFIG), (KEY, other)]


def test_unsupported_key_is_refused_not_compiled(fresh_provider):
    compiled, registered = fresh_provider
    with pytest.raises(RuntimeError, match="no prefill kernel .* head dim 96"):
        warmup.request(KernelKey("bfloat16", 96, 16, 4), CONFIG)
    assert compiled == [] and registered == []


def test_nothing_happens_without_an_sm90_gpu(fresh_provider, monkeypatch):
    compiled, _ = fresh_provider
    monkeypatch.setattr(warmup, "device_unsupported_reason", lambda: "no CUDA GPU")
    warmup.request(KEY, CONFIG)
    assert compiled == [] and warmup.PROVIDER.kernels == []
