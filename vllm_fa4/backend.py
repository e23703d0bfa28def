"""The ``FA4`` attention backend: capability checks and prefill/decode routing.

Decode rows run on vLLM's FlashAttention (FA3) implementation, unchanged; prefill rows run on
the project's paged-prefill path (``vllm_fa4.paged_prefill``). The KV cache is exactly
FLASH_ATTN's, so vLLM writes new K/V with ``reshape_and_cache_flash`` before ``forward`` runs.
"""

from __future__ import annotations

import inspect
import logging
from typing import ClassVar

import torch

from vllm_fa4 import BACKEND_NAME, envs
from vllm_fa4 import kv_cache_dtype as kv_dtypes
from vllm_fa4.compat import (
    KV_CACHE_SHAPE_FROM_BACKEND,
    NHD_KV_CACHE_LAYOUTS,
    AttentionBackend,
    AttentionType,
    FlashAttentionBackend,
    FlashAttentionImpl,
    FlashAttentionMetadata,
    MultipleOf,
    current_platform,
    get_current_vllm_config_or_none,
    unsupported_kv_cache_layout,
)
from vllm_fa4.fp8_decode import DecodeQueryQuant, fa3_reads_fp8_query
from vllm_fa4.kernels.config import (
    SUPPORTED_HEAD_DIMS,
    SUPPORTED_PAGE_SIZES,
    KernelKey,
    ModelFeatures,
    dtype_name,
)
from vllm_fa4.metadata import FA4Metadata, FA4MetadataBuilder
from vllm_fa4.paged_prefill import run_prefill, split_kv_cache
from vllm_fa4.paged_prefill.policy import (
    Fp8Query,
    configured_config,
    configured_fp8_query,
    serving_configs,
)

logger = logging.getLogger("vllm_fa4")
_USE_INSTEAD = "use --attention-backend FLASH_ATTN for this model"
FP8_CACHE = torch.float8_e4m3fn  # how the prefill reads vLLM's fp8 / fp8_e4m3 cache
FA3_SINK_MAX_Q_HEADS = 64  # FA3's s_aux: "We only support query heads <= 64 with S aux"


# Served, not yet fast (issue 30): said once at startup, so the slower prefill is never silent.
FP8_PREFILL_SPEED_WARNING = (
    "FA4: --kv-cache-dtype fp8 is served with 16-bit attention math on the FP8 cache (fp16 "
    "GEMMs on the exact e4m3 values, or at head dim 128 an FP8 Q K^T with Q split exactly "
    "into two e4m3 parts; fp32 softmax and accumulation), but FA4's FP8 prefill kernel is not "
    "yet fast at head dim 128: measured 0.97x the speed of FLASH_ATTN's FP8 prefill on long "
    "batches there (served 32k and 64k prompts 1.01x) and 1.39x at head dim 256 (H100, "
    "docs/results/2026-11-27/fp8qk-adopted-ab-h100-cc1a78b.log); decode runs FLASH_ATTN's "
    f"own FP8 path. For FP8 prefill speed set {envs.FP8_QUERY}=e4m3 (Q rounded to e4m3 for "
    "Q K^T on long batches: 1.12x FLASH_ATTN's FP8 prefill at head dim 128, served 1.07-1.10x "
    "on an H200, with Q K^T as coarse as FLASH_ATTN-FP8's) or use --attention-backend FLASH_ATTN"
)
# VLLM_FA4_FP8_QUERY=e4m3 (opt-in): what the user traded, said once at startup.
FP8_E4M3_QUERY_WARNING = (
    f"FA4: {envs.FP8_QUERY}=e4m3: long prefill batches of bf16 models at head dims 128 (no "
    "soft cap) and 256 (windows and Gemma 2's soft cap included) read the FP8 cache with Q "
    "rounded to e4m3 for Q K^T (one FP8 GEMM; P V, softmax and accumulation as before): "
    "measured 1.12x FLASH_ATTN's FP8 prefill at head dim 128 (1.29x with a 4k window) and "
    "1.4-2.0x at 256, served 32k / 64k prompts 1.07x / 1.09x (H200, docs/perf-notes.md, "
    "sessions 34-36), with a mean error 0.87-0.90x FLASH_ATTN-FP8's against 16-bit values, "
    "not 16-bit attention's. "
    f"Unset {envs.FP8_QUERY} for 16-bit Q on the FP8 cache"
)
_fp8_warned = False


