"""The ``FA4`` attention backend: capability checks and prefill/decode routing.

Decode rows run on vLLM's FlashAttention (FA3) implementation, unchanged; prefill rows run on
the project's paged-prefill path (``vllm_fa4.paged_prefill``). The KV cache is exactly
FLASH_ATTN's, so vLLM writes new K/V with ``reshape_and_cache_flash`` before ``forward`` runs.
"""

from __future__ import annotations

import inspect
from typing import ClassVar

import torch

from vllm_fa4 import BACKEND_NAME, envs
from vllm_fa4.compat import (
    KV_CACHE_SHAPE_FROM_BACKEND,
    NHD_KV_CACHE_LAYOUTS,
    AttentionBackend,
    AttentionType,
    FlashAttentionBackend,
    FlashAttentionImpl,
    MultipleOf,
    unsupported_kv_cache_layout,
)
from vllm_fa4.kernels.config import (
    SUPPORTED_HEAD_DIMS,
    SUPPORTED_PAGE_SIZES,
    KernelKey,
    ModelFeatures,
    dtype_name,
    serving_configs,
)
from vllm_fa4.metadata import FA4Metadata, FA4MetadataBuilder
from vllm_fa4.paged_prefill import run_prefill, split_kv_cache

_USE_INSTEAD = "use --attention-backend FLASH_ATTN for this model"


def _reason(what: str) -> str:
    return f"FA4: {what} is not supported ({_USE_INSTEAD})"


