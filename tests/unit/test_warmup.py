"""Startup compilation: a builder's key is compiled once, at creation, and listed for vLLM."""

import pytest

from vllm_fa4 import warmup
from vllm_fa4.kernels.config import KernelKey

KEY = KernelKey("bfloat16", 128, 16, 4)


@pytest.fixture
def fresh_provider(monkeypatch):
    compiled, registered = [], []
    monkeypatch.setattr(warmup, "PROVIDER", warmup._PrefillWarmupProvider())
    monkeypatch.setattr(warmup, "_kernel_available", lambda: True)
    import vllm.model_executor.warmup.cutedsl_warmup as vllm_warmup

    monkeypatch.setattr(vllm_warmup, "register_cutedsl_warmup_provider", registered.append)
    import sys
    import types

    fake_compile = types.ModuleType("vllm_fa4.kernels.compile")
    fake_compile.compile_keys = lambda keys, progress=True: compiled.extend(keys)
    monkeypatch.setitem(sys.modules, "vllm_fa4.kernels.compile", fake_compile)
    return compiled, registered


def test_key_compiled_once_at_request_and_listed(fresh_provider):
    compiled, registered = fresh_provider
    warmup.request(KEY)
    warmup.request(KEY)  # every layer group's builder asks; one compile
    assert compiled == [KEY]
    assert registered == [warmup.PROVIDER]
    (unit,) = warmup.PROVIDER.get_cutedsl_warmup_compile_units()
    assert unit.name == "vllm_fa4.prefill" and unit.key == ("vllm_fa4", KEY)
    unit.compile()  # vLLM's warmup stage: a cache hit in real runs
    assert compiled == [KEY, KEY]


def test_unsupported_key_is_not_compiled(fresh_provider, caplog):
    compiled, registered = fresh_provider
    warmup.request(KernelKey("bfloat16", 96, 16, 4))
    assert compiled == [] and registered == []
    assert "no prefill kernel" in caplog.text


def test_nothing_happens_without_an_sm90_gpu(fresh_provider, monkeypatch):
    compiled, _ = fresh_provider
    monkeypatch.setattr(warmup, "_kernel_available", lambda: False)
    warmup.request(KEY)
    assert compiled == [] and warmup.PROVIDER.keys == []
