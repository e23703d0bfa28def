"""Every vLLM-version-specific import the backend needs, in one place.

Moving to a newer vLLM (0.33 replaced the KV-cache shape hooks with ``KVCacheLayout``) should be a
change in this module only.
"""

from __future__ import annotations

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
from vllm.v1.attention.backends.utils import get_kv_cache_layout, split_decodes_and_prefills

VLLM_API = "0.26"

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
    "MultipleOf",
    "current_platform",
    "get_kv_cache_layout",
    "split_decodes_and_prefills",
]


def prefill_seq_lens_cpu(cm: CommonAttentionMetadata):
    """CPU seq_lens without a device sync.

    ``seq_lens_cpu_upper_bound`` is exact for prefill rows (it is optimistic only for async
    speculative decode rows, which we never plan); the deprecated ``_seq_lens_cpu`` is the
    fallback. Returns None when neither is present.
    """
    if cm.seq_lens_cpu_upper_bound is not None:
        return cm.seq_lens_cpu_upper_bound
    return cm._seq_lens_cpu


def decode_slice(cm: CommonAttentionMetadata, num_decodes: int, num_decode_tokens: int):
    """The leading decode rows as their own CommonAttentionMetadata (views, no copies).

    Decodes come first in a reordered batch, so the slice starts at request 0 and token 0 and
    needs no rebasing of query_start_loc.
    """
    qsl_cpu = cm.query_start_loc_cpu[: num_decodes + 1]
    query_lens = qsl_cpu[1:] - qsl_cpu[:-1]

    def rows(t):
        return t[:num_decodes] if t is not None else None

    return cm.replace(
        query_start_loc=cm.query_start_loc[: num_decodes + 1],
        query_start_loc_cpu=qsl_cpu,
        seq_lens=cm.seq_lens[:num_decodes],
        num_reqs=num_decodes,
        num_actual_tokens=num_decode_tokens,
        max_query_len=int(query_lens.max()) if num_decodes else 0,
        block_table_tensor=cm.block_table_tensor[:num_decodes],
        slot_mapping=cm.slot_mapping[:num_decode_tokens],
        causal=cm.causal[:num_decodes] if not isinstance(cm.causal, bool) else cm.causal,
        is_prefilling=rows(cm.is_prefilling),
        seq_lens_cpu_upper_bound=rows(cm.seq_lens_cpu_upper_bound),
        dcp_local_seq_lens=rows(cm.dcp_local_seq_lens),
        dcp_local_seq_lens_cpu=rows(cm.dcp_local_seq_lens_cpu),
        encoder_seq_lens=rows(cm.encoder_seq_lens),
        encoder_seq_lens_cpu=rows(cm.encoder_seq_lens_cpu),
        rswa_prefix_lens=rows(cm.rswa_prefix_lens),
        positions=cm.positions[:num_decode_tokens] if cm.positions is not None else None,
        _seq_lens_cpu=rows(cm._seq_lens_cpu),
        _num_computed_tokens_cpu=rows(cm._num_computed_tokens_cpu),
        _num_computed_tokens_cache=None,
        _token_to_req_indices_cache=None,
        logits_indices_padded=None,
        num_logits_indices=None,
    )
