"""Epilogue of the SM90 prefill kernel: normalize O, write O (and LSE) to the packed output.

Tile row r holds token first_token + r // G and query head kv_head * G + r % G, where
G = qhead_per_kvhead; rows past the request (or past the tile's tokens) are skipped.

Three ways to write O:
  direct  - each thread stores its accumulator pairs (32-bit) straight to global memory.
  staged  - each warpgroup writes its bf16/fp16 rows into its own 64-row slice of sQ (only
            that warpgroup's GEMMs ever read that slice, and they have all completed), syncs
            its 128 threads, then re-reads 16-byte vectors along rows and stores them whole.
  tma     - staged into sQ the same way, then one warp issues TMA stores of the slice (the
            kernel's `store_boxes`), left in flight; a warpgroup with rows past the request's
            end stores directly instead (a box cannot stop at a packed request's last token).
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from vllm_fa4.kernels.barriers import wg_sync
from vllm_fa4.kernels.softmax import LOG2_E, acc_rows_view, scale_rows, softmax_finish


def _row_target(work, row, qhead_per_kvhead: int):
    """(request-local token offset in the tile, token index in the packed q/out, query head)."""
    tok_local = row // qhead_per_kvhead
    tok = work.q_start + work.first_token + tok_local
    head = work.kv_head * qhead_per_kvhead + row % qhead_per_kvhead
    return tok_local, tok, head


@cute.jit
def write_output(
    work,
    mO: cute.Tensor,
    mLSE,
    sQ: cute.Tensor,
    acc_O: cute.Tensor,
    row_max: cute.Tensor,
    row_sum: cute.Tensor,
    scale_log2: Float32,
    thr_pv,
    tidx: Int32,
    wg: Int32,
    dtype: cutlass.Constexpr,
    qhead_per_kvhead: cutlass.Constexpr[int],
    tokens_per_tile: cutlass.Constexpr[int],
    has_lse: cutlass.Constexpr[bool],
    staged: cutlass.Constexpr[bool],
    mSinks=None,  # [Hq] fp32 sink logits (attention sinks), or None
    o_scale=None,  # Float32 factor of every O row (an fp8 cache's v_scale), or None
    on_converted=None,  # the tile probe's mark once O is normalized and converted, or None
    store_boxes=None,  # `tma_epilogue`: issues the warpgroup's TMA stores from sQ, or None
):
    num_rows = cute.size(row_max)
    tile_m, head_dim = cute.size(sQ, mode=[0]), cute.size(sQ, mode=[1])
    inv_sum = cute.make_rmem_tensor(num_rows, Float32)
    lse = cute.make_rmem_tensor(num_rows, Float32)
    oC = acc_rows_view(thr_pv.partition_C(cute.make_identity_tensor((tile_m, head_dim))))
    sink_log2 = None
    if cutlass.const_expr(mSinks is not None):
        sink_log2 = cute.make_rmem_tensor(num_rows, Float32)
        for i in cutlass.range_constexpr(num_rows):
            _, _, head = _row_target(work, oC[i, 0][0], qhead_per_kvhead)
            sink_log2[i] = mSinks[head] * Float32(LOG2_E)
    softmax_finish(row_max, row_sum, scale_log2, inv_sum, lse, sink_log2)
    if cutlass.const_expr(o_scale is not None):
        for i in cutlass.range_constexpr(num_rows):
            inv_sum[i] = inv_sum[i] * o_scale
    scale_rows(acc_O, inv_sum)
    rO = cute.make_rmem_tensor_like(acc_O, dtype)
    rO.store(acc_O.load().to(dtype))
    if cutlass.const_expr(on_converted is not None):
        on_converted()

    if cutlass.const_expr(has_lse):
        for i in cutlass.range_constexpr(num_rows):
            t, tok, head = _row_target(work, oC[i, 0][0], qhead_per_kvhead)
            if t < tokens_per_tile and work.first_token + t < work.q_len and oC[0, 0][1] == 0:
                mLSE[head, tok] = lse[i]

    if cutlass.const_expr(store_boxes is not None):
        if work.first_token + (wg + 1) * (64 // qhead_per_kvhead) <= work.q_len:
            # Registers -> this warpgroup's rows of sQ, visible to TMA (the async proxy).
            stage_rows(rO, thr_pv, sQ, wg)
            if cute.arch.make_warp_uniform(tidx // 32) % 4 == 0:
                store_boxes()
        else:
            store_pairs(work, mO, rO, oC, qhead_per_kvhead, tokens_per_tile)
    elif cutlass.const_expr(not staged):
        store_pairs(work, mO, rO, oC, qhead_per_kvhead, tokens_per_tile)
    else:
        stage_rows(rO, thr_pv, sQ, wg)
        # sQ rows -> global, 16 bytes per thread per step, one row per head_dim/8 threads.
        lanes_per_row = head_dim // 8
        vec_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
        lanes = cute.make_ordered_layout((128 // lanes_per_row, lanes_per_row), order=(1, 0))
        row_copy = cute.make_tiled_copy_tv(vec_atom, lanes, cute.make_layout((1, 8)))
        thr_copy = row_copy.get_slice(tidx % 128)
        sOw = cute.local_tile(sQ, (64, head_dim), (wg, 0))
        tSrc = thr_copy.partition_S(sOw)
        tCrd = thr_copy.partition_S(cute.make_identity_tensor((64, head_dim)))
        for m in cutlass.range_constexpr(cute.size(tSrc, mode=[1])):
            for k in cutlass.range_constexpr(cute.size(tSrc, mode=[2])):
                coord = tCrd[0, m, k]
                t, tok, head = _row_target(work, wg * 64 + coord[0], qhead_per_kvhead)
                if t < tokens_per_tile and work.first_token + t < work.q_len:
                    frag = cute.make_rmem_tensor_like(tSrc[None, m, k])
                    cute.copy(vec_atom, tSrc[None, m, k], frag)
                    dst = cute.local_tile(mO[tok, head, None], (8,), (coord[1] // 8,))
                    cute.copy(vec_atom, frag, dst)


@cute.jit
def store_pairs(
    work,
    mO: cute.Tensor,
    rO: cute.Tensor,
    oC: cute.Tensor,
    qhead_per_kvhead: cutlass.Constexpr[int],
    tokens_per_tile: cutlass.Constexpr[int],
):
    """Each thread stores its converted accumulator pairs of the rows inside the request."""
    oR = acc_rows_view(rO)
    for i in cutlass.range_constexpr(cute.size(oR, mode=[0])):
        t, tok, head = _row_target(work, oC[i, 0][0], qhead_per_kvhead)
        if t < tokens_per_tile and work.first_token + t < work.q_len:
            mOrow = mO[tok, head, None]
            for j in cutlass.range_constexpr(cute.size(oR, mode=[1])):
                mOrow[oC[0, j][1]] = oR[i, j]


@cute.jit
def stage_rows(rO: cute.Tensor, thr_pv, sQ: cute.Tensor, wg: Int32):
    """Registers -> this warpgroup's rows of sQ (accumulator layout, 32-bit smem stores),
    visible to the warpgroup and to TMA once every thread has passed the barrier."""
    cute.autovec_copy(rO, thr_pv.partition_C(sQ))
    cute.arch.fence_view_async_shared()
    wg_sync(wg)
