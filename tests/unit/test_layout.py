"""split_kv_cache: zero-copy K/V views of vLLM's packed, NHD-in-memory cache."""

from __future__ import annotations

import pytest
import torch

from vllm_fa4.paged_prefill import split_kv_cache


def _vllm_cache(num_blocks, block_size, hkv, d, dtype=torch.bfloat16):
    """As vLLM allocates it: NHD memory, exposed in the logical (blocks, Hkv, bs, 2D) order."""
    phys = torch.randn(num_blocks, block_size, hkv, 2 * d).to(dtype)
    return phys, phys.permute(0, 2, 1, 3)


@pytest.mark.parametrize("block_size", [16, 32, 64, 128])
@pytest.mark.parametrize("hkv", [1, 8])
def test_views_alias_the_cache(block_size, hkv):
    d = 64
    phys, kv = _vllm_cache(5, block_size, hkv, d)
    k, v = split_kv_cache(kv, d)
    assert k.shape == v.shape == (5, block_size, hkv, d)
    assert k.untyped_storage().data_ptr() == kv.untyped_storage().data_ptr()
    assert k.data_ptr() == kv.data_ptr()
    assert v.data_ptr() == kv.data_ptr() + d * kv.element_size()
    assert k.stride() == v.stride() == (block_size * hkv * 2 * d, hkv * 2 * d, 2 * d, 1)
    assert torch.equal(k, phys[..., :d]) and torch.equal(v, phys[..., d:])
    k[1, 2, 0, 3] = 42.0  # a write through the view lands in the cache
    assert phys[1, 2, 0, 3] == 42.0


def test_singleton_dims_get_canonical_strides():
    d, bs = 128, 16
    phys = torch.randn(3, bs, 1, 2 * d).to(torch.float16)
    # A size-1 head dim may carry any stride; vLLM's tensors sometimes have odd ones.
    odd = phys.as_strided((3, 1, bs, 2 * d), (bs * 2 * d, 1, 2 * d, 1))
    k, v = split_kv_cache(odd, d)
    assert k.stride() == (bs * 2 * d, 2 * d, 2 * d, 1)
    assert torch.equal(k, phys[..., :d]) and torch.equal(v, phys[..., d:])
    # one block
    k1, _ = split_kv_cache(phys[:1].permute(0, 2, 1, 3), d)
    assert k1.stride() == (bs * 2 * d, 2 * d, 2 * d, 1)


def test_cross_layer_block_stride_is_kept():
    d, bs, hkv, layers = 64, 16, 2, 3
    buf = torch.randn(4, layers, bs, hkv, 2 * d).to(torch.bfloat16)
    layer1 = buf[:, 1].permute(0, 2, 1, 3)
    k, v = split_kv_cache(layer1, d)
    assert k.stride(0) == layers * bs * hkv * 2 * d
    assert torch.equal(v, buf[:, 1, ..., d:])


def test_storage_offset_is_kept():
    d = 64
    phys = torch.randn(6, 16, 2, 2 * d).to(torch.bfloat16)
    kv = phys[2:].permute(0, 2, 1, 3)
    k, v = split_kv_cache(kv, d)
    assert torch.equal(k, phys[2:, ..., :d]) and torch.equal(v, phys[2:, ..., d:])


def test_errors_are_clear():
    d = 64
    _, kv = _vllm_cache(2, 16, 2, d)
    with pytest.raises(ValueError, match="4-D"):
        split_kv_cache(kv[0], d)
    with pytest.raises(ValueError, match="2\\*head_dim = 256"):
        split_kv_cache(kv, 128)
    # HND memory (contiguous in the logical order): rejected
    with pytest.raises(ValueError, match="not NHD"):
        split_kv_cache(kv.contiguous(), d)
    # last dim not contiguous
    wide = torch.randn(2, 16, 2, 4 * d).to(torch.bfloat16)[..., ::2].permute(0, 2, 1, 3)
    with pytest.raises(ValueError, match="contiguous"):
        split_kv_cache(wide, d)
    # misaligned head stride (not a multiple of 16 bytes)
    odd = torch.randn(2, 16, 2, 2 * d + 1).to(torch.bfloat16)[..., : 2 * d]
    with pytest.raises(ValueError, match="16-byte"):
        split_kv_cache(odd.permute(0, 2, 1, 3), d)
