"""Online softmax over a wgmma accumulator (SM90), exp2 with the scale folded into log2 space."""

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32

LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)
# lazy_max: how far (in exp2 units) a block may exceed a row's running max before the max
# moves. 0: the max moves whenever a block raises it, so a row's largest P is exactly 1, as in
# FA3, and only O's rescale is skipped (warps where no row moved). FA4's 2^8 left the largest
# P at up to 2^8, rounded to 16 bits in P V while the fp32 row sum kept it exact: up to 2.2x
# FA3's max error on peaky rows (issue 27; docs/perf-notes.md, 2026-11-26). Any margin above
# 0 rounds that P.
LAZY_MAX_MARGIN_LOG2 = 0.0


def acc_rows_view(acc: cute.Tensor) -> cute.Tensor:
    """View an SM90 accumulator ((2, 2, V), M, N) as (rows, cols) = ((2, M), (2, V, N))."""
    flat = cute.make_layout(acc.layout.shape)
    sh, st = flat.shape, flat.stride
    rows = ((sh[0][1], sh[1]), (st[0][1], st[1]))
    cols = ((sh[0][0], sh[0][2], sh[2]), (st[0][0], st[0][2], st[2]))
    mn = cute.make_layout((rows[0], cols[0]), stride=(rows[1], cols[1]))
    return cute.make_tensor(acc.iterator, cute.composition(acc.layout, mn))


def acc_as_operand_a(acc: cute.Tensor) -> cute.Tensor:
    """Reinterpret a QK^T accumulator ((2, 2, V), M, N) as the RS A-operand fragment
    ((2, 2, 2), M, (V/2, N)) of the P*V wgmma (k16 = two 8-column accumulator groups)."""
    lay = cute.logical_divide(acc.layout, ((None, None, 2), None, None))
    v = lay.shape[0]
    s = lay.stride[0]
    frg = cute.make_layout(
        ((v[0], v[1], v[2][0]), lay.shape[1], (v[2][1], lay.shape[2])),
        stride=((s[0], s[1], s[2][0]), lay.stride[1], (s[2][1], lay.stride[2])),
    )
    return cute.make_tensor(acc.iterator, frg)


def row_scale_log2(scale_log2, i: int):
    """Row i's scale_log2: one scalar for every row, or (`fp8_qk`, a per-row tensor) the
    softmax scale times row i's Q scale (S came out of the GEMM divided by it)."""
    if isinstance(scale_log2, cute.Tensor):
        return scale_log2[i]
    return scale_log2


@cute.jit
def quad_allreduce(x: Float32, is_max: cutlass.Constexpr[bool]) -> Float32:
    # The 4 lanes of a quad hold the same accumulator rows.
    for off in cutlass.range_constexpr(2):
        other = cute.arch.shuffle_sync_bfly(x, offset=1 << off)
        if cutlass.const_expr(is_max):
            x = cute.arch.fmax(x, other)
        else:
            x = x + other
    return x


@cute.jit
def _row_new_max(sS, i, row_max, scale_log2, is_first, lazy_max):
    """Row i's max after this block: (new max, whether it moved (lazy_max), the exp2 shift
    -max * scale_log2)."""
    scale_log2 = row_scale_log2(scale_log2, i)
    ncol = cute.size(sS, mode=[1])
    blk_max = sS[i, 0]
    for j in cutlass.range_constexpr(1, ncol):
        blk_max = cute.arch.fmax(blk_max, sS[i, j])
    blk_max = quad_allreduce(blk_max, True)
    prev_max = row_max[i]
    new_max = cute.arch.fmax(prev_max, blk_max)
    moved = None
    if cutlass.const_expr(lazy_max and not is_first):
        # -inf -> finite grows by +inf (moves); -inf -> -inf is NaN (stays -inf).
        moved = (new_max - prev_max) * scale_log2 > Float32(LAZY_MAX_MARGIN_LOG2)
        new_max = new_max if moved else prev_max
    # A row that has seen only masked keys keeps max -inf: shift by 0 so exp2 gives 0.
    safe_max = new_max if new_max != -Float32.inf else Float32(0.0)
    return new_max, moved, -safe_max * scale_log2


