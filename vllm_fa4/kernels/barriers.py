"""Named-barrier ids of the SM90 prefill kernel and the consumer turn-taking protocol.

Id 0 is __syncthreads. Ids used (each `bar` id is a hardware resource; keep them disjoint),
for W consumer warpgroups (2 or 3):
  1 .. W          BAR_WG_LOCAL + wg : one consumer warpgroup (128 threads) - Q landed, V tail
                                      zeroed, O staged in smem.
  W+1 .. 2W       turn_barrier(W, wg) : ping-pong turns (256 threads: the waiting warpgroup
                                      and the one handing it the turn). With 2 warpgroups
                                      these are 3 and 4.

Turn-taking ("ping-pong"): a warpgroup blocks on its own turn barrier before issuing its
GEMMs and, once they are issued, arrives on the next warpgroup's barrier (wg + 1, wrapping).
Each bar.sync (128 threads) completes with the matching bar.arrive (128 threads) of the
previous warpgroup. Warpgroup 0 arrives once on its own barrier up front so it takes the
first turn. All warpgroups run the same number of turns per tile (same n_block_max), so every
wait has a matching arrive. A persistent CTA calls turns_begin once and keeps going round
across tiles; the one arrive left over at exit is harmless.

`turns` below is a compile-time int: the number of warpgroups taking turns, 0 for none.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Int32

BAR_WG_LOCAL = 1
_TURN_THREADS = 256


def turn_barrier(turns: int, wg):
    """The barrier warpgroup `wg` waits on for its turn."""
    return BAR_WG_LOCAL + turns + wg


@cute.jit
def wg_sync(wg: Int32):
    cute.arch.barrier(barrier_id=BAR_WG_LOCAL + wg, number_of_threads=128)


@cute.jit
def turns_begin(turns: cutlass.Constexpr[int], wg: Int32):
    """Hand the first turn to warpgroup 0 (call once per CTA, before any turn_wait)."""
    if cutlass.const_expr(turns):
        if wg == 0:
            cute.arch.barrier_arrive(
                barrier_id=turn_barrier(turns, 0), number_of_threads=_TURN_THREADS
            )


@cute.jit
def turn_wait(turns: cutlass.Constexpr[int], wg: Int32):
    if cutlass.const_expr(turns):
        cute.arch.barrier(barrier_id=turn_barrier(turns, wg), number_of_threads=_TURN_THREADS)


@cute.jit
def turn_pass(turns: cutlass.Constexpr[int], wg: Int32):
    # Two warpgroups keep their `1 - wg` form: the general wrap below computes the same id
    # but would change the machine code of every existing config.
    if cutlass.const_expr(turns == 2):
        cute.arch.barrier_arrive(
            barrier_id=turn_barrier(turns, 1 - wg), number_of_threads=_TURN_THREADS
        )
    elif cutlass.const_expr(turns):
        next_wg = wg + 1
        if next_wg == turns:
            next_wg = Int32(0)
        cute.arch.barrier_arrive(
            barrier_id=turn_barrier(turns, next_wg), number_of_threads=_TURN_THREADS
        )