def _warn_fp8_prefill_speed_once() -> None:
    global _fp8_warned
    if not _fp8_warned:
        _fp8_warned = True
        e4m3 = configured_fp8_query() is Fp8Query.E4M3
        logger.warning(FP8_E4M3_QUERY_WARNING if e4m3 else FP8_PREFILL_SPEED_WARNING)


def _reason(what: str, supported: str | None = None) -> str:
    also = f"supported: {supported}; " if supported else ""
    return f"FA4: {what} is not supported ({also}{_USE_INSTEAD})"


class FA4AttentionBackend(AttentionBackend):
    """Composite backend: our CuTe-DSL SM90 prefill, vLLM's FA3 decode."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    # What vLLM's generic check lets through; kv_dtypes.refusal decides per model (an FP8
    # cache only where the prefill kernel reads it).
    supported_kv_cache_dtypes: ClassVar[list[str]] = list(kv_dtypes.ACCEPTED_NAMES)
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
        # vLLM's generic reasons are terse ("kv_cache_dtype not supported"); say which backend
        # refused, the value it got and what to use instead, so the startup error is actionable.
        given = inspect.signature(super().validate_configuration).bind(*args, **kwargs).arguments
        reasons = [_named_reason(r, given) for r in super().validate_configuration(*args, **kwargs)]
        layout = unsupported_kv_cache_layout()
        if layout is not None:
            reasons.append(_reason(f"KV cache layout {layout} (only NHD)"))
        dtype, head_size, block_size = given["dtype"], given["head_size"], given["block_size"]
        cache_dtype = given["kv_cache_dtype"] or "auto"
        if cache_dtype in kv_dtypes.ACCEPTED_NAMES:  # vLLM's check named the others
            refused = kv_dtypes.refusal(cache_dtype, dtype, head_size, block_size)
            if refused is not None:
                reasons.append(_reason(*refused) + " (or --kv-cache-dtype auto)")
        return reasons + _environment_reasons(head_size, dtype, block_size, cache_dtype)


def _named_reason(generic: str, given: dict) -> str:
    """vLLM's generic refusal ``generic`` (for the arguments ``given`` to
    validate_configuration) as FA4's: the offending value, what FA4 supports, FLASH_ATTN."""
    if generic == "compute capability not supported":
        return _gpu_reason(given["device_capability"])
    named = {
        "head_size not supported": (
            f"head size {given['head_size']}",
            _listed(SUPPORTED_HEAD_DIMS),
        ),
        "dtype not supported": (
            f"dtype {dtype_name(given['dtype'])}",
            _listed(dtype_name(d) for d in FA4AttentionBackend.supported_dtypes),
        ),
        "kv_cache_dtype not supported": kv_dtypes.refusal(
            given["kv_cache_dtype"], given["dtype"], given["head_size"], given["block_size"]
        ),
        "per-head quant scales not supported": (
            "per-head KV cache scales (a kv_cache_scheme with strategy attn_head)",
            "one k_scale and v_scale per layer",
        ),
        "block_size not supported": (
            f"block size {given['block_size']}",
            f"multiples of {_listed(SUPPORTED_PAGE_SIZES)}",
        ),
    }.get(generic)
    if named is not None:
        return _reason(*named)
    if generic.endswith(" not supported"):
        return _reason(generic.removesuffix(" not supported"))
    return f"FA4: {generic} ({_USE_INSTEAD})"


def _listed(values) -> str:
    return ", ".join(str(v) for v in values)


