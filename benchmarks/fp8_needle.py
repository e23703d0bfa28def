"""A needle retrieval on the FP8 KV cache, kernel level (issue 30's long-context check).

vLLM's FP8 prefill once lost a 128k needle test (91 % to 13 %) to its FP8 P V sums. No small
real model here reads 32k+ tokens, so this plants the needles in the kernel's own inputs: one
request whose last ``--queries`` tokens follow a long context (32k or 128k keys). For every
query row and head, one key of the context, drawn at random, is the row's needle: Q is set to
point at it (Q = c K_needle + b n, n random) so that its softmax weight is about
``exp(delta) / (1 + exp(delta))`` with delta drawn in [-2, 2] (about 12 % to 88 %), while the
other logits spread with standard deviation ``--spread``. The context's values share a mean
direction per KV head (``--mean-scale``), as real values do, so a kernel that drops the many
tiny weights of the rest of the context moves its output along that mean.

Readout per (row, head): O fitted by least squares on (V_needle, mean) gives the needle's
share and the context's share. Each contender's shares are compared with the float64
reference on the same cache with the same 16-bit queries (what an exact kernel reads):
  needle err    mean / max |share - reference share| of the needle
  context err   the same for the context's share
  misread       rows whose needle share is off by more than 0.05
  out err       mean over rows of |O - O_ref| / |O_ref| (Euclidean, per row and head)
Contenders: ours-fp8 (``--fp8-variants``: ``default`` the key's serving pick per batch in the
exact mode; ``e4m3`` the key's ``VLLM_FA4_FP8_QUERY=e4m3`` long pick on every batch; or a
config spec), FA3-fp8 (what FLASH_ATTN runs with --kv-cache-dtype fp8: Q rounded to e4m3 at
q_scale 1.0), and ours / FA3 on fp8_ab.py's bf16 twin holding the dequantized values rounded
to bf16 (16-bit attention on nearly the same values: the yardstick).

  python benchmarks/fp8_needle.py --models llama-3.1-8b --contexts 32k,128k
  python benchmarks/fp8_needle.py --models gemma-2-9b --softcap 50 --fp8-variants "default e4m3"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fp8_ab  # noqa: E402
from _common import MODELS  # noqa: E402
from variants_ab import _softcap, _window_left, mask_header, mask_tag  # noqa: E402

from vllm_fa4.kernels.config import KernelConfig  # noqa: E402
from vllm_fa4.paged_prefill.policy import Fp8Query, serving_configs  # noqa: E402
from vllm_fa4.testing.cases import PagedCase, make_paged_case  # noqa: E402
from vllm_fa4.testing.needles import Readout, plant, read, shares  # noqa: E402

DT = torch.bfloat16
CONTEXTS = {"32k": 32768, "64k": 65536, "128k": 131072}


def resolve_variant(spec: str, case: PagedCase) -> KernelConfig | None:
    """``default`` -> None (serving picks, exact mode); ``e4m3`` -> the key's long pick under
    VLLM_FA4_FP8_QUERY=e4m3; anything else parsed as a config spec."""
    if spec == "default":
        return None
    if spec == "e4m3":
        return serving_configs(case.key, fp8_query=Fp8Query.E4M3).long
    return KernelConfig.parse(spec)


def contenders(case: PagedCase, specs: list[str], seed: int) -> dict:
    """name -> callable returning the contender's output, in print order (the 16-bit twin
    from fp8_ab, with the planted Q)."""

    def launcher(on: PagedCase, plan):
        out = on.new_out()
        return lambda: on.ours(plan, out)

    fns = {}
    for spec in specs:
        config = resolve_variant(spec, case)
        name = "ours-fp8" if config is None else f"ours-fp8 {spec}"
        if spec == "e4m3":
            name += f" ({config.spec})"
        fns[name] = launcher(case, case.plan(config))
    fa3_out = case.new_out().to(torch.bfloat16)  # FA3-FP8 writes bf16
    fa3 = fp8_ab.fa3_fp8_call(case, fa3_out)

    def fa3_fp8():
        fa3()
        return fa3_out

    fns["FA3-fp8"] = fa3_fp8
    twin = fp8_ab.bf16_twin(case, seed)
    twin.q.copy_(case.q)
    fns["ours-bf16"] = launcher(twin, twin.plan())
    twin_out = twin.new_out()
    fns["FA3-bf16"] = lambda: twin.fa3(twin_out)
    return fns


def run(model: str, context: str, page: int, args) -> dict[str, Readout]:
    shape = MODELS[model]
    specs = [(args.queries, CONTEXTS[context] + args.queries)]
    case = make_paged_case(
        specs,
        shape.num_q_heads,
        shape.num_kv_heads,
        shape.head_dim,
        page,
        DT,
        "cuda",
        seed=args.seed,
        fp8_kv=True,
        window_left=args.window_left,
        softcap=args.softcap,
    )
    needles = plant(case, args.spread, args.mean_scale, args.seed)
    ref, _ = case.reference(compute_dtype=torch.float64)
    want = shares(ref, needles)
    label = f"{model} {args.queries}@{context} p{page}"
    tag = mask_tag(window_left=args.window_left, softcap=args.softcap, sinks=False)
    label += f" {tag}" if tag else ""
    low, high = (float(want.needle.quantile(p)) for p in (0.05, 0.95))
    print(
        f"{label}: reference needle share mean {float(want.needle.mean()):.3f} (5-95 %: "
        f"{low:.3f}-{high:.3f}), context share mean {float(want.context.mean()):.3f}",
        flush=True,
    )
    found = {}
    for name, fn in contenders(case, args.fp8_variants.split(), args.seed).items():
        out = fn()
        torch.cuda.synchronize()
        found[name] = r = read(out, ref, needles)
        print(
            f"  {name:<66} needle err mean {r.needle_mean:.2e} max {r.needle_max:.2e} | context "
            f"err mean {r.context_mean:.2e} max {r.context_max:.2e} | misread {r.misread} | out "
            f"err {r.out_rel:.2e} | nonfinite rows {r.nonfinite_rows}",
            flush=True,
        )
    return found


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="llama-3.1-8b,gemma-2-9b")
    ap.add_argument("--contexts", default="32k,128k", help=f"of: {', '.join(CONTEXTS)}")
    ap.add_argument("--pages", default="16")
    ap.add_argument("--queries", type=int, default=512, help="query rows after the context")
    ap.add_argument("--fp8-variants", default="default e4m3")
    ap.add_argument("--spread", type=float, default=1.5, help="std of the other logits")
    ap.add_argument("--mean-scale", type=float, default=0.5, help="std of the values' mean")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-j", "--jobs", type=int, default=8, help="parallel compiles first")
    ap.add_argument("--window-left", type=_window_left, default=None)
    ap.add_argument("--softcap", type=_softcap, default=None)
    args = ap.parse_args(argv)
    unknown = [c for c in args.contexts.split(",") if c not in CONTEXTS]
    if unknown:
        ap.error(f"unknown contexts {unknown}; known: {', '.join(CONTEXTS)}")
    if args.queries < 1:
        ap.error("--queries must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    # fp8_ab's twin and precompile read the model features from its FEATURES
    fp8_ab.FEATURES.update(window_left=args.window_left, softcap=args.softcap, sinks=False)
    named = [s for s in args.fp8_variants.split() if s not in ("default", "e4m3")]
    variants = [KernelConfig.parse(s) for s in named]
    fp8_ab.precompile(
        args.models.split(","),
        [int(p) for p in args.pages.split(",")],
        variants,
        args.jobs,
        e4m3_picks=True,
    )
    print(
        f"device={torch.cuda.get_device_name()} kv=float8_e4m3fn queries={args.queries} "
        f"spread={args.spread} mean_scale={args.mean_scale} seed={args.seed} "
        f"{mask_header(window_left=args.window_left, softcap=args.softcap, sinks=False)}"
    )
    worst: dict[str, list[float]] = {}
    for model in args.models.split(","):
        for context in args.contexts.split(","):
            for page in (int(p) for p in args.pages.split(",")):
                for name, r in run(model, context, page, args).items():
                    worst.setdefault(f"{model} {name}", []).append(r.needle_max)
    print("largest needle-share error over the cases (the reference: float64, same cache):")
    for name, errs in worst.items():
        print(f"  {name:<72} {max(errs):.2e}")


if __name__ == "__main__":
    main()
