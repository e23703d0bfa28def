"""Which tile a CTA works on: a row of ``work_tiles`` (batch, kv_head, m_block, cost) read into a
``TileWork``, and the queue a persistent CTA takes its next row from (``TileQueue``)."""

from dataclasses import dataclass
from typing import NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@dataclass
class TileWork:
    """Everything a role needs to know about its tile (all runtime Int32)."""

    batch: Int32
    kv_head: Int32
    m_block: Int32
    q_start: Int32  # first row of the request in the packed q/out
    q_len: Int32
    k_len: Int32
    first_token: Int32  # request-local token of tile row 0
    n_block_max: Int32  # KV blocks [n_block_min, n_block_max) are visited, last one first
    n_block_mask: Int32  # blocks >= this one need the causal mask
    # Sliding window only (else the Python int 0, so the plain causal code is unchanged):
    n_block_min: Int32  # first visited block: the one holding the tile's leftmost window key
    n_block_left_mask: Int32  # blocks < this one need the window's left-edge mask
    # Keys the tile's block grid is shifted right by (block n holds keys from n * tile_n +
    # key_offset; WorkList.shift_keys): the first block starts at the page of the tile's
    # leftmost window key instead of at a multiple of tile_n.
    key_offset: Int32


class WorkList(NamedTuple):
    """The work list and what reading a row of it takes: tile_work(*work_list, tile)."""

    work_tiles: cute.Tensor  # [num_tiles, 4] int32 (batch, kv_head, m_block, cost)
    cu_seqlens_q: cute.Tensor
    seqused_k: cute.Tensor
    num_rows: object  # Int32: rows of out (and q), the bound on every tile's rows
    tokens_per_tile: int
    tile_n: int
    window_left: object  # Int32, or None without a window
    # With a window and K/V boxes shorter than a block (pages below tile_n keys): the
    # granularity of the tile's block-grid shift (the box, one page), else 0 (no shift).
    shift_keys: int


@cute.jit
def tile_work(
    mWorkTiles: cute.Tensor,
    mCuSeqlensQ: cute.Tensor,
    mSeqUsedK: cute.Tensor,
    num_rows: Int32,
    tokens_per_tile: cutlass.Constexpr[int],
    tile_n: cutlass.Constexpr[int],
    window_left,  # Int32 keys left of a row's diagonal it still sees, or None (no window)
    shift_keys: cutlass.Constexpr[int],  # WorkList.shift_keys
    tile_idx: Int32,
) -> TileWork:
    batch = mWorkTiles[tile_idx, 0]
    kv_head = mWorkTiles[tile_idx, 1]
    m_block = mWorkTiles[tile_idx, 2]
    q_start = mCuSeqlensQ[batch]
    # The host checked its copy of the lengths against out's rows; the device copy is never
    # read back (no sync), so a tile's rows are also clamped to out's: a drift between the two
    # copies cannot write past out (one compare per tile).
    q_len = cutlass.min(mCuSeqlensQ[batch + 1] - q_start, num_rows - q_start)
    k_len = mSeqUsedK[batch]
    first_token = m_block * tokens_per_tile
    last_token = cutlass.min(first_token + tokens_per_tile, q_len) - 1
    diag = k_len - q_len
    # Keys visible to the last valid row of the tile; <= k_len because last_token < q_len.
    n_keys = cutlass.max(diag + last_token + 1, 0)
    # The shifted grid (windows with boxes below a block, WorkList.shift_keys) starts at the
    # page of the tile's leftmost window key: a 24-token tile of a 128-key window spans 151
    # keys, 3 blocks of 64 from its page against 3.3 on average from a multiple of 64.
    # Without a shift key_offset is the Python int 0 and every expression below is the
    # unshifted grid's, op for op.
    key_offset = 0
    if cutlass.const_expr(window_left is not None and shift_keys):
        left_key = cutlass.max(diag + first_token - window_left, 0)
        key_offset = (left_key - left_key % shift_keys) % tile_n  # <= left_key < n_keys
    last_keys = n_keys
    if cutlass.const_expr(shift_keys):
        last_keys = n_keys - key_offset
    n_block_max = (last_keys + tile_n - 1) // tile_n
    if last_token < first_token:  # empty tile (q_len == 0 or m_block past the end)
        n_block_max = Int32(0)
    # Block n is fully visible to every row iff (n+1)*tile_n + key_offset <= diag +
    # first_token + 1 (key_offset <= left_key <= diag + first_token).
    first_row_keys = cutlass.max(diag + first_token + 1, 0)
    if cutlass.const_expr(shift_keys):
        first_row_keys = first_row_keys - key_offset
    n_block_mask = first_row_keys // tile_n
    n_block_min, n_block_left_mask = 0, 0
    if cutlass.const_expr(window_left is not None):
        # Row t sees keys [diag + t - window_left, diag + t]: the first row reaches furthest
        # left, the last valid row's left edge is the furthest right. With a shift, key_offset is
        # left_key's page start modulo tile_n, so left_key still lies in block
        # left_key // tile_n.
        n_block_min = cutlass.max(diag + first_token - window_left, 0) // tile_n
        left_edge = cutlass.max(diag + last_token - window_left, 0)
        if cutlass.const_expr(shift_keys):
            left_edge = left_edge - key_offset
        n_block_left_mask = (left_edge + tile_n - 1) // tile_n
        if last_token < first_token:
            n_block_min = Int32(0)
    return TileWork(
        batch,
        kv_head,
        m_block,
        q_start,
        q_len,
        k_len,
        first_token,
        n_block_max,
        n_block_mask,
        n_block_min,
        n_block_left_mask,
        key_offset,
    )


