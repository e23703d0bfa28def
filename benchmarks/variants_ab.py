"""Variant A/B timing: our SM90 paged prefill (one or more compile-time variants) vs vLLM's FA3
on Llama-3.1-8B shapes (Hq 32, Hkv 8, D 128, bf16, causal), in one process.

Run: python benchmarks/variants_ab.py [--variants "base pingpong base@l2=32"|all]
                                      [--pages 16,128] [--cases 512x32,16kx1] [--rounds 3]
Default variants: $VLLM_FA4_TEST_VARIANTS, else the process config (VLLM_FA4_VARIANT).
A contender is a config spec, optionally with a planner option: ``@l2=N`` orders the work list
in L2 sections of N MiB of K/V (``@l2=0`` plain LPT; default: the planner's default).
Inputs are vLLM-shaped (testing.cases: permuted pages, NaN in unused slots, q a strided view);
each config runs the planner's own work list.
Times: median over --rounds interleaved rounds of triton's do_bench median; spread is
(max - min) / median over the rounds. TFLOP/s counts causal FLOPs only.
"""

import argparse
import statistics

import torch
from triton.testing import do_bench

from vllm_fa4 import envs
from vllm_fa4.kernels.compile import prefill_forward
from vllm_fa4.kernels.config import KernelConfig
from vllm_fa4.testing.cases import make_paged_case
from vllm_fa4.testing.variants import config_id, parse_configs

HQ, HKV, HD, DT = 32, 8, 128, torch.bfloat16

# name -> (page sizes it runs at, [(q_len, k_len)] * batch)
CASES = {
    "512x32": ((16, 128), [(512, 512)] * 32),
    "1kx16": ((16, 128), [(1024, 1024)] * 16),
    "2kx8": ((16, 128), [(2048, 2048)] * 8),
    "4kx4": ((16, 128), [(4096, 4096)] * 4),
    "8kx2": ((16, 128), [(8192, 8192)] * 2),
    "16kx1": ((16, 128), [(16384, 16384)]),
    "2k@4k x8": ((16, 128), [(2048, 4096 + 2048)] * 8),
    "2k@8k x4": ((128,), [(2048, 8192 + 2048)] * 4),
    "2k@16k x2": ((16,), [(2048, 16384 + 2048)] * 2),
    "2k@64k": ((16, 128), [(2048, 65536 + 2048)]),
    "16k+31x512": ((16,), [(16384, 16384)] + [(512, 512)] * 31),
}


def parse_contender(text: str) -> tuple[KernelConfig | None, dict]:
    """``"spec[@l2=MiB]"`` -> (config, plan_prefill options); spec ``default``: None, the
    key's default config."""
    spec, _, option = text.partition("@")
    options = {}
    if option:
        name, _, value = option.partition("=")
        if name != "l2":
            raise ValueError(f"unknown planner option {option!r} in {text!r} (known: l2=MiB)")
        options["l2_section_bytes"] = int(value) << 20 if int(value) else None
    return (None if spec == "default" else KernelConfig.parse(spec)), options


def fa3_call(case, out=None):
    """vLLM's FA3 on a testing.cases PagedCase (the baseline of every ratio)."""
    return lambda: case.fa3(out)


def ours_call(case, plan, out):
    """Our kernel on the same case, launched directly (no route or validation)."""
    return lambda: prefill_forward(
        plan.key,
        plan.config,
        case.q,
        case.k_cache,
        case.v_cache,
        out,
        None,
        plan.args,
        case.softmax_scale,
    )


def run(name, specs, page, contenders, rounds=1):
    case = make_paged_case(specs, HQ, HKV, HD, page, DT, "cuda", seed=0)
    out = case.new_out()
    plans = {}
    for text in contenders:
        config, options = parse_contender(text)
        plans[text] = case.plan(config, **options)
    flops = sum(4 * HQ * HD * sum(k - q_len + j + 1 for j in range(q_len)) for q_len, k in specs)

    fns = {"FA3": fa3_call(case)}
    for spec, p in plans.items():
        fns[spec] = ours_call(case, p, out)
    # Interleave: every round times each contender once, in a rotated order, so clock or power
    # drift over the run hits all of them alike; report the median round.
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            times[n].append(do_bench(fns[n], return_mode="median") * 1e-3)
    med = {n: statistics.median(ts) for n, ts in times.items()}
    label = f"{name} p{page}"
    for i, n in enumerate(names):
        t = med[n]
        spread = (max(times[n]) - min(times[n])) / t if rounds > 1 else 0.0
        ratio = "" if n == "FA3" else f"  ours/FA3 {med['FA3'] / t:.3f}"
        print(
            f"{label if i == 0 else '':>16} | {n:<34} {flops / t / 1e12:6.1f} TFLOP/s "
            f"{t * 1e3:8.3f} ms  spread {spread:5.1%}{ratio}"
        )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=envs.sweep_variants_spec())
    ap.add_argument("--pages", default="16,128")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per case")
    args = ap.parse_args()
    if args.variants and "@" in args.variants:
        contenders = list(dict.fromkeys(args.variants.split()))
    else:
        contenders = list(dict.fromkeys(config_id(c) for c in parse_configs(args.variants)))
    pages = {int(p) for p in args.pages.split(",")}
    print(f"device={torch.cuda.get_device_name()} contenders={contenders}")
    for name in args.cases.split(","):
        case_pages, specs = CASES[name]
        for page in case_pages:
            if page in pages:
                run(name, specs, page, contenders, args.rounds)


if __name__ == "__main__":
    main()
