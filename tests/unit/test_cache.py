"""Kernel-cache faults (CPU): a bad entry, an unwritable directory, two processes at once.

Most tests hand ``KernelCache`` a fake compiler and loader (``testing.fake_kernels``); one
compiles and loads a real CuTe-DSL kernel for sm_90a (no GPU needed to compile or load).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_fa4 import envs
from vllm_fa4.kernels import cache as cache_mod
from vllm_fa4.kernels.cache import KernelCache, digest_path
from vllm_fa4.testing.fake_kernels import FakeKernel, RecordingCompiler, load_fake_kernel

ENTRIES = [("key", n, False) for n in range(3)]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "kernels"
    monkeypatch.setenv(envs.CACHE_DIR, str(d))
    return d


def fake_cache(tmp_path, tag="") -> tuple[KernelCache, RecordingCompiler]:
    compiler = RecordingCompiler(tmp_path / "compiles.txt", tag=tag)
    return KernelCache(compiler, "fn", loader=load_fake_kernel), compiler


def warnings_of(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "vllm_fa4" and r.levelno >= logging.WARNING
    ]


def test_entry_written_once_then_loaded(cache_dir, tmp_path, caplog):
    first, compiler = fake_cache(tmp_path)
    fn = first.get(ENTRIES[0])
    assert fn == FakeKernel(repr(ENTRIES[0])) and first.get(ENTRIES[0]) is fn  # memory
    path = first.entry_path(ENTRIES[0])
    assert path.parent == cache_dir and path.exists() and digest_path(path).exists()
    second, _ = fake_cache(tmp_path)
    assert second.get(ENTRIES[0]) == FakeKernel(repr(ENTRIES[0]), source="loaded")
    assert len(compiler.compiles()) == 1 and warnings_of(caplog) == []


def _truncate(path):
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def _flip_one_byte(path):  # same length, the loader would accept it: only the digest sees it
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def _garbage_with_matching_digest(path):  # the loader (linker) must reject it
    path.write_bytes(b"\x7fELF garbage")
    import hashlib

    digest_path(path).write_text(hashlib.sha256(path.read_bytes()).hexdigest())


CORRUPTIONS = {
    "truncated": _truncate,
    "empty": lambda p: p.write_bytes(b""),
    "one_byte_flipped": _flip_one_byte,
    "digest_missing": lambda p: digest_path(p).unlink(),
    "loader_rejects": _garbage_with_matching_digest,
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_bad_entry_is_recompiled_logged_served_and_rewritten(
    corruption, cache_dir, tmp_path, caplog
):
    writer, compiler = fake_cache(tmp_path)
    writer.get(ENTRIES[0])
    path = writer.entry_path(ENTRIES[0])
    CORRUPTIONS[corruption](path)

    reader, _ = fake_cache(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        fn = reader.get(ENTRIES[0])
    assert fn == FakeKernel(repr(ENTRIES[0]))  # served: freshly compiled
    assert len(compiler.compiles()) == 2
    (warning,) = warnings_of(caplog)
    assert "bad kernel cache entry" in warning and str(path) in warning
    # Rewritten: the next process loads it without compiling.
    again, _ = fake_cache(tmp_path)
    assert again.get(ENTRIES[0]).source == "loaded" and len(compiler.compiles()) == 2


def test_real_kernel_entry_corrupted_is_recompiled(cache_dir, caplog):
    """The real thing: a CuTe-DSL kernel for sm_90a, exported, truncated, then replaced by
    garbage the linker must reject; each time recompiled, logged and served (~10 s)."""
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
    path = fresh().entry_path(entry)
    assert path.stat().st_size > 1000
    for corrupt in (_truncate, _garbage_with_matching_digest):
        corrupt(path)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
            assert fresh().get(entry) is not None
        (warning,) = warnings_of(caplog)
        assert "bad kernel cache entry" in warning
    assert len(compiles) == 3
    assert callable(fresh().get(entry)) and len(compiles) == 3  # rewritten entry loads


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
    assert "not writable" in warning and envs.CACHE_DIR in warning


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

        def refusing_open(path, flags, *args, **kwargs):
            if str(path).startswith(str(directory)) and flags & os.O_CREAT:
                raise PermissionError(13, "Read-only file system", str(path))
            return real_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(cache_mod.os, "open", refusing_open)

    return make


def test_read_only_cache_dir_serves_what_it_holds_and_warns_once(
    cache_dir, tmp_path, caplog, read_only
):
    writer, compiler = fake_cache(tmp_path)
    writer.get(ENTRIES[0])  # written while the directory was writable
    read_only(cache_dir)
    cache, _ = fake_cache(tmp_path)
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        fns = [cache.get(e) for e in ENTRIES]
    assert fns[0] == FakeKernel(repr(ENTRIES[0]), source="loaded")
    assert fns[1:] == [FakeKernel(repr(e)) for e in ENTRIES[1:]]
    assert len(compiler.compiles()) == len(ENTRIES)  # 1 before, 2 in memory now
    (warning,) = warnings_of(caplog)
    assert "not writable" in warning and str(cache_dir) in warning


def test_failed_writes_are_served_and_warned_once(cache_dir, tmp_path, caplog):
    class Unexportable(FakeKernel):
        def export_to_c(self, path, function_name):
            raise OSError(28, "No space left on device")

    cache = KernelCache(lambda *e: Unexportable(repr(e)), "fn", loader=load_fake_kernel)
    with caplog.at_level(logging.WARNING, logger="vllm_fa4"):
        fns = [cache.get(e) for e in ENTRIES]
    assert [f.payload for f in fns] == [repr(e) for e in ENTRIES]
    (warning,) = warnings_of(caplog)
    assert "could not write" in warning and "No space left" in warning
    assert not list(cache_dir.glob("*.o")) and not list(cache_dir.glob("*.tmp"))


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
    env = dict(os.environ, **{envs.CACHE_DIR: str(cache_dir)})
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACE, str(record), str(ready), f"rank{i}"],
            env=env,
            cwd=tmp_path,  # import the package under test, never a checkout in the cwd
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
