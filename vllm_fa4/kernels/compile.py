"""Compile, cache (memory + disk) and call the SM90 prefill kernel.

Compiled with `--enable-tvm-ffi` against fake tensors whose shapes are all dynamic, so one
artifact serves every batch; the stream comes from the caller's current torch stream (no
stream argument: CUDA-graph friendly). On disk: `export_to_c` objects keyed by a sha256 of
our kernel sources, the cutlass / tvm_ffi / python versions and the compile key.
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import hashlib
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

from vllm_fa4.kernels.config import KernelKey, Variant, kernel_config

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402

from vllm_fa4.kernels.fwd_sm90 import Sm90PagedPrefill  # noqa: E402

logger = logging.getLogger("vllm_fa4")


def _variant_from_env() -> Variant:
    """Read once at import: VLLM_FA4_VARIANT (e.g. "overlap+pingpong+smemepi", default "base");
    the older VLLM_FA4_OVERLAP=1 adds the intra-WG overlap flag."""
    v = Variant.parse(os.environ.get("VLLM_FA4_VARIANT", "base"))
    if os.environ.get("VLLM_FA4_OVERLAP", "0") == "1" and not v.overlap:
        v = dataclasses.replace(v, overlap=True)
    return v


VARIANT = _variant_from_env()
INTRA_WG_OVERLAP = VARIANT.overlap  # kept for callers that print it

_DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}
_FN_NAME = "vllm_fa4_prefill"
_compiled: dict = {}
_runtime_preloaded = False


def _cache_dir() -> Path:
    root = os.environ.get("VLLM_FA4_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "vllm_fa4" / "kernels"


def _source_fingerprint() -> str:
    h = hashlib.sha256()
    for p in sorted(Path(__file__).parent.glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    try:
        import tvm_ffi

        tvm_ver = getattr(tvm_ffi, "__version__", "?")
    except ImportError:  # pragma: no cover
        tvm_ver = "none"
    h.update(f"{cutlass.__version__}|{tvm_ver}|{sys.version_info[:3]}".encode())
    return h.hexdigest()


_FINGERPRINT: str | None = None


def _entry_path(ck: tuple) -> Path:
    global _FINGERPRINT
    if _FINGERPRINT is None:
        _FINGERPRINT = _source_fingerprint()
    digest = hashlib.sha256(f"{_FINGERPRINT}|{ck!r}".encode()).hexdigest()
    return _cache_dir() / f"{digest[:40]}.o"


def _preload_runtime() -> None:
    """load_module resolves DSL runtime symbols globally; load those libs RTLD_GLOBAL first."""
    global _runtime_preloaded
    if _runtime_preloaded:
        return
    for lib in cute.runtime.find_runtime_libraries(enable_tvm_ffi=False):
        if Path(lib).exists():
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    _runtime_preloaded = True


def _fake_args(key: KernelKey, has_lse: bool):
    sym = cute.sym_int
    dt = _DTYPES[key.dtype]
    div = 128 // dt.width  # 16-byte aligned strides

    def fake(dtype, ndim, divisibility, align):
        shape = tuple(sym() for _ in range(ndim))
        stride = tuple(cute.sym_int64(divisibility=divisibility) for _ in range(ndim - 1)) + (1,)
        return cute.runtime.make_fake_tensor(dtype, shape, stride=stride, assumed_align=align)

    mQ = fake(dt, 3, div, 16)
    mK = fake(dt, 4, div, 16)
    mV = fake(dt, 4, div, 16)
    mO = fake(dt, 3, div, 16)
    mLSE = fake(cutlass.Float32, 2, 1, 4) if has_lse else None
    mCu = fake(cutlass.Int32, 1, 1, 4)
    mSeqK = fake(cutlass.Int32, 1, 1, 4)
    mPT = fake(cutlass.Int32, 2, 1, 4)
    mWork = fake(cutlass.Int32, 2, 1, 4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    num_ctas = cutlass.Int32(1)
    return (mQ, mK, mV, mO, mLSE, mCu, mSeqK, mPT, mWork, cutlass.Float32(1.0), num_ctas, stream)


def compile_kernel(key: KernelKey, has_lse: bool = True, variant: Variant | None = None):
    """Trace and compile one variant (no cache)."""
    reason = key.unsupported_reason()
    if reason is not None:
        raise ValueError(f"vllm_fa4: unsupported kernel key {key}: {reason}")
    cfg = kernel_config(key, VARIANT if variant is None else variant)
    kern = Sm90PagedPrefill(key, cfg, has_lse)
    return cute.compile(kern, *_fake_args(key, has_lse), options="--enable-tvm-ffi")


def _load_or_compile(ck: tuple):
    key, has_lse, variant = ck
    path = _entry_path(ck)
    lock_path = path.with_suffix(".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        logger.warning("vllm_fa4: kernel cache dir %s unusable; compiling", path.parent)
        return compile_kernel(key, has_lse, variant)
    with open(lock_path, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # TP ranks: one compiles, the others then load
        if path.exists():
            try:
                _preload_runtime()
                mod = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
                return getattr(mod, _FN_NAME)
            except Exception as e:  # a bad entry is a miss
                logger.warning("vllm_fa4: dropping bad cache entry %s (%s)", path, e)
                path.unlink(missing_ok=True)
        fn = compile_kernel(key, has_lse, variant)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".o.tmp")
        os.close(fd)
        try:
            fn.export_to_c(tmp, function_name=_FN_NAME)
            os.replace(tmp, path)
        except Exception as e:
            logger.warning("vllm_fa4: could not write kernel cache %s (%s)", path, e)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return fn


def get_kernel(key: KernelKey, has_lse: bool, variant: Variant | None = None):
    # The cache key (memory and disk, via repr) holds every Variant field.
    ck = (key, has_lse, VARIANT if variant is None else variant)
    fn = _compiled.get(ck)
    if fn is None:
        fn = _compiled[ck] = _load_or_compile(ck)
    return fn


def compile_keys(keys, progress: bool = True, with_lse: bool = False) -> None:
    """Ahead-of-time warmup: compile or load from disk every key (one log line per key)."""
    for key in keys:
        for has_lse in (False, True) if with_lse else (False,):
            t0 = time.perf_counter()
            get_kernel(key, has_lse)
            if progress:
                logger.info(
                    "vllm_fa4: kernel %s lse=%s ready in %.2f s",
                    key,
                    has_lse,
                    time.perf_counter() - t0,
                )


_SM_COUNT: dict = {}


def _sm_count(device) -> int:
    n = _SM_COUNT.get(device)
    if n is None:
        import torch

        n = _SM_COUNT[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return n


def prefill_forward(
    key,
    q,
    k_cache,
    v_cache,
    out,
    lse,
    cu_seqlens_q,
    seqused_k,
    page_table,
    work_tiles,
    softmax_scale,
    variant: Variant | None = None,
) -> None:
    """`variant` None -> the process-wide VARIANT (env); tests and benchmarks pass one."""
    ck = (key, lse is not None, VARIANT if variant is None else variant)
    fn = _compiled.get(ck)
    if fn is None:
        fn = get_kernel(key, lse is not None, ck[2])
    # Persistent variants launch min(tiles, SMs) CTAs; the others ignore the value.
    num_ctas = min(work_tiles.shape[0], _sm_count(q.device))
    fn(
        q,
        k_cache,
        v_cache,
        out,
        lse,
        cu_seqlens_q,
        seqused_k,
        page_table,
        work_tiles,
        softmax_scale,
        num_ctas,
    )
