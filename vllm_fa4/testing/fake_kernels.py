"""Stand-ins for a compiled kernel, its loader and the compiler, for the kernel-cache fault
tests (``kernels.cache.KernelCache(compile_fn, name, loader=...)``): no CuTe-DSL compile, no
GPU. ``RecordingCompiler`` appends one line per compile to a file, so compiles in several
processes can be counted; ``RecordingLoader`` keeps what it was asked to link.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"FAKE-KERNEL\n"


@dataclass(frozen=True)
class FakeKernel:
    payload: str
    source: str = "compiled"  # or "loaded"

    def export_to_c(self, path, function_name: str) -> None:
        Path(path).write_bytes(MAGIC + f"{function_name}\n{self.payload}".encode())


def load_fake_kernel(data: bytes) -> FakeKernel:
    """The loader (takes the file's bytes, as ``KernelCache`` hands them): rejects bytes that
    are not an exported FakeKernel (as the real linker rejects a file that is not an object)."""
    if not data.startswith(MAGIC):
        raise RuntimeError("not a valid object file")
    _, payload = data[len(MAGIC) :].decode().split("\n", 1)
    return FakeKernel(payload, source="loaded")


class RecordingLoader:
    """``load_fake_kernel`` that keeps every object handed to it in ``calls``: a test that
    plants a file asserts the cache never got as far as linking it."""

    def __init__(self):
        self.calls: list[bytes] = []

    def __call__(self, data: bytes) -> FakeKernel:
        self.calls.append(data)
        return load_fake_kernel(data)


class RecordingCompiler:
    """``compile_fn`` that records each compile (``tag`` and entry) as a line of ``record``
    and takes ``seconds`` (so that two processes overlap)."""

    def __init__(self, record: Path, tag: str = "", seconds: float = 0.0):
        self.record, self.tag, self.seconds = Path(record), tag, seconds

    def __call__(self, *entry) -> FakeKernel:
        with open(self.record, "a") as f:
            f.write(f"{self.tag} {entry!r}\n")
        time.sleep(self.seconds)
        return FakeKernel(repr(entry))

    def compiles(self) -> list[str]:
        return self.record.read_text().splitlines() if self.record.exists() else []
