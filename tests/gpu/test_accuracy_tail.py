"""Issue 27's accuracy tail as regression tests: the four batches where ours' max error against
an fp64 reference was 2.2-3.2x FA3's (the suite's rule is 2x), rebuilt from the issue's
description (shapes, (q_len, k_len) lists, decode threshold, query scale, page size, heads).

The issue gives no data seeds: each case runs SEEDS (fixed, 0-4) and the worst seed's ratio
must stay <= 2. Ours is plan_prefill + the kernel on the batch's prefill requests (the ones
after the decodes, split at the decode threshold as vLLM's builder does); FA3 is vLLM's
``flash_attn_varlen_func`` on the same rows, q, block table and cache (its NaN-poisoned unused
slots zeroed: FA3 reads them, flash-attention #2374). Both against the float64 reference.
The errors are printed (``-s``, and a table at the end of the session).

As a script, a table of ours / FA3 per kernel config (to find which kernel change widened
the tail)::

    python tests/gpu/test_accuracy_tail.py --configs default \\
        "queue_with_work+overlap+q_tma+v_warp+lazy_max" \\
        "queue_with_work+pv_wait_mid+q_tma+v_warp"

``default`` is the serving pick (``policy.serving_configs(key).pick`` per batch, printed); other
strings are ``KernelConfig.parse`` specs. ``--seeds`` and ``--cases`` narrow the run. Exit
status 1 when a worst ratio is above 2.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

SEEDS = (0, 1, 2, 3, 4)  # the issue gives none; fixed so a run is repeatable
MAX_RATIO = 2.0  # the fuzz's rule: ours' max error <= 2x FA3's


@dataclass(frozen=True)
class TailCase:
    name: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    requests: tuple[tuple[int, int], ...]  # (q_len, k_len) in batch order, decodes first
    decode_threshold: int  # requests up front with q_len <= this are FA3's decodes
    q_scale: float  # queries multiplied by this (logits scale with it)
    issue: tuple[float, float]  # (ours, FA3) max errors issue 27 measured (H200)


# Case 4's batch held (7, 578) "among decodes"; the issue does not list them: five decodes
# with these contexts stand in for them (they are FA3's rows and do not enter the errors).
_DECODES = ((1, 1030), (1, 77), (1, 4097), (1, 2), (1, 600))

TAIL_CASES = (
    TailCase(
        "hd128-x5.9",
        32,
        8,
        128,
        16,
        ((1, 77), (1, 174), (1, 112), (3, 64), (83, 6128)),
        1,
        5.9,
        (0.0174, 0.0079),
    ),
    TailCase("hd64-x4.8", 32, 32, 64, 128, ((320, 7423),), 1, 4.8, (0.0173, 0.0080)),
    TailCase(
        "hd128-long",
        28,
        4,
        128,
        64,
        ((2364, 2560), (896, 6912), (18, 2561)),
        1,
        1.0,
        (0.0057, 0.0022),
    ),
    TailCase("hd64-decodes", 40, 8, 64, 32, (*_DECODES, (7, 578)), 1, 1.0, (0.0036, 0.0011)),
)


@dataclass(frozen=True)
class TailResult:
    ours: float  # max |ours - fp64 reference| over the prefill rows
    fa3: float  # the same for FA3
    out_max: float  # max |reference| over those rows
    config: str  # the config that ran (the serving pick for "default")

    @property
    def ratio(self) -> float:
        return self.ours / max(self.fa3, 1e-30)


def _split(requests, threshold: int) -> int:
    """vLLM's split_decodes_and_prefills on a reordered batch: leading requests with q_len <=
    threshold are decodes."""
    n = 0
    while n < len(requests) and requests[n][0] <= threshold:
        n += 1
    return n


def run_tail(tail: TailCase, config, seed: int, device: str = "cuda") -> TailResult:
    """One batch of ``tail`` at data seed ``seed`` with kernel config ``config`` (None: the
    serving pick)."""
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    from vllm_fa4.kernels.launch import prefill_forward
    from vllm_fa4.paged_prefill import plan_prefill
    from vllm_fa4.paged_prefill.policy import serving_configs
    from vllm_fa4.testing.cases import make_paged_case

    case = make_paged_case(
        tail.requests,
        tail.num_q_heads,
        tail.num_kv_heads,
        tail.head_dim,
        tail.page_size,
        torch.bfloat16,
        device,
        seed=seed,
    )
    case.q.mul_(tail.q_scale)
    nd = _split(tail.requests, tail.decode_threshold)
    start = int(case.query_start_loc_cpu[nd])  # the first prefill row
    qsl = case.query_start_loc_cpu[nd:] - start
    cu = case.cu_seqlens_q[nd:] - start
    seqused, table = case.seqused_k[nd:], case.page_table[nd:]
    plan = plan_prefill(
        qsl,
        case.seq_lens_cpu[nd:],
        key=case.key,
        configs=serving_configs(case.key, config),
        num_kv_heads=case.num_kv_heads,
        cu_seqlens_q=cu,
        seqused_k=seqused,
        page_table=table,
    )
    q = case.q[start:]
    out = torch.full(q.shape, float("nan"), dtype=q.dtype, device=device)
    prefill_forward(
        plan.key,
        plan.config,
        q,
        case.k_cache,
        case.v_cache,
        out,
        None,
        plan.args,
        case.softmax_scale,
    )
    kv = case.kv_view(case.kv_buffer.nan_to_num(0.0))
    fa3 = torch.empty(q.shape, dtype=q.dtype, device=device)
    flash_attn_varlen_func(
        q,
        kv[..., : tail.head_dim],
        kv[..., tail.head_dim :],
        max_seqlen_q=plan.max_seqlen_q,
        cu_seqlens_q=cu,
        max_seqlen_k=plan.max_seqlen_k,
        seqused_k=seqused,
        softmax_scale=case.softmax_scale,
        causal=True,
        block_table=table,
        fa_version=3,
        out=fa3,
    )
    torch.cuda.synchronize()
    ref, _ = case.reference(compute_dtype=torch.float64)
    ref = ref[start:]
    if not torch.isfinite(out).all():
        raise AssertionError(f"{tail.name} seed {seed}: ours left NaN/Inf rows")
    return TailResult(
        ours=float((out.double() - ref).abs().max()),
        fa3=float((fa3.double() - ref).abs().max()),
        out_max=float(ref.abs().max()),
        config=plan.config.spec,
    )


def _key(tail: TailCase):
    from vllm_fa4.kernels.config import KernelKey

    return KernelKey.for_layer(
        "bfloat16", tail.head_dim, tail.page_size, tail.num_q_heads, tail.num_kv_heads
    )


def _line(tail: TailCase, results: dict[int, TailResult]) -> str:
    seed, worst = max(results.items(), key=lambda kv: kv[1].ratio)
    picked = sorted({r.config for r in results.values()})
    ratios = " ".join(f"{s}:{r.ratio:.2f}" for s, r in sorted(results.items()))
    return (
        f"{tail.name:13} worst seed {seed}: ours {worst.ours:.4f} FA3 {worst.fa3:.4f} ratio "
        f"{worst.ratio:.2f} (out max {worst.out_max:.2f}; issue: ours {tail.issue[0]} FA3 "
        f"{tail.issue[1]}) | seeds {ratios} | ran {', '.join(picked)}"
    )


# ---------------------------------------------------------------------------------------------
# pytest

_report: list[str] = []


@pytest.fixture(scope="module")
def tail_report(request):
    yield _report
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and _report:
        reporter.write_line("accuracy tail (max error against fp64, prefill rows):")
        for line in _report:
            reporter.write_line("  " + line)


def _configs():
    from vllm_fa4.testing.variants import config_id, sweep_configs

    return [pytest.param(c, id=config_id(c)) for c in sweep_configs()]


@pytest.mark.parametrize("config", _configs())
@pytest.mark.parametrize("tail", TAIL_CASES, ids=[t.name for t in TAIL_CASES])
def test_accuracy_tail_within_twice_fa3(tail, config, tail_report):
    from vllm_fa4.testing.variants import config_id

    if config is not None and (why := config.unsupported_reason(_key(tail))):
        pytest.skip(f"{config.spec} does not build {tail.name}'s key: {why}")
    results = {seed: run_tail(tail, config, seed) for seed in SEEDS}
    line = f"[{config_id(config)}] {_line(tail, results)}"
    print(line)
    tail_report.append(line)
    worst = max(r.ratio for r in results.values())
    assert worst <= MAX_RATIO, f"ours' max error above {MAX_RATIO}x FA3's: {line}"


# ---------------------------------------------------------------------------------------------
# script


def main(argv=None) -> int:
    from vllm_fa4.kernels.config import KernelConfig

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--configs",
        nargs="+",
        default=["default"],
        help="'default' (the serving pick per batch) and/or KernelConfig spec strings",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    names = [t.name for t in TAIL_CASES]
    parser.add_argument("--cases", nargs="+", default=names, choices=names)
    args = parser.parse_args(argv)
    print(f"{torch.cuda.get_device_name()}; max error against fp64 on the prefill rows")
    worst = 0.0
    for spec in args.configs:
        config = None if spec == "default" else KernelConfig.parse(spec)
        print(f"config {spec}:")
        for tail in (t for t in TAIL_CASES if t.name in args.cases):
            if config is not None and (why := config.unsupported_reason(_key(tail))):
                print(f"  {tail.name:13} n/a: {why}")
                continue
            results = {seed: run_tail(tail, config, seed) for seed in args.seeds}
            print("  " + _line(tail, results))
            worst = max(worst, *(r.ratio for r in results.values()))
    print(f"worst ratio ours/FA3 {worst:.2f} (rule: <= {MAX_RATIO})")
    return 1 if worst > MAX_RATIO else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's vllm_fa4
    sys.exit(main())
