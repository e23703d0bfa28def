"""Compiled kernels cached in memory and on disk.

On disk (``$VLLM_FA4_CACHE_DIR``): ``<name>.o``, the native object ``export_to_c`` wrote, which
the loader links into this process; ``<name>.sha256``, a JSON record binding the source
fingerprint (our kernel sources, the cutlass / tvm_ffi / python versions), the entry (its
repr) and the object's sha256; ``<name>.lock``. The name is a hash of fingerprint and entry.
Who may write there, and what is checked (``private_files``; docs/reliability.md, "Kernel
cache threat model"):

- the directory is created 0700 and checked before every use: a real directory owned by us
  (or root), not writable by group or others; otherwise ONE warning and compiling in memory;
- an entry is read once through an ``O_NOFOLLOW`` descriptor, owner and mode checked with
  ``fstat``; its record must name this fingerprint, this entry and the sha256 of exactly those
  bytes, which are what the loader links (through a memfd, never the path again);
- writes are made in a private 0700 directory inside the cache and renamed into place.

Growth: every change of the kernel sources (a new release) writes a new set of entries, so at
a process's first use of the directory the entries of other sources or versions that no
process has loaded or written for ``VLLM_FA4_CACHE_MAX_AGE_DAYS`` (default 30; a load
refreshes the ``.o``'s mtime) are removed with their lock files: only regular files of ours,
never one whose lock another process holds, never one of this process's fingerprint
(``prune_stale``).

Faults and what they cost (tests/unit/test_cache.py):

- processes that want the same entry at once (TP ranks) take a file lock on it: one compiles,
  the others wait (at most ``lock_timeout_s``, then they compile in memory) and load what it
  wrote;
- a bad entry (truncated, corrupt, another entry's or an older format's, untrusted owner or
  mode, a symlink; or the loader rejects it) is a miss: logged, removed, recompiled and
  rewritten;
- a directory that cannot be created or is not trusted, a lock file that cannot be created or
  locked (a read-only directory, ``ENOLCK``), a lock held past the deadline: the kernel is
  compiled in memory, with ONE warning per directory and kind (a read-only or lock-less
  directory still serves the good entries it holds); a failed write is likewise warned about
  once.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import logging
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import cutlass
import cutlass.cute as cute

from vllm_fa4 import envs
from vllm_fa4.kernels.private_files import (
    Untrusted,
    open_private_dir,
    private_tmpdir,
    read_own,
    read_trusted,
    write_new,
)

logger = logging.getLogger("vllm_fa4")

_SOURCES = Path(__file__).parent  # every kernels/*.py is part of the fingerprint
RECORD_FORMAT = "vllm_fa4 kernel cache entry 2"
LOCK_TIMEOUT_S = 600.0  # a rank stuck compiling must not block the others forever
_LOCK_POLL_S = 0.05
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


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
    """The record (fingerprint, entry, sha256) of the cache entry ``path``."""
    return path.with_suffix(".sha256")


def entry_record(fingerprint: str, entry: tuple, data: bytes) -> bytes:
    """What ``<name>.sha256`` holds for ``entry``'s object ``data``."""
    record = {
        "format": RECORD_FORMAT,
        "fingerprint": fingerprint,
        "entry": repr(entry),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    return json.dumps(record, indent=1).encode()


def _check_record(raw: bytes, fingerprint: str, entry: tuple, data: bytes) -> None:
    """Raise ValueError unless ``raw`` is this fingerprint's record of ``entry`` and ``data``."""
    try:
        record = json.loads(raw)
        fmt = record["format"]
    except (ValueError, TypeError, KeyError):
        record, fmt = None, None
    if fmt != RECORD_FORMAT:
        raise ValueError("record is not in the current format (an older cache?)")
    if record.get("fingerprint") != fingerprint:
        raise ValueError("record is for other kernel sources or versions")
    if record.get("entry") != repr(entry):
        raise ValueError(f"record is for another entry: {str(record.get('entry'))[:200]}")
    got, want = hashlib.sha256(data).hexdigest(), str(record.get("sha256"))
    if got != want:
        raise ValueError(f"sha256 {got[:12]}... != recorded {want[:12]}...: truncated?")


class KernelCache:
    """``get(entry)``: the compiled function for ``entry`` (a hashable tuple whose repr
    names everything that changes the code), from memory, disk, or ``compile_fn(*entry)``.

    ``compile_fn(*entry)`` returns an object with ``export_to_c(path, function_name=...)``;
    ``loader(data)`` turns the bytes of a file written that way back into the function
    (default: CuTe-DSL's ``load_module``). Tests pass fakes for both, and a short
    ``lock_timeout_s``. All disk checks run here, once per entry and process (at startup);
    ``get`` of an entry already in memory is a dict lookup.
    """

    def __init__(
        self,
        compile_fn: Callable,
        function_name: str,
        *,
        loader: Callable[[bytes], object] | None = None,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
    ):
        self.compile_fn = compile_fn
        self._function_name = function_name
        self._loader = loader or self._load_module
        self._lock_timeout_s = lock_timeout_s
        self._memory: dict = {}
        self._fingerprint: str | None = None
        self._runtime_preloaded = False
        self._warned: set[tuple[str, Path]] = set()
        self._pruned: set[Path] = set()

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

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = _source_fingerprint()
        return self._fingerprint

    def entry_name(self, entry: tuple) -> str:
        """The file name stem of ``entry``'s files in the cache directory."""
        return hashlib.sha256(f"{self.fingerprint}|{entry!r}".encode()).hexdigest()[:40]

    def entry_path(self, entry: tuple) -> Path:
        return envs.kernel_cache_dir() / f"{self.entry_name(entry)}.o"

    def _max_age_days(self, directory: Path) -> int:
        """VLLM_FA4_CACHE_MAX_AGE_DAYS; a value that does not parse (refused at backend
        selection, so only outside a server) keeps every entry, with one warning."""
        try:
            return envs.cache_max_age_days()
        except ValueError as e:
            self._warn_once("max_age", directory, "vllm_fa4: %s; no entry is pruned", e)
            return 0

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

    def _load_module(self, data: bytes):
        """Link ``data`` (an object file's bytes) into the process. load_module takes a path
        and reads it once: a memfd of our own holding exactly these bytes."""
        self._preload_runtime()
        fd = os.memfd_create("vllm_fa4_kernel", os.MFD_CLOEXEC)
        try:
            with os.fdopen(os.dup(fd), "wb") as f:
                f.write(data)
            mod = cute.runtime.load_module(f"/proc/self/fd/{fd}", enable_tvm_ffi=True)
        finally:
            os.close(fd)
        return getattr(mod, self._function_name)

    def _load_or_compile(self, entry: tuple):
        directory = envs.kernel_cache_dir()
        try:
            dir_fd = open_private_dir(directory)
        except (Untrusted, OSError) as e:
            self._warn_once(
                "dir",
                directory,
                "vllm_fa4: kernel cache dir %s is not used (%s); kernels are compiled in "
                "memory. Set %s to a directory only you can write (created 0700 if missing)",
                directory,
                e,
                envs.CACHE_DIR,
            )
            return self.compile_fn(*entry)
        try:
            if directory not in self._pruned:
                self._pruned.add(directory)
                prune_stale(dir_fd, directory, self._max_age_days(directory), self.fingerprint)
            name = self.entry_name(entry)
            with self._entry_lock(dir_fd, directory, name) as locked:
                fn = self._read(dir_fd, directory, name, entry, remove_bad=locked)
                if fn is None:
                    fn = self.compile_fn(*entry)
                    if locked:
                        self._write(fn, dir_fd, directory, name, entry)
                return fn
        finally:
            os.close(dir_fd)

    @contextlib.contextmanager
    def _entry_lock(self, dir_fd: int, directory: Path, name: str) -> Iterator[bool]:
        """Hold ``name``'s lock (True: this process may remove and write the entry), or not
        (False: only read it). Not holding it is warned about once per directory."""
        try:
            lock = os.open(f"{name}.lock", _LOCK_FLAGS, 0o600, dir_fd=dir_fd)
        except OSError as e:  # a read-only directory; ELOOP: a symlink planted as the lock
            self._warn_cannot_lock(directory, f"cannot create {name}.lock: {e.strerror}")
            lock = None
        try:
            yield lock is not None and self._wait_for_lock(lock, directory, name)
        finally:
            if lock is not None:
                os.close(lock)  # releases the lock

    def _wait_for_lock(self, lock: int, directory: Path, name: str) -> bool:
        deadline = time.monotonic() + self._lock_timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # one rank compiles
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    self._warn_once(
                        "deadline",
                        directory,
                        "vllm_fa4: kernel cache entry %s was locked by another process for "
                        "over %g s (a stuck compile?); compiling it in memory",
                        directory / name,
                        self._lock_timeout_s,
                    )
                    return False
                time.sleep(_LOCK_POLL_S)
            except OSError as e:  # ENOLCK (no lock support), EINVAL, ...
                self._warn_cannot_lock(directory, f"flock: {errno.errorcode.get(e.errno)} {e}")
                return False

    def _warn_cannot_lock(self, directory: Path, why: str) -> None:
        self._warn_once(
            "lock",
            directory,
            "vllm_fa4: kernel cache dir %s is not writable or cannot be locked (%s); kernels "
            "it does not hold are compiled in memory (set %s to a directory only you can "
            "write to keep them)",
            directory,
            why,
            envs.CACHE_DIR,
        )

    def _read(self, dir_fd: int, directory: Path, name: str, entry: tuple, remove_bad: bool):
        """The function cached as ``name``, or None when there is none or it is bad (a bad
        entry is logged and, when ``remove_bad``, removed)."""
        try:
            data = read_trusted(dir_fd, f"{name}.o")
        except FileNotFoundError:
            return None
        except (Untrusted, OSError) as e:
            return self._bad_entry(dir_fd, directory, name, e, remove_bad)
        try:
            _check_record(read_trusted(dir_fd, f"{name}.sha256"), self.fingerprint, entry, data)
            fn = self._loader(data)
        except Exception as e:  # a bad entry is a miss
            return self._bad_entry(dir_fd, directory, name, e, remove_bad)
        with contextlib.suppress(OSError):  # in use: prune_stale's age counts from now
            os.utime(f"{name}.o", dir_fd=dir_fd, follow_symlinks=False)
        return fn

    def _bad_entry(self, dir_fd: int, directory: Path, name: str, e: Exception, remove: bool):
        logger.warning(
            "vllm_fa4: bad kernel cache entry %s (%s); recompiling", directory / f"{name}.o", e
        )
        if remove:
            for suffix in (".o", ".sha256"):
                with contextlib.suppress(OSError):
                    os.unlink(f"{name}{suffix}", dir_fd=dir_fd)
        return None

    def _write(self, fn, dir_fd: int, directory: Path, name: str, entry: tuple) -> None:
        """Export ``fn`` and its record, made in a private directory and renamed into place;
        a failure is only logged."""
        try:
            with private_tmpdir(dir_fd) as (tmp_fd, tmp_path):
                fn.export_to_c(f"{tmp_path}/export.o", function_name=self._function_name)
                data = read_own(tmp_fd, "export.o")
                write_new(tmp_fd, f"{name}.o", data)  # 0600 whatever the umask
                write_new(tmp_fd, f"{name}.sha256", entry_record(self.fingerprint, entry, data))
                # Record first: a crash between the two renames leaves a mismatch (a miss).
                for suffix in (".sha256", ".o"):
                    os.rename(
                        f"{name}{suffix}", f"{name}{suffix}", src_dir_fd=tmp_fd, dst_dir_fd=dir_fd
                    )
        except Exception as e:
            self._warn_once(
                "write",
                directory,
                "vllm_fa4: could not write kernel cache entry %s (%s); the kernel is kept in "
                "memory only",
                directory / f"{name}.o",
                e,
            )


_ENTRY_SUFFIXES = (".o", ".sha256", ".lock")


def prune_stale(
    dir_fd: int, directory: Path, max_age_days: int, keep: str, now: float | None = None
) -> int:
    """Remove the entries of ``dir_fd`` (a trusted cache directory) whose files are all older
    than ``max_age_days`` (0: none) and whose record is not of fingerprint ``keep`` (this
    process's: a server restarted after a long run keeps its kernels): an entry's ``.o``,
    ``.sha256`` and ``.lock``, each only if it is a regular file owned by this user, and only
    while holding the entry's lock without waiting (a process using the entry holds it; that
    entry is skipped). Returns the number of entries removed; logs one line when any were.
    Never raises: a failure keeps files."""
    if max_age_days <= 0:
        return 0
    cutoff = (time.time() if now is None else now) - max_age_days * 86400
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return 0
    stems: dict[str, list[str]] = {}
    for fname in names:
        stem, dot, suffix = fname.rpartition(".")
        if dot and f".{suffix}" in _ENTRY_SUFFIXES:
            stems.setdefault(stem, []).append(fname)
    removed, freed = 0, 0
    for stem, files in stems.items():
        sizes = _stale_own_files(dir_fd, files, cutoff)
        if sizes is None or _record_fingerprint(dir_fd, stem) == keep:
            continue
        if not _remove_entry(dir_fd, stem, files):
            continue
        removed, freed = removed + 1, freed + sum(sizes)
    if removed:
        logger.info(
            "vllm_fa4: removed %d kernel cache entries (%.1f MiB) unused for %d days from %s "
            "(%s=0 keeps them)",
            removed,
            freed / 2**20,
            max_age_days,
            directory,
            envs.CACHE_MAX_AGE_DAYS,
        )
    return removed


def _stale_own_files(dir_fd: int, files: list[str], cutoff: float) -> list[int] | None:
    """The sizes of ``files`` if every one is a regular file of ours older than ``cutoff``."""
    sizes = []
    for fname in files:
        try:
            st = os.stat(fname, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return None
        if not _is_own_regular(st) or st.st_mtime >= cutoff:
            return None
        sizes.append(st.st_size)
    return sizes


def _record_fingerprint(dir_fd: int, stem: str) -> str | None:
    """The fingerprint ``stem``'s record names (None: no record, or not one of ours)."""
    try:
        record = json.loads(read_trusted(dir_fd, f"{stem}.sha256"))
        return str(record["fingerprint"])
    except Exception:  # missing, untrusted, an older format: not this process's
        return None


def _is_own_regular(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def _remove_entry(dir_fd: int, stem: str, files: list[str]) -> bool:
    """Unlink ``files`` under the entry's lock, taken without waiting (no lock file: nobody
    can hold it). False, removing nothing, when another process holds it."""
    lock = None
    if f"{stem}.lock" in files:
        try:
            lock = os.open(f"{stem}.lock", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held (BlockingIOError), gone, or cannot be locked: keep the entry
            if lock is not None:
                os.close(lock)
            return False
    try:
        # The lock file last: a process that opens it meanwhile finds the entry gone (a miss).
        for fname in sorted(files, key=lambda f: f.endswith(".lock")):
            with contextlib.suppress(OSError):
                os.unlink(fname, dir_fd=dir_fd)
        return True
    finally:
        if lock is not None:
            os.close(lock)
