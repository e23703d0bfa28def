"""FP8 (e4m3) K/V cache read by the 16-bit kernel (issue 30): staging and conversion.

The producer's TMA loads each fp8 K/V tile, exactly as it loads a 16-bit one (same boxes,
same zero fill past the request's last page), into a staging ring (``KvStaging.staged``).
Converter warps of the producer warpgroup turn each staged tile into the model's dtype and
store it into the ordinary swizzled K/V stage, which the consumers read as before: the
16-bit stage's "full" barrier counts the converters' arrivals instead of TMA bytes.

Two exact conversions of a pair of e4m3 values (``e4m3_pair``), picked per dtype:
- "cvt": ``cvt.rn.f16x2.e4m3x2`` (one F2FP; every e4m3 value is a normal f16 or zero);
  bf16 then goes through f32 (2 HADD2.F32 + 1 F2FP: 3 bits of mantissa fit in 7).
- "bits" (no F2FP, which runs at a quarter of the ALU's rate: docs/perf-notes.md FP8):
  PRMT puts each byte in the top byte of its 16-bit lane; its 7 magnitude bits shifted
  down into the target's exponent/mantissa fields read as the value times 2^-k (a
  subnormal for e4m3 subnormals), so a f16x2/bf16x2 multiply by 2^k gives it exactly, and
  the sign bit is ORed back in (-0 stays -0). PRMT, SHF, 2 LOP3 and HMUL2 per pair, each
  LOP3 with one immediate. The NaN code 0x7f becomes +-480 (finite): unused slots stay
  harmless (their K columns are masked, their V rows meet P = 0).
The scales are not applied here: k_scale is in the softmax scale, v_scale in the epilogue.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from vllm_fa4.kernels.paged_kv import D_CHUNK

# A/B switches for the GPU (docs/perf-notes.md FP8; flip with sed in a copy of the tree):
CONVERTERS = 3  # converter warps: 3 = warps 1-3 (2 where warp 1 loads V, `v_warp`), 2 = 2-3
BF16_BY_BITS = True  # bf16 models: the "bits" conversion (else "cvt" through f32)
F16_BY_BITS = False  # fp16 models: the "bits" conversion (else the one cvt)

VEC = 16  # elements per lane per step: 16 bytes of fp8 in, 2 x 16 bytes of f16/bf16 out
LANES_PER_ROW = D_CHUNK // VEC  # a warp covers 8 rows of one 64-column chunk per step

_CVT_F16 = "cvt.rn.f16x2.e4m3x2 $0, {half};"
_CVT_BF16 = (
    "{{.reg .b32 h; .reg .b16 a, b; .reg .f32 x, y;"
    " cvt.rn.f16x2.e4m3x2 h, {half}; mov.b32 {{a, b}}, h;"
    " cvt.f32.f16 x, a; cvt.f32.f16 y, b; cvt.rn.bf16x2.f32 $0, y, x;}}"
)
# "bits": (shift, magnitude mask, 2^k, multiply): bf16's magnitude at bits 10..4 (exponent
# 0..15 of 127's bias) times 2^120, f16's at bits 13..7 (exponent 0..15 of 15's) times 2^8.
_BITS_BF16 = (4, 0x07F007F0, 0x7B807B80, "mul.rn.bf16x2")
_BITS_F16 = (1, 0x3F803F80, 0x5C005C00, "mul.rn.f16x2")
_SIGNS = 0x80008000
_PRMT_TOP_BYTES = (0x1404, 0x3424)  # bytes 0, 1 (or 2, 3) of the word -> bits 15..8, 31..24


def _bits_asm(high: bool, shift: int, mask: int, power: int, mul: str) -> str:
    sel = _PRMT_TOP_BYTES[high]
    return (
        "{.reg .b32 a, x, p;"
        f" prmt.b32 a, $1, 0, {sel:#x}; shr.b32 x, a, {shift}; and.b32 x, x, {mask:#x};"
        f" mov.b32 p, {power:#x}; {mul} x, x, p; and.b32 a, a, {_SIGNS:#x}; or.b32 $0, x, a;}}"
    )


def pair_asm(high: bool, to_bf16: bool) -> str:
    """The PTX of one pair: the word's low (or high) two e4m3 bytes -> packed 16-bit pair."""
    if BF16_BY_BITS if to_bf16 else F16_BY_BITS:
        return _bits_asm(high, *(_BITS_BF16 if to_bf16 else _BITS_F16))
    body = (_CVT_BF16 if to_bf16 else _CVT_F16).format(half="hi" if high else "lo")
    return "{.reg .b16 lo, hi; mov.b32 {lo, hi}, $1; " + body + "}"


@dsl_user_op
def e4m3_pair(word: Int32, high: bool, to_bf16: bool, *, loc=None, ip=None) -> Int32:
    """The two e4m3 values of ``word``'s low (or high) 16 bits as a packed f16x2 / bf16x2."""
    out = llvm.inline_asm(
        T.i32(),
        [Int32(word).ir_value(loc=loc, ip=ip)],
        pair_asm(high, to_bf16),
        "=r,r",
        loc=loc,
        ip=ip,
    )
    return Int32(out)


