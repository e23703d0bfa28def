"""Named-barrier ids of the SM90 prefill kernel and the consumer turn-taking protocol.

Id 0 is __syncthreads. Ids used (each `bar` id is a hardware resource; keep them disjoint):
  1, 2  BAR_WG_LOCAL + wg  : one consumer warpgroup (128 threads) - Q landed, V tail zeroed,
                              O staged in smem.
  3, 4  BAR_TURN + wg      : ping-pong turns (256 threads = both consumer warpgroups).

Turn-taking ("ping-pong"): a warpgroup blocks on its own turn barrier before issuing its
GEMMs and, once they are issued, arrives on the other warpgroup's barrier. Each bar.sync
(128 threads) completes with the matching bar.arrive (128 threads) of the other side.
Warpgroup 0 arrives once on its own barrier up front so it takes the first turn. Both
warpgroups run the same number of turns per tile (same n_block_max), so every wait has a
matching arrive. A persistent CTA calls turns_begin once and keeps alternating across tiles;
the one arrive left over at exit is harmless.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32

BAR_WG_LOCAL = 1
BAR_TURN = 3
_TWO_WG = 256


@cute.jit
def wg_sync(wg: Int32):
    cute.arch.barrier(barrier_id=BAR_WG_LOCAL + wg, number_of_threads=128)


@cute.jit
def turns_begin(enabled: cutlass.Constexpr[bool], wg: Int32):
    """Hand the first turn to warpgroup 0 (call once per CTA, before any turn_wait)."""
    if cutlass.const_expr(enabled):
        if wg == 0:
            cute.arch.barrier_arrive(barrier_id=BAR_TURN, number_of_threads=_TWO_WG)


@cute.jit
def turn_wait(enabled: cutlass.Constexpr[bool], wg: Int32):
    if cutlass.const_expr(enabled):
        cute.arch.barrier(barrier_id=BAR_TURN + wg, number_of_threads=_TWO_WG)


@cute.jit
def turn_pass(enabled: cutlass.Constexpr[bool], wg: Int32):
    if cutlass.const_expr(enabled):
        cute.arch.barrier_arrive(barrier_id=BAR_TURN + 1 - wg, number_of_threads=_TWO_WG)