class FA4AttentionBackend(AttentionBackend):
    """Composite backend: our CuTe-DSL SM90 prefill, vLLM's FA3 decode."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "float16", "bfloat16"]
    forward_includes_kv_cache_update: bool = False

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME  # must equal the enum member name (vLLM looks it up by name)

    @staticmethod
    def get_impl_cls() -> type[FA4AttentionImpl]:
        return FA4AttentionImpl

    @staticmethod
    def get_builder_cls() -> type[FA4MetadataBuilder]:
        return FA4MetadataBuilder

    # Same cache tensor as FLASH_ATTN: decode delegates to it and reads the same memory.
    if KV_CACHE_SHAPE_FROM_BACKEND:  # vLLM 0.26 asks the backend for shape and stride order
        get_kv_cache_shape = staticmethod(FlashAttentionBackend.get_kv_cache_shape)
        get_kv_cache_stride_order = staticmethod(FlashAttentionBackend.get_kv_cache_stride_order)
    else:  # vLLM 0.33 builds it from the layer's spec and one layout all backends accept

        @classmethod
        def customize_spec(cls, spec):
            return FlashAttentionBackend.customize_spec(spec)

        @classmethod
        def supported_kv_cache_layouts(cls):
            return NHD_KV_CACHE_LAYOUTS

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        # (the spec argument: vLLM 0.33; 0.26 calls this without one)
        return list(SUPPORTED_PAGE_SIZES)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(SUPPORTED_HEAD_DIMS)

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        return capability.major == 9

    # Sliding window and sinks (and the soft cap, which vLLM does not ask about here): our
    # prefill kernel, FA3's decode, same settings.
    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_device_cpu_query_lens_mismatch(cls) -> bool:
        # vLLM 0.33 (adaptive verification): the builder splits and plans from the CPU query
        # lengths, which must match the device's.
        return False

    @classmethod
    def validate_configuration(cls, *args, **kwargs) -> list[str]:
        # vLLM's generic reasons are terse ("sliding window not supported"); say which backend
        # refused and what to use instead, so the startup error is actionable.
        reasons = [
            _reason(r.removesuffix(" not supported"))
            if r.endswith(" not supported")
            else f"FA4: {r} ({_USE_INSTEAD})"
            for r in super().validate_configuration(*args, **kwargs)
        ]
        layout = unsupported_kv_cache_layout()
        if layout is not None:
            reasons.append(_reason(f"KV cache layout {layout} (only NHD)"))
        given = inspect.signature(super().validate_configuration).bind(*args, **kwargs)
        return reasons + _environment_reasons(
            given.arguments["head_size"], given.arguments["dtype"], given.arguments["block_size"]
        )


def _environment_reasons(head_size: int, dtype: torch.dtype, block_size: int | None) -> list[str]:
    """Startup errors from the package's environment, at backend selection (before weights
    load): a misspelt VLLM_FA4_VARIANT or VLLM_FA4_PREFILL_ROUTE (the message lists the valid
    spellings), or a kernel config that cannot build this head dim. The builder checks the
    full key (GQA group included) when it is created."""
    reasons, route, config = [], None, None
    try:
        route = envs.prefill_route()
    except ValueError as e:
        reasons.append(f"FA4: {e}")
    try:
        config = envs.kernel_config()
    except ValueError as e:
        reasons.append(f"FA4: {e}")
    key = KernelKey(dtype_name(dtype), head_size, block_size or 16, 1)
    if reasons or route == "reference" or key.unsupported_reason() is not None:
        return reasons  # no kernel wanted, or the key is refused by vLLM's generic checks
    for candidate in serving_configs(key, config).all:
        why = candidate.unsupported_reason(key)
        if why is not None:
            named = f"{envs.VARIANT}={config.spec}" if config else f"kernel config {candidate.spec}"
            reasons.append(f"FA4: {named} cannot build the prefill kernel: {why}")
    return reasons


class FA4AttentionImpl(FlashAttentionImpl):
    """Routes decode rows to FlashAttentionImpl.forward and prefill rows to our kernel."""

    supports_dcp = False

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
        **extra,
    ) -> None:
        unsupported = {
            "ALiBi": alibi_slopes is not None,
            f"attention type {attn_type}": attn_type != AttentionType.DECODER,
            f"kv_cache_dtype {kv_cache_dtype}": kv_cache_dtype
            not in ("auto", "float16", "bfloat16"),
            f"options {sorted(extra)}": bool(extra),
        }
        refused = [name for name, bad in unsupported.items() if bad]
        if refused:
            raise NotImplementedError(_reason(", ".join(refused)))
        super().__init__(
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            None,
            sliding_window,
            kv_cache_dtype,
            logits_soft_cap,
            attn_type,
            kv_sharing_target_layer_name,
            sinks=sinks,
        )
        if self.dcp_world_size > 1:
            raise NotImplementedError(_reason("decode context parallelism"))
        self.supports_quant_query_input = False
        # The metadata builder reads these to pick the kernel key of the layer's group.
        self.model_features = ModelFeatures(
            window_left=None if sliding_window is None else sliding_window - 1,
            softcap=float(logits_soft_cap) if logits_soft_cap else None,
            sinks=sinks is not None,
        )
        self._sinks_stamp = self._sinks_fp32_copy = None  # see _sinks_fp32

    def _sinks_fp32(self) -> torch.Tensor | None:
        """The sink logits as the kernel reads them (fp32). The weights load (and may reload)
        after construction, so the copy is remade when the parameter's storage or version
        changes, not on every call (this runs once per layer per step)."""
        sinks = self.sinks
        if sinks is None or sinks.dtype == torch.float32:
            return sinks
        stamp = (sinks.data_ptr(), sinks._version)
        if self._sinks_stamp != stamp:
            self._sinks_fp32_copy = sinks.float()
            self._sinks_stamp = stamp
        return self._sinks_fp32_copy

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: FA4Metadata,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError(_reason("fused output quantization"))
        if attn_metadata is None:  # profiling run
            return output.fill_(0)
        metadata = attn_metadata
        if metadata.decode is not None:  # rows [0, num_decode_tokens), FA3 writes in place
            super().forward(layer, query, key, value, kv_cache, metadata.decode, output)
        if metadata.prefill is not None:  # rows after the decodes; K/V already in the cache
            start = metadata.num_decode_tokens
            stop = start + metadata.prefill.num_tokens
            if metadata.prefill.window_left != self.model_features.window_left:
                raise RuntimeError(  # the builder's group would disagree with this layer
                    f"FA4: the prefill plan's window ({metadata.prefill.window_left}) is not "
                    f"this layer's ({self.model_features.window_left})"
                )
            k_cache, v_cache = split_kv_cache(kv_cache, self.head_size)
            run_prefill(
                metadata.prefill,
                query[start:stop],
                k_cache,
                v_cache,
                output[start:stop],
                softmax_scale=self.scale,
                softcap=self.model_features.softcap,
                sinks=self._sinks_fp32(),
            )
        return output
