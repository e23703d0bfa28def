"""vLLM config fixtures for CPU tests (device forced to "cpu")."""

import os

import pytest
from helpers.vllm_configs import make_vllm_config, write_tiny_llama

# Compile-only kernel tests target Hopper whatever the CuTe-DSL default (scripts/test.sh and
# .ci/run set it too; this covers a bare `pytest tests/unit/test_cache.py`).
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def vllm_config(tiny_llama_dir):
    from vllm.config import set_current_vllm_config

    config = make_vllm_config(tiny_llama_dir)
    with set_current_vllm_config(config):
        yield config
