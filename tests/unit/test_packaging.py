"""What the wheel declares and ships: every third-party module the package imports is a declared
dependency (nvidia-cutlass-dsl was once missing), the LICENSE is the Apache-2.0 text and is
listed for the wheel (.ci/run checks the built wheel holds it), and the README names every
extra."""

from __future__ import annotations

import ast
import hashlib
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import vllm_fa4

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]

# Modules whose distribution importlib cannot see: nvidia-cutlass-dsl puts `cutlass` on sys.path
# with a .pth file (its files belong to nvidia-cutlass-dsl-libs-core, which it requires).
DISTRIBUTION_OF = {"cutlass": "nvidia-cutlass-dsl"}
# Imported under `except ImportError` (kernels/cache.py: a version in the cache fingerprint).
OPTIONAL = {"tvm_ffi"}
# md5 of the Apache License 2.0 text as apache.org publishes it (LICENSE-2.0.txt).
APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"


def imported_modules(package: Path) -> dict[str, set[str]]:
    """Top-level module -> the package files importing it (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.partition(".")[0], set()).add(path.name)
    return found


def requirement_name(spec: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", spec).group(0).lower().replace("_", "-")


def test_every_third_party_import_is_a_declared_dependency():
    declared = {requirement_name(spec) for spec in PROJECT["dependencies"]}
    distributions = packages_distributions()
    third_party = {
        module: files
        for module, files in imported_modules(Path(vllm_fa4.__file__).parent).items()
        if module not in sys.stdlib_module_names and module != "vllm_fa4"
    }
    assert {"cutlass", "torch", "vllm"} <= set(third_party)  # the scan sees the imports
    undeclared = {}
    for module, files in sorted(third_party.items()):
        if module in OPTIONAL:
            continue
        dist = DISTRIBUTION_OF.get(module) or distributions[module][0]
        if requirement_name(dist) not in declared:
            undeclared[module] = (dist, sorted(files))
    assert not undeclared, f"imported but not in pyproject's dependencies: {undeclared}"


def test_cutlass_dsl_range_covers_the_installed_version():
    """The declared nvidia-cutlass-dsl floor is the version the kernels are built for."""
    from importlib.metadata import version

    (spec,) = [s for s in PROJECT["dependencies"] if requirement_name(s) == "nvidia-cutlass-dsl"]
    floor = re.search(r">=\s*([0-9.]+)", spec).group(1)
    as_tuple = lambda v: tuple(int(x) for x in re.findall(r"\d+", v)[:3])
    assert as_tuple(version("nvidia-cutlass-dsl")) >= as_tuple(floor)


def test_license_is_the_apache_2_text_and_goes_into_the_wheel():
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.md5(text).hexdigest() == APACHE_2_MD5, "LICENSE is not the Apache-2.0 text"


def test_readme_names_every_extra():
    readme = (ROOT / "README.md").read_text()
    for extra in PROJECT["optional-dependencies"]:
        assert f"`{extra}`" in readme, f"the README does not mention the {extra!r} extra"
