"""FP8 (e4m3) K/V cache read by the 16-bit kernel (issue 30): staging and conversion.

The producer's TMA loads each fp8 K/V tile, exactly as it loads a 16-bit one (same boxes,
same zero fill past the request's last page), into a staging ring (``KvStaging.staged``).
Two converter warps of the producer warpgroup turn each staged tile into the model's dtype
and store it into the ordinary swizzled K/V stage, which the consumers read as before: the
16-bit stage's "full" barrier counts the converters' arrivals instead of TMA bytes.

e4m3 -> f16 is one ``cvt.rn.f16x2.e4m3x2`` per pair (exact: every e4m3 value, subnormals
included, is a normal f16). bf16 goes on through f32 (exact again: 3 bits of mantissa fit
in 7), 4 SASS per pair in all; a bit-level exponent rebias costs as many instructions
(mask, shift, sign merge and a power-of-two multiply) and turns NaN into a finite value,
whereas this path keeps NaN a NaN (the mask's -inf and the V tail's zeros deal with it).
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

CONVERTER_WARPS = (2, 3)  # producer warps: 0 issues Q/K TMA (and the queue), 1 V (`v_warp`)
CONVERTER_THREADS = 32 * len(CONVERTER_WARPS)
VEC = 8  # elements per thread per step: 8 bytes of fp8 in, 16 bytes of f16/bf16 out

_TO_F16 = "cvt.rn.f16x2.e4m3x2 $0, {half};"
_TO_BF16 = (
    "{{.reg .b32 h; .reg .b16 a, b; .reg .f32 x, y;"
    " cvt.rn.f16x2.e4m3x2 h, {half}; mov.b32 {{a, b}}, h;"
    " cvt.f32.f16 x, a; cvt.f32.f16 y, b; cvt.rn.bf16x2.f32 $0, y, x;}}"
)


@dsl_user_op
def e4m3_pair(word: Int32, high: bool, to_bf16: bool, *, loc=None, ip=None) -> Int32:
    """The two e4m3 values of ``word``'s low (or high) 16 bits as a packed f16x2 / bf16x2."""
    body = (_TO_BF16 if to_bf16 else _TO_F16).format(half="hi" if high else "lo")
    asm = "{.reg .b16 lo, hi; mov.b32 {lo, hi}, $1; " + body + "}"
    out = llvm.inline_asm(
        T.i32(), [Int32(word).ir_value(loc=loc, ip=ip)], asm, "=r,r", loc=loc, ip=ip
    )
    return Int32(out)


@dataclass
class KvStaging:
    """One of K and V with an fp8 cache: the staging ring TMA fills and the 16-bit stages the
    consumers read, each with its pipeline."""

    staged_pipe: pipeline.PipelineTmaAsync  # TMA -> converters (transaction bytes)
    staged: cute.Tensor  # (tile_n, D, staging stages) fp8
    pipe: pipeline.PipelineAsync  # converters -> consumers (thread arrivals)
    smem: cute.Tensor  # (tile_n, D, KV_STAGES) in the model's dtype


def _row_copies(dtype, bits: int):
    """A tiled copy of VEC-element pieces over CONVERTER_THREADS threads, 8 threads along one
    64-column chunk and the threads' rows below each other; both sides of the conversion use
    the same thread -> (row, column) map. Bank-conflict free on both sides: 16 threads'
    8-byte loads are two 64-byte rows of the fp8 tile, one 128-byte line of its 64-byte
    swizzle; 8 threads' 16-byte stores are one 128-byte row of the 16-bit tile."""
    per_row = D_CHUNK // VEC
    threads = cute.make_ordered_layout((CONVERTER_THREADS // per_row, per_row), order=(1, 0))
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=bits)
    return atom, cute.make_tiled_copy_tv(atom, threads, cute.make_layout((1, VEC)))


@cute.jit
def convert_tile(src: cute.Tensor, dst: cute.Tensor, tid: Int32, dtype: cutlass.Constexpr):
    """dst (tile_n, D) <- src (tile_n, D) fp8, this thread's pieces (tid among the
    converters): 8-byte shared loads, 16-byte shared stores."""
    atom8, copy8 = _row_copies(src.element_type, 64)
    atom16, copy16 = _row_copies(dtype, 128)
    t_src = copy8.get_slice(tid).partition_S(src)
    t_dst = copy16.get_slice(tid).partition_D(dst)
    to_bf16 = dtype is cutlass.BFloat16
    for m in cutlass.range(cute.size(t_src, mode=[1]), unroll=2):
        for k in cutlass.range_constexpr(cute.size(t_src, mode=[2])):
            raw = cute.make_rmem_tensor_like(t_src[None, m, k])
            cute.copy(atom8, t_src[None, m, k], raw)
            out = cute.make_rmem_tensor_like(t_dst[None, m, k])
            words, out_words = cute.recast_tensor(raw, Int32), cute.recast_tensor(out, Int32)
            for w in cutlass.range_constexpr(cute.size(words)):
                out_words[2 * w] = e4m3_pair(words[w], False, to_bf16)
                out_words[2 * w + 1] = e4m3_pair(words[w], True, to_bf16)
            cute.copy(atom16, out, t_dst[None, m, k])


@cute.jit
def convert_block(kv: KvStaging, staged_state, state, tid: Int32, dtype: cutlass.Constexpr):
    """Wait for one staged fp8 tile, convert it into the next 16-bit stage, publish that
    stage to the consumers and free the staging slot."""
    kv.staged_pipe.consumer_wait(staged_state)
    kv.pipe.producer_acquire(state)
    convert_tile(
        kv.staged[None, None, staged_state.index], kv.smem[None, None, state.index], tid, dtype
    )
    # The consumers' wgmma reads the stage through the async proxy.
    cute.arch.fence_view_async_shared()
    kv.pipe.producer_commit(state)
    cute.arch.sync_warp()  # every lane's loads are done before lane 0 frees the slot
    kv.staged_pipe.consumer_release(staged_state)
