"""The per-step tensors of one kernel launch (built by the planner, read by the launch)."""

from typing import Any, NamedTuple


class LaunchArgs(NamedTuple):
    """Device tensors that change every step (shapes in docs/contracts.md)."""

    cu_seqlens_q: Any  # [B+1] int32, prefill rows only, starts at 0
    seqused_k: Any  # [B] int32, k_len per request
    page_table: Any  # [B, max_pages] int32, view of vLLM's block table rows
    work_tiles: Any  # [num_tiles, 4] int32 (batch, kv_head, m_block, cost), launch order