TILE_QUEUE_STAGES = 2  # tile indices the producer may publish ahead of the consumers
# `queue_work`: the TileWork fields the producer writes beside a tile's index, in this order
# (the window's two only for windowed keys; without a window they are the Python int 0).
WORK_WORDS = (
    "batch",
    "kv_head",
    "m_block",
    "q_start",
    "q_len",
    "k_len",
    "first_token",
    "n_block_max",
    "n_block_mask",
)
WINDOW_WORDS = ("n_block_min", "n_block_left_mask")
SHIFT_WORDS = ("key_offset",)  # windows with a shifted grid (WorkList.shift_keys) only


def queue_work_words(with_work: bool, windowed: bool, shifted: bool = False) -> tuple:
    """The TileWork fields a queue slot holds after the tile index (`queue_work`)."""
    if not with_work:
        return ()
    return WORK_WORDS + (WINDOW_WORDS if windowed else ()) + (SHIFT_WORDS if shifted else ())


class TileQueue:
    """Dynamic persistent scheduling: each CTA starts on tile ``blockIdx.x`` and then claims
    ``num_ctas + atomicAdd(counters[0], 1)`` until the index runs past the list, so CTAs take
    tiles in list (LPT) order as they become free, whatever the tiles they drew before cost.

    Only the producer warp claims. It issues the atomic when it starts a tile, so the round
    trip to L2 hides under that tile's K/V loads, and hands the claimed index to the consumer
    warpgroups through a ``TILE_QUEUE_STAGES``-deep shared-memory ring (an mbarrier pipeline:
    32 producer lanes arrive on "full", 256 consumer threads on "empty").

    The counter resets itself: every CTA's producer adds 1 to ``counters[1]`` after its last
    claim (acq_rel), and the CTA that brings it to ``num_ctas`` zeroes both words, so the
    next launch on the stream (the next layer) starts from zero without a memset. Launches
    that share a counter buffer must therefore be ordered (one buffer per stream).
    """

    def __init__(
        self,
        counters: cute.Tensor,
        pipe,
        slots: cute.Tensor,
        num_ctas: Int32,
        work_words: tuple = (),
        handoff=None,
    ):
        self.counters = counters  # [2] int32 in global memory: claims, finished CTAs
        self.pipe = pipe
        # [TILE_QUEUE_STAGES] int32 in shared memory, or with `queue_work`
        # [TILE_QUEUE_STAGES, 1 + len(work_words)]: the index, then those TileWork fields
        self.slots = slots
        self.num_ctas = num_ctas
        self.work_words = work_words
        # `kv_multicast`: ClaimHandoff (rank 0 claims a pair of rows, rank 1 receives it)
        self.handoff = handoff

    @cute.jit
    def claim(self, n: Int32 = 0) -> Int32:
        """Producer warp: start claiming the tile after the current one (lane 0's value), the
        CTA's `n`-th claim (`kv_multicast`: ClaimHandoff)."""
        claimed = Int32(0)
        if cutlass.const_expr(self.handoff is not None):
            claimed = self.handoff.send_or_expect(self.counters.iterator, n)
        else:
            claims_ptr = self.counters.iterator
            if cute.arch.lane_idx() == 0:
                claimed = cute.arch.atomic_add(claims_ptr, Int32(1), sem="relaxed", scope="gpu")
        return claimed

    @cute.jit
    def publish(self, claimed: Int32, state):
        """Producer warp: hand the claimed tile to the consumers; returns (tile, state)."""
        tile = cute.arch.shuffle_sync(claimed, 0) + self.num_ctas
        self.pipe.producer_acquire(state)
        slots = self.slots  # a local: the DSL's `if` would try to carry `self`
        if cute.arch.lane_idx() == 0:
            slots[state.index] = tile
        self.pipe.producer_commit(state)
        state.advance()
        return tile, state

    @cute.jit
    def receive(self, state):
        """Consumer threads: the next tile the producer published; returns (tile, state)."""
        self.pipe.consumer_wait(state)
        tile = self.slots[state.index]
        self.pipe.consumer_release(state)
        state.advance()
        return tile, state

    # ---- `queue_work`: (stage, word) slots, the index then `work_words` ----
    @cute.jit
    def next_tile(self, claimed: Int32, n: Int32 = 0) -> Int32:
        """Producer warp: the tile index lane 0's claim (its `n`-th) stands for."""
        tile = Int32(0)
        if cutlass.const_expr(self.handoff is not None):
            tile = self.handoff.receive(claimed, n) + self.num_ctas
        else:
            tile = cute.arch.shuffle_sync(claimed, 0) + self.num_ctas
        return tile

    @cute.jit
    def publish_work(self, tile: Int32, work: TileWork, state):
        """Producer warp: hand a tile and its TileWork to the consumers, so they read no
        global memory to start it; returns the advanced state."""
        self.pipe.producer_acquire(state)
        slots = self.slots  # a local: the DSL's `if` would try to carry `self`
        words = self.work_words
        if cute.arch.lane_idx() == 0:
            slots[state.index, 0] = tile
            for i in cutlass.range_constexpr(len(words)):
                slots[state.index, 1 + i] = getattr(work, words[i])
        self.pipe.producer_commit(state)
        state.advance()
        return state

    @cute.jit
    def wait_tile(self, state) -> Int32:
        """Consumer threads: wait for the next published tile and read its index; the slot
        stays held until take_work."""
        self.pipe.consumer_wait(state)
        return self.slots[state.index, 0]

    @cute.jit
    def take_work(self, state):
        """Consumer threads: the held slot's TileWork (fields not in the slot are 0); frees
        the slot. Returns (work, state)."""
        fields = {name: 0 for name in WINDOW_WORDS + SHIFT_WORDS}
        for i in cutlass.range_constexpr(len(self.work_words)):
            fields[self.work_words[i]] = self.slots[state.index, 1 + i]
        self.pipe.consumer_release(state)
        state.advance()
        return TileWork(**fields), state

    @cute.jit
    def finish(self):
        """Producer warp, after its last claim: the last CTA to get here zeroes the counter."""
        counters, num_ctas = self.counters, self.num_ctas
        if cute.arch.lane_idx() == 0:
            done_ptr = counters.iterator + 1
            done = cute.arch.atomic_add(done_ptr, Int32(1), sem="acq_rel", scope="gpu")
            if done == num_ctas - 1:
                counters[0] = Int32(0)
                counters[1] = Int32(0)


