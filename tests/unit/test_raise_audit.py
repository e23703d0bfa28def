"""Every ``raise`` reachable from the metadata builder's ``build`` and the impl's ``forward``
is listed in docs/reliability.md ("Exceptions reachable from build and forward"), each with
why vLLM cannot trigger it (issue 27): an exception there kills vLLM's engine core and every
request in flight, so what vLLM can send is served or refused at startup.

The functions below are those the two entry points call in this package (vLLM's own code
aside). A raise added to one of them, or a function added to the path, fails this test until
the doc's table says why vLLM cannot reach it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import vllm_fa4

PACKAGE = Path(vllm_fa4.__file__).resolve().parent
DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"

# module (relative to the package) -> the functions build and forward reach in it
REACHABLE = {
    "metadata.py": ["FA4MetadataBuilder.build", "FA4MetadataBuilder._plan_prefill"],
    "compat.py": ["prefill_seq_lens_cpu", "decode_slice"],
    "paged_prefill/plan.py": [
        "plan_prefill",
        "_check_int32_1d",
        "build_work_tiles",
        "_l2_sections",
        "kv_bytes_per_token",
    ],
    "paged_prefill/policy.py": ["ServingConfigs.pick"],
    "kernels/config.py": ["check_window", "check_features"],
    "backend.py": [
        "FA4AttentionImpl.forward",
        "FA4AttentionImpl.sinks",
        "FA4AttentionImpl._sink_weights_as",
        "FA4AttentionImpl._sinks_fp32",
        "FA4AttentionImpl._forward_decode",
    ],
    "fp8_decode.py": ["DecodeQueryQuant.__call__", "fa3_reads_fp8_query"],
    "paged_prefill/layout.py": [
        "split_kv_cache",
        "_canonical_strides",
        "kv_views_problem",
        "fit_config",
        "KvCacheLayout.of_views",
        "KvCacheLayout.unsupported_reason",
        "KvCacheLayout.fits_slot_boxes",
    ],
    "paged_prefill/run.py": [
        "run_prefill",
        "_check_tensor",
        "_check_kv_scales",
        "_config_for_views",
        "rows_problem",
        "_say_once",
    ],
    "kernels/launch.py": ["prefill_forward", "check_slot_boxes", "_sm_count", "_tile_counters"],
    "kernels/compile.py": ["get_kernel", "compile_kernel"],
    "paged_prefill/reference.py": ["paged_attention_reference", "_dequantized"],
}


def _functions(path: Path) -> dict[str, ast.AST]:
    """Every function of a module by qualified name (a property's getter and setter share one
    name: their bodies are merged)."""
    found: dict[str, list] = {}

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef):
                found.setdefault(prefix + child.name, []).append(child)

    walk(ast.parse(path.read_text()), "")
    return found


def _direct_raises(defs) -> int:
    """``raise X`` statements in the functions' own bodies (not in nested functions); bare
    re-raises are not new exceptions."""
    count = 0

    def visit(node):
        nonlocal count
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                count += 1
            visit(child)

    for d in defs:
        visit(d)
    return count


def _documented() -> dict[str, int]:
    """The doc's table: `` `module::function` `` -> the number of raises it says."""
    section = DOC.read_text().split("## Exceptions reachable from build and forward", 1)
    assert len(section) == 2, "docs/reliability.md has no 'Exceptions reachable from ...' section"
    rows = re.findall(r"^\| `([\w/.]+::[\w.]+)` \| (\d+) \|", section[1], flags=re.M)
    return {name: int(count) for name, count in rows}


CASES = [(module, name) for module, names in REACHABLE.items() for name in names]


@pytest.mark.parametrize("module,name", CASES, ids=[f"{m}::{n}" for m, n in CASES])
def test_every_reachable_raise_is_documented(module, name):
    functions = _functions(PACKAGE / module)
    assert name in functions, f"{module} has no function {name}: update REACHABLE"
    raises = _direct_raises(functions[name])
    documented = _documented()
    key = f"{module}::{name}"
    if raises == 0:
        assert key not in documented, f"{key} raises nothing now: drop its row"
        return
    assert documented.get(key) == raises, (
        f"{key} has {raises} raise statement(s), docs/reliability.md's table says "
        f"{documented.get(key)}: say why vLLM cannot trigger each (or move it to startup)"
    )


def test_the_table_lists_only_reachable_functions():
    listed = {f"{m}::{n}" for m, n in CASES}
    assert set(_documented()) <= listed
