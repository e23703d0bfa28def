"""kernels/trace_locations.py: the memoized source locations give the DSL exactly what
``inspect.getframeinfo`` gives, and the DSL's module is restored after each compile."""

import inspect
import sys
import threading
import types

import pytest

from vllm_fa4.kernels import trace_locations
from vllm_fa4.kernels.trace_locations import _MemoizedInspect, memoized_source_locations


def _full(info):
    return (*info, info.positions)  # Traceback's == leaves its positions out


def test_memoized_frame_info_is_getframeinfo():
    """A loop traces the same call sites again and again, as the DSL's unrolled loops do."""
    memo = _MemoizedInspect()

    def both(frame, context=1):  # the caller's frame waits at one instruction meanwhile
        return _full(memo.getframeinfo(frame, context)), _full(inspect.getframeinfo(frame, context))

    for i in range(6):
        a, a_ref = both(sys._getframe())
        assert a == a_ref
        if i % 2:
            b, b_ref = both(sys._getframe(), context=3)
            assert b == b_ref and len(b[3]) == 3 and b[1] == a[1] + 3
        c, c_ref = both(sys._getframe())  # another site in the same code object
        assert c == c_ref and c[1] == a[1] + 5
    assert len(memo.frame_infos) == 3  # one per call site and context
    assert "a, a_ref = both(sys._getframe())" in a[3][0]
    assert memo.currentframe is inspect.currentframe  # everything else is inspect's


def test_memo_is_keyed_by_call_site():
    memo = _MemoizedInspect()

    def site_a():
        return memo.getframeinfo(sys._getframe())

    def site_b():
        return memo.getframeinfo(sys._getframe())

    a1, a2, b = site_a(), site_a(), site_b()
    assert a1 is a2 and a1 != b and a1.function == "site_a" and b.function == "site_b"
    assert len(memo.frame_infos) == 2


@pytest.fixture
def fake_op_module(monkeypatch):
    """A DSL 4.6-like op module (it imports inspect and has no _fast_frameinfo)."""
    module = types.ModuleType(trace_locations._OP_MODULE)
    module.inspect = inspect
    monkeypatch.setitem(sys.modules, trace_locations._OP_MODULE, module)
    return module


def test_patched_only_while_compiling(fake_op_module):
    with memoized_source_locations():
        assert isinstance(fake_op_module.inspect, _MemoizedInspect)
        with memoized_source_locations():  # nested: one memo
            inner = fake_op_module.inspect
        assert fake_op_module.inspect is inner
    assert fake_op_module.inspect is inspect
    with pytest.raises(RuntimeError), memoized_source_locations():
        raise RuntimeError("a failed compile restores the module too")
    assert fake_op_module.inspect is inspect


def test_overlapping_compiles_in_threads_restore_once(fake_op_module):
    inside, release = threading.Barrier(2), threading.Event()

    def compile_like():
        with memoized_source_locations():
            inside.wait()
            release.wait()

    first = threading.Thread(target=compile_like)
    first.start()
    with memoized_source_locations():
        inside.wait()
        release.set()
        first.join()
        assert isinstance(fake_op_module.inspect, _MemoizedInspect)  # still compiling here
    assert fake_op_module.inspect is inspect


def test_left_alone_where_the_dsl_is_fast_already(fake_op_module):
    fake_op_module._fast_frameinfo = lambda frame: None  # DSL 4.8+
    with memoized_source_locations():
        assert fake_op_module.inspect is inspect


def test_the_installed_dsl_is_patched_or_fast():
    """Against the installed CuTe DSL: 4.6 gets the memo, 4.8+ has its own fast path. A DSL
    that moved its op wrapper would leave compiles slow, silently; this says so."""
    pytest.importorskip("cutlass")
    import cutlass._mlir_helpers.op as op

    if hasattr(op, "_fast_frameinfo"):
        return
    assert op.inspect is inspect and "inspect.getframeinfo(frame)" in inspect.getsource(op)
    with memoized_source_locations():
        assert isinstance(op.inspect, _MemoizedInspect)
    assert op.inspect is inspect
