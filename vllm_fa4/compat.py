"""Every vLLM-version-specific part of the backend, in one place.

Tested against vLLM 0.26.0 and 0.33.0. Each difference is chosen by feature detection (an
attribute, a dataclass field, an importable module), never by version string, so a release in
between takes whichever side it has. The differences that touch us:

- KV cache shape: 0.26 asks the backend (``get_kv_cache_shape``/``get_kv_cache_stride_order``)
  and has one global "NHD"/"HND" layout; 0.33 builds the shape from the layer's spec
  (``customize_spec``) and resolves a ``KVCacheLayout`` from every backend's
  ``supported_kv_cache_layouts``.
- ``CommonAttentionMetadata``: 0.26's deprecated ``_seq_lens_cpu``/``_num_computed_tokens_cpu``
  and ``dcp_local_seq_lens_cpu`` are gone in 0.33, which adds per-request ``req_idx``,
  ``replayssm_decode_base_cpu`` and ``dcp_local_seq_lens_cpu_upper_bound``.
"""

from __future__ import annotations

import dataclasses

from vllm.config import get_current_vllm_config_or_none
from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape
from vllm.platforms import current_platform
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.flash_attn import (
    FlashAttentionBackend,
    FlashAttentionImpl,
    FlashAttentionMetadata,
    FlashAttentionMetadataBuilder,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

__all__ = [
    "AttentionBackend",
    "AttentionCGSupport",
    "AttentionMetadataBuilder",
    "AttentionType",
    "CommonAttentionMetadata",
    "FlashAttentionBackend",
    "FlashAttentionImpl",
    "FlashAttentionMetadata",
    "FlashAttentionMetadataBuilder",
    "GroupShape",
    "KV_CACHE_SHAPE_FROM_BACKEND",
    "MultipleOf",
    "NHD_KV_CACHE_LAYOUTS",
    "QuantFP8",
    "current_platform",
    "decode_slice",
    "get_current_vllm_config_or_none",
    "prefill_seq_lens_cpu",
    "split_decodes_and_prefills",
    "unsupported_kv_cache_layout",
]

# --- KV cache shape and layout ----------------------------------------------------------------

# vLLM 0.26: the backend names the cache's shape and stride order (FA4 copies FLASH_ATTN's).
KV_CACHE_SHAPE_FROM_BACKEND: bool = hasattr(AttentionBackend, "get_kv_cache_shape")

try:  # vLLM 0.33: one physical layout per model, negotiated between the backends
    from vllm.v1.kv_cache_layout import KVCacheLayout
except ImportError:
    KVCacheLayout = None

# The layouts whose per-layer view is NHD in memory (blocks, tokens, heads, 2*D), the only
# order the prefill kernel reads, in the enum's order: LBNHC (FLASH_ATTN's default) first, then
# its cross-layer twin BLNHC (a larger block stride, which the kernel takes). None on 0.26.
NHD_KV_CACHE_LAYOUTS = (
    None
    if KVCacheLayout is None
    else tuple(layout for layout in KVCacheLayout if layout.layer_view_order == (0, 2, 1, 3))
)


def unsupported_kv_cache_layout() -> str | None:
    """The KV cache layout asked for (``VLLM_KV_CACHE_LAYOUT``, or on 0.26 a KV connector)
    when it is not NHD in memory, else None. Checked at backend selection, so the refusal
    names FA4; 0.33 would also refuse it when it resolves the layout, without naming us."""
    if NHD_KV_CACHE_LAYOUTS is None:  # vLLM 0.26: one global "NHD"/"HND" string
        from vllm.v1.attention.backends.utils import get_kv_cache_layout

        layout = get_kv_cache_layout()
        return None if layout in (None, "NHD") else layout
    import vllm.envs as envs

    requested = envs.VLLM_KV_CACHE_LAYOUT
    nhd_names = {"NHD"} | {layout.name for layout in NHD_KV_CACHE_LAYOUTS}
    return None if requested is None or requested in nhd_names else requested


# --- CommonAttentionMetadata -----------------------------------------------------------------

_METADATA_FIELDS = frozenset(field.name for field in dataclasses.fields(CommonAttentionMetadata))

# How decode_slice treats each field, by name. A field missing here is one this module has not
# reviewed (tests/unit/test_compat.py fails on it): a new vLLM may need it sliced.
PER_REQUEST_FIELDS = (
    "seq_lens",
    "block_table_tensor",
    "is_prefilling",
    "seq_lens_cpu_upper_bound",
    "encoder_seq_lens",
    "encoder_seq_lens_cpu",
    "dcp_local_seq_lens",
    "dcp_local_seq_lens_cpu",  # 0.26
    "dcp_local_seq_lens_cpu_upper_bound",  # 0.33
    "rswa_prefix_lens",
    "req_idx",  # 0.33
    "replayssm_decode_base_cpu",  # 0.33
    "_seq_lens_cpu",  # 0.26 (deprecated)
    "_num_computed_tokens_cpu",  # 0.26 (deprecated)
)
PER_TOKEN_FIELDS = ("slot_mapping", "positions")
QUERY_START_FIELDS = ("query_start_loc", "query_start_loc_cpu")
# Set from the slice itself, or reset: caches of the whole batch and the sampler's logits rows.
RECOMPUTED_FIELDS = ("num_reqs", "num_actual_tokens", "max_query_len", "causal")
CLEARED_FIELDS = (
    "_num_computed_tokens_cache",
    "_token_to_req_indices_cache",
    "logits_indices_padded",
    "num_logits_indices",
    "max_logits_per_req",  # 0.33
)
# Kept as they are: an upper bound, and per-request ranges keyed by request index (the
# decodes come first, so their indices do not move; FA4 refuses mm-prefix models anyway).
KEPT_FIELDS = ("max_seq_len", "mm_req_doc_ranges")


def prefill_seq_lens_cpu(cm: CommonAttentionMetadata):
    """CPU seq_lens without a device sync.

    ``seq_lens_cpu_upper_bound`` (both versions) is exact for prefill rows (it is optimistic
    only for async speculative decode rows, which we never plan); 0.26's deprecated
    ``_seq_lens_cpu`` is the fallback. Returns None when neither is present.
    """
    if cm.seq_lens_cpu_upper_bound is not None:
        return cm.seq_lens_cpu_upper_bound
    return getattr(cm, "_seq_lens_cpu", None)


def decode_slice(cm: CommonAttentionMetadata, num_decodes: int, num_decode_tokens: int):
    """The leading decode rows as their own CommonAttentionMetadata (views, no copies), with
    every per-request and per-token field this vLLM has sliced to them.

    Decodes come first in a reordered batch, so the slice starts at request 0 and token 0 and
    needs no rebasing of query_start_loc.
    """
    qsl_cpu = cm.query_start_loc_cpu[: num_decodes + 1]
    query_lens = qsl_cpu[1:] - qsl_cpu[:-1]

    def present(names):
        return [name for name in names if name in _METADATA_FIELDS]

    def sliced(value, stop):
        return value[:stop] if value is not None else None

    changes = {name: sliced(getattr(cm, name), num_decodes) for name in present(PER_REQUEST_FIELDS)}
    changes |= {
        name: sliced(getattr(cm, name), num_decode_tokens) for name in present(PER_TOKEN_FIELDS)
    }
    changes |= {name: getattr(cm, name)[: num_decodes + 1] for name in QUERY_START_FIELDS}
    changes |= dict.fromkeys(present(CLEARED_FIELDS))
    return cm.replace(
        **changes,
        num_reqs=num_decodes,
        num_actual_tokens=num_decode_tokens,
        max_query_len=int(query_lens.max()) if num_decodes else 0,
        causal=cm.causal[:num_decodes] if not isinstance(cm.causal, bool) else cm.causal,
    )
