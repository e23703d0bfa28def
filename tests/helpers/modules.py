"""Load a script (tools/, benchmarks/, configs/) as a module by its path."""

import importlib.util
import sys


def load_file(name: str, path) -> object:
    """The module ``name`` from ``path``, registered in sys.modules (dataclasses look their
    module up while a class is built)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
