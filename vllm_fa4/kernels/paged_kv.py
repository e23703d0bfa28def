"""Paged K/V tiles via per-page TMA boxes (no gather copy of the cache).

The pool ``[num_blocks, page, Hkv, D]`` (strided view of vLLM's packed cache) is described
to TMA as a rank-4 tensor (row_in_page, D, head, page). A K/V tile of ``tile_n`` keys is
``tile_n / box_n`` boxes of ``box_n`` rows (one page each, or a slice of a bigger page),
split along D into 64-element (128 B, the swizzle width) chunks. All boxes of a tile
complete on the tile's stage mbarrier, whose tx-count is the whole tile. Boxes past the
request's last page target page ``num_blocks`` (out of bounds), so TMA zero-fills them.

`wide_box`: one box per ``box_n`` rows carries every chunk of D. The cache's token slots
(block b, row r: slot ``b * slots_per_block + r``, slots_per_block = block stride / token
stride) are one strided dimension, so the pool is a rank-5 tensor (64 columns, 8 rows,
chunk, 8-row group of slots, head) whose box (64, 8, chunks, box_n / 8) lands in shared
memory as the 1 KB swizzle atoms of an 8-row group side by side, chunk after chunk
(``kv_smem_order``). Box ``page * boxes_per_block + row_block`` of that tensor is one page's
slice; ``num_blocks * boxes_per_block`` is past the end (zero fill).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync

D_CHUNK = 64  # elements per 128-byte swizzle row


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


# ---- wide_box: boxes over whole rows (every chunk of D) of the cache's token slots ----
def kv_smem_order(wide_box: bool, with_stages: bool) -> tuple:
    """tile_to_shape order of a K/V tile's swizzle atoms (8 rows x 64 columns, 1 KB): down
    the rows first, chunk by chunk, or with `wide_box` the chunks of an 8-row group side by
    side (the order a wide box's bytes arrive in). Both are canonical wgmma layouts; only
    the 8-row-group and chunk strides differ."""
    order = (1, 0) if wide_box else (0, 1)
    return (*order, 2) if with_stages else order


def wide_box_coords(rows: int, head_dim: int, box_n: int, stages=None) -> cute.Layout:
    """(64 columns, 8 rows, chunk, 8-row group[, box in tile, stage]) -> the column-major
    index of (row, column[, stage]) in a ``rows`` x ``head_dim`` K/V tile: the first four
    modes are one wide box in the order TMA writes it."""
    shape = (D_CHUNK, 8, head_dim // D_CHUNK, box_n // 8)
    stride = (rows, 1, D_CHUNK * rows, 8)
    if stages is not None:
        shape, stride = (*shape, rows // box_n, stages), (*stride, box_n, rows * head_dim)
    return cute.make_layout(shape, stride=stride)


def slot_view(mX: cute.Tensor, box_n: int, boxes_per_block) -> cute.Tensor:
    """[num_blocks, page, Hkv, D] -> (64 columns, 8 rows, chunk, 8-row slot group, Hkv): the
    pool's token slots as one dimension (block stride = boxes_per_block * box_n slots)."""
    _, s_tok, s_head, _ = mX.layout.stride
    groups = mX.shape[0] * boxes_per_block * (box_n // 8)
    chunks = mX.shape[3] // D_CHUNK
    layout = cute.make_layout(
        (D_CHUNK, 8, chunks, groups, mX.shape[2]), stride=(1, s_tok, D_CHUNK, 8 * s_tok, s_head)
    )
    return cute.make_tensor(mX.iterator, layout)


def partition_slot_boxes(
    tma_atom: cute.CopyAtom,
    mX_tma: cute.Tensor,
    sX: cute.Tensor,
    kv_head,
    box_n: int,
    tile_shape: tuple,  # sX's (rows, head_dim, stages)
):
    """`wide_box` TMA views: smem ((box), box_in_tile, stage), gmem ((box), box of slots)."""
    rows, head_dim, stages = tile_shape
    sXb = cute.composition(sX, wide_box_coords(rows, head_dim, box_n, stages))
    box = (D_CHUNK, 8, head_dim // D_CHUNK, box_n // 8)
    gX = cute.local_tile(mX_tma[None, None, None, None, kv_head], box, (0, 0, 0, None))
    return cpasync.tma_partition(
        tma_atom, 0, cute.make_layout(1), cute.group_modes(sXb, 0, 4), cute.group_modes(gX, 0, 4)
    )


@cute.jit
def _issue_box(tma_atom, tXs, tXg, b, rowblk, page, stage, mbar, boxes_per_block, mcast_rank):
    """Box b of a tile: one per 64-column chunk, or with `wide_box` (boxes_per_block given)
    one for the whole row block. `mcast_rank` (`kv_multicast`, else None): this CTA's rank in
    its two-CTA cluster; it issues the chunks (with `wide_box` the boxes) of its parity, each
    multicast to both CTAs."""
    mcast = {} if mcast_rank is None else {"mcast_mask": cutlass.Int16(3)}
    if cutlass.const_expr(boxes_per_block is None):
        step = 1 if mcast_rank is None else 2  # the multicast: this CTA's parity of chunks
        for j in cutlass.range_constexpr(cute.size(tXs, mode=[2]) // step):
            c = step * j + (0 if mcast_rank is None else mcast_rank)
            src, dst = tXg[None, rowblk, c, page], tXs[None, b, c, stage]
            cute.copy(tma_atom, src, dst, tma_bar_ptr=mbar, **mcast)
    elif cutlass.const_expr(mcast_rank is None):
        src = tXg[None, page * boxes_per_block + rowblk]
        cute.copy(tma_atom, src, tXs[None, b, stage], tma_bar_ptr=mbar)
    elif b % 2 == mcast_rank:  # the multicast: this CTA's parity of boxes
        # (no name bound here: the DSL would carry it out of this runtime branch)
        cute.copy(
            tma_atom,
            tXg[None, page * boxes_per_block + rowblk],
            tXs[None, b, stage],
            tma_bar_ptr=mbar,
            **mcast,
        )


@cute.jit
def last_page_of(page_row: cute.Tensor, k_len: Int32, page_size):
    """The request's last page-table entry: k_len's last page, and never past the table's
    width (the device k_len is not checked against the host's, which the plan checked
    against the table: no sync)."""
    return cutlass.min(cutlass.max(k_len - 1, 0) // page_size, cute.size(page_row) - 1)


@cute.jit
def box_page(page_row, token: Int32, last_page: Int32, k_len: Int32, num_blocks: Int32, page_size):
    """The page holding `token`: the page-table read clamped to the request's last page
    (entries past it are junk and may lie past the row's end); past k_len, page num_blocks
    (out of bounds: TMA zero-fills the box)."""
    page = page_row[cutlass.min(token // page_size, last_page)]
    if token >= k_len:
        page = num_blocks
    return page


def block_first_key(n_block, tile_n: int, key_offset=0):
    """Block n_block's first key in its tile's grid (``TileWork.key_offset``: the Python int
    0 without a shift, which leaves the unshifted expression alone)."""
    if isinstance(key_offset, int) and key_offset == 0:
        return n_block * tile_n
    return n_block * tile_n + key_offset


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
    boxes_per_block=None,  # `wide_box`: boxes of box_n slots per cache block, else None
    key_offset=0,  # TileWork.key_offset
    mcast_rank=None,  # `kv_multicast`: the CTA's rank in its cluster (_issue_box)
):
    """Issue every box of K/V tile n_block into `stage`, all on the stage's mbarrier."""
    last_page = last_page_of(page_row, k_len, page_size)
    first_key = block_first_key(n_block, tile_n, key_offset)
    for b in cutlass.range_constexpr(tile_n // box_n):
        token = first_key + b * box_n
        page = box_page(page_row, token, last_page, k_len, num_blocks, page_size)
        rowblk = (token % page_size) // box_n
        _issue_box(tma_atom, tXs, tXg, b, rowblk, page, stage, mbar, boxes_per_block, mcast_rank)


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
    key_offset=0,  # TileWork.key_offset
):
    """This lane's share of block n_block's pages: box min(lane, last box)'s page, as
    load_paged_tile computes it (num_blocks past k_len: zero fill)."""
    boxes = tile_n // box_n
    box = 0
    if cutlass.const_expr(boxes > 1):
        box = cutlass.min(cute.arch.lane_idx(), boxes - 1)
    token = block_first_key(n_block, tile_n, key_offset) + box * box_n
    last_page = last_page_of(page_row, k_len, page_size)
    return box_page(page_row, token, last_page, k_len, num_blocks, page_size)


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
    boxes_per_block=None,
    key_offset=0,  # TileWork.key_offset
    mcast_rank=None,  # `kv_multicast` (_issue_box)
):
    """load_paged_tile with the pages already read: box b's page comes from lane b."""
    boxes = tile_n // box_n
    first_key = block_first_key(n_block, tile_n, key_offset)
    for b in cutlass.range_constexpr(boxes):
        page = lane_pages
        if cutlass.const_expr(boxes > 1):
            page = cute.arch.shuffle_sync(lane_pages, b)
        token = first_key + b * box_n
        rowblk = (token % page_size) // box_n
        _issue_box(tma_atom, tXs, tXg, b, rowblk, page, stage, mbar, boxes_per_block, mcast_rank)
