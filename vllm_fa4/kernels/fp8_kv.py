"""FP8 (e4m3) K/V cache read by the 16-bit kernel (issue 30): staging and conversion.

The producer's TMA loads each fp8 K/V tile, exactly as it loads a 16-bit one (same boxes,
same zero fill past the request's last page), into a staging ring (``KvStaging.staged``).
Converter warps of the producer warpgroup turn each staged tile into fp16 and store it into
the ordinary swizzled K/V stage, which the consumers read as before: the 16-bit stage's
"full" barrier counts the converters' arrivals instead of TMA bytes. The GEMMs of an fp8
cache run in fp16 for bf16 models too (fwd_sm90: ``mma_dtype``, Q converted once per tile):
the converter warps bound the kernel, and a bf16 pair took four instructions (F2FP, two
HADD2.F32, PRMT) where fp16 takes one (docs/perf-notes.md, FP8).

A pair of e4m3 values (``e4m3_pair``) converts exactly: ``cvt.rn.f16x2.e4m3x2`` (one F2FP:
every e4m3 value is a normal f16 or zero). NaN stays NaN (the mask's -inf and the V tail's
zeros deal with it).
The scales are not applied here: k_scale is in the softmax scale, v_scale in the epilogue.

With `fp8_qk` (SPLIT_Q; ROUNDED_Q reads the hi part alone) K is not converted: S = Q K^T runs
as e4m3 x e4m3 wgmma on the staged K, with Q split once a tile into two e4m3 parts (split_pair
below), and the converter warps convert V alone.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from vllm_fa4.kernels.paged_kv import D_CHUNK

VEC = 16  # elements per lane per step: 16 bytes of fp8 in, 2 x 16 bytes of f16 out
LANES_PER_ROW = D_CHUNK // VEC  # a warp covers 8 rows of one 64-column chunk per step


def pair_asm(high: bool) -> str:
    """The PTX of one pair: the word's low (or high) two e4m3 bytes -> packed f16x2."""
    half = "hi" if high else "lo"
    return "{.reg .b16 lo, hi; mov.b32 {lo, hi}, $1; " + f"cvt.rn.f16x2.e4m3x2 $0, {half};}}"


def _asm(result, operands, text: str, constraints: str, loc, ip):
    """One PTX block on DSL values (``operands``, already typed), its result ``result``."""
    values = [x.ir_value(loc=loc, ip=ip) for x in operands]
    return llvm.inline_asm(result, values, text, constraints, loc=loc, ip=ip)


@dsl_user_op
def e4m3_pair(word: Int32, high: bool, *, loc=None, ip=None) -> Int32:
    """The two e4m3 values of ``word``'s low (or high) 16 bits as a packed f16x2."""
    return Int32(_asm(T.i32(), [Int32(word)], pair_asm(high), "=r,r", loc, ip))


# `fp8_qk` (config.Fp8Qk.SPLIT_Q): Q's split. With a power-of-two row scale p putting the row's
# largest |q| / p in [128, 256), hi = e4m3(q / p) keeps a bf16 value's top 4 significant bits
# and lo = e4m3(q / p - hi) the next 4, so hi + lo = q / p exactly for every element of at
# least 2^-9 of its row's largest (there |q / p| >= 1/4 and lo's bits stay above e4m3's
# subnormal step 2^-9; smaller ones are off by at most 2^-10, under 2^-17 of the row's
# largest), and p (hi K^T + lo K^T) is S up to the FP8 GEMM's accumulation
# (tools/fp8_qk_error_probe.py: `split`; tests/unit/test_fp8_kv.py on the host).
SPLIT_PAIR_ASM = (
    "{.reg .b16 h, l; .reg .b32 hf; .reg .f16 a0, a1; .reg .f32 f0, f1, r0, r1; "
    "cvt.rn.satfinite.e4m3x2.f32 h, $2, $1; cvt.rn.f16x2.e4m3x2 hf, h; mov.b32 {a0, a1}, hf; "
    "cvt.f32.f16 f0, a0; cvt.f32.f16 f1, a1; sub.f32 r0, $1, f0; sub.f32 r1, $2, f1; "
    "cvt.rn.satfinite.e4m3x2.f32 l, r1, r0; mov.b32 $0, {h, l};}"
)


