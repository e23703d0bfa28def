"""Compiled kernels cached in memory and on disk.

On disk: ``export_to_c`` objects named by a sha256 of our kernel sources, the cutlass /
tvm_ffi / python versions and the entry (its repr), each with a ``.sha256`` file holding the
object's digest. Faults and what they cost (tests/unit/test_cache.py):

- processes that want the same entry at once (TP ranks) take a file lock on it: one compiles,
  the others wait and load what it wrote;
- a bad entry (truncated, corrupt: its digest does not match, or the loader rejects it) is a
  miss: logged, removed, recompiled and rewritten;
- an unusable directory (cannot be created, or no file can be created in it) means compiling
  in memory, with ONE warning per directory (a read-only directory still serves the good
  entries it holds); a failed write is likewise warned about once.
"""

from __future__ import annotations

import contextlib
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


def digest_path(path: Path) -> Path:
    """The file holding the sha256 of the cache entry ``path``."""
    return path.with_suffix(".sha256")


class KernelCache:
    """``get(entry)``: the compiled function for ``entry`` (a hashable tuple whose repr
    names everything that changes the code), from memory, disk, or ``compile_fn(*entry)``.

    ``compile_fn(*entry)`` returns an object with ``export_to_c(path, function_name=...)``;
    ``loader(path)`` turns a file written that way back into the function (default: CuTe-DSL's
    ``load_module``). Tests pass fakes for both.
    """

    def __init__(
        self,
        compile_fn: Callable,
        function_name: str,
        *,
        loader: Callable[[Path], object] | None = None,
    ):
        self.compile_fn = compile_fn
        self._function_name = function_name
        self._loader = loader or self._load_module
        self._memory: dict = {}
        self._fingerprint: str | None = None
        self._runtime_preloaded = False
        self._warned: set[tuple[str, Path]] = set()

    def get(self, entry: tuple):
        fn = self._memory.get(entry)
        if fn is None:
            fn = self._memory[entry] = self._load_or_compile(entry)
        return fn

    def load_or_compile(self, entry: tuple):
        """``get`` without keeping the function in this process (a compile check builds
        a hundred kernels and needs none of them afterwards)."""
        fn = self._memory.get(entry)
        return self._load_or_compile(entry) if fn is None else fn

    def entry_path(self, entry: tuple) -> Path:
        if self._fingerprint is None:
            self._fingerprint = _source_fingerprint()
        digest = hashlib.sha256(f"{self._fingerprint}|{entry!r}".encode()).hexdigest()
        return envs.kernel_cache_dir() / f"{digest[:40]}.o"

    def _warn_once(self, kind: str, directory: Path, msg: str, *args) -> None:
        if (kind, directory) in self._warned:
            logger.debug(msg, *args)
            return
        self._warned.add((kind, directory))
        logger.warning(msg, *args)

    def _preload_runtime(self) -> None:
        """load_module resolves DSL runtime symbols globally; load those libs RTLD_GLOBAL first."""
        if self._runtime_preloaded:
            return
        for lib in cute.runtime.find_runtime_libraries(enable_tvm_ffi=False):
            if Path(lib).exists():
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        self._runtime_preloaded = True

    def _load_module(self, path: Path):
        self._preload_runtime()
        mod = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
        return getattr(mod, self._function_name)

    def _open_lock(self, path: Path) -> int | None:
        """A file descriptor to lock ``path``'s entry with, or None: the directory is unusable."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            self._warn_once(
                "dir",
                path.parent,
                "vllm_fa4: kernel cache dir %s is not writable (%s); kernels it does not hold "
                "are compiled in memory (set %s to a writable directory to keep them)",
                path.parent,
                e,
                envs.CACHE_DIR,
            )
            return None

    def _load_or_compile(self, entry: tuple):
        path = self.entry_path(entry)
        lock = self._open_lock(path)
        if lock is None:  # a read-only directory still serves the good entries it holds
            fn = self._read(path, writable=False)
            return self.compile_fn(*entry) if fn is None else fn
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # TP ranks: one compiles, the others then load
            fn = self._read(path, writable=True)
            if fn is None:
                fn = self.compile_fn(*entry)
                self._write(fn, path)
            return fn
        finally:
            os.close(lock)  # releases the lock

    def _read(self, path: Path, writable: bool):
        """The function cached at ``path``, or None when there is none or it is bad (a bad
        entry is logged and, where the directory allows, removed)."""
        if not path.exists():
            return None
        try:
            want = digest_path(path).read_text().strip()
            got = hashlib.sha256(path.read_bytes()).hexdigest()
            if got != want:
                raise ValueError(f"sha256 {got[:12]}... != recorded {want[:12]}...: truncated?")
            return self._loader(path)
        except Exception as e:  # a bad entry is a miss
            logger.warning("vllm_fa4: bad kernel cache entry %s (%s); recompiling", path, e)
            if writable:
                for p in (path, digest_path(path)):
                    with contextlib.suppress(OSError):
                        p.unlink(missing_ok=True)
            return None

    def _write(self, fn, path: Path) -> None:
        """Export ``fn`` to ``path`` (and its digest), atomically; a failure is only logged."""
        tmps = []
        try:
            for suffix in (".o.tmp", ".sha256.tmp"):
                fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=suffix)
                os.close(fd)
                tmps.append(tmp)
            fn.export_to_c(tmps[0], function_name=self._function_name)
            Path(tmps[1]).write_text(hashlib.sha256(Path(tmps[0]).read_bytes()).hexdigest())
            # Digest first: a crash between the two replaces leaves a mismatch (a miss).
            os.replace(tmps[1], digest_path(path))
            os.replace(tmps[0], path)
        except Exception as e:
            self._warn_once(
                "write",
                path.parent,
                "vllm_fa4: could not write kernel cache entry %s (%s); the kernel is kept in "
                "memory only",
                path,
                e,
            )
        finally:
            for tmp in tmps:
                if os.path.exists(tmp):
                    os.unlink(tmp)
