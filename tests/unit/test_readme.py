"""The README's facts that code can check: the kernel cache's default path, the layout table's
test folders, where the package imports vLLM, what the two commands need and take."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import vllm_fa4
from vllm_fa4 import envs

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    """The README's text under ``## title`` up to the next ``## ``."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.S | re.M)
    assert match, f"no section {title!r} in the README"
    return match.group(1)


def test_default_kernel_cache_path_is_the_one_the_readme_names(monkeypatch):
    monkeypatch.delenv(envs.CACHE_DIR, raising=False)
    default = envs.kernel_cache_dir()
    shown = "~/" + str(default.relative_to(Path.home()))
    assert f"`$VLLM_FA4_CACHE_DIR`, default `{shown}`" in README


@pytest.mark.parametrize(
    "folder",
    sorted(p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name[0] != "_"),
    ids=lambda folder: f"tests/{folder}",  # not a bare "gpu": that is the GPU marker
)
def test_layout_table_lists_every_test_folder(folder):
    assert re.search(rf"`tests/{folder}/?`", section("Layout")), f"tests/{folder} not in Layout"


def test_every_vllm_import_outside_compat_is_named_in_compatibility():
    """compat.py holds the vLLM attention-backend API; any other module importing vLLM must be
    named in the README's Compatibility section (which once claimed there were none)."""
    package = Path(vllm_fa4.__file__).parent
    importing = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else []
            )
            if any(name.partition(".")[0] == "vllm" for name in names):
                importing.add(path.relative_to(package).as_posix())
    assert "compat.py" in importing
    compatibility = section("Compatibility")
    unnamed = sorted(f for f in importing - {"compat.py"} if f"`{f}`" not in compatibility)
    assert not unnamed, f"vLLM imported in {unnamed}, not named in the README's Compatibility"


def test_two_commands_say_what_they_need_and_take():
    commands = section("The two commands")
    assert "Serving needs an NVIDIA Hopper GPU (SM90" in commands
    assert re.search(r"about \d+(-\d+)? minutes on an?( idle)?\s+2-core machine", commands)
    assert "`scripts/test.sh FILE...` runs just those files" in commands
    assert "`FRESH=1`" in commands and 'FRESH:-0}" = 1' in (ROOT / "scripts/_venv.sh").read_text()
