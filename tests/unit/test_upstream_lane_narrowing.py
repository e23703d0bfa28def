"""tests/upstream/lane_conftest.py's narrowing of vLLM's backend comparisons to the lane's
backends, on the CPU: a comparison keeps only the wanted backends, and one left with none of
them is a skip naming both lists, not a pass that compared nothing."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.modules import load_file

LANE = Path(__file__).resolve().parents[1] / "upstream" / "lane_conftest.py"
lane = load_file("fa4_lane_conftest", LANE)


def _module():
    calls = []

    def compare(batch_spec, model, backend_to_test, *args, **kwargs):
        calls.append(list(backend_to_test))

    return SimpleNamespace(_test_backend_correctness=compare), calls


def test_comparisons_keep_only_the_lanes_backends():
    module, calls = _module()
    lane._narrow(module, {"FA4", "FLASH_ATTN"})
    module._test_backend_correctness("spec", "model", ["FLASH_ATTN", "FLEX_ATTENTION", "FA4"])
    assert calls == [["FLASH_ATTN", "FA4"]]
    lane._narrow(module, {"FA4", "FLASH_ATTN"})  # collection runs it once per item: no rewrap
    module._test_backend_correctness("spec", "model", ["FA4"])
    assert calls == [["FLASH_ATTN", "FA4"], ["FA4"]]


def test_a_comparison_without_the_lanes_backends_is_a_skip():
    module, calls = _module()
    lane._narrow(module, {"FA4"})
    with pytest.raises(pytest.skip.Exception, match=r"none of \['FLEX_ATTENTION'\].*\['FA4'\]"):
        module._test_backend_correctness("spec", "model", ["FLEX_ATTENTION"])
    assert calls == []
