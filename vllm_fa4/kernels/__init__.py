"""Device side of vllm-fa4: CuTe-DSL SM90 paged prefill kernels.

Kept light: importing this package must not import cutlass (the DSL import costs ~2 s).
Use ``vllm_fa4.kernels.compile`` for ``prefill_forward`` / ``compile_keys``.
"""

from vllm_fa4.kernels.config import KernelKey, tile_shape, tokens_per_tile

__all__ = ["KernelKey", "tile_shape", "tokens_per_tile"]
