"""Faster kernel tracing on CuTe DSL 4.6 (vLLM 0.26's): memoized source locations.

The DSL gives every MLIR op it builds a source location, found with
``inspect.getframeinfo`` (a file resolve, two ``stat`` calls and a source lookup per op). A
kernel builds about 40,000 ops from about 600 call sites. A frame's info depends only on its
code object and instruction offset (and the source file, which does not change while we
compile), so within a compile it is looked up once per call site: 28 % less compile time on
2 cores (session 24, docs/reliability.md). The locations, and so the machine code, are
the same. DSL 4.8 (vLLM 0.33's) computes them cheaply itself (``_fast_frameinfo``); there
this does nothing.
"""

from __future__ import annotations

import inspect
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType, ModuleType

_OP_MODULE = "cutlass._mlir_helpers.op"  # the DSL's op wrapper: `inspect.getframeinfo(frame)`


class _MemoizedInspect:
    """Stands in for the ``inspect`` module inside the DSL's op wrapper; only
    ``getframeinfo`` differs."""

    def __init__(self) -> None:
        self.frame_infos: dict[tuple, inspect.Traceback] = {}

    def __getattr__(self, name: str):
        return getattr(inspect, name)

    def getframeinfo(self, frame: FrameType, context: int = 1) -> inspect.Traceback:
        site = (frame.f_code, frame.f_lasti, context)
        info = self.frame_infos.get(site)
        if info is None:
            info = self.frame_infos[site] = inspect.getframeinfo(frame, context)
        return info


_lock = threading.Lock()
_depth = 0  # compiles in progress (threads may overlap; the last one out restores)


def _patchable_op_module() -> ModuleType | None:
    module = sys.modules.get(_OP_MODULE)
    if module is None or hasattr(module, "_fast_frameinfo"):  # DSL 4.8+: cheap already
        return None
    if getattr(module, "inspect", None) is not inspect:  # another layout: leave it alone
        return None
    return module


@contextmanager
def memoized_source_locations() -> Iterator[None]:
    """Within this block the DSL looks up each call site's source location once."""
    global _depth
    with _lock:
        module = _patchable_op_module() if _depth == 0 else sys.modules[_OP_MODULE]
        if module is not None:
            if _depth == 0:
                module.inspect = _MemoizedInspect()
            _depth += 1
    try:
        yield
    finally:
        if module is not None:
            with _lock:
                _depth -= 1
                if _depth == 0:
                    module.inspect = inspect  # the memo (code objects, lines) goes with it
