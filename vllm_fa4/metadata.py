"""Per-step attention metadata for the FA4 backend.

vLLM reorders each batch so decodes come first (we set ``reorder_batch_threshold``). The builder
splits the batch at the first prefill: the decode rows go to vLLM's FlashAttention builder
unchanged (so pure-decode batches keep FA3's full CUDA graphs), the prefill rows become a
``PrefillPlan`` for our kernel. Everything is computed from CPU copies vLLM already has: no
host-device sync in ``build``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from vllm_fa4 import envs, warmup
from vllm_fa4 import kv_cache_dtype as kv_dtypes
from vllm_fa4.compat import (
    AttentionCGSupport,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
    FlashAttentionMetadata,
    FlashAttentionMetadataBuilder,
    decode_slice,
    prefill_seq_lens_cpu,
    split_decodes_and_prefills,
)
from vllm_fa4.kernels.config import KernelKey, ModelFeatures, dtype_name
from vllm_fa4.paged_prefill import PrefillPlan, plan_prefill, select_route
from vllm_fa4.paged_prefill.layout import KvCacheLayout, fit_serving_configs
from vllm_fa4.paged_prefill.policy import (
    configured_config,
    configured_fp8_query,
    serving_configs,
    unreviewed_config_warning,
)

logger = logging.getLogger("vllm_fa4")


@dataclass
class FA4Metadata:
    num_actual_tokens: int  # may include CUDA-graph padding after the last request
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    decode: FlashAttentionMetadata | None  # rows [0, num_decode_tokens)
    prefill: PrefillPlan | None  # rows [num_decode_tokens, num_decode_tokens + num_prefill_tokens)
    # [num_actual_tokens] cache slot of every row; vLLM reads it off any backend's metadata
    # (micro-batching, its own backend tests)
    slot_mapping: torch.Tensor


class FA4MetadataBuilder(AttentionMetadataBuilder[FA4Metadata]):
    reorder_batch_threshold: int = 1
    _warned_sync: bool = False
    _lengths_differed: bool = False  # VLLM_FA4_CHECK found a difference (logged once)

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        # Decode-only batches go to FA3 wholesale and may be captured in full graphs; batches
        # with prefill must run attention eagerly (our plan changes shape every step).
        inner = FlashAttentionMetadataBuilder.get_cudagraph_support(vllm_config, kv_cache_spec)
        return AttentionCGSupport(min(inner.value, AttentionCGSupport.UNIFORM_BATCH.value))

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        model_config, parallel = vllm_config.model_config, vllm_config.parallel_config
        if getattr(model_config, "rswa_window", None) is not None:
            raise NotImplementedError("FA4: R-SWA is not supported (use FLASH_ATTN)")
        head_size = kv_cache_spec.head_size
        if getattr(kv_cache_spec, "head_size_v", head_size) != head_size:
            raise NotImplementedError("FA4: different K and V head sizes are not supported")
        self.num_kv_heads = kv_cache_spec.num_kv_heads
        self.features = group_features(vllm_config, layer_names, kv_cache_spec)
        cache_dtype = group_cache_dtype(vllm_config, layer_names, kv_cache_spec)
        # The one key and config of this layer group: warmup compiles exactly what every
        # step's plan will launch, so nothing compiles while serving.
        self.kernel_key = KernelKey.for_layer(
            model_config.dtype,
            head_size,
            kv_cache_spec.block_size,
            model_config.get_num_attention_heads(parallel),
            self.num_kv_heads,
            **self.features.key_flags(),
            kv_dtype=kv_dtypes.key_kv_dtype(cache_dtype),
        )
        # VLLM_FA4_VARIANT fixes one config; unset, the plan picks per batch among the
        # measured defaults (short batches: persistent grid). All are compiled at startup,
        # fitted to the cache layout the spec announces (padded pages of hybrid models).
        # VLLM_FA4_FP8_QUERY=e4m3 swaps an FP8 cache's long picks for Q rounded to e4m3.
        fixed = configured_config()
        self.kernel_configs = _fit_to_spec_layout(
            serving_configs(self.kernel_key, fixed, configured_fp8_query()),
            self.kernel_key,
            kv_cache_spec,
        )
        if (warning := unreviewed_config_warning(self.kernel_key, fixed)) is not None:
            logger.warning(warning)
        # Startup, not mid-request: a key without a kernel raises here (route "auto" on a
        # GPU); the fp32 reference runs only when VLLM_FA4_PREFILL_ROUTE=reference asks for
        # it, or on CPU (tests). Every plan carries this one decision.
        self.prefill_route = select_route(self.kernel_key, self.kernel_configs, device)
        self.check_lengths = envs.check_lengths()  # VLLM_FA4_CHECK: a debugging aid
        if self.prefill_route == "kernel":
            for config in self.kernel_configs.all:
                warmup.request(self.kernel_key, config)
        self.decode_builder = FlashAttentionMetadataBuilder(
            kv_cache_spec, layer_names, vllm_config, device
        )
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> FA4Metadata:
        cm = common_attn_metadata
        num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(
            cm, decode_threshold=self.reorder_batch_threshold
        )
        if num_prefills == 0:  # pure decode (incl. full-graph capture/replay): FA3 sees cm as is
            decode = self.decode_builder.build(0, cm, fast_build)
            return FA4Metadata(
                num_actual_tokens=cm.num_actual_tokens,
                num_decodes=num_decodes,
                num_decode_tokens=num_decode_tokens,
                num_prefills=0,
                num_prefill_tokens=0,
                decode=decode,
                prefill=None,
                slot_mapping=cm.slot_mapping,
            )
        if isinstance(cm.causal, torch.Tensor) or not cm.causal:
            raise NotImplementedError("FA4: non-causal batches are not supported")
        decode = None
        if num_decodes:
            decode_cm = decode_slice(cm, num_decodes, num_decode_tokens)
            decode = self.decode_builder.build(0, decode_cm, fast_build)
        prefill = self._plan_prefill(cm, num_decodes, num_decode_tokens)
        return FA4Metadata(
            num_actual_tokens=cm.num_actual_tokens,
            num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            num_prefills=num_prefills,
            num_prefill_tokens=prefill.num_tokens,
            decode=decode,
            prefill=prefill,
            slot_mapping=cm.slot_mapping,
        )

    def _plan_prefill(
        self, cm: CommonAttentionMetadata, num_decodes: int, num_decode_tokens: int
    ) -> PrefillPlan:
        nd, num_reqs = num_decodes, cm.num_reqs
        qsl_cpu = cm.query_start_loc_cpu[nd : num_reqs + 1]
        seq_lens_cpu = prefill_seq_lens_cpu(cm)
        if seq_lens_cpu is None:  # not filled by this runner: a sync per step, said once
            if not self._warned_sync:
                logger.warning("FA4: no CPU seq_lens in the batch metadata; copying from GPU")
                self._warned_sync = True
            seq_lens_cpu = cm.seq_lens.cpu()
        plan = plan_prefill(
            qsl_cpu - qsl_cpu[0],
            seq_lens_cpu[nd:num_reqs],
            key=self.kernel_key,
            configs=self.kernel_configs,
            route=self.prefill_route,
            num_kv_heads=self.num_kv_heads,
            cu_seqlens_q=cm.query_start_loc[nd : num_reqs + 1] - num_decode_tokens,
            seqused_k=cm.seq_lens[nd:num_reqs],
            page_table=cm.block_table_tensor[nd:num_reqs],
            window_left=self.features.window_left,
        )
        if self.check_lengths and not self._lengths_differed:
            difference = lengths_difference(plan)
            if difference is not None:  # logged, never raised: requests are in flight
                self._lengths_differed = True
                logger.error(
                    "FA4 (%s=1): %s. The kernel bounds its reads by the device copies and "
                    "tiles by the host ones, so rows of this batch may be wrong; said once",
                    envs.CHECK,
                    difference,
                )
        return plan

    def use_cascade_attention(self, *args, **kwargs) -> bool:
        return False  # vLLM 0.26 asks; 0.33 has no cascade attention


def group_cache_dtype(vllm_config, layer_names, kv_cache_spec) -> str:
    """vLLM's ``--kv-cache-dtype`` name for one KV-cache group (its layers' impls carry it;
    per layer, since ``--kv-cache-dtype-skip-layers`` keeps some layers 16-bit), refused
    here, at startup, unless FA4 serves it. An FP8 group's key then needs a kernel that reads
    FP8 (``route.kernel_reads_fp8``, asked by ``select_route``)."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.attention.backends.utils import get_layers_from_vllm_config

    layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase, layer_names)
    found = {getattr(layer.impl, "kv_cache_dtype", None) for layer in layers.values()}
    found.discard(None)
    model_dtype = vllm_config.model_config.dtype
    spec_dtype = dtype_name(kv_cache_spec.dtype)
    if len(found) > 1:
        raise NotImplementedError(
            f"FA4: the layers of one KV-cache group differ in KV cache dtype ({sorted(found)}); "
            "use --attention-backend FLASH_ATTN for this model"
        )
    if found:
        cache_dtype = found.pop()
    elif kv_cache_spec.dtype.itemsize == 1:  # no layers to ask: vLLM's setting
        cache_dtype = vllm_config.cache_config.cache_dtype
    else:
        cache_dtype = "auto" if spec_dtype == dtype_name(model_dtype) else spec_dtype
    if kv_cache_spec.dtype.itemsize > 1 and spec_dtype != dtype_name(model_dtype):
        raise NotImplementedError(
            f"FA4: KV cache dtype {spec_dtype} with model dtype {dtype_name(model_dtype)} is "
            "not supported (the prefill kernel reads the cache in the model's dtype); use "
            "--kv-cache-dtype auto, or --attention-backend FLASH_ATTN for this model"
        )
    refused = kv_dtypes.name_refusal(cache_dtype, model_dtype)
    if refused is not None:
        what, supported = refused
        also = f" (supported: {supported})" if supported else ""
        raise NotImplementedError(
            f"FA4: {what} is not supported{also}; use --kv-cache-dtype auto, or "
            "--attention-backend FLASH_ATTN for this model"
        )
    return cache_dtype


