"""testing/needles.py (issue 30's needle retrieval on the FP8 cache) on the CPU: the planted
needles carry the weights they were built for, the readout tells a kernel that drops the
context's tail from one that reads the needle coarsely, and benchmarks/fp8_needle.py's options
and variant names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from vllm_fa4.paged_prefill.policy import FP8_E4M3_Q_LONG
from vllm_fa4.testing.cases import FP8_NAN_BYTE, make_paged_case
from vllm_fa4.testing.needles import MISREAD, plant, read, request_slots, shares

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fp8_needle  # noqa: E402

CONTEXT, QUERIES = 4096, 48


def _case(hd=128, window_left=None, softcap=None, specs=None, fp8=True):
    specs = specs or [(QUERIES, CONTEXT + QUERIES)]
    return make_paged_case(
        specs, 4, 2, hd, 16, torch.bfloat16, "cpu", seed=3, fp8_kv=fp8,
        window_left=window_left, softcap=softcap,
    )  # fmt: skip


def _needle_weights(case, needles) -> torch.Tensor:
    """Each (row, head)'s softmax weight on its needle, from the logits in float64."""
    hd, hq = case.head_dim, case.num_q_heads
    blk, off = request_slots(case)
    keys = case.kv_cache[blk, off, :, :hd].double() * case.k_scale
    q = case.q[needles.rows].double()
    kv_head = torch.arange(hq) // (hq // case.num_kv_heads)
    logits = torch.einsum("rhd,nhd->rhn", q, keys[:, kv_head]) * case.softmax_scale
    if case.softcap is not None:
        logits = case.softcap * torch.tanh(logits / case.softcap)
    pos = CONTEXT + torch.arange(q.shape[0])
    n = torch.arange(keys.shape[0])
    seen = n[None, :] <= pos[:, None]
    if case.window_left is not None:
        seen &= n[None, :] >= pos[:, None] - case.window_left
    weights = logits.masked_fill(~seen[:, None, :], float("-inf")).softmax(-1)
    return weights.gather(-1, needles.keys.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize(
    "hd, window_left, softcap", [(128, None, None), (256, None, 50.0), (128, 1023, None)]
)
def test_planted_needles_carry_their_weights(hd, window_left, softcap):
    case = _case(hd, window_left, softcap)
    needles = plant(case)
    ref, _ = case.reference(compute_dtype=torch.float64)
    got = shares(ref, needles)
    want = _needle_weights(case, needles)
    # the readout recovers each needle's weight; the rest is the context's mean (up to the
    # mean of its values' random parts: about 0.006 over the 1k-key window)
    assert float((got.needle - want).abs().mean()) < 0.005
    assert float((got.needle + got.context - 1).abs().mean()) < 0.01
    # weights spread over most of (0, 1), needles drawn from the context the row sees
    assert float(want.quantile(0.05)) < 0.15 and float(want.quantile(0.95)) > 0.85
    assert int(needles.keys.max()) < CONTEXT
    if window_left is not None:
        assert int(needles.keys.min()) >= CONTEXT - window_left


def test_plant_rewrites_the_request_only():
    case = _case()
    raw = case.kv_cache.view(torch.uint8)
    poisoned = int((raw == FP8_NAN_BYTE).sum())
    keys_before = case.kv_cache[..., : case.head_dim].view(torch.uint8).clone()
    plant(case)
    assert int((raw == FP8_NAN_BYTE).sum()) == poisoned  # unused slots stay NaN
    assert torch.equal(case.kv_cache[..., : case.head_dim].view(torch.uint8), keys_before)


def test_the_readout_tells_a_dropped_tail_from_a_coarse_needle():
    case = _case()
    needles = plant(case)
    ref, _ = case.reference(compute_dtype=torch.float64)
    weights = _needle_weights(case, needles)
    rows = needles.rows
    # a kernel that keeps the needle and loses every other key's weight (P underflowing)
    dropped = ref.clone()
    dropped[rows] = weights.unsqueeze(-1) * needles.value
    r = read(dropped, ref, needles)
    assert r.needle_mean < 0.005 and r.context_mean > 0.3 and r.misread == 0
    # a kernel whose needle logits are off by 0.5 (a coarse Q K^T)
    w = weights * torch.exp(torch.tensor(0.5)) / (1 + weights * (torch.exp(torch.tensor(0.5)) - 1))
    shifted = ref.clone()
    shifted[rows] = w.unsqueeze(-1) * needles.value + (1 - w).unsqueeze(-1) * needles.mean
    r = read(shifted, ref, needles)
    assert r.needle_mean > 0.05 and r.misread > 0
    # the reference rounded to bf16 reads as exact; a NaN row is counted, not averaged
    rounded = ref.to(torch.bfloat16)
    rounded[0, 1, 5] = float("nan")
    r = read(rounded, ref, needles)
    assert r.needle_max < 0.005 and r.misread == 0 and r.nonfinite_rows == 1
    assert MISREAD == 0.05


def test_plant_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="one-request FP8"):
        plant(_case(fp8=False))
    with pytest.raises(ValueError, match="one-request FP8"):
        plant(_case(specs=[(8, 100), (8, 100)]))
    with pytest.raises(ValueError, match="no context key"):
        plant(_case(window_left=16))  # 48 queries, a 17-key window: late rows see no context
    with pytest.raises(ValueError, match="context before"):
        plant(_case(specs=[(64, 64)]))


def test_the_tools_twin_holds_the_planted_case(monkeypatch):
    """benchmarks/fp8_needle.py's 16-bit contenders run on fp8_ab's twin with the planted Q:
    the same pages, the dequantized values (the new mean included; rounded to bf16, since the
    case's scales are not powers of two), the same queries."""
    import fp8_ab

    def on_cpu(*args, **kwargs):
        return make_paged_case(*args[:6], "cpu", **kwargs)

    monkeypatch.setattr(fp8_ab, "make_paged_case", on_cpu)
    monkeypatch.setitem(fp8_ab.FEATURES, "window_left", None)
    case = _case()
    plant(case)
    twin = fp8_ab.bf16_twin(case, seed=3)
    twin.q.copy_(case.q)
    assert torch.equal(twin.block_table, case.block_table)
    blk, off = request_slots(case)
    want = case.dequantized_kv_cache()[blk, off].to(torch.bfloat16)
    assert torch.equal(twin.kv_cache[blk, off], want)
    assert torch.equal(twin.q, case.q)


def test_the_tool_names_its_variants_and_refuses_unknown_contexts():
    case = _case()
    assert fp8_needle.resolve_variant("default", case) is None
    e4m3 = fp8_needle.resolve_variant("e4m3", case)
    assert e4m3.spec == FP8_E4M3_Q_LONG[(128, False, False)]
    args = fp8_needle.parse_args([])
    assert args.contexts == "32k,128k" and args.fp8_variants == "default e4m3"
    for bad in (["--contexts", "1m"], ["--queries", "0"]):
        with pytest.raises(SystemExit):
            fp8_needle.parse_args(bad)
