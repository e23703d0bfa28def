"""Bottom-right causal mask (optionally with a sliding window's left edge) on an S accumulator
with GQA rows packed into M."""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from vllm_fa4.kernels.softmax import acc_rows_view


@cute.jit
def apply_causal_mask(
    acc_S: cute.Tensor,
    tScS: cute.Tensor,  # identity coordinates of acc_S, same partition
    n_block: Int32,
    first_token: Int32,  # request-local token of tile row 0
    diag_offset: Int32,  # k_len - q_len
    qhead_per_kvhead: cutlass.Constexpr[int],
    tile_n: cutlass.Constexpr[int],
    window_left=None,  # Int32: a row also drops keys more than this left of its diagonal
    col_offsets: cutlass.Constexpr[bool] = False,  # config.MaskCols.OFFSETS
):
    """Keys past each row's causal limit (or left of its window) become -inf by *select*
    (K may hold NaN there)."""
    sS = acc_rows_view(acc_S)
    cS = acc_rows_view(tScS)
    col_base = n_block * tile_n
    # With col_offsets each column is taken relative to the thread's first one (a constant
    # difference) and that first column goes into the row's limit once.
    col0 = cS[0, 0][1] if cutlass.const_expr(col_offsets) else 0
    for i in cutlass.range_constexpr(cute.size(sS, mode=[0])):
        row = cS[i, 0][0]
        # Last visible key of this row, relative to this block's first column.
        limit = diag_offset + first_token + row // qhead_per_kvhead - col_base - col0
        if cutlass.const_expr(window_left is None):
            for j in cutlass.range_constexpr(cute.size(sS, mode=[1])):
                sS[i, j] = -Float32.inf if cS[0, j][1] - col0 > limit else sS[i, j]
        else:
            # visible iff 0 <= d <= window_left for d = limit - col, i.e. iff neither d nor
            # window_left - d is negative: one sign test of their OR per element. (Two
            # compares per element ran the three-warpgroup loop out of registers: 65 spills.)
            for j in cutlass.range_constexpr(cute.size(sS, mode=[1])):
                dist = limit - (cS[0, j][1] - col0)
                outside = (dist | (window_left - dist)) < 0
                sS[i, j] = -Float32.inf if outside else sS[i, j]
