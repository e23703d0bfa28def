"""Kernel-cache faults and who may write the cache (CPU).

Faults: a bad entry, an unwritable directory, lock errors, two processes at once. Trust
(docs/reliability.md, "Kernel cache threat model"): a file that another user wrote or could
have replaced is never linked into the process. Tests that act as a second user (uid 4242:
``os.setresuid`` in a forked child) or ``chown`` need root, as CI runs.

Most tests hand ``KernelCache`` a fake compiler and loader (``testing.fake_kernels``); one
compiles and loads a real CuTe-DSL kernel for sm_90a (no GPU needed to compile or load).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import pickle
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from pathlib import Path

import pytest

from vllm_fa4 import envs
from vllm_fa4.kernels import cache as cache_mod
from vllm_fa4.kernels.cache import KernelCache, digest_path, entry_record
from vllm_fa4.testing.fake_kernels import FakeKernel, RecordingCompiler, RecordingLoader

ENTRIES = [("key", n, False) for n in range(3)]
OTHER_UID = 4242  # the other local user
needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="acting as another user (chown, setresuid) needs root"
)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "kernels"
    monkeypatch.setenv(envs.CACHE_DIR, str(d))
    return d


def fake_cache(tmp_path, tag="", **kwargs) -> tuple[KernelCache, RecordingCompiler]:
    compiler = RecordingCompiler(tmp_path / "compiles.txt", tag=tag)
    return KernelCache(compiler, "fn", loader=RecordingLoader(), **kwargs), compiler


def loads(cache: KernelCache) -> list[bytes]:
    """What ``cache``'s loader was asked to link."""
    return cache._loader.calls


def warnings_of(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "vllm_fa4" and r.levelno >= logging.WARNING
    ]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def in_child(fn, *args, uid: int | None = None, umask: int | None = None):
    """``fn(*args)`` in a forked child, as ``uid`` and/or under ``umask``: its return value
    (an exception in the child fails the test with the child's traceback)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_end)
        try:
            if umask is not None:
                os.umask(umask)
            if uid is not None:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            result = ("ok", fn(*args))
        except BaseException:
            result = ("error", traceback.format_exc())
        with os.fdopen(write_end, "wb") as f:
            pickle.dump(result, f)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        status, value = pickle.load(f)
    os.waitpid(pid, 0)
    assert status == "ok", f"child failed:\n{value}"
    return value


class WarningsSeen(logging.Handler):
    """Collects vllm_fa4 warnings (in a forked child, where caplog cannot see them)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        logging.getLogger("vllm_fa4").addHandler(self)

    def emit(self, record):
        self.messages.append(record.getMessage())


