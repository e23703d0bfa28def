"""Per-request error of FA3 and of every serving config on a sliding-window case (GPU).

python3 tools/diag_window.py --window 999 --page 16
"""

import argparse

import torch

from vllm_fa4.kernels.config import DEBUG_BASELINE
from vllm_fa4.paged_prefill.policy import serving_configs
from vllm_fa4.paged_prefill.run import run_prefill
from vllm_fa4.testing import cases


def per_request(out, ref, cu):
    errs = []
    for b in range(len(cu) - 1):
        d = (out[cu[b] : cu[b + 1]].float() - ref[cu[b] : cu[b + 1]]).abs()
        nan = int(torch.isnan(d).sum())
        d = d.nan_to_num(float("inf"))
        worst = d.flatten().argmax().item()
        t, h = worst // (d.shape[1] * d.shape[2]), (worst // d.shape[2]) % d.shape[1]
        errs.append(f"req{b}: max {d.max().item():.3e} nan {nan} at t{t} h{h}")
    return "; ".join(errs)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--window", type=int, default=999)
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--specs", default="1000:1000,333:333,77:1300")
    p.add_argument("--fit-request", type=int, default=None)
    p.add_argument("--fit-max", type=int, default=1400)
    p.add_argument("--fit-step", type=int, default=8)
    a = p.parse_args()
    specs = [tuple(int(x) for x in s.split(":")) for s in a.specs.split(",")]
    case = cases.make_paged_case(
        specs, 32, 8, 128, a.page, torch.bfloat16, "cuda", seed=0, window_left=a.window
    )
    cu = [int(x) for x in case.cu_seqlens_q.tolist()]
    ref, _ = case.reference()
    lowp, _ = case.reference(compute_dtype=case.dtype)
    print("lowp ", per_request(lowp, ref, cu))
    kv = case.kv_cache.clone().nan_to_num_(0.0)
    out = torch.empty_like(case.q).contiguous()
    fa3 = case.fa3(out, k_cache=kv[..., :128], v_cache=kv[..., 128:])
    print("FA3  ", per_request(fa3, ref, cu))
    for config in dict.fromkeys((*serving_configs(case.key).all, DEBUG_BASELINE)):
        plan = case.plan(config)
        o = case.new_out()
        run_prefill(plan, case.q, case.k_cache, case.v_cache, o, softmax_scale=case.softmax_scale)
        torch.cuda.synchronize()
        print(f"{config.spec:60s}", per_request(o, ref, cu))
    if a.fit_request is not None:  # which window does FA3 apply to each row of this request?
        b = a.fit_request
        rows = slice(cu[b], cu[b + 1])
        grid = sorted({*range(0, a.fit_max, a.fit_step), a.window})
        errs = []
        for w in [*grid, None]:
            r, _ = case.reference(window_left=w)
            errs.append((fa3[rows].float() - r[rows]).abs().amax(dim=(1, 2)))
        errs = torch.stack(errs)  # [windows, rows]
        best = errs.argmin(dim=0)
        labels = [*grid, None]
        for t in range(0, best.numel(), max(1, best.numel() // 16)):
            at_window = errs[grid.index(a.window), t]
            print(
                f"req{b} row {t}: FA3 best fit window {labels[best[t]]} "
                f"(err {errs[best[t], t]:.2e}; at {a.window}: {at_window:.2e})"
            )


if __name__ == "__main__":
    main()