@cute.jit
def _row_exps(sS, i, scale_log2, neg_shift) -> Float32:
    """Row i: S -> exp2(S * scale_log2 - max * scale_log2) in place; returns the row's sum."""
    scale_log2 = row_scale_log2(scale_log2, i)
    part = Float32(0.0)
    for j in cutlass.range_constexpr(cute.size(sS, mode=[1])):
        p = cute.math.exp2(sS[i, j] * scale_log2 + neg_shift, fastmath=True)
        sS[i, j] = p
        part = part + p
    return part


@cute.jit
def _row_scale(i, row_max, scale_log2, moved, neg_shift, is_first, lazy_max):
    """Row i's O factor exp2((old max - new max) * scale_log2), read before row_max[i] is
    updated: 1 on the first block, and with lazy_max when the max stayed."""
    scale_log2 = row_scale_log2(scale_log2, i)
    scale = Float32(1.0)
    if cutlass.const_expr(not is_first):
        scale = cute.math.exp2(row_max[i] * scale_log2 + neg_shift, fastmath=True)
        if cutlass.const_expr(lazy_max):
            scale = scale if moved else Float32(1.0)
    return scale


@cute.jit
def softmax_step(
    acc_S: cute.Tensor,
    row_max: cute.Tensor,
    row_sum: cute.Tensor,
    row_scale: cute.Tensor,
    scale_log2: Float32,
    is_first: cutlass.Constexpr[bool],
    lazy_max: cutlass.Constexpr[bool] = False,
):
    """S -> unnormalized P in place; row_scale[i] = factor to apply to O's row i.

    row_max / row_sum are this thread's running stats (row_sum stays a per-thread partial
    until softmax_finish).

    lazy_max: a row's running max moves only when the block raises it by more than
    LAZY_MAX_MARGIN_LOG2 (else row_scale is exactly 1), so blocks where no row of a warp
    moved leave O alone (rescale_needed)."""
    sS = acc_rows_view(acc_S)
    for i in cutlass.range_constexpr(cute.size(row_max)):
        new_max, moved, neg_shift = _row_new_max(sS, i, row_max, scale_log2, is_first, lazy_max)
        part = _row_exps(sS, i, scale_log2, neg_shift)
        scale = _row_scale(i, row_max, scale_log2, moved, neg_shift, is_first, lazy_max)
        row_scale[i] = scale
        if cutlass.const_expr(is_first):
            row_sum[i] = part
        else:
            row_sum[i] = row_sum[i] * scale + part
        row_max[i] = new_max


@cute.jit
def softmax_head(
    acc_S: cute.Tensor,
    row_max: cute.Tensor,
    row_sum: cute.Tensor,
    row_scale: cute.Tensor,
    neg_shift: cute.Tensor,
    scale_log2: Float32,
    lazy_max: cutlass.Constexpr[bool],
):
    """`pv_wait_mid`, a block after the first, the part before the P V wait: every row's
    new max, O factor (row_scale) and exp2 shift (kept in neg_shift for softmax_rest), then
    the first row's exponentials. softmax_head + softmax_rest = softmax_step(is_first=False)."""
    sS = acc_rows_view(acc_S)
    for i in cutlass.range_constexpr(cute.size(row_max)):
        new_max, moved, shift = _row_new_max(sS, i, row_max, scale_log2, False, lazy_max)
        row_scale[i] = _row_scale(i, row_max, scale_log2, moved, shift, False, lazy_max)
        neg_shift[i] = shift
        row_max[i] = new_max
    row_sum[0] = row_sum[0] * row_scale[0] + _row_exps(sS, 0, scale_log2, neg_shift[0])


