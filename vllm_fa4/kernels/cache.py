"""Compiled kernels cached in memory and on disk.

On disk: ``export_to_c`` objects named by a sha256 of our kernel sources, the cutlass /
tvm_ffi / python versions and the entry (its repr). A file lock makes processes that want the
same entry at once (TP ranks) compile it once; a bad file is a miss and is rewritten; an
unusable directory means compiling in memory, with one warning.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import cutlass
import cutlass.cute as cute

from vllm_fa4 import envs

logger = logging.getLogger("vllm_fa4")

_SOURCES = Path(__file__).parent  # every kernels/*.py is part of the fingerprint


def _source_fingerprint() -> str:
    h = hashlib.sha256()
    for p in sorted(_SOURCES.glob("*.py")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    try:
        import tvm_ffi

        tvm_ver = getattr(tvm_ffi, "__version__", "?")
    except ImportError:  # pragma: no cover
        tvm_ver = "none"
    h.update(f"{cutlass.__version__}|{tvm_ver}|{sys.version_info[:3]}".encode())
    return h.hexdigest()


class KernelCache:
    """``get(entry)``: the compiled function for ``entry`` (a hashable tuple whose repr
    names everything that changes the code), from memory, disk, or ``compile_fn(*entry)``."""

    def __init__(self, compile_fn: Callable, function_name: str):
        self.compile_fn = compile_fn
        self._function_name = function_name
        self._memory: dict = {}
        self._fingerprint: str | None = None
        self._runtime_preloaded = False

    def get(self, entry: tuple):
        fn = self._memory.get(entry)
        if fn is None:
            fn = self._memory[entry] = self._load_or_compile(entry)
        return fn

    def entry_path(self, entry: tuple) -> Path:
        if self._fingerprint is None:
            self._fingerprint = _source_fingerprint()
        digest = hashlib.sha256(f"{self._fingerprint}|{entry!r}".encode()).hexdigest()
        return envs.kernel_cache_dir() / f"{digest[:40]}.o"

    def _preload_runtime(self) -> None:
        """load_module resolves DSL runtime symbols globally; load those libs RTLD_GLOBAL first."""
        if self._runtime_preloaded:
            return
        for lib in cute.runtime.find_runtime_libraries(enable_tvm_ffi=False):
            if Path(lib).exists():
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        self._runtime_preloaded = True

    def _load_or_compile(self, entry: tuple):
        path = self.entry_path(entry)
        lock_path = path.with_suffix(".lock")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            logger.warning("vllm_fa4: kernel cache dir %s unusable; compiling", path.parent)
            return self.compile_fn(*entry)
        with open(lock_path, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # TP ranks: one compiles, the others then load
            if path.exists():
                try:
                    self._preload_runtime()
                    mod = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
                    return getattr(mod, self._function_name)
                except Exception as e:  # a bad entry is a miss
                    logger.warning("vllm_fa4: dropping bad cache entry %s (%s)", path, e)
                    path.unlink(missing_ok=True)
            fn = self.compile_fn(*entry)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".o.tmp")
            os.close(fd)
            try:
                fn.export_to_c(tmp, function_name=self._function_name)
                os.replace(tmp, path)
            except Exception as e:
                logger.warning("vllm_fa4: could not write kernel cache %s (%s)", path, e)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return fn