def converter_warps(v_warp: bool) -> tuple[int, ...]:
    """The producer warps that convert: the last CONVERTERS of 1-3 (warp 0 issues the TMA
    loads and the queue, warp 1 V's loads with `v_warp`)."""
    count = min(CONVERTERS, 2 if v_warp else 3)
    return tuple(range(4 - count, 4))


@dataclass
class KvStaging:
    """One of K and V with an fp8 cache: the staging ring TMA fills and the 16-bit stages the
    consumers read, each with its pipeline."""

    staged_pipe: pipeline.PipelineTmaAsync  # TMA -> converters (transaction bytes)
    staged: cute.Tensor  # (tile_n, D, staging stages) fp8
    pipe: pipeline.PipelineAsync  # converters -> consumers (thread arrivals)
    smem: cute.Tensor  # (tile_n, D, KV_STAGES) in the model's dtype


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


@cute.jit
def convert_piece(src: cute.Tensor, dst: cute.Tensor, to_bf16: cutlass.Constexpr):
    """One lane's VEC elements: a 16-byte load, VEC/2 pairs, two 16-byte stores."""
    raw = cute.make_rmem_tensor_like(src)
    cute.autovec_copy(src, raw)
    out = cute.make_rmem_tensor_like(dst)
    words, out_words = cute.recast_tensor(raw, Int32), cute.recast_tensor(out, Int32)
    for w in cutlass.range_constexpr(cute.size(words)):
        out_words[2 * w] = e4m3_pair(words[w], False, to_bf16)
        out_words[2 * w + 1] = e4m3_pair(words[w], True, to_bf16)
    cute.autovec_copy(out, dst)


# The tiles' swizzles (fwd_sm90._smem_layout) on byte addresses, (bits, base, shift) by
# element width: fp8 staging 64-byte, 16-bit stages 128-byte.
_SWIZZLES = {8: (2, 4, 3), 16: (3, 4, 3)}


def _static_ints(value) -> list:
    return [x for v in value for x in _static_ints(v)] if isinstance(value, tuple) else [value]


@cute.jit
def _lane_pieces(tile: cute.Tensor, copy, lane: Int32):
    """This lane's pieces of ``tile`` (VEC, rows / 8, chunks) on the unswizzled pointer, and
    the element offset the swizzle adds to each: the swizzle XORs address bits from bit
    base + shift up into bits from base, and no step between pieces (8 rows, a chunk) touches
    bits below base + shift + bits (checked here), so the offset is the same for every
    piece and costs a few instructions per block instead of three per access."""
    bits, base, shift = _SWIZZLES[tile.element_type.width]
    assert f"S<{bits},{base},{shift}>" in str(tile.iterator.type), tile.iterator.type
    plain = cute.make_tensor(cute.recast_ptr(tile.iterator), tile.layout)
    pieces = copy.get_slice(lane).partition_S(plain)
    width = tile.element_type.width // 8
    period = 1 << (base + shift + bits)  # bytes
    for stride in _static_ints(pieces.layout.stride[1:]):  # (rows / 8, chunks)
        assert isinstance(stride, int) and (stride * width) % period == 0, pieces.layout
    addr = pieces[None, 0, 0].iterator.toint()
    moved = (addr >> shift) & (((1 << bits) - 1) << base)
    offset = ((addr ^ moved) - addr) >> (width // 2)  # bytes -> elements (exact: 16 B units)
    return pieces, cute.assume(offset, divby=16 // width)


@cute.jit
def convert_tile(src: cute.Tensor, dst: cute.Tensor, me: Converter, dtype: cutlass.Constexpr):
    """dst (tile_n, D) <- src (tile_n, D) fp8, this warp's 8-row groups."""
    _, copy_in = _warp_copy(src.element_type)
    _, copy_out = _warp_copy(dtype)
    t_src, src_offset = _lane_pieces(src, copy_in, me.lane)
    t_dst, dst_offset = _lane_pieces(dst, copy_out, me.lane)
    for m in cutlass.range(me.rank, cute.size(t_src, mode=[1]), me.warps, unroll=1):
        for k in cutlass.range_constexpr(cute.size(t_src, mode=[2])):
            piece_in, piece_out = t_src[None, m, k], t_dst[None, m, k]
            convert_piece(
                cute.make_tensor(piece_in.iterator + src_offset, piece_in.layout),
                cute.make_tensor(piece_out.iterator + dst_offset, piece_out.layout),
                dtype is cutlass.BFloat16,
            )


@cute.jit
def convert_block(kv: KvStaging, staged_state, state, me: Converter, dtype: cutlass.Constexpr):
    """Wait for one staged fp8 tile, convert it into the next 16-bit stage, publish that
    stage to the consumers and free the staging slot."""
    kv.staged_pipe.consumer_wait(staged_state)
    kv.pipe.producer_acquire(state)
    convert_tile(
        kv.staged[None, None, staged_state.index], kv.smem[None, None, state.index], me, dtype
    )
    # The consumers' wgmma reads the stage through the async proxy.
    cute.arch.fence_view_async_shared()
    kv.pipe.producer_commit(state)
    cute.arch.sync_warp()  # every lane's loads are done before lane 0 frees the slot
    kv.staged_pipe.consumer_release(staged_state)
