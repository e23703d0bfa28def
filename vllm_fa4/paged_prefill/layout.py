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

from dataclasses import dataclass, replace

import torch

from vllm_fa4.kernels.config import KernelConfig, KernelKey, KvBox
from vllm_fa4.paged_prefill.policy import ServingConfigs


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
        after K. Whether the kernel can read their strides is ``kv_views_problem``'s question.

    Raises:
        ValueError: wrong rank or last dim != 2*D (vLLM's cache shape is fixed by
            ``get_kv_cache_shape``, so vLLM cannot send this).
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
    s0, s1, s2, _ = kv_cache.stride()
    shape = (num_blocks, block_size, num_kv_heads, packed)
    strides = _canonical_strides(shape, (s0, s2, s1, kv_cache.stride(3)), head_dim)
    k_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    off = kv_cache.storage_offset()
    k_cache = kv_cache.as_strided(k_shape, strides, off)
    v_cache = kv_cache.as_strided(k_shape, strides, off + head_dim)
    return k_cache, v_cache


@dataclass(frozen=True)
class KvCacheLayout:
    """Byte strides of one layer's K (and V: same strides, D elements later) views.

    vLLM's block stride is ``block_size`` token strides, more with padded pages (hybrid
    models: ``AttentionSpec.page_size_padded``) or a cross-layer cache (a multiple of the
    page). The kernel's TMA descriptors need every stride 16-byte aligned, and ``wide_box``
    (one box per 8 token slots across all of D) needs whole boxes per block.
    """

    block_stride: int
    token_stride: int
    head_stride: int
    head_bytes: int  # D * element size: V's offset from K

    @classmethod
    def packed(
        cls,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        element_size: int,
        page_bytes: int | None = None,
    ) -> KvCacheLayout:
        """vLLM's packed NHD layout; ``page_bytes``: the (padded) bytes per block, as
        ``AttentionSpec.page_size_bytes`` says when ``page_size_padded`` is set."""
        head = 2 * head_dim * element_size
        token = num_kv_heads * head
        return cls(page_bytes or block_size * token, token, head, head_dim * element_size)

    @classmethod
    def of_views(cls, k_cache: torch.Tensor) -> KvCacheLayout:
        """The layout of ``split_kv_cache``'s K view."""
        es = k_cache.element_size()
        s0, s1, s2, _ = k_cache.stride()
        return cls(s0 * es, s1 * es, s2 * es, k_cache.shape[3] * es)

    def unsupported_reason(self) -> str | None:
        """Why the kernel cannot read this layout (TMA's 16-byte stride rule), or None."""
        for name, value in (
            ("block", self.block_stride),
            ("token", self.token_stride),
            ("head", self.head_stride),
            ("head dim", self.head_bytes),
        ):
            if value % 16:
                return f"the KV cache's {name} stride ({value} bytes) is not a multiple of 16 bytes"
        return None

    def fits_slot_boxes(self, box_rows: int) -> bool:
        """Whether a block is a whole number of ``box_rows``-slot boxes (``wide_box``)."""
        return self.block_stride % (self.token_stride * box_rows) == 0


def fit_config(config: KernelConfig, key: KernelKey, layout: KvCacheLayout) -> KernelConfig:
    """``config``, or the same config with per-chunk K/V boxes where its whole-row boxes
    (``wide_box``) cannot address ``layout``'s blocks (padded pages)."""
    if config.kv_box is KvBox.WIDE and not layout.fits_slot_boxes(config.box_n(key)):
        return replace(config, kv_box=KvBox.PER_CHUNK)
    return config


def fit_serving_configs(
    configs: ServingConfigs, key: KernelKey, layout: KvCacheLayout
) -> ServingConfigs:
    """``configs`` with each member fitted to ``layout`` (``fit_config``)."""
    return replace(
        configs,
        long=fit_config(configs.long, key, layout),
        short=fit_config(configs.short, key, layout),
    )


def kv_views_problem(k_cache: torch.Tensor, v_cache: torch.Tensor) -> str | None:
    """Why the kernel cannot read these K/V views, or None (runs per layer per step: the
    usual case costs a few integer operations)."""
    layout = KvCacheLayout.of_views(k_cache)
    why = layout.unsupported_reason()
    if why is None and (k_cache.data_ptr() % 16 or v_cache.data_ptr() % 16):
        why = "the KV cache's data pointer is not 16-byte aligned"
    if why is None and k_cache.stride(3) != 1:
        why = "the KV cache's last dim is not contiguous"
    if (
        why is None
        and k_cache.shape[2] > 1
        and k_cache.stride(1) < k_cache.shape[2] * k_cache.stride(2)
    ):
        why = "the KV cache is not NHD (token stride below num_kv_heads x head stride)"
    if why is None:
        return None
    return (
        f"{why}; K view shape {tuple(k_cache.shape)} strides {tuple(k_cache.stride())} "
        f"(elements of {k_cache.element_size()} bytes)"
    )