def group_features(vllm_config, layer_names, kv_cache_spec) -> ModelFeatures:
    """The sliding window, soft cap and sinks of one KV-cache group's layers (one kernel key
    per group, so they must agree). Layers come from vLLM's forward context; the window is
    also cross-checked against a sliding-window cache spec."""
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.attention.backends.utils import get_layers_from_vllm_config

    layers = get_layers_from_vllm_config(vllm_config, AttentionLayerBase, layer_names)
    found = {getattr(layer.impl, "model_features", None) for layer in layers.values()}
    found.discard(None)
    spec_window = getattr(kv_cache_spec, "sliding_window", None)
    if len(found) > 1:
        raise NotImplementedError(
            f"FA4: the layers of one KV-cache group differ in sliding window, soft cap or "
            f"sinks ({sorted(map(str, found))}); use FLASH_ATTN for this model"
        )
    features = (
        found.pop()
        if found
        else ModelFeatures(window_left=None if spec_window is None else spec_window - 1)
    )
    if spec_window is not None and features.window_left != spec_window - 1:
        raise NotImplementedError(
            f"FA4: the cache spec's sliding window {spec_window} is not the layers' "
            f"(window_left {features.window_left})"
        )
    return features


def _fit_to_spec_layout(configs, key: KernelKey, kv_cache_spec):
    """``configs`` fitted to the block stride vLLM will give this group's caches: ``block_size``
    token strides, or ``page_size_padded`` bytes when the spec pads its pages (a hybrid model
    whose other layers have larger pages). A layout the kernel cannot read is refused here, at
    startup; a cross-layer cache (a multiple of the page) needs nothing."""
    padded = getattr(kv_cache_spec, "page_size_padded", None)
    layout = KvCacheLayout.packed(
        kv_cache_spec.block_size,
        kv_cache_spec.num_kv_heads,
        kv_cache_spec.head_size,
        kv_cache_spec.dtype.itemsize,
        page_bytes=padded,
    )
    why = layout.unsupported_reason()
    if why is not None:
        raise NotImplementedError(
            f"FA4: {why} (page_size_padded={padded}); use --attention-backend FLASH_ATTN for "
            "this model"
        )
    fitted = fit_serving_configs(configs, key, layout)
    for old, new in zip(configs.all, fitted.all, strict=True):
        if old != new:
            logger.info(
                "FA4: padded KV pages (%d bytes per block): %s runs as %s",
                layout.block_stride,
                old.spec,
                new.spec,
            )
    return fitted


def lengths_difference(plan: PrefillPlan) -> str | None:
    """Where the lengths the kernel reads on its device (cu_seqlens_q, seqused_k) differ from
    the host copies ``plan`` was tiled with, or None. A device->host copy each: a sync per
    step (``VLLM_FA4_CHECK`` only); skipped while a CUDA graph is captured."""
    if plan.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    pairs = (
        ("cu_seqlens_q", plan.args.cu_seqlens_q, plan.query_start_loc_cpu),
        ("seqused_k", plan.args.seqused_k, plan.seq_lens_cpu),
    )
    for name, on_device, on_host in pairs:
        got = on_device.cpu()
        if not torch.equal(got, on_host):
            i = int((got != on_host).nonzero()[0, 0])
            return f"{name}[{i}] is {int(got[i])} on the GPU, {int(on_host[i])} on the host"
    return None
