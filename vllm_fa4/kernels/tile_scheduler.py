"""Which tile a CTA works on: a row of ``work_tiles`` (batch, kv_head, m_block, cost) read into a
``TileWork``, and the order a persistent CTA walks the rows in."""

from dataclasses import dataclass

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
    n_block_max: Int32  # KV blocks [0, n_block_max) are visited, last one first
    n_block_mask: Int32  # blocks >= this one need the causal mask


@cute.jit
def tile_work(
    mWorkTiles: cute.Tensor,
    mCuSeqlensQ: cute.Tensor,
    mSeqUsedK: cute.Tensor,
    tokens_per_tile: cutlass.Constexpr[int],
    tile_n: cutlass.Constexpr[int],
    tile_idx: Int32,
) -> TileWork:
    batch = mWorkTiles[tile_idx, 0]
    kv_head = mWorkTiles[tile_idx, 1]
    m_block = mWorkTiles[tile_idx, 2]
    q_start = mCuSeqlensQ[batch]
    q_len = mCuSeqlensQ[batch + 1] - q_start
    k_len = mSeqUsedK[batch]
    first_token = m_block * tokens_per_tile
    last_token = cutlass.min(first_token + tokens_per_tile, q_len) - 1
    diag = k_len - q_len
    # Keys visible to the last valid row of the tile; <= k_len because last_token < q_len.
    n_keys = cutlass.max(diag + last_token + 1, 0)
    n_block_max = (n_keys + tile_n - 1) // tile_n
    if last_token < first_token:  # empty tile (q_len == 0 or m_block past the end)
        n_block_max = Int32(0)
    # Block n is fully visible to every row iff (n+1)*tile_n <= diag + first_token + 1.
    n_block_mask = cutlass.max(diag + first_token + 1, 0) // tile_n
    return TileWork(
        batch, kv_head, m_block, q_start, q_len, k_len, first_token, n_block_max, n_block_mask
    )


def snake_tile(round_start, cta, num_ctas):
    """Tile of `cta` in the round that starts at `round_start` of a persistent walk over the
    cost-sorted (LPT) list: left to right on even rounds, right to left on odd ones.

    A plain stride walk hands CTA 0 the costliest tile of every round, so its total exceeds
    the last CTA's by about one round's cost spread per round (makespan ~3 % over the mean at
    16k x 1, benchmarks/schedule_sim.py); alternating the direction cancels that in pairs of
    rounds. May return an index past the
    list in the last round; the caller skips it. Branch-free integer arithmetic, so the same
    function runs on DSL Int32 values in the kernel and on Python ints in the unit tests.
    """
    odd = (round_start // num_ctas) % 2
    return round_start + cta + odd * (num_ctas - 1 - 2 * cta)
