#!/usr/bin/env python3
"""CPU error probe for issue 30's Q K^T-in-FP8 design (docs/perf-notes.md, session 9): one
query block attending a long context, attention computed in float64 from the operands each
variant's hardware would see, against two float64 references: the dequantized FP8 cache with
the model's bf16 Q (the fuzz suite's yardstick: what the kernel adds), and a bf16 cache (the
SmolLM2 rule's yardstick: what the FP8 path as a whole costs). No GPU; synthetic Q/K/V, a few
channels of Q and K eight times the others (as LLM activations have).

    python tools/fp8_qk_error_probe.py [--context 32768] [--seeds 4]

Variants:
  today     bf16 Q, K/V exact from e4m3 (fp16 GEMMs), P rounded to fp16 for P V
  hybrid    Q in e4m3 with a per-row scale (row amax / 448), S from e4m3 x e4m3, P V as today
  hybrid14  hybrid with each 32-term partial sum of S rounded to 14 significant bits (a
            pessimistic model of Hopper's FP8 wgmma accumulator)
  split     Q split into two e4m3 halves under a power-of-two per-row scale p (hi = e4m3(q/p),
            lo = e4m3(q/p - hi): bf16's 8 significant bits are two e4m3's 4), S = p (hi K^T +
            lo K^T) from two e4m3 x e4m3 GEMMs (together one fp16 GEMM's tensor time), P V as
            today (session 10's FP8 SASS report, docs/results/2026-11-27/sass-fp8-hd128-p128)
  split14   split with each 32-term partial sum of each half rounded to 14 significant bits
  rounded   split's hi part alone (`fp8_qk_rounded`: Q rounded once to e4m3 under the power-of-two
            row scale, one e4m3 GEMM), P V as today
  fa3fp8    vLLM's FA3 FP8 path as modelled here: Q in e4m3 with scale 1.0, P in e4m3 for P V
"""

from __future__ import annotations

import argparse

import torch

E4M3_MAX = 448.0


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round to e4m3 (saturating at +-448), back in float64."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float64)


def round_bits(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round to ``bits`` significant bits (the exponent kept)."""
    m, e = torch.frexp(x)
    return torch.ldexp(torch.round(m * 2**bits) / 2**bits, e)


def operands(seed: int, m: int, n: int, d: int, peak: float, outlier: float):
    g = torch.Generator().manual_seed(seed)
    outliers = torch.ones(d, dtype=torch.float64)
    outliers[torch.randperm(d, generator=g)[:4]] = outlier
    q = torch.randn(m, d, generator=g, dtype=torch.float64) * outliers * peak
    k = torch.randn(n, d, generator=g, dtype=torch.float64) * outliers
    v = torch.randn(n, d, generator=g, dtype=torch.float64)
    q = q.to(torch.bfloat16).to(torch.float64)  # the model's Q
    k_scale, v_scale = k.abs().max() / E4M3_MAX, v.abs().max() / E4M3_MAX  # per-tensor
    bf16 = (k.to(torch.bfloat16).to(torch.float64), v.to(torch.bfloat16).to(torch.float64))
    return (q, e4m3(k / k_scale), k_scale, e4m3(v / v_scale), v_scale), bf16


def attend(s: torch.Tensor, v8: torch.Tensor, v_scale, p_round) -> torch.Tensor:
    p = torch.exp(s - s.max(dim=1, keepdim=True).values)
    o = p_round(p) @ v8
    return o * v_scale / p.sum(dim=1, keepdim=True)


def variants(q, k8, k_scale, v8, v_scale, scale):
    d = q.shape[1]
    fp16 = lambda p: p.to(torch.float16).to(torch.float64)  # noqa: E731
    row_scale = q.abs().amax(dim=1, keepdim=True) / E4M3_MAX
    q8_row = e4m3(q / row_scale)
    out = {
        "reference": attend(scale * k_scale * (q @ k8.T), v8, v_scale, lambda p: p),
        "today": attend(scale * k_scale * (q @ k8.T), v8, v_scale, fp16),
        "hybrid": attend(scale * k_scale * row_scale * (q8_row @ k8.T), v8, v_scale, fp16),
    }
    partial = sum(
        round_bits(q8_row[:, c : c + 32] @ k8[:, c : c + 32].T, 14) for c in range(0, d, 32)
    )
    out["hybrid14"] = attend(scale * k_scale * row_scale * partial, v8, v_scale, fp16)
    # A power-of-two row scale keeps q / p exact, so hi + lo is q / p itself wherever lo's
    # bits stay above e4m3's subnormal step (a row's entries of at least ~2^-10 of its
    # largest; tests/unit/test_fp8_kv.py).
    p2 = torch.exp2(torch.ceil(torch.log2(row_scale)))
    hi = e4m3(q / p2)
    lo = e4m3(q / p2 - hi)
    out["split"] = attend(scale * k_scale * p2 * ((hi + lo) @ k8.T), v8, v_scale, fp16)
    chains = sum(
        round_bits(half[:, c : c + 32] @ k8[:, c : c + 32].T, 14)
        for half in (hi, lo)
        for c in range(0, d, 32)
    )
    out["split14"] = attend(scale * k_scale * p2 * chains, v8, v_scale, fp16)
    # `fp8_qk_rounded`: the split's hi part alone (one e4m3 GEMM), P V as today
    out["rounded"] = attend(scale * k_scale * p2 * (hi @ k8.T), v8, v_scale, fp16)
    out["fa3fp8"] = attend(scale * k_scale * (e4m3(q) @ k8.T), v8, v_scale, e4m3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=32768, help="keys the block attends")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--peaks", default="0.25,1,3", help="Q scales (logit peakiness)")
    ap.add_argument("--outlier", type=float, default=8.0, help="the large channels' factor")
    args = ap.parse_args(argv)
    d, scale = args.head_dim, args.head_dim**-0.5
    print(
        f"context {args.context}, {args.rows} rows, head dim {d}, outlier channels x"
        f"{args.outlier:g}; max |O - ref| / max |ref|, worst of {args.seeds} seeds (mean |O - "
        "ref| / mean |ref| in parentheses)"
    )
    for peak in (float(x) for x in args.peaks.split(",")):
        worst: dict[str, tuple[float, float]] = {}
        for seed in range(args.seeds):
            fp8, (k16, v16) = operands(seed, args.rows, args.context, d, peak, args.outlier)
            outs = variants(*fp8, scale)
            q = fp8[0]
            refs = {
                "dequantized": outs.pop("reference"),
                "bf16 cache": attend(scale * (q @ k16.T), v16, 1.0, lambda p: p),
            }
            for ref_name, ref in refs.items():
                for name, o in outs.items():
                    err = (o - ref).abs()
                    mx = float(err.max() / ref.abs().max())
                    mean = float(err.mean() / ref.abs().mean())
                    old = worst.get((ref_name, name), (0.0, 0.0))
                    worst[(ref_name, name)] = (max(old[0], mx), max(old[1], mean))
        for ref_name in ("dequantized", "bf16 cache"):
            cells = ", ".join(
                f"{n} {mx:.1e} ({mean:.1e})"
                for (r, n), (mx, mean) in worst.items()
                if r == ref_name
            )
            print(f"Q x{peak:g} vs {ref_name}: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