@cute.jit
def softmax_rest(
    acc_S: cute.Tensor,
    row_sum: cute.Tensor,
    row_scale: cute.Tensor,
    neg_shift: cute.Tensor,
    scale_log2: Float32,
):
    """`pv_wait_mid`: the exponentials of every row but the first (after the P V wait)."""
    sS = acc_rows_view(acc_S)
    for i in cutlass.range_constexpr(1, cute.size(row_sum)):
        row_sum[i] = row_sum[i] * row_scale[i] + _row_exps(sS, i, scale_log2, neg_shift[i])


@cute.jit
def apply_softcap(acc_S: cute.Tensor, prescale: Float32):
    """Logit soft cap, S <- tanh(S * scale / cap), before the mask (tanh(-inf) is not -inf).
    The cap's own factor rides in scale_log2 (cap * log2 e), so the softmax is unchanged."""
    for i in cutlass.range_constexpr(cute.size(acc_S)):
        acc_S[i] = cute.math.tanh(acc_S[i] * prescale, fastmath=True)


@cute.jit
def softmax_finish(
    row_max: cute.Tensor,
    row_sum: cute.Tensor,
    scale_log2: Float32,
    inv_sum: cute.Tensor,
    lse: cute.Tensor,
    sink_log2=None,  # per-row sink logit * log2 e (attention sinks), or None
):
    """inv_sum = the factor that normalizes O's row (1 for empty rows); lse in natural log
    (-inf for empty rows). A sink joins the denominator: with both in log2 units, the row's
    max m and the sink s meet at M = max(m, s), so neither exp2 can overflow."""
    for i in cutlass.range_constexpr(cute.size(row_max)):
        row_log2_scale = row_scale_log2(scale_log2, i)
        total = quad_allreduce(row_sum[i], False)
        if cutlass.const_expr(sink_log2 is None):
            empty = total == 0.0 or total != total
            inv_sum[i] = Float32(1.0) if empty else cute.arch.rcp_approx(total)
            lse[i] = (
                -Float32.inf
                if empty
                else (row_max[i] * row_log2_scale + cute.math.log2(total, fastmath=True)) * LN_2
            )
        else:
            # An empty row (max -inf, total 0) gets O = 0 and lse = the sink.
            row_log2 = row_max[i] * row_log2_scale
            top = cute.arch.fmax(row_log2, sink_log2[i])
            kept = cute.math.exp2(row_log2 - top, fastmath=True)
            total = total * kept + cute.math.exp2(sink_log2[i] - top, fastmath=True)
            inv_sum[i] = kept * cute.arch.rcp_approx(total)
            lse[i] = (top + cute.math.log2(total, fastmath=True)) * LN_2


@cute.jit
def rescale_needed(row_scale: cute.Tensor):
    """lazy_max: whether any row of this warp has a scale other than exactly 1 (warp-uniform,
    so the skip is a branch, not predicated FMULs)."""
    moved = row_scale[0] != Float32(1.0)
    for i in cutlass.range_constexpr(1, cute.size(row_scale)):
        moved = moved | (row_scale[i] != Float32(1.0))
    return cute.arch.vote_any_sync(moved)


@cute.jit
def scale_rows(acc_O: cute.Tensor, row_scale: cute.Tensor):
    oO = acc_rows_view(acc_O)
    for i in cutlass.range_constexpr(cute.size(oO, mode=[0])):
        for j in cutlass.range_constexpr(cute.size(oO, mode=[1])):
            oO[i, j] = oO[i, j] * row_scale[i]


@cute.jit
def apply_softcap_rows(acc_S: cute.Tensor, prescale: cute.Tensor):
    """apply_softcap with one prescale per accumulator row (`fp8_qk`: S came out of the GEMM
    divided by each row's Q scale, which its prescale carries)."""
    sS = acc_rows_view(acc_S)
    for i in cutlass.range_constexpr(cute.size(sS, mode=[0])):
        for j in cutlass.range_constexpr(cute.size(sS, mode=[1])):
            sS[i, j] = cute.math.tanh(sS[i, j] * prescale[i], fastmath=True)


def softcap_for(prescale):
    """The soft cap for a scalar prescale or a per-row one (row_scale_log2's two forms)."""
    return apply_softcap_rows if isinstance(prescale, cute.Tensor) else apply_softcap
