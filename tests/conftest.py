"""Test-suite switches: `gpu` tests need an SM90 GPU, `slow` ones run only when asked."""

import os

import pytest


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
