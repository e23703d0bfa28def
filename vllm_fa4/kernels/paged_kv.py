"""Paged K/V tiles via per-page TMA boxes (no gather copy of the cache).

The pool ``[num_blocks, page, Hkv, D]`` (strided view of vLLM's packed cache) is described
to TMA as a rank-4 tensor (row_in_page, D, head, page). A K/V tile of ``tile_n`` keys is
``tile_n / box_n`` boxes of ``box_n`` rows (one page each, or a slice of a bigger page),
split along D into 64-element (128 B, the swizzle width) chunks. All boxes of a tile
complete on the tile's stage mbarrier, whose tx-count is the whole tile. Boxes past the
request's last page target page ``num_blocks`` (out of bounds), so TMA zero-fills them.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync

D_CHUNK = 64  # elements per 128-byte swizzle row
# L2 cache-policy operand of a TMA load: what `createpolicy.fractional.L2::evict_last.b64 p,
# 1.0` produces (an opaque 64-bit value; the same constant CUTLASS names EVICT_LAST). K/V are
# re-read by every M tile of their (request, KV head) pair; Q and O are touched once.
L2_EVICT_LAST = 0x14F0000000000000


@cute.jit
def _copy_box(tma_atom, src, dst, mbar, cache_policy):
    if cutlass.const_expr(cache_policy is None):
        cute.copy(tma_atom, src, dst, tma_bar_ptr=mbar)
    else:
        cute.copy(tma_atom, src, dst, tma_bar_ptr=mbar, cache_policy=cache_policy)


def pool_view(mX: cute.Tensor) -> cute.Tensor:
    """[num_blocks, page, Hkv, D] -> (page, D, Hkv, num_blocks), strides kept."""
    return cute.make_tensor(mX.iterator, cute.select(mX.layout, mode=[1, 3, 2, 0]))


def partition_pool_tiles(
    tma_atom: cute.CopyAtom, mX_tma: cute.Tensor, sX: cute.Tensor, kv_head, box_n: int
):
    """TMA views: smem ((box), box_in_tile, d_chunk, stage), gmem ((box), rowblk, d_chunk, page)."""
    gX = cute.local_tile(mX_tma[None, None, kv_head, None], (box_n, D_CHUNK), (None, None, None))
    sXb = cute.local_tile(sX, (box_n, D_CHUNK), (None, None, None))
    return cpasync.tma_partition(
        tma_atom, 0, cute.make_layout(1), cute.group_modes(sXb, 0, 2), cute.group_modes(gX, 0, 2)
    )


@cute.jit
def load_paged_tile(
    tma_atom: cute.CopyAtom,
    tXs: cute.Tensor,
    tXg: cute.Tensor,
    page_row: cute.Tensor,  # page_table[batch, :]
    k_len: Int32,
    num_blocks: Int32,
    n_block: Int32,
    stage: Int32,
    mbar: cute.Pointer,
    tile_n: cutlass.Constexpr[int],
    box_n: cutlass.Constexpr[int],
    page_size: cutlass.Constexpr[int],
    cache_policy=None,  # Int64 L2 policy for the loads (L2_EVICT_LAST), or None: no hint
):
    """Issue every box of K/V tile n_block into `stage`, all on the stage's mbarrier."""
    # Clamp the page-table read to the request's last page (entries past it are junk and
    # may lie past the row's end); boxes past k_len read page num_blocks -> zero fill.
    last_page = cutlass.max(k_len - 1, 0) // page_size
    for b in cutlass.range_constexpr(tile_n // box_n):
        token = n_block * tile_n + b * box_n
        page = page_row[cutlass.min(token // page_size, last_page)]
        if token >= k_len:
            page = num_blocks
        rowblk = (token % page_size) // box_n
        for c in cutlass.range_constexpr(cute.size(tXs, mode=[2])):
            _copy_box(
                tma_atom, tXg[None, rowblk, c, page], tXs[None, b, c, stage], mbar, cache_policy
            )


# ---- page_prefetch variant: the producer warp reads a block's page-table entries one block
# ahead, lane b holding box b's page (one coalesced load per block instead of one load per
# box after every stage acquire), and K and V of one block share them. load_paged_tile reads
# them after the acquire, which puts a global-load latency on every stage refill.
@cute.jit
def read_block_pages(
    page_row: cute.Tensor,
    k_len: Int32,
    num_blocks: Int32,
    n_block: Int32,
    tile_n: cutlass.Constexpr[int],
    box_n: cutlass.Constexpr[int],
    page_size: cutlass.Constexpr[int],
):
    """This lane's share of block n_block's pages: box min(lane, last box)'s page, as
    load_paged_tile computes it (num_blocks past k_len: zero fill)."""
    boxes = tile_n // box_n
    box = 0
    if cutlass.const_expr(boxes > 1):
        box = cutlass.min(cute.arch.lane_idx(), boxes - 1)
    token = n_block * tile_n + box * box_n
    last_page = cutlass.max(k_len - 1, 0) // page_size
    page = page_row[cutlass.min(token // page_size, last_page)]
    if token >= k_len:
        page = num_blocks
    return page


@cute.jit
def issue_paged_tile(
    tma_atom: cute.CopyAtom,
    tXs: cute.Tensor,
    tXg: cute.Tensor,
    lane_pages: Int32,  # read_block_pages for the same n_block
    n_block: Int32,
    stage: Int32,
    mbar: cute.Pointer,
    tile_n: cutlass.Constexpr[int],
    box_n: cutlass.Constexpr[int],
    page_size: cutlass.Constexpr[int],
    cache_policy=None,
):
    """load_paged_tile with the pages already read: box b's page comes from lane b."""
    boxes = tile_n // box_n
    for b in cutlass.range_constexpr(boxes):
        page = lane_pages
        if cutlass.const_expr(boxes > 1):
            page = cute.arch.shuffle_sync(lane_pages, b)
        token = n_block * tile_n + b * box_n
        rowblk = (token % page_size) // box_n
        for c in cutlass.range_constexpr(cute.size(tXs, mode=[2])):
            _copy_box(
                tma_atom, tXg[None, rowblk, c, page], tXs[None, b, c, stage], mbar, cache_policy
            )
