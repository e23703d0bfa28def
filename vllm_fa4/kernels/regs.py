"""Register placement hints for the block loop."""

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


@dsl_user_op
def _opaque(value: Int32, *, loc=None, ip=None) -> Int32:
    # An empty volatile asm that passes the register through: no instruction, but what
    # comes out is opaque to LLVM, so LLVM can neither sink nor recompute what went in.
    out = llvm.inline_asm(
        T.i32(), [value.ir_value(loc=loc, ip=ip)], "", "=r,0", has_side_effects=True, loc=loc, ip=ip
    )
    return Int32(out)


@cute.jit
def computed_here(frag: cute.Tensor):
    """Keep a register fragment's values computed before this point of the program.

    LLVM sinks a value to its only use; P's bf16 packing (the next block's P V operand)
    would otherwise move to the loop's head, after the V wait, where ptxas cannot
    interleave it with the exponentials."""
    words = cute.recast_tensor(frag, Int32)
    for i in cutlass.range_constexpr(cute.size(words)):
        words[i] = _opaque(words[i])
