"""benchmarks/fp8_ab.py --accuracy (issue 30's long-context check) on the CPU: its error
summary and its cases; the GPU run itself is a benchmark (docs/benchmarks.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fp8_ab  # noqa: E402


def test_errors_measure_finite_rows_and_count_the_others():
    ref = torch.zeros(4, 2, 8)
    out = ref.clone().to(torch.bfloat16)
    out[0, 1, 3] = 0.5
    out[1] = 0.25
    out[2, 0, 0] = float("nan")  # a row with a NaN counts, and is left out of the error
    found = fp8_ab.errors(out, ref)
    assert found.nonfinite_rows == 1
    assert found.max_abs == 0.5
    assert found.mean_abs == pytest.approx((0.5 + 0.25 * 16) / (3 * 2 * 8))
    assert fp8_ab.errors(ref, ref) == fp8_ab.Errors(0.0, 0.0, 0)


def test_accuracy_defaults_to_the_long_contexts_and_refuses_unknown_cases():
    args = fp8_ab.parse_args(["--accuracy"])
    assert args.cases == fp8_ab.ACCURACY_CASES
    for name in args.cases.split(","):
        pages, specs = fp8_ab.ALL_CASES[name]
        assert max(k for _, k in specs) >= 32768 and 16 in pages
    assert fp8_ab.parse_args([]).cases == fp8_ab.DEFAULT_CASES
    with pytest.raises(SystemExit):
        fp8_ab.parse_args(["--cases", "512@1m"])
    with pytest.raises(SystemExit):  # one mode at a time
        fp8_ab.parse_args(["--accuracy", "--profile"])


def test_model_features_reach_the_keys_and_the_labels(monkeypatch):
    """--window-left / --softcap / --sinks: parsed and checked as in variants_ab.py, and every
    row label names them (a windowed log cannot pass for a plain one)."""
    args = fp8_ab.parse_args(["--window-left", "127", "--sinks", "--softcap", "50"])
    assert (args.window_left, args.softcap, args.sinks) == (127, 50.0, True)
    for bad in (["--window-left", "-1"], ["--softcap", "0"]):
        with pytest.raises(SystemExit):
            fp8_ab.parse_args(bad)
    assert fp8_ab._label("llama-3.1-8b", "4kx4", 16) == "llama-3.1-8b 4kx4 p16"
    monkeypatch.setitem(fp8_ab.FEATURES, "window_left", 127)
    monkeypatch.setitem(fp8_ab.FEATURES, "sinks", True)
    assert fp8_ab._label("gpt-oss-20b", "4kx4", 16) == "gpt-oss-20b 4kx4 p16 w127 sinks"
