"""End to end, serving soak: benchmarks/soak.py against `vllm serve` (Llama-3.1-8B shapes, dummy
weights, prefix caching on), FA4 then FLASH_ATTN, at saturation with ~100- and ~32k-token
prompts, shared prefixes and cancellations (docs/reliability.md, "Serving soak").

Markers `gpu` and `slow` (tests/conftest.py): skipped without an SM90 GPU, and on one unless
VLLM_FA4_RUN_SLOW=1. Minutes per backend from VLLM_FA4_SOAK_MINUTES (default 5, so about 12
minutes in all with the two server starts). The report lands in VLLM_FA4_SOAK_OUT when set (else
a temporary folder). The pass rules are the script's; this test fails when FA4 breaks one.

    VLLM_FA4_RUN_SLOW=1 python3 -m pytest tests/e2e/test_serving_soak.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "soak.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("soak", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.gpu
def test_serving_soak_fa4_and_flash_attn(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script adds benchmarks/
    soak = _load_script()
    out = Path(os.environ.get("VLLM_FA4_SOAK_OUT") or tmp_path)
    minutes = os.environ.get("VLLM_FA4_SOAK_MINUTES", "5")

    rc = soak.main(["--out", str(out), "--minutes", minutes, "--backends", "FA4,FLASH_ATTN"])

    report = json.loads((out / "soak.json").read_text())
    fa4 = report["results"]["FA4"]
    broken = [f"{r['rule']}: {r['detail']}" for r in fa4["rules"] if not r["ok"]]
    assert not broken, broken
    assert rc == 0
    assert "FLASH_ATTN" in report["results"]  # the second phase ran (its verdict is reported)
