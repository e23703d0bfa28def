"""vLLM config objects for CPU tests (no GPU: the device is forced to "cpu")."""

import json

import pytest


def make_vllm_config(model_dir, *, block_size=16, num_speculative_tokens=None):
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig

    model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype=torch.bfloat16,
                        max_model_len=131072)
    cache = CacheConfig(block_size=block_size)
    cache.num_gpu_blocks = 4096
    config = VllmConfig(model_config=model, cache_config=cache,
                        device_config=DeviceConfig(device="cpu"))
    if num_speculative_tokens:  # only the field the builder reads; no draft model is built
        from types import SimpleNamespace

        config.speculative_config = SimpleNamespace(
            num_speculative_tokens=num_speculative_tokens, parallel_drafting=False)
    return config


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A Llama config with Llama-3.1-8B's attention shape (32/8 heads, head dim 128), 2 layers."""
    path = tmp_path_factory.mktemp("tiny-llama")
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 1000,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    }))
    return path


@pytest.fixture(scope="session")
def vllm_config(tiny_llama_dir):
    from vllm.config import set_current_vllm_config

    config = make_vllm_config(tiny_llama_dir)
    with set_current_vllm_config(config):
        yield config