def _gpu_reason(capability) -> str:
    """The refusal on a GPU other than SM90: which GPU was found and what to use instead."""
    try:  # the name is a courtesy: the refusal must not depend on NVML answering
        name = current_platform.get_device_name()
    except Exception:
        name = "a GPU"
    return (
        f"FA4: needs an SM90 (Hopper: H100, H200, GH200) GPU; found {name} with compute "
        f"capability {capability.major}.{capability.minor}. Use --attention-backend "
        "FLASH_ATTN on this GPU"
    )


def _environment_reasons(
    head_size: int, dtype: torch.dtype, block_size: int | None, cache_dtype: str = "auto"
) -> list[str]:
    """Startup errors from the package's environment, at backend selection (before weights
    load): a misspelt VLLM_FA4_VARIANT or VLLM_FA4_PREFILL_ROUTE (the message lists the valid
    spellings), a VLLM_FA4_CHECK or VLLM_FA4_CACHE_MAX_AGE_DAYS that does not parse (read
    later, at the first build and the first kernel-cache use), or a kernel config that cannot
    build this head dim. The builder checks the full key (GQA group included) when it is
    created."""
    reasons, route, config = [], None, None
    try:
        route = envs.prefill_route()
    except ValueError as e:
        reasons.append(f"FA4: {e}")
    for read_later in (envs.check_lengths, envs.cache_max_age_days):
        try:
            read_later()
        except ValueError as e:
            reasons.append(f"FA4: {e}; fix or unset it, {envs.WAY_OUT}")
    try:
        config = configured_config()
    except ValueError as e:
        reasons.append(f"FA4: {e}")
    fp8_query = Fp8Query.EXACT
    try:
        fp8_query = configured_fp8_query()
    except ValueError as e:
        reasons.append(f"FA4: {e}")
    kv_dtype = kv_dtypes.key_kv_dtype(cache_dtype)
    key = KernelKey.for_layer(dtype, head_size, block_size or 16, 1, 1, kv_dtype=kv_dtype)
    if reasons or route == "reference" or key.unsupported_reason() is not None:
        return reasons  # no kernel wanted, or the key is refused by vLLM's generic checks
    for candidate in serving_configs(key, config, fp8_query).all:
        why = candidate.unsupported_reason(key)
        if why is not None:
            named = f"{envs.VARIANT}={config.spec}" if config else f"kernel config {candidate.spec}"
            reasons.append(f"FA4: {named} cannot build the prefill kernel: {why}")
    return reasons


