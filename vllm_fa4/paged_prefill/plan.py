"""Prefill planning: vLLM's batch (prefill rows) -> kernel arguments and the LPT work list.

Runs once per model step in the metadata builder, on the CPU copies of the lengths only: no
``.item()``, no device->host sync; the single host->device copy is the work list.

Work list: one row ``(batch, kv_head, m_block, cost)`` per CTA. M tile ``m_block`` of request
``batch`` holds query tokens ``[m_block*tpt, (m_block+1)*tpt)`` (tpt = tokens_per_tile(D, qpk));
``cost`` is the number of KV tiles (tile_n keys) it visits under bottom-right causal masking:
``ceil(min(k_len, prefix + last_token + 1) / tile_n)`` with prefix = k_len - q_len. Rows are
sorted by cost, longest first (LPT), across requests; ties keep (batch, kv_head, m_block)
order so tiles reading the same K/V run side by side (L2 reuse).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_fa4.kernels.config import KernelKey, tile_shape, tokens_per_tile

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


@dataclass(frozen=True)
class PrefillPlan:
    """Everything ``run_prefill`` needs besides q, the cache views and out.

    Host fields are Python ints / CPU tensors; device fields are on ``device``.
    """

    key: KernelKey
    # device tensors (kernel argument names)
    cu_seqlens_q: torch.Tensor  # [B+1] int32, prefill rows only, starts at 0
    seqused_k: torch.Tensor  # [B] int32
    page_table: torch.Tensor  # [B, max_pages] int32, view of vLLM's block table
    work_tiles: torch.Tensor  # [num_tiles, 4] int32 (batch, kv_head, m_block, cost), LPT order
    # host copies
    query_start_loc_cpu: torch.Tensor  # [B+1] int32
    seq_lens_cpu: torch.Tensor  # [B] int32
    work_tiles_cpu: torch.Tensor  # [num_tiles, 4] int32, same rows as work_tiles
    # sizes
    num_reqs: int
    num_tokens: int
    max_seqlen_q: int
    max_seqlen_k: int
    num_tiles: int
    total_work: int  # sum of tile costs (KV tiles visited by all CTAs)
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype
    device: torch.device
    tile_m: int
    tile_n: int
    tokens_per_tile: int

    @property
    def qhead_per_kvhead(self) -> int:
        return self.num_q_heads // self.num_kv_heads


def _check_int32_1d(name: str, t: torch.Tensor, n: int, cpu: bool) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != n:
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a 1-D tensor of {n} entries, got {shape}")
    if t.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {t.dtype}")
    if cpu and t.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor (host copy), got device {t.device}")


def build_work_tiles(
    q_lens: np.ndarray,
    k_lens: np.ndarray,
    num_kv_heads: int,
    tokens_per_tile_: int,
    tile_n: int,
) -> np.ndarray:
    """LPT work list on the CPU: int64 [num_tiles, 4] rows (batch, kv_head, m_block, cost).

    Vectorised, no per-tile Python; requests with q_len 0 get no tiles. NumPy rather than
    torch: torch's CPU repeat_interleave/searchsorted/index go through the intra-op thread
    pool and cost ~8 ms each when the cores are busy (measured on 2 loaded cores); NumPy's
    single-threaded ops take microseconds.
    """
    q_lens = np.asarray(q_lens, dtype=np.int64)
    k_lens = np.asarray(k_lens, dtype=np.int64)
    m_blocks = (q_lens + tokens_per_tile_ - 1) // tokens_per_tile_  # [B], 0 for q_len 0
    per_req = m_blocks * num_kv_heads
    total = int(per_req.sum())
    if total == 0:
        return np.zeros((0, 4), dtype=np.int64)
    # Per-tile copies of per-request values; enumeration order (batch, kv_head, m_block).
    batch = np.repeat(np.arange(q_lens.shape[0], dtype=np.int64), per_req)
    starts = np.cumsum(per_req) - per_req
    local = np.arange(total, dtype=np.int64) - np.repeat(starts, per_req)
    mb = np.repeat(m_blocks, per_req)
    q_len = np.repeat(q_lens, per_req)
    k_len = np.repeat(k_lens, per_req)
    kv_head = local // mb
    m_block = local - kv_head * mb
    # Keys visible to the tile's last token: prefix + last + 1 = k_len - q_len + end.
    end = np.minimum((m_block + 1) * tokens_per_tile_, q_len)
    visible = np.maximum(np.minimum(k_len, k_len - q_len + end), 0)
    cost = (visible + tile_n - 1) // tile_n
    order = np.argsort(-cost, kind="stable")  # longest first; ties keep enumeration order
    return np.stack((batch, kv_head, m_block, cost), axis=1)[order]


def plan_prefill(
    query_start_loc_cpu: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    seqused_k: torch.Tensor,
    page_table: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> PrefillPlan:
    """Plan one step's prefill rows.

    Args:
        query_start_loc_cpu: [B+1] int32 CPU, prefill rows only, rebased so it starts at 0.
        seq_lens_cpu: [B] int32 CPU, k_len per request (cached prefix + q_len).
        cu_seqlens_q, seqused_k: the same on ``device`` (passed through, not copied).
        page_table: [B, max_pages] int32 on ``device`` (a view of vLLM's block table rows).
        num_q_heads, num_kv_heads, head_dim, page_size, dtype: the layer's attention shape.
        device: where the kernel runs.
    """
    if num_q_heads <= 0 or num_kv_heads <= 0 or num_q_heads % num_kv_heads:
        raise ValueError(
            f"num_q_heads ({num_q_heads}) must be a positive multiple of num_kv_heads "
            f"({num_kv_heads})"
        )
    if not isinstance(query_start_loc_cpu, torch.Tensor) or query_start_loc_cpu.dim() != 1:
        raise ValueError("query_start_loc_cpu must be a 1-D CPU int32 tensor [B+1]")
    num_reqs = query_start_loc_cpu.shape[0] - 1
    if num_reqs < 0:
        raise ValueError("query_start_loc_cpu must have at least one entry")
    _check_int32_1d("query_start_loc_cpu", query_start_loc_cpu, num_reqs + 1, cpu=True)
    _check_int32_1d("seq_lens_cpu", seq_lens_cpu, num_reqs, cpu=True)
    _check_int32_1d("cu_seqlens_q", cu_seqlens_q, num_reqs + 1, cpu=False)
    _check_int32_1d("seqused_k", seqused_k, num_reqs, cpu=False)
    device = torch.device(device)
    for name, t in (
        ("cu_seqlens_q", cu_seqlens_q),
        ("seqused_k", seqused_k),
        ("page_table", page_table),
    ):
        if t.device.type != device.type or (
            device.index is not None and t.device.index != device.index
        ):
            raise ValueError(f"{name} is on {t.device}, expected {device}")
    if page_table.dim() != 2 or page_table.shape[0] != num_reqs:
        raise ValueError(
            f"page_table must be [num_reqs={num_reqs}, max_pages], got {tuple(page_table.shape)}"
        )
    if page_table.dtype != torch.int32:
        raise ValueError(f"page_table must be int32, got {page_table.dtype}")
    if page_table.stride(1) != 1:
        raise ValueError(f"page_table rows must be contiguous, got strides {page_table.stride()}")

    qsl = query_start_loc_cpu.numpy().astype(np.int64)
    if num_reqs and int(qsl[0]) != 0:
        raise ValueError(
            f"query_start_loc_cpu must start at 0 (rebase the prefill rows), got {int(qsl[0])}"
        )
    q_lens = qsl[1:] - qsl[:-1]
    k_lens = seq_lens_cpu.numpy().astype(np.int64)
    if num_reqs:
        if (q_lens < 0).any():
            raise ValueError("query_start_loc_cpu must be non-decreasing")
        if (k_lens < q_lens).any():
            b = int(np.flatnonzero(k_lens < q_lens)[0])
            raise ValueError(
                f"request {b}: seq_len {int(k_lens[b])} < query length {int(q_lens[b])}"
            )
    max_seqlen_q = int(q_lens.max()) if num_reqs else 0
    max_seqlen_k = int(k_lens.max()) if num_reqs else 0
    if max_seqlen_k > page_table.shape[1] * page_size:
        raise ValueError(
            f"page_table has {page_table.shape[1]} pages of {page_size} tokens per request, "
            f"too few for seq_len {max_seqlen_k}"
        )

    qpk = num_q_heads // num_kv_heads
    key = KernelKey(
        dtype=dtype_name(dtype),
        head_dim=head_dim,
        page_size=page_size,
        qhead_per_kvhead=qpk,
        causal=True,
    )
    tile_m, tile_n = tile_shape(head_dim)
    tpt = tokens_per_tile(head_dim, qpk)
    if tpt < 1:
        raise ValueError(f"GQA group size {qpk} exceeds the M tile ({tile_m} rows)")

    tiles = build_work_tiles(q_lens, k_lens, num_kv_heads, tpt, tile_n)
    num_tiles = tiles.shape[0]
    total_work = int(tiles[:, 3].sum()) if num_tiles else 0
    tiles32 = torch.from_numpy(tiles.astype(np.int32))
    if device.type == "cuda":
        # Pinned staging so the one host->device copy is truly async; the caching host
        # allocator keeps the block alive until the copy has run.
        host = torch.empty((num_tiles, 4), dtype=torch.int32, pin_memory=True)
        host.copy_(tiles32)
        work_tiles = host.to(device, non_blocking=True)
    else:
        host = tiles32
        work_tiles = host if device.type == "cpu" else host.to(device)

    return PrefillPlan(
        key=key,
        cu_seqlens_q=cu_seqlens_q,
        seqused_k=seqused_k,
        page_table=page_table,
        work_tiles=work_tiles,
        query_start_loc_cpu=query_start_loc_cpu,
        seq_lens_cpu=seq_lens_cpu,
        work_tiles_cpu=host,
        num_reqs=num_reqs,
        num_tokens=int(qsl[-1]) if num_reqs else 0,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        num_tiles=num_tiles,
        total_work=total_work,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        dtype=dtype,
        device=cu_seqlens_q.device,
        tile_m=tile_m,
        tile_n=tile_n,
        tokens_per_tile=tpt,
    )
