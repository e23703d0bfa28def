"""Cache layouts vLLM can hand the backend (issue 27): a padded block stride that breaks the
kernel's 16-byte alignment must be refused when the builder is made (startup), never in
``forward``; an aligned pad must be accepted. Pads of whole 16-byte units are what the fuzz
draws (testing.fuzz), so the refusal is tested here."""

import pytest
import torch

HKV, D, PAGE = 8, 128, 16  # the unit tests' tiny Llama (tests/vllm_configs.py)
PAGE_BYTES = 2 * PAGE * HKV * D * 2  # K and V, bf16


def _builder(vllm_config, page_size_padded):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from vllm_fa4.metadata import FA4MetadataBuilder

    spec = FullAttentionSpec(
        block_size=PAGE,
        num_kv_heads=HKV,
        head_size=D,
        dtype=torch.bfloat16,
        page_size_padded=page_size_padded,
    )
    return FA4MetadataBuilder(spec, ["layer.0"], vllm_config, torch.device("cpu"))


@pytest.mark.parametrize("pad_bytes", [2, 8, 24, 1000])
def test_unaligned_padded_page_is_refused_at_startup(vllm_config, pad_bytes):
    padded = PAGE_BYTES + pad_bytes
    with pytest.raises((NotImplementedError, ValueError)) as refused:
        _builder(vllm_config, padded)
    message = str(refused.value)
    assert "FLASH_ATTN" in message, message
    # the reason names the layout: the padded page in bytes, or the block stride in elements
    assert str(padded) in message or str(padded // 2) in message, message


@pytest.mark.parametrize("pad_bytes", [16, 48, 256, PAGE_BYTES])
def test_aligned_padded_page_is_served(vllm_config, pad_bytes):
    _builder(vllm_config, PAGE_BYTES + pad_bytes)