def _layer_cache_refusal(cache_dtype: str, head_size: int) -> tuple[str, str | None] | None:
    """``kv_dtypes.refusal`` for a layer, with the model dtype and block size of vLLM's current
    config (the layer is built inside it); without one only the names are checked."""
    config = get_current_vllm_config_or_none()
    if config is None or config.model_config is None:
        return None
    block_size = config.cache_config.block_size if config.cache_config else None
    return kv_dtypes.refusal(cache_dtype, config.model_config.dtype, head_size, block_size)


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
            f"kv_cache_dtype {kv_cache_dtype!r}": kv_cache_dtype
            not in FA4AttentionBackend.supported_kv_cache_dtypes,
            f"options {sorted(extra)}": bool(extra),
        }
        refused = [name for name, bad in unsupported.items() if bad]
        if refused:
            raise NotImplementedError(_reason(", ".join(refused)))
        cache_refused = _layer_cache_refusal(kv_cache_dtype, head_size)
        if cache_refused is not None:
            raise NotImplementedError(_reason(*cache_refused))
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
        # Never quantize Q in the layer: prefill rows take 16-bit Q. With an FP8 cache the
        # decode rows get FP8 Q from DecodeQueryQuant instead (fp8_decode.py).
        self.supports_quant_query_input = False
        self._fp8_cache = kv_cache_dtype in kv_dtypes.FP8_E4M3_NAMES
        self._decode_query_quant = DecodeQueryQuant() if self._fp8_cache else None
        if self._fp8_cache:
            _warn_fp8_prefill_speed_once()
        # The metadata builder reads these to pick the kernel key of the layer's group.
        self.model_features = ModelFeatures(
            window_left=None if sliding_window is None else sliding_window - 1,
            softcap=float(logits_soft_cap) if logits_soft_cap else None,
            sinks=sinks is not None,
        )
        if sinks is not None and num_heads > FA3_SINK_MAX_Q_HEADS:
            raise NotImplementedError(
                f"FA4: attention sinks with {num_heads} query heads per GPU are not supported: "
                f"the decode rows run on FA3, whose sinks take at most {FA3_SINK_MAX_Q_HEADS} "
                "query heads (FLASH_ATTN has the same limit); use a larger "
                "--tensor-parallel-size or an attention backend without it"
            )

    # The layer's sink weights load (and may reload) after construction, in the model's dtype.
    # FA3's decode (FlashAttentionImpl reads self.sinks) takes them in bf16 only; our prefill
    # kernel in fp32. Both copies are remade when the weights' storage or version changes,
    # not on every call (this runs once per layer per step).
    @property
    def sinks(self) -> torch.Tensor | None:
        return self._sink_weights_as(torch.bfloat16)

    @sinks.setter
    def sinks(self, weights: torch.Tensor | None) -> None:
        self._sink_weights = weights
        self._sink_copies: dict = {}  # dtype -> (stamp, copy)

    def _sink_weights_as(self, dtype: torch.dtype) -> torch.Tensor | None:
        weights = self._sink_weights
        if weights is None or weights.dtype == dtype:
            return weights
        stamp = (weights.data_ptr(), weights._version)
        cached = self._sink_copies.get(dtype)
        if cached is None or cached[0] != stamp:
            cached = self._sink_copies[dtype] = (stamp, weights.to(dtype))
        return cached[1]

    def _sinks_fp32(self) -> torch.Tensor | None:
        """The sink logits as the prefill kernel reads them."""
        return self._sink_weights_as(torch.float32)

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
            self._forward_decode(layer, query, key, value, kv_cache, metadata.decode, output)
        if metadata.prefill is not None:  # rows after the decodes; K/V already in the cache
            start = metadata.num_decode_tokens
            stop = start + metadata.prefill.num_tokens
            if metadata.prefill.window_left != self.model_features.window_left:
                raise RuntimeError(  # the builder's group would disagree with this layer
                    f"FA4: the prefill plan's window ({metadata.prefill.window_left}) is not "
                    f"this layer's ({self.model_features.window_left})"
                )
            k_cache, v_cache = split_kv_cache(kv_cache, self.head_size)
            scales = {}
            if self._fp8_cache:  # vLLM's cache tensor is uint8: view it as e4m3
                k_cache, v_cache = k_cache.view(FP8_CACHE), v_cache.view(FP8_CACHE)
                # host floats, read every step: 0.26's calculate_kv_scales sets them after
                # startup (once, in the first forward); a device scale's .item() would sync
                scales = dict(k_scale=layer._k_scale_float, v_scale=layer._v_scale_float)
            run_prefill(
                metadata.prefill,
                query[start:stop],
                k_cache,
                v_cache,
                output[start:stop],
                softmax_scale=self.scale,
                softcap=self.model_features.softcap,
                sinks=self._sinks_fp32(),
                **scales,
            )
        return output

    def _forward_decode(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        decode: FlashAttentionMetadata,
        output: torch.Tensor,
    ) -> None:
        """FA3 on the decode rows, as FLASH_ATTN runs them: with an FP8 cache, Q quantized
        by the layer's scale and q_descale passed (fp8_decode.py)."""
        if not self._fp8_cache:
            super().forward(layer, query, key, value, kv_cache, decode, output)
            return
        fp8_query = self._decode_query_quant(layer, query[: decode.num_actual_tokens])
        with fa3_reads_fp8_query(self):
            super().forward(layer, fp8_query, key, value, kv_cache, decode, output)
