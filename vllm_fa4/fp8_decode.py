"""Decode rows on an FP8 KV cache: FA3 gets Q as FLASH_ATTN gives it (issue 30).

FA3's FP8 kernel takes q, k and v in one dtype. Under FLASH_ATTN the impl says
``supports_quant_query_input``, so vLLM's Attention layer quantizes Q (``QuantFP8``, static,
per tensor, ``layer._q_scale``) before ``forward``, and ``FlashAttentionImpl.forward`` passes
``q_descale = layer._q_scale`` to FA3. FA4's impl must say no (its prefill rows take 16-bit Q),
so it quantizes the decode rows itself, with the same op and scale, and has FA3 pass the
descale for that one call (``fa3_reads_fp8_query``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from vllm_fa4.compat import GroupShape, QuantFP8


class DecodeQueryQuant:
    """Q of the decode rows as vLLM's Attention layer quantizes it for FLASH_ATTN."""

    def __init__(self) -> None:
        # A vLLM CustomOp: built while vLLM's config is current (the impl's construction),
        # so it dispatches as the layer's own would (CUDA kernel or torch ops).
        self._quant = QuantFP8(static=True, group_shape=GroupShape.PER_TENSOR)

    def __call__(self, layer: torch.nn.Module, query: torch.Tensor) -> torch.Tensor:
        """``query`` [tokens, Hq, D] (16-bit) -> the same shape in FP8, divided by the
        layer's per-tensor ``_q_scale`` (a device tensor: nothing syncs)."""
        rows = query.shape[0]
        # the layer quantizes [tokens, Hq * D]: a view here too (vLLM's head stride is D)
        quantized, _ = self._quant(query.reshape(rows, -1), layer._q_scale)
        return quantized.view(query.shape)


@contextlib.contextmanager
def fa3_reads_fp8_query(impl) -> Iterator[None]:
    """``FlashAttentionImpl.forward`` passes ``q_descale`` only when the impl says
    ``supports_quant_query_input`` (the layer quantized Q); for this call it has (Q quantized by
    ``DecodeQueryQuant``). The layer reads the flag before ``forward``, so it sees False."""
    impl.supports_quant_query_input = True
    try:
        yield
    finally:
        impl.supports_quant_query_input = False
