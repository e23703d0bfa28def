"""vLLM config objects for tests, on CPU (device "cpu") or on the GPU machine (device "cuda")."""

import contextlib
import json
from types import SimpleNamespace

# Llama-3.1-8B's attention shape (32/8 heads, head dim 128) in a 2-layer model.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 1000,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}


def write_tiny_llama(path, **overrides):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**TINY_LLAMA, **overrides}))
    return path


def make_vllm_config(
    model_dir, *, block_size=16, device="cpu", dtype="bfloat16", num_speculative_tokens=None
):
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig

    model = ModelConfig(
        model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, max_model_len=131072
    )
    cache = CacheConfig(block_size=block_size)
    cache.num_gpu_blocks = 4096
    config = VllmConfig(
        model_config=model, cache_config=cache, device_config=DeviceConfig(device=device)
    )
    if num_speculative_tokens:  # only the fields the builder reads; no draft model is built
        config.speculative_config = SimpleNamespace(
            num_speculative_tokens=num_speculative_tokens, parallel_drafting=False
        )
    return config


def shaped_vllm_config(tmp, hq, hkv, d, page, *, cache_dtype="auto", **kwargs):
    """A vLLM config (make_vllm_config's ``kwargs``) whose model has the attention shape
    ``hq``/``hkv`` heads of dim ``d``, at block size ``page``; the model folder goes in ``tmp``."""
    model = write_tiny_llama(
        tmp / f"m{hq}-{hkv}-{d}",
        num_attention_heads=hq,
        num_key_value_heads=hkv,
        head_dim=d,
        hidden_size=hq * d,
    )
    config = make_vllm_config(model, block_size=page, **kwargs)
    if cache_dtype != "auto":
        config.cache_config.cache_dtype = cache_dtype
    return config


@contextlib.contextmanager
def current_shaped_configs(tmp, **kwargs):
    """Yields make(hq, hkv, d, page): a shaped_vllm_config, made vLLM's current config (the
    backend registered) until the context exits."""
    import vllm_fa4

    vllm_fa4.register()
    from vllm.config import set_current_vllm_config

    with contextlib.ExitStack() as stack:

        def make(hq, hkv, d, page):
            config = shaped_vllm_config(tmp, hq, hkv, d, page, **kwargs)
            stack.enter_context(set_current_vllm_config(config))
            return config

        yield make
