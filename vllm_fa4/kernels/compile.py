"""Compile the SM90 prefill kernel (the launch is kernels/launch.py).

Compiled with `--enable-tvm-ffi` against fake tensors whose shapes are all dynamic, so one
artifact serves every batch; the stream comes from the caller's current torch stream (no
stream argument: CUDA-graph friendly). Compiled functions are cached by ``cache.KernelCache``
under the entry ``(key, config, has_lse)``.
"""

from __future__ import annotations

import logging
import os
import time

from vllm_fa4 import envs
from vllm_fa4.kernels.config import DEFAULT_CONFIG, KernelConfig, KernelKey

envs.default_cute_dsl_env()

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402

from vllm_fa4.kernels.cache import KernelCache  # noqa: E402
from vllm_fa4.kernels.fwd_sm90 import CUTLASS_DTYPES, Sm90PagedPrefill  # noqa: E402
from vllm_fa4.kernels.trace_locations import memoized_source_locations  # noqa: E402

logger = logging.getLogger("vllm_fa4")


def _fake_args(key: KernelKey, config: KernelConfig, has_lse: bool):
    sym = cute.sym_int
    dt = CUTLASS_DTYPES[key.dtype]
    div = 128 // dt.width  # 16-byte aligned strides

    def fake(dtype, ndim, divisibility, align):
        shape = tuple(sym() for _ in range(ndim))
        stride = tuple(cute.sym_int64(divisibility=divisibility) for _ in range(ndim - 1)) + (1,)
        return cute.runtime.make_fake_tensor(dtype, shape, stride=stride, assumed_align=align)

    kv_dt = cutlass.Float8E4M3FN if key.fp8_kv else dt
    kv_div = 128 // kv_dt.width
    mQ = fake(dt, 3, div, 16)
    mK = fake(kv_dt, 4, kv_div, 16)
    mV = fake(kv_dt, 4, kv_div, 16)
    mO = fake(dt, 3, div, 16)
    mLSE = fake(cutlass.Float32, 2, 1, 4) if has_lse else None
    mCu = fake(cutlass.Int32, 1, 1, 4)
    mSeqK = fake(cutlass.Int32, 1, 1, 4)
    mPT = fake(cutlass.Int32, 2, 1, 4)
    mWork = fake(cutlass.Int32, 2, 1, 4)
    mCounters = fake(cutlass.Int32, 1, 1, 4) if config.persistent else None
    mSinks = fake(cutlass.Float32, 1, 1, 4) if key.sinks else None
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    num_ctas = cutlass.Int32(1)
    scale = cutlass.Float32(1.0)
    window_left = cutlass.Int32(0)
    softcap = cutlass.Float32(1.0)
    v_scale = cutlass.Float32(1.0)
    tensors = (mQ, mK, mV, mO, mLSE, mCu, mSeqK, mPT, mWork, mCounters, mSinks)
    return (*tensors, scale, num_ctas, window_left, softcap, v_scale, stream)


def compile_kernel(
    key: KernelKey,
    config: KernelConfig = DEFAULT_CONFIG,
    has_lse: bool = True,
    *,
    dump_dir: str | None = None,
):
    """Trace and compile one kernel (no cache). With ``dump_dir`` the DSL also writes the
    kernel's PTX and cubin there (tests and tools that read the machine code; in this
    process, where the DSL's CUTE_DSL_DUMP_DIR is read once at import). The folder is made
    if missing: the DSL writes nothing into a missing one, and says nothing."""
    reason = key.unsupported_reason() or config.unsupported_reason(key)
    if reason is not None:
        raise ValueError(f"vllm_fa4: cannot build {key} with {config.spec}: {reason}")
    options = "--enable-tvm-ffi"
    if dump_dir is not None:
        if any(ch.isspace() for ch in str(dump_dir)):
            raise ValueError(f"vllm_fa4: dump_dir {dump_dir!r} holds whitespace (an option value)")
        os.makedirs(dump_dir, exist_ok=True)
        options += f" --keep-ptx --keep-cubin --dump-dir {dump_dir}"
    kern = Sm90PagedPrefill(key, config, has_lse)
    with memoized_source_locations():
        return cute.compile(kern, *_fake_args(key, config, has_lse), options=options)


_CACHE = KernelCache(compile_kernel, function_name="vllm_fa4_prefill")


def get_kernel(key: KernelKey, config: KernelConfig, has_lse: bool):
    return _CACHE.get((key, config, has_lse))


def build_kernel(key: KernelKey, config: KernelConfig, has_lse: bool):
    """``get_kernel`` for compile checks: through the disk cache (a kernel another process
    compiled from the same sources is loaded), not kept in memory afterwards."""
    return _CACHE.load_or_compile((key, config, has_lse))


def compile_keys(
    keys, config: KernelConfig = DEFAULT_CONFIG, progress: bool = True, with_lse: bool = False
) -> None:
    """Ahead-of-time warmup: compile or load from disk every key (one log line per key)."""
    for key in keys:
        for has_lse in (False, True) if with_lse else (False,):
            t0 = time.perf_counter()
            get_kernel(key, config, has_lse)
            if progress:
                logger.info(
                    "vllm_fa4: kernel %s %s lse=%s ready in %.2f s",
                    key,
                    config.spec,
                    has_lse,
                    time.perf_counter() - t0,
                )
