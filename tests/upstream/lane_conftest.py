"""conftest.py of the vLLM backend-tests lane (``tools/upstream_lane.sh`` copies it next to vLLM
0.26.0's or 0.33.0's ``tests/v1/attention/test_attention_backends.py``; not a conftest of this
repo).

- The bits of vLLM's own ``tests/conftest.py`` that the test file uses: the fixture
  ``default_vllm_config`` and the autouse cleanup, verbatim in effect, without that conftest's
  other imports (tblib, PIL, ``tests.models``...) that the GPU machine lacks.
- Registers FA4 the way vLLM's plugin loader does in every process (``vllm_fa4.register()``),
  so the patched backend lists can name ``AttentionBackendEnum.FA4``.
- ``FA4_LANE_BACKENDS``: the backends each upstream comparison runs, comma-separated names
  (default ``FLASH_ATTN,FA4``; ``all``: upstream's lists plus FA4). Batches, tolerances and the
  SDPA/flex reference stay upstream's; only the other backends are left out, for time
  (FlashInfer and compiled flex attention JIT-compile for minutes).
- A test whose model config is not under the lane's root (the GPU machine is offline) is
  skipped with a reason naming the missing config, and a comparison left with none of the
  lane's backends is skipped naming both lists (never a silent pass). Configurations
  FA4 does not support are turned away by vLLM's selector in the patched test itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import vllm_fa4

vllm_fa4.register()

BACKENDS_ENV = "FA4_LANE_BACKENDS"
DEFAULT_BACKENDS = "FLASH_ATTN,FA4"


@pytest.fixture
def default_vllm_config():
    """vLLM's tests/conftest.py (0.26.0 and 0.33.0 alike): a default VllmConfig for code that
    reads the current one."""
    from vllm.config import VllmConfig, set_current_vllm_config

    config = VllmConfig()
    with set_current_vllm_config(config):
        yield config


@pytest.fixture(autouse=True)
def cleanup_fixture():
    """vLLM's tests/conftest.py: global cleanup after every test (0.33.0 skips it for tests
    marked skip_global_cleanup, which the lane's test file has none of)."""
    yield
    from vllm.distributed import cleanup_dist_env_and_memory

    cleanup_dist_env_and_memory()


def _backend_name(backend) -> str:
    return backend if isinstance(backend, str) else backend.name


def _wanted_backends() -> set[str] | None:
    spec = os.environ.get(BACKENDS_ENV, DEFAULT_BACKENDS).strip()
    if spec == "all":
        return None
    return {name.strip() for name in spec.split(",") if name.strip()}


def _narrow(module, wanted: set[str]) -> None:
    """Wrap the module's ``_test_backend_correctness`` so it compares only ``wanted``."""
    inner = getattr(module, "_test_backend_correctness", None)
    if inner is None or getattr(inner, "fa4_lane_wanted", None) == wanted:
        return
    inner = getattr(inner, "fa4_lane_inner", inner)

    def narrowed(batch_spec, model, backend_to_test, *args, **kwargs):
        chosen = [b for b in backend_to_test if _backend_name(b) in wanted]
        if not chosen:  # a skip, not a pass: nothing was compared
            names = sorted(_backend_name(b) for b in backend_to_test)
            pytest.skip(f"none of {names} is among the lane's backends {sorted(wanted)}")
        inner(batch_spec, model, chosen, *args, **kwargs)

    narrowed.fa4_lane_inner = inner
    narrowed.fa4_lane_wanted = wanted
    module._test_backend_correctness = narrowed


def pytest_collection_modifyitems(config, items):
    wanted = _wanted_backends()
    root = Path(config.rootpath)
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and wanted is not None:
            _narrow(module, wanted)
        params = getattr(getattr(item, "callspec", None), "params", {})
        model = params.get("model")
        if isinstance(model, str) and not (root / model / "config.json").is_file():
            item.add_marker(
                pytest.mark.skip(
                    reason=f"model config {model} not available offline (prepare --models DIR "
                    f"puts DIR/{model}/config.json under the lane's root)"
                )
            )
