"""Needles in a 32k context on the FP8 cache (issue 30's long-context check, testing/needles.py):
each query row and head attends to one planted key with a weight of about 10-90 %, over
values that share a mean. The exact mode (16-bit Q) must read every needle and the context's
share as 16-bit attention on the dequantized values does; the e4m3 mode (Q rounded once, P V
16-bit) no worse than FLASH_ATTN's FP8 prefill (Q rounded, P in e4m3), which rounds Q the same
way. benchmarks/fp8_needle.py prints the same readout at 32k and 128k for the full shapes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from vllm_fa4.kernels.config import Fp8Qk
from vllm_fa4.paged_prefill.policy import Fp8Query, serving_configs
from vllm_fa4.testing.cases import make_paged_case
from vllm_fa4.testing.needles import plant, read

pytestmark = pytest.mark.gpu

CONTEXT, QUERIES = 32768, 256


def _readouts(hd: int, softcap: float | None):
    """Each contender's Readout on one seeded case: the exact mode's serving pick, the e4m3
    mode's long pick, our serving pick on the bf16 twin (the dequantized values), FA3-FP8."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from fp8_ab import fa3_fp8_call  # imports vLLM and triton: GPU runs only

    heads = (32, 8) if hd == 128 else (16, 8)  # Llama-3.1-8B's, Gemma-2-9B's
    case = make_paged_case(
        [(QUERIES, CONTEXT + QUERIES)], *heads, hd, 16, torch.bfloat16, "cuda", seed=5,
        fp8_kv=True, softcap=softcap,
    )  # fmt: skip
    needles = plant(case, seed=5)
    ref, _ = case.reference(compute_dtype=torch.float64)
    twin = make_paged_case(
        case.specs, *heads, hd, 16, torch.bfloat16, "cuda", seed=5, softcap=softcap
    )
    twin.kv_cache.copy_(case.dequantized_kv_cache().to(torch.bfloat16))
    twin.q.copy_(case.q)
    e4m3 = serving_configs(case.key, fp8_query=Fp8Query.E4M3).long
    assert e4m3.fp8_qk is Fp8Qk.ROUNDED_Q, f"no e4m3 pick for {case.key}"
    found = {
        "exact": case.ours(case.plan(), case.new_out()),
        "e4m3": case.ours(case.plan(e4m3), case.new_out()),
        "bf16": twin.ours(twin.plan(), twin.new_out()),
    }
    fa3_out = case.new_out().to(torch.bfloat16)
    fa3_fp8_call(case, fa3_out)()
    found["FA3-fp8"] = fa3_out
    torch.cuda.synchronize()
    return {name: read(out, ref, needles) for name, out in found.items()}


@pytest.mark.parametrize("hd, softcap", [(128, None), (256, 50.0)], ids=["hd128", "hd256-cap50"])
def test_needles_in_32k_on_the_fp8_cache(hd, softcap):
    r = _readouts(hd, softcap)
    for name, found in r.items():
        assert found.nonfinite_rows == 0, (name, found)
    exact, bf16 = r["exact"], r["bf16"]
    # the exact mode reads the cache as 16-bit attention does: every needle, the context too
    assert exact.misread == 0 and exact.needle_max < 0.01 and exact.context_max < 0.01, exact
    assert exact.out_rel <= 2 * bf16.out_rel + 1e-4, (exact, bf16)
    # the e4m3 mode rounds Q as FLASH_ATTN-FP8 does and keeps P V 16-bit: no worse than it
    e4m3, fa3 = r["e4m3"], r["FA3-fp8"]
    assert e4m3.needle_mean <= 1.5 * fa3.needle_mean, (e4m3, fa3)
    assert e4m3.context_mean <= 1.5 * fa3.context_mean, (e4m3, fa3)
    assert e4m3.out_rel <= 1.5 * fa3.out_rel, (e4m3, fa3)