@dsl_user_op
def split_pair(x0, x1, *, loc=None, ip=None) -> Int32:
    """Two scaled Q values -> one word: their e4m3 hi pair (low 16 bits, x0 in the low byte)
    and their e4m3 lo pair (high 16 bits)."""
    return Int32(_asm(T.i32(), [Float32(x0), Float32(x1)], SPLIT_PAIR_ASM, "=r,f,f", loc, ip))


@dsl_user_op
def halves(w01: Int32, w23: Int32, high: bool, *, loc=None, ip=None) -> Int32:
    """Four elements' hi (or, ``high``, lo) bytes from two split_pair words, in order."""
    text = f"prmt.b32 $0, $1, $2, {'0x7632' if high else '0x5410'};"
    return Int32(_asm(T.i32(), [Int32(w01), Int32(w23)], text, "=r,r,r", loc, ip))


def row_scale_asm(inverse: bool) -> str:
    """The PTX of row_scale_pow2: the max's biased exponent e clamped to [8, 254], then
    1/p's exponent field 261 - e or p's e - 7."""
    field = "sub.u32 e, 261, e;" if inverse else "sub.u32 e, e, 7;"
    return (
        "{.reg .b32 e; mov.b32 e, $1; bfe.u32 e, e, 23, 8; max.u32 e, e, 8; min.u32 e, e, 254; "
        f"{field} shl.b32 e, e, 23; mov.b32 $0, e;}}"
    )


@dsl_user_op
def row_scale_pow2(amax, inverse: bool, *, loc=None, ip=None) -> Float32:
    """1/p (``inverse``) or p for a row whose largest |q| is ``amax``: p = 2^(e - 7) for the
    max's biased exponent e, clamped so that zero, subnormal, inf and NaN maxima still give
    a finite normal p."""
    return Float32(_asm(T.f32(), [Float32(amax)], row_scale_asm(inverse), "=f,f", loc, ip))


def converter_warps(v_warp: bool) -> tuple[int, ...]:
    """The producer warps that convert: 1-3, or 2-3 where warp 1 loads V (`v_warp`); warp 0
    issues the TMA loads and runs the tile queue."""
    return (2, 3) if v_warp else (1, 2, 3)


@dataclass
class KvStaging:
    """One of K and V with an fp8 cache: the staging ring TMA fills and the 16-bit stages the
    consumers read, each with its pipeline."""

    staged_pipe: pipeline.PipelineTmaAsync  # TMA -> converters (transaction bytes)
    staged: cute.Tensor  # (tile_n, D, staging stages) fp8
    pipe: pipeline.PipelineAsync  # converters -> consumers (thread arrivals)
    smem: cute.Tensor  # (tile_n, D, KV_STAGES) fp16 (the GEMMs' dtype)


@dataclass
class Converter:
    """This converter thread: its lane, its warp's rank among the converter warps and their
    number (each warp converts every `warps`-th 8-row group of each chunk)."""

    lane: Int32
    rank: Int32
    warps: int


