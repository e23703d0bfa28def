"""split_kv_cache: zero-copy K/V views of vLLM's packed, NHD-in-memory cache; the layouts
the kernel can read (padded pages, cross-layer blocks) and the configs fitted to them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vllm_fa4.kernels.config import KernelKey, KvBox
from vllm_fa4.paged_prefill import split_kv_cache
from vllm_fa4.paged_prefill.layout import KvCacheLayout, fit_config, kv_views_problem
from vllm_fa4.paged_prefill.policy import serving_configs


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


def test_shape_errors_are_clear():
    d = 64
    _, kv = _vllm_cache(2, 16, 2, d)
    with pytest.raises(ValueError, match="4-D"):
        split_kv_cache(kv[0], d)
    with pytest.raises(ValueError, match="2\\*head_dim = 256"):
        split_kv_cache(kv, 128)


def _problem(kv, d):
    return kv_views_problem(*split_kv_cache(kv, d))


def test_views_the_kernel_cannot_read_are_named_not_raised():
    d = 64
    _, kv = _vllm_cache(2, 16, 2, d)
    assert _problem(kv, d) is None
    # HND memory (contiguous in the logical order)
    assert "not NHD" in _problem(kv.contiguous(), d)
    # last dim not contiguous
    wide = torch.randn(2, 16, 2, 4 * d).to(torch.bfloat16)[..., ::2].permute(0, 2, 1, 3)
    assert "not contiguous" in _problem(wide, d)
    # head stride not a multiple of 16 bytes
    odd = torch.randn(2, 16, 2, 2 * d + 1).to(torch.bfloat16)[..., : 2 * d]
    assert "not a multiple of 16 bytes" in _problem(odd.permute(0, 2, 1, 3), d)
    # a padded block stride that breaks the 16-byte rule (a pad of 2 elements)
    assert "block stride" in _problem(_padded(2, 16, 2, d, pad=2), d)
    assert _problem(_padded(2, 16, 2, d, pad=8), d) is None


def _padded(num_blocks, block_size, hkv, d, pad, dtype=torch.bfloat16):
    """vLLM's padded-page view (``page_size_padded``): each block ``pad`` elements longer."""
    page = block_size * hkv * 2 * d
    raw = torch.randn(num_blocks * (page + pad)).to(dtype)
    phys = raw.as_strided((num_blocks, block_size, hkv, 2 * d), (page + pad, hkv * 2 * d, 2 * d, 1))
    return phys.permute(0, 2, 1, 3)


def test_packed_layout_matches_the_views():
    d, bs, hkv = 128, 16, 8
    _, kv = _vllm_cache(3, bs, hkv, d)
    k, _ = split_kv_cache(kv, d)
    assert KvCacheLayout.of_views(k) == KvCacheLayout.packed(bs, hkv, d, 2)
    k_pad, _ = split_kv_cache(_padded(3, bs, hkv, d, pad=64), d)
    page_bytes = (bs * hkv * 2 * d + 64) * 2
    assert KvCacheLayout.of_views(k_pad) == KvCacheLayout.packed(bs, hkv, d, 2, page_bytes)


@pytest.mark.parametrize(
    "pad_bytes, fits",
    [(0, True), (16, False), (128, False), (16 * 3 * 256 * 8, True), (16 * 3 * 256, False)],
)
def test_wide_box_fits_whole_boxes_only(pad_bytes, fits):
    """hd 128, 3 KV heads: a token is 3 x 512 = 1536 bytes, a 16-row box 24,576 bytes. Pads
    of whole boxes keep wide_box; any other pad falls back to per-chunk boxes."""
    key = KernelKey("bfloat16", 128, 16, 4)
    long = serving_configs(key).long
    assert long.kv_box is KvBox.WIDE  # the default long-batch config at page 16
    page = 16 * 3 * 2 * 128 * 2
    layout = KvCacheLayout.packed(16, 3, 128, 2, page + pad_bytes)
    assert layout.unsupported_reason() is None
    fitted = fit_config(long, key, layout)
    assert (fitted.kv_box is KvBox.WIDE) == fits
    assert fitted == (long if fits else dataclasses.replace(long, kv_box=KvBox.PER_CHUNK))
    # configs without wide_box are never touched
    short = serving_configs(key).short
    assert fit_config(short, key, layout) is short


def test_cross_layer_layout_keeps_wide_box():
    key = KernelKey("bfloat16", 128, 16, 4)
    page = 16 * 8 * 2 * 128 * 2
    for layers in (2, 3, 32):
        layout = KvCacheLayout.packed(16, 8, 128, 2, layers * page)
        assert fit_config(serving_configs(key).long, key, layout).kv_box is KvBox.WIDE
