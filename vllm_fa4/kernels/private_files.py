"""Files that only this user (or root) can have written, for the kernel cache.

The cache holds native objects that are linked into the server, so a file another local user
could have written or replaced must never be read. Everything here works through descriptors,
never by re-resolving a path:

- ``open_private_dir``: the directory, created 0700 (missing parents too) whatever the umask,
  opened without following a symlink and checked with ``fstat`` (as ssh checks ``~/.ssh``);
- ``read_trusted``: a file in it, opened ``O_NOFOLLOW`` and checked the same way, read once;
- ``private_tmpdir`` + ``write_new`` + ``os.rename(..., src_dir_fd=, dst_dir_fd=)``: new files
  are made 0600 in a fresh 0700 directory of our own and renamed into place.

Trusted means: owned by the effective uid or by root (root can write anything anyway; a
root-owned read-only directory is how a fleet shares kernels), and not writable by group or
others.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Untrusted(Exception):
    """A directory or file that another user could have written (the message says why)."""


def untrusted_reason(st: os.stat_result) -> str | None:
    """Why a file with this ``stat`` may have been written by another user, or None."""
    euid = os.geteuid()
    if st.st_uid not in (euid, 0):
        return f"it is owned by uid {st.st_uid} (only uid {euid} or root is trusted)"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _make_dirs(path: Path) -> bool:
    """Create ``path`` and its missing parents 0700 (``Path.mkdir(parents=True)`` would make
    the parents 0777 minus the umask: all of them world-writable under umask 000). Whether
    this call created ``path`` itself."""
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    created = False
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
            created = True
        except FileExistsError:  # made meanwhile by someone else: the checks still run
            created = False
    return created


def open_private_dir(path: Path) -> int:
    """A descriptor of directory ``path`` (created 0700 when missing); raises ``Untrusted``
    when it is a symlink, not a directory, or not trusted, and OSError when it cannot be
    created or opened."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        created = _make_dirs(path)
        fd = os.open(path, _DIR_FLAGS)
        if created:  # exactly 0700, even under an umask that masks the owner's bits
            os.fchmod(fd, 0o700)
    except NotADirectoryError:
        if os.path.islink(path):
            raise Untrusted("it is a symbolic link") from None
        raise
    try:
        reason = untrusted_reason(os.fstat(fd))
        if reason is not None:
            raise Untrusted(reason)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_all(fd: int) -> bytes:
    with os.fdopen(os.dup(fd), "rb") as f:
        return f.read()


def read_trusted(dir_fd: int, name: str) -> bytes:
    """The bytes of ``name`` in ``dir_fd``, read once through a descriptor opened without
    following a symlink; raises ``Untrusted`` for a symlink, a non-regular or untrusted file,
    FileNotFoundError when there is none."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Untrusted(f"{name} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(f"{name} is not a regular file")
        reason = untrusted_reason(st)
        if reason is not None:
            raise Untrusted(f"{name}: {reason}")
        return _read_all(fd)
    finally:
        os.close(fd)


def read_own(dir_fd: int, name: str) -> bytes:
    """The bytes of ``name`` in a directory only we can write (a ``private_tmpdir``): opened
    without following a symlink, no owner check (its mode follows the umask)."""
    fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    try:
        return _read_all(fd)
    finally:
        os.close(fd)


def write_new(dir_fd: int, name: str, data: bytes) -> None:
    """Create ``name`` (0600, must not exist) in ``dir_fd`` holding ``data``."""
    fd = os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


@contextlib.contextmanager
def private_tmpdir(dir_fd: int) -> Iterator[tuple[int, str]]:
    """A fresh 0700 directory inside ``dir_fd``: ``(its descriptor, a path to it)``. The path
    goes through ``/proc/self/fd``, so a writer that only takes paths (``export_to_c``) still
    writes into this very directory. Removed, with what is left in it, on exit."""
    for _ in range(100):
        name = f".tmp-{secrets.token_hex(8)}"
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - 100 collisions of 64 random bits
        raise FileExistsError(errno.EEXIST, "no free temporary directory name")
    try:
        tmp_fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        try:
            yield tmp_fd, f"/proc/self/fd/{tmp_fd}"
        finally:
            for leftover in os.listdir(tmp_fd):
                with contextlib.suppress(OSError):
                    os.unlink(leftover, dir_fd=tmp_fd)
            os.close(tmp_fd)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=dir_fd)
