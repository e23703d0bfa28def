"""Device side of vllm-fa4: CuTe-DSL SM90 paged prefill kernels (no vLLM imports).

Kept light: importing this package must not import cutlass (the DSL import costs ~2 s).

    config.py          KernelKey, KernelConfig (what the kernel can be), tile_geometry (host only)
    launch.py          LaunchArgs (the per-step tensors), prefill_forward (the launch)
    compile.py         compile_kernel, compile_keys (warmup), get_kernel (cached)
    cache.py           memory + disk cache of compiled kernels
    private_files.py   the disk cache's files: only ours (or root's), no symlinks, by descriptor
    fwd_sm90.py        the kernel: producer warpgroup + 2 or 3 consumer warpgroups
    tile_scheduler.py  which work tile a CTA runs next
    paged_kv.py, softmax.py, mask.py, epilogue.py, barriers.py   device building blocks
"""

from vllm_fa4.kernels.config import KernelConfig, KernelKey, tile_geometry
from vllm_fa4.kernels.launch import LaunchArgs

__all__ = ["KernelConfig", "KernelKey", "LaunchArgs", "tile_geometry"]
