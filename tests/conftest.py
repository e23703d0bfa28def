"""Test-suite switches: `gpu` tests need an SM90 GPU, `slow` ones run only when asked,
`compile_matrix` and `compile_variants` ones only when ``-m`` selects them (pyproject's
addopts leave them out).

VLLM_FA4_TEST_INSTALLED=1 (set by .ci/run): the suite tests an installed wheel, so a
``vllm_fa4`` imported from this checkout is an error; the package's location is printed.

Compiled kernels go to one disk cache per run (``VLLM_FA4_CACHE_DIR``, unless the caller
set it), shared by the run's pytest-xdist workers, which inherit the environment.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]


def pytest_report_header(config):
    import vllm_fa4

    return f"vllm_fa4 {vllm_fa4.__version__}: {vllm_fa4.__file__}"


def pytest_configure(config):
    if os.environ.get("VLLM_FA4_CACHE_DIR") or hasattr(config, "workerinput"):
        return  # the caller's cache, or a worker: the controller has set it
    # Not the user's serving cache (~/.cache/vllm_fa4/kernels): a test run keeps its own.
    cache_dir = tempfile.mkdtemp(prefix="vllm-fa4-test-kernels-")
    os.environ["VLLM_FA4_CACHE_DIR"] = cache_dir
    config.add_cleanup(lambda: shutil.rmtree(cache_dir, ignore_errors=True))


def pytest_sessionstart(session):
    if os.environ.get("VLLM_FA4_TEST_INSTALLED") != "1":
        return
    import vllm_fa4

    where = Path(vllm_fa4.__file__).resolve()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:  # shown with -q too
        reporter.write_line(f"vllm_fa4 under test: {where}")
    if where.parent == CHECKOUT / "vllm_fa4":  # (a venv inside the checkout is fine)
        raise pytest.UsageError(
            f"VLLM_FA4_TEST_INSTALLED=1 but vllm_fa4 was imported from the checkout ({where}), "
            "not from the installed wheel"
        )


def _has_sm90() -> bool:
    from vllm_fa4.paged_prefill.route import device_unsupported_reason

    return device_unsupported_reason() is None


def pytest_collection_modifyitems(config, items):
    sm90 = _has_sm90()
    run_slow = os.environ.get("VLLM_FA4_RUN_SLOW") == "1"
    skip_gpu = pytest.mark.skip(reason="needs an SM90 (Hopper) GPU")
    skip_slow = pytest.mark.skip(reason="slow end-to-end test; set VLLM_FA4_RUN_SLOW=1")
    for item in items:
        if "gpu" in item.keywords and not sm90:
            item.add_marker(skip_gpu)
        elif "slow" in item.keywords and not run_slow:
            item.add_marker(skip_slow)
