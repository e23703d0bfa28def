"""Launch the SM90 prefill kernel: the per-step tensors (``LaunchArgs``, built by the planner),
``prefill_forward`` and the per-stream tile counters of the persistent grid.

Light to import: the compiled kernels (kernels/compile.py, which imports the DSL) and torch
are imported on the first launch.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from vllm_fa4.kernels.config import KernelConfig, KernelKey, KvBox


class LaunchArgs(NamedTuple):
    """Device tensors that change every step (shapes in docs/contracts.md)."""

    cu_seqlens_q: Any  # [B+1] int32, prefill rows only, starts at 0
    seqused_k: Any  # [B] int32, k_len per request
    page_table: Any  # [B, max_pages] int32, view of vLLM's block table rows
    work_tiles: Any  # [num_tiles, 4] int32 (batch, kv_head, m_block, cost), launch order


def check_slot_boxes(k_cache, box_n: int) -> None:
    """`wide_box` addresses the cache as token slots (paged_kv.slot_view): a block must be a
    whole number of ``box_n``-slot boxes. vLLM's caches are (block stride = page_size token
    strides, or a multiple of it in a cross-layer layout)."""
    block_stride, token_stride = k_cache.stride(0), k_cache.stride(1)
    if block_stride % (token_stride * box_n):
        raise ValueError(
            f"vllm_fa4: the kernel config's wide_box needs the cache's block stride "
            f"({block_stride}) to be a multiple of {box_n} token strides ({token_stride}); "
            f"k_cache shape {tuple(k_cache.shape)} strides {tuple(k_cache.stride())}. Set "
            "VLLM_FA4_VARIANT to a config without wide_box for this cache layout."
        )


_SM_COUNT: dict = {}
# (device, stream) -> the [2] int32 tile counter of `persistent` launches on that stream. The kernel
# zeroes it again on exit (tile_scheduler.TileQueue), so ordered launches share it; two
# streams never do, or concurrent launches would steal each other's tiles.
_TILE_COUNTERS: dict = {}


def _sm_count(device) -> int:
    n = _SM_COUNT.get(device)
    if n is None:
        import torch

        n = _SM_COUNT[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def _tile_counters(device):
    import torch

    slot = (device, torch.cuda.current_stream(device).cuda_stream)
    counters = _TILE_COUNTERS.get(slot)
    if counters is None:
        counters = _TILE_COUNTERS[slot] = torch.zeros(2, dtype=torch.int32, device=device)
    return counters


def prefill_forward(
    key: KernelKey,
    config: KernelConfig,
    q,
    k_cache,
    v_cache,
    out,
    lse,
    args: LaunchArgs,
    softmax_scale: float,
    num_ctas: int | None = None,
    *,
    window_left: int | None = None,
    softcap: float | None = None,
    sinks=None,
    v_scale: float = 1.0,
) -> None:
    """Run the kernel for one step's prefill rows (tensor contracts: docs/contracts.md).

    ``num_ctas``: grid of the persistent configs, min(tiles, SMs) by default (tests pass more
    CTAs than tiles); the other configs launch one CTA per tile and ignore it.
    ``window_left`` / ``softcap`` / ``sinks`` ([Hq] fp32): the model features, given exactly
    when ``key`` has the matching flag (docs/contracts.md; ``run_prefill`` checks them, once
    per call, before it launches).
    ``v_scale``: an fp8 cache's V scale, applied to O in the epilogue (its K scale is folded
    into ``softmax_scale`` by the caller); a 16-bit key's kernel ignores it.
    """
    from vllm_fa4.kernels.compile import get_kernel

    if config.kv_box is KvBox.WIDE:
        check_slot_boxes(k_cache, config.box_n(key))
    fn = get_kernel(key, config, lse is not None)
    if num_ctas is None:
        num_ctas = min(args.work_tiles.shape[0], _sm_count(q.device))
    if config.kv_multicast:  # whole clusters of two (the paired rows keep their parity)
        num_ctas -= num_ctas % 2
    fn(
        q,
        k_cache,
        v_cache,
        out,
        lse,
        args.cu_seqlens_q,
        args.seqused_k,
        args.page_table,
        args.work_tiles,
        _tile_counters(q.device) if config.persistent else None,
        sinks,
        softmax_scale,
        num_ctas,
        0 if window_left is None else window_left,
        1.0 if softcap is None else softcap,
        v_scale,
    )