def subprocess_env(drop=(), **extra) -> dict[str, str]:
    """The environment for a subprocess that imports the same ``vllm_fa4`` as this test (a
    worktree or the installed wheel, whatever an editable install elsewhere would give)."""
    import vllm_fa4

    env = {k: v for k, v in os.environ.items() if k not in drop}
    package_root = str(Path(vllm_fa4.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return dict(env, **extra)


@pytest.fixture
def shared_base():
    """A world-writable sticky directory, like /tmp (pytest's tmp_path is private to root)."""
    base = Path(tempfile.mkdtemp(prefix="vllm-fa4-cache-test-"))
    base.chmod(0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


# ---- the happy path ---------------------------------------------------------------------


def test_entry_written_once_then_loaded(cache_dir, tmp_path, caplog):
    first, compiler = fake_cache(tmp_path)
    fn = first.get(ENTRIES[0])
    assert fn == FakeKernel(repr(ENTRIES[0])) and first.get(ENTRIES[0]) is fn  # memory
    path = first.entry_path(ENTRIES[0])
    assert path.parent == cache_dir and path.exists() and digest_path(path).exists()
    assert mode(cache_dir) == 0o700
    assert {p.name: mode(p) for p in cache_dir.iterdir()} == {
        path.name: 0o600,
        digest_path(path).name: 0o600,
        path.with_suffix(".lock").name: 0o600,
    }  # and no temporary files left behind
    record = json.loads(digest_path(path).read_bytes())
    assert record["entry"] == repr(ENTRIES[0]) and record["fingerprint"] == first.fingerprint
    second, _ = fake_cache(tmp_path)
    assert second.get(ENTRIES[0]) == FakeKernel(repr(ENTRIES[0]), source="loaded")
    assert loads(second) == [path.read_bytes()]
    assert len(compiler.compiles()) == 1 and warnings_of(caplog) == []


def test_fresh_cache_dir_and_files_are_private_whatever_the_umask(shared_base, monkeypatch):
    """Under umask 000 the parents the cache creates, the directory and every file in it are
    still 0700 / 0600 (Path.mkdir(parents=True) would make the parents 0777)."""
    cache_dir = shared_base / "home" / ".cache" / "kernels"
    monkeypatch.setenv(envs.CACHE_DIR, str(cache_dir))

    def fill():
        cache = KernelCache(lambda *e: FakeKernel(repr(e)), "fn", loader=RecordingLoader())
        return cache.get(ENTRIES[0]).source

    assert in_child(fill, umask=0o000) == "compiled"
    for d in (shared_base / "home", shared_base / "home" / ".cache", cache_dir):
        assert mode(d) == 0o700, d
    files = {p.suffix: mode(p) for p in cache_dir.iterdir()}
    assert files == {".o": 0o600, ".sha256": 0o600, ".lock": 0o600}


# ---- bad entries: a miss, logged, recompiled, rewritten ---------------------------------


def _truncate(cache, path):
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def _flip_one_byte(cache, path):  # same length, the loader would accept it: only the digest
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def _garbage_with_matching_record(cache, path):  # the loader (linker) must reject it
    path.write_bytes(b"\x7fELF garbage")
    digest_path(path).write_bytes(entry_record(cache.fingerprint, ENTRIES[0], path.read_bytes()))


def _old_format_digest(cache, path):  # what the cache wrote before records: a bare sha256
    import hashlib

    digest_path(path).write_text(hashlib.sha256(path.read_bytes()).hexdigest())


def _other_fingerprint(cache, path):  # a valid object and record, of other kernel sources
    record = json.loads(digest_path(path).read_bytes())
    record["fingerprint"] = "0" * 64
    digest_path(path).write_text(json.dumps(record))


def _renamed_from_another_entry(cache, path):  # entry 1's valid files under entry 0's name
    other = cache.entry_path(ENTRIES[1])
    shutil.copy(other, path)
    shutil.copy(digest_path(other), digest_path(path))


CORRUPTIONS = {
    "truncated": _truncate,
    "empty": lambda cache, p: p.write_bytes(b""),
    "one_byte_flipped": _flip_one_byte,
    "digest_missing": lambda cache, p: digest_path(p).unlink(),
    "loader_rejects": _garbage_with_matching_record,
    "old_format_digest": _old_format_digest,
    "other_fingerprint": _other_fingerprint,
    "renamed_from_another_entry": _renamed_from_another_entry,
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_bad_entry_is_recompiled_logged_served_and_rewritten(
    corruption, cache_dir, tmp_path, caplog
):
    writer, compiler = fake_cache(tmp_path)
    writer.get(ENTRIES[0]), writer.get(ENTRIES[1])
    path = writer.entry_path(ENTRIES[0])
    CORRUPTIONS[corruption](writer, path)

    reader, _ = fake_cache(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        fn = reader.get(ENTRIES[0])
    assert fn == FakeKernel(repr(ENTRIES[0]))  # served: freshly compiled
    assert len(compiler.compiles()) == 3
    # Only an entry whose record checks out reaches the loader (which then rejects garbage).
    assert loads(reader) == ([b"\x7fELF garbage"] if corruption == "loader_rejects" else [])
    (warning,) = warnings_of(caplog)
    assert "bad kernel cache entry" in warning and str(path) in warning
    # Rewritten: the next process loads it without compiling.
    again, _ = fake_cache(tmp_path)
    assert again.get(ENTRIES[0]) == FakeKernel(repr(ENTRIES[0]), source="loaded")
    assert len(compiler.compiles()) == 3


def test_real_kernel_entry_corrupted_is_recompiled(cache_dir, caplog):
    """The real thing: a CuTe-DSL kernel for sm_90a, exported, linked back from its bytes,
    truncated, then replaced by garbage (with a matching record) that the linker must
    reject; each time recompiled, logged and served (~10 s)."""
    from vllm_fa4.kernels.compile import DEFAULT_CONFIG, compile_kernel
    from vllm_fa4.kernels.config import KernelKey

    entry = (KernelKey("bfloat16", 64, 16, 1), DEFAULT_CONFIG, False)
    compiles = []

    def counting(*e):
        compiles.append(e)
        return compile_kernel(*e)

    def fresh():
        return KernelCache(counting, "vllm_fa4_prefill")

    assert fresh().get(entry) is not None and len(compiles) == 1
    assert callable(fresh().get(entry)) and len(compiles) == 1  # loaded from disk
    path = fresh().entry_path(entry)
    assert path.stat().st_size > 1000

    def garbage(cache, path):
        path.write_bytes(b"\x7fELF garbage")
        digest_path(path).write_bytes(entry_record(cache.fingerprint, entry, path.read_bytes()))

    for corrupt in (_truncate, garbage):
        corrupt(fresh(), path)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
            assert fresh().get(entry) is not None
        (warning,) = warnings_of(caplog)
        assert "bad kernel cache entry" in warning
    assert len(compiles) == 3
    assert callable(fresh().get(entry)) and len(compiles) == 3  # rewritten entry loads


# ---- who may write the cache ------------------------------------------------------------


def _chown_dir(d, tmp_path):
    os.chown(d, OTHER_UID, OTHER_UID)


def _symlink_dir(d, tmp_path):  # a link to a valid private directory of ours
    real = tmp_path / "real-kernels"
    d.rename(real)
    d.symlink_to(real)


UNTRUSTED_DIRS = {
    "owned_by_another_user": (_chown_dir, "owned by uid 4242"),
    "group_writable": (lambda d, t: d.chmod(0o770), "writable by group or others (mode 0770)"),
    "world_writable_sticky": (lambda d, t: d.chmod(0o1777), "writable by group or others"),
    "symlink": (_symlink_dir, "symbolic link"),
}


@pytest.mark.parametrize("kind", list(UNTRUSTED_DIRS))
def test_untrusted_cache_dir_is_never_read_or_written(kind, cache_dir, tmp_path, caplog):
    """The directory holds a valid entry of ours, but another user owns the directory or
    could write into it: nothing is loaded from it or created in it; one warning."""
    if kind == "owned_by_another_user" and os.geteuid() != 0:
        pytest.skip("chown needs root")
    writer, compiler = fake_cache(tmp_path)
    writer.get(ENTRIES[0])
    make_untrusted, reason = UNTRUSTED_DIRS[kind]
    make_untrusted(cache_dir, tmp_path)
    before = sorted(p.name for p in cache_dir.iterdir())

    reader, _ = fake_cache(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        fns = [reader.get(e) for e in ENTRIES]
    assert fns == [FakeKernel(repr(e)) for e in ENTRIES]  # all compiled in memory
    assert loads(reader) == [] and len(compiler.compiles()) == 1 + len(ENTRIES)
    (warning,) = warnings_of(caplog)
    assert f"kernel cache dir {cache_dir} is not used" in warning and reason in warning
    assert envs.CACHE_DIR in warning
    assert sorted(p.name for p in cache_dir.iterdir()) == before  # no lock, no write


def _chown_file(path):
    os.chown(path, OTHER_UID, OTHER_UID)


def _symlink_to_copy(path):  # a link to a valid copy (ours, 0600) outside the directory
    copy = path.parent.parent / f"elsewhere-{path.name}"
    shutil.copy(path, copy)
    path.unlink()
    path.symlink_to(copy)


UNTRUSTED_FILES = {
    "object_owned_by_another_user": (".o", _chown_file),
    "record_owned_by_another_user": (".sha256", _chown_file),
    "object_world_writable": (".o", lambda p: p.chmod(0o666)),
    "record_group_writable": (".sha256", lambda p: p.chmod(0o620)),
    "object_symlink": (".o", _symlink_to_copy),
    "record_symlink": (".sha256", _symlink_to_copy),
}


@pytest.mark.parametrize("kind", list(UNTRUSTED_FILES))
def test_untrusted_entry_file_is_never_loaded(kind, cache_dir, tmp_path, caplog):
    """A valid entry whose object or record another user owns or could write, or that is a
    symlink to valid files: a bad entry (not linked), recompiled and rewritten."""
    if "owned_by_another_user" in kind and os.geteuid() != 0:
        pytest.skip("chown needs root")
    writer, compiler = fake_cache(tmp_path)
    writer.get(ENTRIES[0])
    suffix, make_untrusted = UNTRUSTED_FILES[kind]
    path = writer.entry_path(ENTRIES[0])
    make_untrusted(path.with_suffix(suffix))

    reader, _ = fake_cache(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        assert reader.get(ENTRIES[0]) == FakeKernel(repr(ENTRIES[0]))
    assert loads(reader) == [] and len(compiler.compiles()) == 2
    (warning,) = warnings_of(caplog)
    assert "bad kernel cache entry" in warning
    again, _ = fake_cache(tmp_path)  # rewritten by us: trusted again
    assert again.get(ENTRIES[0]).source == "loaded" and len(compiler.compiles()) == 2


def _plant(cache_dir: str, make_dir: bool, files: dict[str, bytes]) -> None:
    """The other user: (make the cache directory first, world-writable,) then put a valid
    looking object and a matching record under every entry's name."""
    if make_dir:
        os.mkdir(cache_dir, 0o777)
    for name, data in files.items():
        with open(os.path.join(cache_dir, name), "wb") as f:
            f.write(data)


@needs_root
@pytest.mark.parametrize("who_made_the_dir", ["other_user", "victim_world_writable"])
def test_objects_planted_by_another_user_are_never_loaded(
    who_made_the_dir, shared_base, tmp_path, monkeypatch, caplog
):
    """The attack of the review (issue 28): another user plants objects and records for
    every entry name (computable from public versions) in a directory it could write."""
    cache_dir = shared_base / "kernels"
    monkeypatch.setenv(envs.CACHE_DIR, str(cache_dir))
    victim, compiler = fake_cache(tmp_path)
    planted = FakeKernel("PLANTED")
    planted.export_to_c(tmp_path / "planted.o", function_name="fn")
    data = (tmp_path / "planted.o").read_bytes()
    files = {}
    for entry in ENTRIES:
        name = victim.entry_name(entry)
        files[f"{name}.o"] = data
        files[f"{name}.sha256"] = entry_record(victim.fingerprint, entry, data)
    if who_made_the_dir == "victim_world_writable":
        cache_dir.mkdir()
        cache_dir.chmod(0o777)
    in_child(
        _plant, str(cache_dir), who_made_the_dir == "other_user", files, uid=OTHER_UID, umask=0
    )

    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        fns = [victim.get(e) for e in ENTRIES]
    assert fns == [FakeKernel(repr(e)) for e in ENTRIES]  # compiled, never the planted one
    assert loads(victim) == [] and len(compiler.compiles()) == len(ENTRIES)
    (warning,) = warnings_of(caplog)
    assert "is not used" in warning
    assert "owned by uid 4242" in warning or "writable by group or others" in warning
    assert sorted(p.name for p in cache_dir.iterdir()) == sorted(files)  # nothing added


@needs_root
def test_root_owned_read_only_dir_serves_other_users(shared_base, tmp_path, monkeypatch):
    """The fleet's shared cache: filled by root (tools/precompile.py), then made readable
    (`chmod -R go+rX`). Another user loads what it holds, compiles the rest in memory with one
    warning, and creates nothing in it."""
    cache_dir = shared_base / "kernels"
    monkeypatch.setenv(envs.CACHE_DIR, str(cache_dir))
    root_cache, _ = fake_cache(tmp_path)
    root_cache.get(ENTRIES[0])
    subprocess.run(["chmod", "-R", "go+rX", str(cache_dir)], check=True)
    before = sorted(p.name for p in cache_dir.iterdir())
    user_cache = KernelCache(lambda *e: FakeKernel(repr(e)), "fn", loader=RecordingLoader())
    assert user_cache.fingerprint  # computed now: our sources may be unreadable to uid 4242

    def serve():
        seen = WarningsSeen()
        return [user_cache.get(e).source for e in ENTRIES], seen.messages

    sources, warnings = in_child(serve, uid=OTHER_UID)
    assert sources == ["loaded", "compiled", "compiled"]
    (warning,) = warnings
    assert "not writable or cannot be locked" in warning and "Permission denied" in warning
    assert sorted(p.name for p in cache_dir.iterdir()) == before


# ---- writes ------------------------------------------------------------------------------


def test_writes_are_made_in_a_private_directory_and_renamed(cache_dir, tmp_path):
    """export_to_c (which takes a path) writes into a fresh 0700 directory of ours inside the
    cache, never into the cache directory itself; nothing of it is left behind."""
    exports = []

    class Inspected(FakeKernel):
        def export_to_c(self, path, function_name):
            st = os.stat(Path(path).parent)
            exports.append((st.st_ino, stat.S_IMODE(st.st_mode), st.st_uid))
            super().export_to_c(path, function_name)

    cache = KernelCache(lambda *e: Inspected(repr(e)), "fn", loader=RecordingLoader())
    cache.get(ENTRIES[0])
    ((ino, dir_mode, uid),) = exports
    assert ino != cache_dir.stat().st_ino and dir_mode == 0o700 and uid == os.geteuid()
    assert sorted(p.suffix for p in cache_dir.iterdir()) == [".lock", ".o", ".sha256"]
    fresh = KernelCache(lambda *e: None, "fn", loader=RecordingLoader())
    assert fresh.get(ENTRIES[0]) == FakeKernel(repr(ENTRIES[0]), source="loaded")


def test_failed_writes_are_served_and_warned_once(cache_dir, tmp_path, caplog):
    class Unexportable(FakeKernel):
        def export_to_c(self, path, function_name):
            raise OSError(28, "No space left on device")

    cache = KernelCache(lambda *e: Unexportable(repr(e)), "fn", loader=RecordingLoader())
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        fns = [cache.get(e) for e in ENTRIES]
    assert [f.payload for f in fns] == [repr(e) for e in ENTRIES]
    (warning,) = warnings_of(caplog)
    assert "could not write" in warning and "No space left" in warning
    assert sorted(p.suffix for p in cache_dir.iterdir()) == [".lock"] * len(ENTRIES)


# ---- directories that cannot be used, locks ----------------------------------------------


def test_uncreatable_cache_dir_compiles_in_memory_with_one_warning(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(envs.CACHE_DIR, str(blocker / "kernels"))
    cache, compiler = fake_cache(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="vllm_fa4"):
        fns = [cache.get(e) for e in ENTRIES] + [cache.get(e) for e in ENTRIES]
    assert fns == [FakeKernel(repr(e)) for e in ENTRIES] * 2  # all served
    assert len(compiler.compiles()) == len(ENTRIES)  # each once (memory)
    (warning,) = warnings_of(caplog)
    assert "is not used" in warning and "Not a directory" in warning
    assert envs.CACHE_DIR in warning


@pytest.fixture(params=["chmod", "create_refused"])
def read_only(request, monkeypatch):
    """Make an existing directory refuse new files: chmod (not as root: root writes anyway),
    or refusing O_CREAT below it (what a read-only mount does; works as root too)."""

    def make(directory: Path):
        if request.param == "chmod":
            directory.chmod(0o555)
            request.addfinalizer(lambda: directory.chmod(0o755))
            if os.access(directory, os.W_OK):
                pytest.skip("running as root: chmod does not stop writes")
            return
        real_open = os.open

        def refusing_open(path, flags, *args, dir_fd=None, **kwargs):
            if dir_fd is not None and flags & os.O_CREAT:  # the cache's files, by descriptor
                raise PermissionError(errno.EROFS, "Read-only file system", str(path))
            return real_open(path, flags, *args, dir_fd=dir_fd, **kwargs)

        monkeypatch.setattr(os, "open", refusing_open)

    return make


def test_read_only_cache_dir_serves_what_it_holds_and_warns_once(
    cache_dir, tmp_path, caplog, read_only
):
    writer, compiler = fake_cache(tmp_path)
    writer.get(ENTRIES[0])  # written while the directory was writable
    (cache_dir / f"{writer.entry_name(ENTRIES[0])}.lock").unlink()  # a fresh read-only copy
    read_only(cache_dir)
    cache, _ = fake_cache(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        fns = [cache.get(e) for e in ENTRIES]
    assert fns[0] == FakeKernel(repr(ENTRIES[0]), source="loaded")
    assert fns[1:] == [FakeKernel(repr(e)) for e in ENTRIES[1:]]
    assert len(compiler.compiles()) == len(ENTRIES)  # 1 before, 2 in memory now
    (warning,) = warnings_of(caplog)
    assert "not writable or cannot be locked" in warning and str(cache_dir) in warning


def test_symlinked_lock_file_is_not_followed(cache_dir, tmp_path, caplog):
    """A symlink planted as an entry's lock: never followed (it would create, as the server's
    user, a file wherever it points); the kernel is compiled in memory."""
    cache, compiler = fake_cache(tmp_path)
    cache.get(ENTRIES[1])  # the directory exists
    target = tmp_path / "created-through-the-link"
    (cache_dir / f"{cache.entry_name(ENTRIES[0])}.lock").symlink_to(target)
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        assert cache.get(ENTRIES[0]) == FakeKernel(repr(ENTRIES[0]))
    assert not os.path.lexists(target)
    (warning,) = warnings_of(caplog)
    assert "cannot be locked" in warning and "symbolic links" in warning
    assert not cache.entry_path(ENTRIES[0]).exists()  # not written without its lock


def test_lock_errors_compile_in_memory_with_one_warning(cache_dir, tmp_path, monkeypatch, caplog):
    """flock failing (ENOLCK: a filesystem without locks) is not a startup error: the good
    entries are served, the rest compiled in memory, one warning."""
    writer, compiler = fake_cache(tmp_path)
    writer.get(ENTRIES[0])

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(cache_mod.fcntl, "flock", no_locks)
    cache, _ = fake_cache(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        fns = [cache.get(e) for e in ENTRIES]
    assert fns[0] == FakeKernel(repr(ENTRIES[0]), source="loaded")
    assert fns[1:] == [FakeKernel(repr(e)) for e in ENTRIES[1:]]
    (warning,) = warnings_of(caplog)
    assert "cannot be locked" in warning and "ENOLCK" in warning
    assert len(list(cache_dir.glob("*.o"))) == 1  # nothing written without a lock


def test_lock_held_past_the_deadline_compiles_in_memory(cache_dir, tmp_path, caplog):
    """A rank stuck compiling (or stopped) holds an entry's lock: the others wait at most
    the deadline, then compile in memory with a warning."""
    cache, compiler = fake_cache(tmp_path, lock_timeout_s=0.5)
    cache.get(ENTRIES[1])  # the directory exists
    holder = os.open(cache_dir / f"{cache.entry_name(ENTRIES[0])}.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    served = []
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        waiter = threading.Thread(target=lambda: served.append(cache.get(ENTRIES[0])))
        waiter.start()
        waiter.join(timeout=30)
        finished = not waiter.is_alive()
        os.close(holder)  # releases the lock (and a waiter that ignored the deadline)
        waiter.join()
    assert finished, "still waiting for the lock 30 s after a 0.5 s deadline"
    assert served == [FakeKernel(repr(ENTRIES[0]))] and time.monotonic() - t0 >= 0.5
    (warning,) = warnings_of(caplog)
    assert "locked by another process for over 0.5 s" in warning
    assert not cache.entry_path(ENTRIES[0]).exists()  # not written without its lock


_RACE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from vllm_fa4.kernels.cache import KernelCache
    from vllm_fa4.testing.fake_kernels import RecordingCompiler, load_fake_kernel

    record, ready, me = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    entry = ("key", 7, False)
    cache = KernelCache(RecordingCompiler(record, tag=me, seconds=1.5), "fn",
                        loader=load_fake_kernel)
    cache.entry_path(entry)  # fingerprint the sources before the start line
    (ready / me).touch()
    deadline = time.monotonic() + 120
    while len(list(ready.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    fn = cache.get(entry)
    print("SERVED", me, fn.source, fn.payload)
    """
)


def test_two_processes_same_key_compile_once_both_served(cache_dir, tmp_path):
    """Two TP workers want the same kernel at the same moment: one compiles (1.5 s), the
    other waits on the entry's lock and loads what the first wrote."""
    record, ready = tmp_path / "compiles.txt", tmp_path / "ready"
    ready.mkdir()
    env = subprocess_env(**{envs.CACHE_DIR: str(cache_dir)})
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE, str(record), str(ready), f"rank{i}"],
            env=env,
            cwd=tmp_path,  # never a checkout that happens to be the cwd
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    served = sorted(line.split()[1:] for out, _ in outs for line in out.splitlines())
    compiles = record.read_text().splitlines()
    assert len(compiles) == 1, compiles
    compiled_by = compiles[0].split()[0]
    payload = repr(("key", 7, False))
    assert {(rank, source) for rank, source, *_ in served} == {
        (compiled_by, "compiled"),
        ("rank1" if compiled_by == "rank0" else "rank0", "loaded"),
    }
    assert all(" ".join(rest) == payload for _, _, *rest in served)


# ---- cutlass's own file cache ------------------------------------------------------------


def test_cutlass_ir_cache_is_kept_out_of_tmp(tmp_path):
    """Importing the kernels points CuTe-DSL's IR file cache into our private directory, so
    cutlass no longer creates $TMPDIR/$USER/cutlass_python_cache (unchecked, plantable)."""
    tmpdir, cache = tmp_path / "tmp", tmp_path / "kernels"
    tmpdir.mkdir()
    env = subprocess_env(
        drop=("CUTE_DSL_CACHE_DIR", "CUTE_EXPERIMENTAL_DSL_CACHE_DIR"),
        TMPDIR=str(tmpdir),
        **{envs.CACHE_DIR: str(cache)},
    )
    script = (
        "import vllm_fa4.kernels.compile\n"
        "from cutlass.base_dsl.cache_helpers import get_default_generated_ir_path as p\n"
        "print(p())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [str(cache / "cute_dsl")]
    assert list(tmpdir.iterdir()) == []


# ---- growth: stale entries of other sources pruned ----------------------------------------


def _age(cache_dir: Path, stem: str, days: float) -> None:
    when = time.time() - days * 86400
    for path in cache_dir.glob(f"{stem}.*"):
        os.utime(path, (when, when), follow_symlinks=False)


def _stems(cache_dir: Path) -> set[str]:
    return {p.name.rpartition(".")[0] for p in cache_dir.iterdir() if p.is_file()}


def _entry_of_other_sources(tmp_path, cache_dir: Path, entry) -> str:
    """``entry`` written by a cache whose kernel sources differ (an older release)."""
    old, _ = fake_cache(tmp_path, tag="old")
    old._fingerprint = "0" * 64
    old.get(entry)
    return old.entry_name(entry)


def test_stale_entries_of_other_sources_are_pruned_at_first_use(cache_dir, tmp_path, caplog):
    """Entries of other kernel sources unused for VLLM_FA4_CACHE_MAX_AGE_DAYS go, lock files
    included; this release's entries stay at any age (a restart after a long run must not
    recompile), as do young ones of other sources and a stale one whose lock is held."""
    stale = _entry_of_other_sources(tmp_path, cache_dir, ENTRIES[0])
    young = _entry_of_other_sources(tmp_path, cache_dir, ENTRIES[1])
    held = _entry_of_other_sources(tmp_path, cache_dir, ENTRIES[2])
    mine, _ = fake_cache(tmp_path)
    mine.get(ENTRIES[0])
    own = mine.entry_name(ENTRIES[0])
    for stem, days in ((stale, 31), (young, 29), (held, 90), (own, 400)):
        _age(cache_dir, stem, days)
    lock = os.open(cache_dir / f"{held}.lock", os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)  # another process using that entry now
    try:
        caplog.set_level(logging.INFO, logger="vllm_fa4")
        second, compiler = fake_cache(tmp_path, tag="second")
        compiled_before = len(compiler.compiles())
        assert second.get(ENTRIES[0]) == FakeKernel(repr(ENTRIES[0]), source="loaded")
    finally:
        os.close(lock)
    assert _stems(cache_dir) == {young, held, own}
    assert len(compiler.compiles()) == compiled_before and warnings_of(caplog) == []
    assert any("removed 1 kernel cache entries" in r.getMessage() for r in caplog.records)
    assert (cache_dir / f"{own}.o").stat().st_mtime > time.time() - 60  # the load refreshed it


def test_max_age_zero_keeps_every_entry_and_others_files_are_never_removed(
    cache_dir, tmp_path, monkeypatch
):
    stale = _entry_of_other_sources(tmp_path, cache_dir, ENTRIES[0])
    _age(cache_dir, stale, 365)
    (cache_dir / "notes.txt").write_text("not ours to judge")
    link = cache_dir / "planted.o"
    link.symlink_to(cache_dir / f"{stale}.o")
    os.utime(link, (0, 0), follow_symlinks=False)
    monkeypatch.setenv(envs.CACHE_MAX_AGE_DAYS, "0")
    fake_cache(tmp_path)[0].get(ENTRIES[1])
    assert stale in _stems(cache_dir)
    monkeypatch.delenv(envs.CACHE_MAX_AGE_DAYS)
    fake_cache(tmp_path)[0].get(ENTRIES[1])
    assert stale not in _stems(cache_dir)
    assert link.is_symlink() and (cache_dir / "notes.txt").exists()  # not regular / not ours


def test_bad_max_age_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv(envs.CACHE_MAX_AGE_DAYS, "-1")
    with pytest.raises(ValueError, match=envs.CACHE_MAX_AGE_DAYS):
        envs.cache_max_age_days()


def test_unparsable_max_age_prunes_nothing_and_serves(cache_dir, tmp_path, monkeypatch, caplog):
    """Outside a server (backend selection refuses the value), the cache still serves: one
    warning, every entry kept."""
    stale = _entry_of_other_sources(tmp_path, cache_dir, ENTRIES[0])
    _age(cache_dir, stale, 365)
    monkeypatch.setenv(envs.CACHE_MAX_AGE_DAYS, "-3")
    cache, _ = fake_cache(tmp_path)
    assert cache.get(ENTRIES[1]) == FakeKernel(repr(ENTRIES[1]))
    assert stale in _stems(cache_dir)
    assert [w for w in warnings_of(caplog) if envs.CACHE_MAX_AGE_DAYS in w] != []