class ClaimHandoff(NamedTuple):
    """`kv_multicast` on the persistent grid: a cluster's two CTAs take paired work rows (2p,
    2p + 1) in list order. Rank 0's producer lane takes p from the atomic counter and stores
    it into rank 1's `slot` by st.async, which completes a transaction on rank 1's `full`
    mbarrier; rank 1 reads it and arrives on rank 0's `empty` before the next claim may
    overwrite it. One slot: claim n waits for `empty`'s phase n - 1."""

    slot: cute.Pointer  # int32 in shared memory (same offset in both CTAs)
    full: cute.Pointer  # mbarrier: 1 arrival (rank 1's own) + 4 transaction bytes
    empty: cute.Pointer  # mbarrier: 1 arrival (rank 1's, remote)
    rank: Int32  # block_idx_in_cluster (warp-uniform)

    @cute.jit
    def send_or_expect(self, counter, n: Int32) -> Int32:
        """Producer warp at its n-th claim: rank 0's lane 0 claims a pair and sends it; rank
        1's lane 0 arms `full` for it. Returns rank 0's pair index (lane 0; else 0)."""
        claimed = Int32(0)
        if cute.arch.lane_idx() == 0:
            if self.rank == 0:
                if n > 0:
                    cute.arch.mbarrier_wait(self.empty, (n - 1) % 2)
                claimed = cute.arch.atomic_add(counter, Int32(1), sem="relaxed", scope="gpu")
                cute.arch.store_async_dsmem(self.slot, claimed, self.full, Int32(1))
            else:
                cute.arch.mbarrier_arrive_and_expect_tx(self.full, 4)
        return claimed

    @cute.jit
    def receive(self, claimed: Int32, n: Int32) -> Int32:
        """Producer warp: the work row the n-th claim gives this CTA (before the grid's
        offset): 2p + rank."""
        pair = claimed
        if self.rank == 1:
            if cute.arch.lane_idx() == 0:
                cute.arch.mbarrier_wait(self.full, n % 2)
                pair = self.slot.load()
        # the shuffle needs the loaded value: rank 1 frees the slot only after reading it
        pair = cute.arch.shuffle_sync(pair, 0)
        if self.rank == 1:
            if cute.arch.lane_idx() == 0:
                cute.arch.mbarrier_arrive(self.empty, Int32(0))
        return 2 * pair + self.rank
