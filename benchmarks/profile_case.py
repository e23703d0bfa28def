"""One case, each contender launched once inside a profiler window, for Nsight Compute.

    ncu --clock-control none --profile-from-start off -k regex:"Sm90PagedPrefill|device_kernel" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        python benchmarks/profile_case.py --case 8kx2 --page 128 \
            --contenders "default default@l2=32"

``--model gemma-2-9b --softcap 50`` (``--window-left N``) profiles a model feature, both
contenders given it as in variants_ab.py.

Contenders as in variants_ab.py (config spec, optional ``@l2=MiB``); FA3 (vLLM's build) is
launched after them on the same inputs, then FA3c (FA3 on the same K/V laid out contiguously,
FA3 at its best) unless ``--no-fa3c``. Every contender is warmed up (compiled) first, and
the outputs are checked against each other, so a profile never shows a broken kernel.
"""

import argparse

import torch
from _common import MODELS
from variants_ab import (
    CASES,
    DEFAULT_MODEL,
    DT,
    _softcap,
    _window_left,
    fa3_call,
    fa3_contiguous_call,
    ours_call,
    parse_contender,
)

from vllm_fa4.testing.cases import make_paged_case


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="8kx2", choices=list(CASES))
    ap.add_argument("--page", type=int, default=128)
    ap.add_argument("--contenders", default="default")
    ap.add_argument("--model", default=DEFAULT_MODEL, choices=list(MODELS))
    ap.add_argument("--window-left", type=_window_left, default=None, help="as variants_ab.py")
    ap.add_argument("--softcap", type=_softcap, default=None, help="as variants_ab.py")
    ap.add_argument("--sinks", action="store_true", help="as variants_ab.py")
    ap.add_argument("--no-fa3c", action="store_true", help="leave FA3 on contiguous K/V out")
    args = ap.parse_args()
    shape = MODELS[args.model]
    heads = (shape.num_q_heads, shape.num_kv_heads, shape.head_dim)
    case = make_paged_case(
        CASES[args.case][1],
        *heads,
        args.page,
        DT,
        "cuda",
        seed=0,
        window_left=args.window_left,
        softcap=args.softcap,
        sinks=args.sinks,
    )
    fns = {}
    for text in args.contenders.split():
        config, options = parse_contender(text)
        out = case.new_out()
        fns[text] = (ours_call(case, case.plan(config, **options), out), out)
    fa3_out = case.new_out()
    fns["FA3"] = (fa3_call(case, fa3_out), fa3_out)
    if not args.no_fa3c:
        fa3c = fa3_contiguous_call(case)
        fns["FA3c"] = (fa3c, fa3c.out)
    for fn, _ in fns.values():  # compile / warm up outside the window
        fn()
    torch.cuda.synchronize()
    for name, (_, out) in fns.items():
        err = (out.float() - fa3_out.float()).abs().max().item()
        print(f"{name}: max |out - FA3| = {err:.3g}")
        assert err < 0.05, name
    torch.cuda.cudart().cudaProfilerStart()
    for fn, _ in fns.values():
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("profiled:", " ".join(fns))


if __name__ == "__main__":
    main()
