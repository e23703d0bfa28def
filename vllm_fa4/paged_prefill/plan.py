"""Prefill planning: vLLM's batch (prefill rows) -> kernel arguments and the LPT work list.

Runs once per model step in the metadata builder, on the CPU copies of the lengths only: no
``.item()``, no device->host sync; the single host->device copy is the work list.

Work list: one row ``(batch, kv_head, m_block, cost)`` per CTA. M tile ``m_block`` of request
``batch`` holds query tokens ``[m_block*T, (m_block+1)*T)`` (T = the key's tokens_per_tile);
``cost`` is the number of KV tiles (tile_n keys) it visits under bottom-right causal masking:
``n_block_max = ceil(min(k_len, prefix + last_token + 1) / tile_n)`` with prefix =
k_len - q_len; with a sliding window the tile starts at ``n_block_min = max(0, prefix +
first_token - window_left) // tile_n`` and cost = n_block_max - n_block_min (without one,
n_block_min = 0); where pages are shorter than a K/V tile its blocks start at that first key's
page, not at a multiple of tile_n (``config.grid_shift_keys``), and n_block_max counts from
there. Rows are sorted by cost, longest first (LPT), across requests; ties keep
(batch, kv_head, m_block) order so tiles reading the same K/V run side by side (L2 reuse).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_fa4.kernels.config import (
    KernelConfig,
    KernelKey,
    TileGeometry,
    check_window,
    grid_shift_keys,
)
from vllm_fa4.kernels.launch import LaunchArgs
from vllm_fa4.paged_prefill.policy import ServingConfigs
from vllm_fa4.paged_prefill.route import select_route

# K/V bytes the tiles in flight may share before the tile order cuts a section
# (build_work_tiles); None keeps plain LPT. H100 and H200 have 50 MB of L2; 16 MiB measured
# best of 8-32 MiB (H100: +1-7 % over plain LPT, L2 hit rate 79 % -> 95 %, perf-notes.md).
L2_SECTION_BYTES: int | None = 16 << 20


@dataclass(frozen=True)
class PrefillPlan:
    """Everything ``run_prefill`` needs besides q, the cache views and out.

    Host fields are Python ints / CPU tensors; ``args`` holds the device tensors.
    """

    key: KernelKey  # built once by the caller (the metadata builder), never per step
    config: KernelConfig  # the batch's pick of the caller's ServingConfigs
    route: str  # "kernel" or "reference": decided once by the caller (route.select_route)
    args: LaunchArgs  # device tensors of the launch (work_tiles in LPT order)
    # host copies
    query_start_loc_cpu: torch.Tensor  # [B+1] int32
    seq_lens_cpu: torch.Tensor  # [B] int32
    work_tiles_cpu: torch.Tensor  # [num_tiles, 4] int32, same rows as args.work_tiles
    # sizes
    num_reqs: int
    num_tokens: int
    max_seqlen_q: int
    max_seqlen_k: int
    num_tiles: int
    total_work: int  # sum of tile costs (KV tiles visited by all CTAs)
    num_q_heads: int
    num_kv_heads: int
    device: torch.device
    geometry: TileGeometry
    window_left: int | None = None  # the sliding window (key.sliding_window), None: none


def kv_bytes_per_token(key: KernelKey) -> int:
    """Cache bytes of one key of one KV head, K and V: 16-bit, or 1 byte each in an FP8
    cache (the L2 sections then hold twice the keys)."""
    return 2 * key.head_dim * (1 if key.fp8_kv else 2)


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
    tokens_per_tile: int,
    tile_n: int,
    kv_bytes_per_token: int = 0,
    l2_section_bytes: int | None = None,
    window_left: int | None = None,
    shift_keys: int = 0,
    tail_sections: int = 1,
) -> np.ndarray:
    """LPT work list on the CPU: int64 [num_tiles, 4] rows (batch, kv_head, m_block, cost).

    ``cost`` counts the K/V tiles a tile visits: [n_block_min, n_block_max), n_block_min
    > 0 only with a sliding window (``window_left``: keys a row sees left of its diagonal).
    ``shift_keys`` (``config.grid_shift_keys``): the window's tile starts its block grid at
    its leftmost key's page, as the kernel does (tile_scheduler.tile_work).

    With ``l2_section_bytes``, the (request, KV head) pairs are cut into sections whose K/V
    (``kv_bytes_per_token`` per key) fits that many bytes, longest pairs first, and the list
    runs section by section, LPT inside each: the tiles in flight then share the K/V of one
    section, which stays in L2, instead of streaming every pair's K/V at once (a cyclic
    access pattern larger than L2 misses on nearly every read). A pair larger than the budget
    is a section of its own. ``tail_sections``: the last that many sections run as one LPT
    stretch, so the longest tiles of the end are not the last ones claimed (up to that many
    sections' K/V are then in flight at the end).

    Vectorised, no per-tile Python; requests with q_len 0 get no tiles. NumPy rather than
    torch: torch's CPU repeat_interleave/searchsorted/index go through the intra-op thread
    pool and cost ~8 ms each when the cores are busy (measured on 2 loaded cores); NumPy's
    single-threaded ops take microseconds.
    """
    q_lens = np.asarray(q_lens, dtype=np.int64)
    k_lens = np.asarray(k_lens, dtype=np.int64)
    m_blocks = (q_lens + tokens_per_tile - 1) // tokens_per_tile  # [B], 0 for q_len 0
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
    end = np.minimum((m_block + 1) * tokens_per_tile, q_len)
    visible = np.maximum(np.minimum(k_len, k_len - q_len + end), 0)
    if window_left is None:
        cost = (visible + tile_n - 1) // tile_n  # n_block_max
    else:
        # The tile's first token reaches furthest left: [prefix + first - window_left, ...].
        first = m_block * tokens_per_tile
        left_key = np.maximum(k_len - q_len + first - window_left, 0)
        # With a shift the grid starts at left_key's page (key_offset < tile_n keys in).
        key_offset = (left_key - left_key % shift_keys) % tile_n if shift_keys else 0
        n_block_max = (visible - key_offset + tile_n - 1) // tile_n
        cost = np.maximum(n_block_max - left_key // tile_n, 0)
    if l2_section_bytes is None:
        order = np.argsort(-cost, kind="stable")  # longest first; ties keep enumeration order
    else:
        section = _l2_sections(
            k_lens, m_blocks, num_kv_heads, kv_bytes_per_token, l2_section_bytes, tile_n
        )
        if tail_sections > 1:
            section = np.minimum(section, max(int(section.max()) - tail_sections + 1, 0))
        pair = batch * num_kv_heads + kv_head
        order = np.lexsort((-cost, section[pair]))  # stable: ties keep enumeration order
    return np.stack((batch, kv_head, m_block, cost), axis=1)[order]


def pair_rows(rows: np.ndarray) -> np.ndarray:
    """``KernelConfig.paired_heads``: every row of a work list twice in a row, as virtual KV
    heads 2h and 2h + 1 (each half of head h's query heads; with the multicast, the two CTAs
    of one cluster), in the list's order."""
    paired = np.repeat(rows, 2, axis=0)
    paired[:, 1] = 2 * paired[:, 1] + np.tile(np.arange(2, dtype=paired.dtype), len(rows))
    return paired


def _l2_sections(
    k_lens: np.ndarray,
    m_blocks: np.ndarray,
    num_kv_heads: int,
    kv_bytes_per_token: int,
    budget: int,
    tile_n: int,
) -> np.ndarray:
    """Section index of every (request, KV head) pair, pair = batch * num_kv_heads + kv_head.

    Pairs are taken longest first (by their costliest tile, i.e. their k_len) and packed
    greedily, in that order, into consecutive sections of at most ``budget`` bytes of K/V.
    """
    pair_bytes = np.repeat(k_lens * kv_bytes_per_token, num_kv_heads)
    pair_cost = np.repeat(np.where(m_blocks > 0, (k_lens + tile_n - 1) // tile_n, -1), num_kv_heads)
    by_cost = np.argsort(-pair_cost, kind="stable")
    # Greedy cut: a new section starts where the running total would pass a multiple of
    # the budget (vectorised: section = floor of the running total before each pair).
    running = np.cumsum(pair_bytes[by_cost]) - pair_bytes[by_cost]
    section_sorted = running // max(budget, 1)
    # Consecutive pairs in one budget window share a section; renumber to 0, 1, 2, ...
    section_sorted = np.concatenate(([0], np.cumsum(np.diff(section_sorted) > 0)))
    section = np.empty_like(section_sorted)
    section[by_cost] = section_sorted
    return section


def plan_prefill(
    query_start_loc_cpu: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    *,
    key: KernelKey,
    configs: ServingConfigs,
    num_kv_heads: int,
    cu_seqlens_q: torch.Tensor,
    seqused_k: torch.Tensor,
    page_table: torch.Tensor,
    l2_section_bytes: int | None = L2_SECTION_BYTES,
    tail_sections: int = 1,
    window_left: int | None = None,
    route: str | None = None,
) -> PrefillPlan:
    """Plan one step's prefill rows.

    Args:
        query_start_loc_cpu: [B+1] int32 CPU, prefill rows only, rebased so it starts at 0.
        seq_lens_cpu: [B] int32 CPU, k_len per request (cached prefix + q_len).
        key, configs: the layer's kernel key and ``ServingConfigs`` (``policy.serving_configs``),
            built once by the caller; the plan picks one by the batch's mean tile cost.
        num_kv_heads: KV heads of the layer (query heads = num_kv_heads * GQA group).
        cu_seqlens_q, seqused_k: the same lengths on the kernel's device (passed through).
        page_table: [B, max_pages] int32 on that device (a view of vLLM's block table rows).
        l2_section_bytes: L2 budget of the tile order (``build_work_tiles``); None: plain LPT.
        tail_sections: the last that many L2 sections as one LPT stretch (``build_work_tiles``).
        window_left: the layer's sliding window, keys a row sees left of its diagonal
            (vLLM's ``sliding_window - 1``, >= 0); given iff ``key.sliding_window``. Tile
            costs (the LPT order, ``total_work`` and the config pick) count only the K/V
            tiles inside the window; ``run_prefill`` reads it from the plan.
        route: ``select_route``'s answer for (key, configs, device), decided once by the
            caller (the metadata builder, at startup); None: asked here (tests and tools).
    """
    if num_kv_heads <= 0:
        raise ValueError(f"num_kv_heads must be positive, got {num_kv_heads}")
    window_left = check_window(key, window_left)
    if not isinstance(query_start_loc_cpu, torch.Tensor) or query_start_loc_cpu.dim() != 1:
        raise ValueError("query_start_loc_cpu must be a 1-D CPU int32 tensor [B+1]")
    num_reqs = query_start_loc_cpu.shape[0] - 1
    if num_reqs < 0:
        raise ValueError("query_start_loc_cpu must have at least one entry")
    _check_int32_1d("query_start_loc_cpu", query_start_loc_cpu, num_reqs + 1, cpu=True)
    _check_int32_1d("seq_lens_cpu", seq_lens_cpu, num_reqs, cpu=True)
    _check_int32_1d("cu_seqlens_q", cu_seqlens_q, num_reqs + 1, cpu=False)
    _check_int32_1d("seqused_k", seqused_k, num_reqs, cpu=False)
    device = cu_seqlens_q.device
    for name, t in (("seqused_k", seqused_k), ("page_table", page_table)):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, cu_seqlens_q on {device}")
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
    if max_seqlen_k > page_table.shape[1] * key.page_size:
        raise ValueError(
            f"page_table has {page_table.shape[1]} pages of {key.page_size} tokens per request, "
            f"too few for seq_len {max_seqlen_k}"
        )

    geometry = configs.geometry(key)
    if geometry.tokens_per_tile < 1:
        raise ValueError(
            f"GQA group size {key.qhead_per_kvhead} exceeds the M tile ({geometry.tile_m} rows)"
        )

    def tile(geometry: TileGeometry) -> np.ndarray:
        return build_work_tiles(
            q_lens,
            k_lens,
            num_kv_heads,
            geometry.tokens_per_tile,
            geometry.tile_n,
            kv_bytes_per_token=kv_bytes_per_token(key),
            l2_section_bytes=l2_section_bytes,
            tail_sections=tail_sections,
            window_left=window_left,
            shift_keys=grid_shift_keys(key, geometry.tile_n),
        )

    tiles = tile(geometry)
    num_tiles = tiles.shape[0]
    total_work = int(tiles[:, 3].sum()) if num_tiles else 0
    config = configs.pick(num_tiles, total_work)
    if config.geometry(key) != geometry:
        # a short pick with its own N tile, or its own tokens a tile where the long pick packs
        # half the group (`kv_multicast`): its tiles, costs, order
        geometry = config.geometry(key)
        tiles = tile(geometry)
        num_tiles = tiles.shape[0]
        total_work = int(tiles[:, 3].sum()) if num_tiles else 0
    if config.paired_heads:  # the same tiles (the pick's geometry), each row twice
        tiles = pair_rows(tiles)
        num_tiles, total_work = tiles.shape[0], 2 * total_work
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
        config=config,
        route=select_route(key, configs, device) if route is None else route,
        args=LaunchArgs(cu_seqlens_q, seqused_k, page_table, work_tiles),
        query_start_loc_cpu=query_start_loc_cpu,
        seq_lens_cpu=seq_lens_cpu,
        work_tiles_cpu=host,
        num_reqs=num_reqs,
        num_tokens=int(qsl[-1]) if num_reqs else 0,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        num_tiles=num_tiles,
        total_work=total_work,
        num_q_heads=num_kv_heads * key.qhead_per_kvhead,
        num_kv_heads=num_kv_heads,
        device=device,
        geometry=geometry,
        window_left=window_left,
    )
