"""vLLM's packed per-layer KV cache -> the kernel's strided K and V views.

vLLM 0.26 (FlashAttention backend layout, which FA4 reuses) hands the attention forward one
tensor per layer with the *logical* shape ``(num_blocks, num_kv_heads, block_size, 2*head_size)``
whose memory is NHD, i.e. it is a permuted view of a physical
``(num_blocks, block_size, num_kv_heads, 2*head_size)`` buffer (``get_kv_cache_stride_order`` =
(0, 2, 1, 3)); K is ``[..., :head_size]`` and V is ``[..., head_size:]``. With a cross-layer
cache the block stride also spans the other layers; only the strides below are assumed.

The kernel takes K and V as ``[num_blocks, block_size, Hkv, D]`` views: last dim contiguous,
head stride 2*D, token stride Hkv*2*D (in elements), all strides 16-byte aligned.
"""

from __future__ import annotations

import torch


def _canonical_strides(
    shape: tuple[int, ...], strides: tuple[int, ...], head_dim: int
) -> list[int]:
    """Give size-1 dims the stride the packed layout implies (any stride is legal there).

    Order (block, token, head, dim): head stride 2*D, token stride Hkv * head stride, block
    stride block_size * token stride. The kernel then sees the same strides for Hkv == 1
    (MQA) as for Hkv > 1, and TMA never sees a degenerate (e.g. 1-element) stride.
    """
    out = list(strides)
    if shape[2] == 1:
        out[2] = 2 * head_dim
    if shape[1] == 1:
        out[1] = shape[2] * out[2]
    if shape[0] == 1:
        out[0] = shape[1] * out[1]
    return out


def split_kv_cache(kv_cache: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split vLLM's packed cache into K and V views ``[num_blocks, block_size, Hkv, D]``.

    Args:
        kv_cache: the per-layer tensor as vLLM passes it to the attention forward: logical
            shape ``(num_blocks, num_kv_heads, block_size, 2*head_dim)``, NHD memory.
        head_dim: D.

    Returns:
        (k_cache, v_cache): views sharing ``kv_cache``'s storage (no copy); V starts D elements
        after K.

    Raises:
        ValueError: wrong rank, last dim != 2*D, or strides the kernel cannot use.
    """
    if kv_cache.dim() != 4:
        raise ValueError(
            "kv_cache must be vLLM's 4-D per-layer cache (num_blocks, num_kv_heads, block_size, "
            f"2*head_dim); got shape {tuple(kv_cache.shape)}"
        )
    num_blocks, num_kv_heads, block_size, packed = kv_cache.shape
    if packed != 2 * head_dim:
        raise ValueError(
            f"kv_cache last dim is {packed}, expected 2*head_dim = {2 * head_dim} "
            f"(K and V packed); shape {tuple(kv_cache.shape)}"
        )
    # The NHD view is kv_cache.transpose(1, 2); build it from strides directly (cheaper).
    s0, s1, s2, s3 = kv_cache.stride()
    shape = (num_blocks, block_size, num_kv_heads, packed)
    strides = _canonical_strides(shape, (s0, s2, s1, s3), head_dim)
    if kv_cache.numel() > 0:
        _check_strides(kv_cache, shape, strides, head_dim)
    k_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    off = kv_cache.storage_offset()
    k_cache = kv_cache.as_strided(k_shape, strides, off)
    v_cache = kv_cache.as_strided(k_shape, strides, off + head_dim)
    return k_cache, v_cache


def _check_strides(
    kv_cache: torch.Tensor, shape: tuple[int, ...], strides: list[int], head_dim: int
) -> None:
    esize = kv_cache.element_size()
    if (
        strides[3] == 1
        and strides[2] >= 2 * head_dim
        and not (strides[0] * esize) % 16
        and not (strides[1] * esize) % 16
        and not (strides[2] * esize) % 16
        and not (head_dim * esize) % 16
        and not kv_cache.data_ptr() % 16
        and (shape[2] == 1 or strides[1] >= shape[2] * strides[2])
        and (shape[1] == 1 or strides[0] >= shape[1] * strides[1])
    ):
        return  # fast path: all good (this runs per layer per step)
    where = (
        f"kv_cache shape {tuple(kv_cache.shape)} strides {tuple(kv_cache.stride())} "
        f"(logical (blocks, Hkv, block_size, 2D) expected over NHD memory)"
    )
    if strides[3] != 1:
        raise ValueError(f"kv_cache last dim must be contiguous (stride 1); {where}")
    # K and V of one (token, head) must not overlap and the head stride must cover both.
    if strides[2] < 2 * head_dim:
        raise ValueError(
            f"kv_cache head stride {strides[2]} < 2*head_dim {2 * head_dim}: K/V would overlap; "
            f"{where}"
        )
    names = ("block", "token", "head")
    for i, name in enumerate(names):
        if (strides[i] * esize) % 16:
            raise ValueError(
                f"kv_cache {name} stride {strides[i]} elements = {strides[i] * esize} bytes is "
                f"not 16-byte aligned; {where}"
            )
    if (head_dim * esize) % 16:
        raise ValueError(
            f"head_dim {head_dim} x {esize} bytes is not 16-byte aligned (V view offset); {where}"
        )
    if kv_cache.data_ptr() % 16:
        raise ValueError(f"kv_cache data pointer is not 16-byte aligned; {where}")
    # NHD: token stride must be at least Hkv * head stride (heads of a token are adjacent)
    # and the block stride at least block_size * token stride; anything else would mean
    # the caller passed an HND cache or an already-permuted tensor.
    if shape[2] > 1 and strides[1] < shape[2] * strides[2]:
        raise ValueError(
            f"kv_cache is not NHD: token stride {strides[1]} < num_kv_heads * head stride "
            f"{shape[2] * strides[2]} (HND layout or wrong dim order?); {where}"
        )
    if shape[1] > 1 and strides[0] < shape[1] * strides[1]:
        raise ValueError(
            f"kv_cache block stride {strides[0]} < block_size * token stride "
            f"{shape[1] * strides[1]} (wrong dim order?); {where}"
        )