def _warp_copy(dtype):
    """A one-warp tiled copy of VEC-element pieces, LANES_PER_ROW lanes along a 64-column
    chunk and 8 rows below each other; both sides of the conversion use the same lane ->
    (row, column) map. Bank-conflict free: 8 lanes' 16-byte loads are two 64-byte rows of
    the fp8 tile (one 128-byte line of its 64-byte swizzle); 8 lanes' 16-byte stores are two
    128-byte rows of the 16-bit tile whose swizzles (row % 8) differ in the lowest bit, so
    the lanes' even 16-byte units land on disjoint bank groups."""
    lanes = cute.make_ordered_layout((32 // LANES_PER_ROW, LANES_PER_ROW), order=(1, 0))
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=128)
    return atom, cute.make_tiled_copy_tv(atom, lanes, cute.make_layout((1, VEC)))


UNIT_BYTES = 16  # a swizzle moves 16-byte units; within one the bytes stay in order


@cute.jit
def load_piece(src, src_units):
    """One lane's VEC fp8 elements (one 16-byte load); ``src`` is the piece's first element on
    the unswizzled pointer, ``src_units`` the offset its swizzle adds (unit_offsets)."""
    raw = cute.make_rmem_tensor(cute.make_layout(VEC), src.dtype)
    cute.autovec_copy(cute.make_tensor(src + src_units[0], cute.make_layout(VEC)), raw)
    return raw


@cute.jit
def store_piece(raw, dst, dst_units):
    """``raw``'s VEC/2 pairs as fp16, two 16-byte stores; ``dst_units`` as for load_piece."""
    per_unit = UNIT_BYTES // (dst.dtype.width // 8)
    words = cute.recast_tensor(raw, Int32)
    for u in cutlass.range_constexpr(len(dst_units)):
        out = cute.make_rmem_tensor(cute.make_layout(per_unit), dst.dtype)
        out_words = cute.recast_tensor(out, Int32)
        for w in cutlass.range_constexpr(per_unit // 4):  # an fp8 word is 4 elements
            word = words[u * per_unit // 4 + w]
            out_words[2 * w] = e4m3_pair(word, False)
            out_words[2 * w + 1] = e4m3_pair(word, True)
        unit = cute.make_tensor(dst + (u * per_unit + dst_units[u]), cute.make_layout(per_unit))
        cute.autovec_copy(out, unit)


# The tiles' swizzles (fwd_sm90._smem_layout) on byte addresses, (bits, base, shift) by
# element width: fp8 staging 64-byte, 16-bit stages 128-byte.
SWIZZLES = {8: (2, 4, 3), 16: (3, 4, 3)}


def swizzle_delta(addr, bits: int, base: int, shift: int):
    """What the swizzle adds to byte address ``addr`` (Python or DSL integers): it XORs
    the ``bits`` bits from ``base + shift`` into those from ``base``."""
    moved = (addr >> shift) & (((1 << bits) - 1) << base)
    return (addr ^ moved) - addr


def unit_offsets(addr, element_bytes: int, piece_bytes: int):
    """The element offset the swizzle adds to each 16-byte unit of a piece starting at
    byte address ``addr``. Units differ: within a piece the unit index bits are the ones
    the swizzle XORs (a 32-byte piece's second unit may move down, not up)."""
    swizzle = SWIZZLES[8 * element_bytes]
    return tuple(
        swizzle_delta(addr + u * UNIT_BYTES, *swizzle) >> (element_bytes // 2)  # exact
        for u in range(piece_bytes // UNIT_BYTES)
    )


def _static_ints(value) -> list:
    return [x for v in value for x in _static_ints(v)] if isinstance(value, tuple) else [value]


def _is_contiguous(shape, stride, size: int) -> bool:
    """Whether a (static) mode walks ``size`` consecutive elements from its first."""
    expected = 1
    for n, d in zip(_static_ints(shape), _static_ints(stride)):
        if n > 1:
            if d != expected:
                return False
            expected *= n
    return expected == size


@cute.jit
def _lane_pieces(tile: cute.Tensor, copy, lane: Int32):
    """This lane's pieces of ``tile`` (VEC, rows / 8, chunks) on the unswizzled pointer, and
    the element offsets the swizzle adds to each 16-byte unit of a piece: the swizzle XORs
    address bits from base + shift up into bits from base, and no step between pieces
    (8 rows, a chunk) touches bits below base + shift + bits (checked here), so the offsets
    are the same for every piece: a few instructions per block instead of three per access.
    (Within a piece they are not: unit_offsets.)"""
    bits, base, shift = SWIZZLES[tile.element_type.width]
    assert f"S<{bits},{base},{shift}>" in str(tile.iterator.type), tile.iterator.type
    plain = cute.make_tensor(cute.recast_ptr(tile.iterator), tile.layout)
    pieces = copy.get_slice(lane).partition_S(plain)
    width = tile.element_type.width // 8
    period = 1 << (base + shift + bits)  # bytes
    for stride in _static_ints(pieces.layout.stride[1:]):  # (rows / 8, chunks)
        assert isinstance(stride, int) and (stride * width) % period == 0, pieces.layout
    assert _is_contiguous(pieces.layout.shape[0], pieces.layout.stride[0], VEC), pieces.layout
    addr = pieces[None, 0, 0].iterator.toint()
    offsets = unit_offsets(addr, width, VEC * width)
    return pieces, tuple(cute.assume(o, divby=UNIT_BYTES // width) for o in offsets)


# Pieces a converter warp loads before it stores any: the compiler cannot move a load above
# an earlier store (it may alias), so each batch's loads are in flight together.
LOAD_BATCH = 4


def warp_pieces(groups: int, chunks: int, warps: int) -> tuple[list, list]:
    """A tile's (8-row group, chunk) pieces among ``warps`` converter warps: each warp's
    groups ``rank + warps * i`` whole (the same static offsets for every rank), then the
    ``groups % warps`` groups left piece by piece, so no warp has more than one piece above
    another (whole groups gave one warp 6 of 16 and the others 5: 12 pieces, not 11).
    Returns (shared, rest): ``shared`` (group - rank, chunk) pairs every warp converts;
    ``rest[rank]`` the (group, chunk) pieces of the leftover groups."""
    shared = [(warps * i, k) for i in range(groups // warps) for k in range(chunks)]
    left = groups - groups % warps
    leftover = [(left + q // chunks, q % chunks) for q in range((groups % warps) * chunks)]
    return shared, [leftover[rank::warps] for rank in range(warps)]


@cute.jit
def _convert_pieces(t_src, t_dst, src_units, dst_units, pieces, row0):
    """``pieces`` ((group, chunk), static; group counted from ``row0``), LOAD_BATCH loads
    before their stores."""
    for first in cutlass.range_constexpr(0, len(pieces), LOAD_BATCH):
        batch = pieces[first : first + LOAD_BATCH]
        raws = [load_piece(t_src[None, row0 + m, k].iterator, src_units) for m, k in batch]
        for b in cutlass.range_constexpr(len(batch)):
            m, k = batch[b]
            store_piece(raws[b], t_dst[None, row0 + m, k].iterator, dst_units)


@cute.jit
def convert_tile(src: cute.Tensor, dst: cute.Tensor, me: Converter):
    """dst (tile_n, D) fp16 <- src (tile_n, D) fp8, this warp's pieces (one lane's VEC
    elements of 8 rows of one 64-column chunk; warp_pieces), every offset static but the
    warp's first row group."""
    assert dst.element_type is cutlass.Float16, dst.element_type  # an fp8 cache's GEMMs: fp16
    _, copy_in = _warp_copy(src.element_type)
    _, copy_out = _warp_copy(dst.element_type)
    t_src, src_units = _lane_pieces(src, copy_in, me.lane)
    t_dst, dst_units = _lane_pieces(dst, copy_out, me.lane)
    shared, rest = warp_pieces(cute.size(t_src, mode=[1]), cute.size(t_src, mode=[2]), me.warps)
    _convert_pieces(t_src, t_dst, src_units, dst_units, shared, me.rank)
    for rank in cutlass.range_constexpr(me.warps):
        if cutlass.const_expr(len(rest[rank]) > 0):
            if me.rank == rank:
                _convert_pieces(t_src, t_dst, src_units, dst_units, rest[rank], 0)


@cute.jit
def convert_block(kv: KvStaging, staged_state, state, me: Converter):
    """Wait for one staged fp8 tile, convert it into the next 16-bit stage, publish that
    stage to the consumers and free the staging slot."""
    kv.staged_pipe.consumer_wait(staged_state)
    kv.pipe.producer_acquire(state)
    convert_tile(kv.staged[None, None, staged_state.index], kv.smem[None, None, state.index], me)
    # The consumers' wgmma reads the stage through the async proxy.
    cute.arch.fence_view_async_shared()
    kv.pipe.producer_commit(state)
    cute.arch.sync_warp()  # every lane's loads are done before lane 0 frees the slot
    kv.staged_pipe.consumer_release(staged_state)
