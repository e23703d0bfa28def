"""FP8 (e4m3) KV cache timing (issue 30): our kernel reading the fp8 cache with fp16 GEMMs vs
vLLM's FA3 FP8 call on the same cache, in one process, contenders interleaved.

Run: python benchmarks/fp8_ab.py [--models llama-3.1-8b,gemma-2-9b] [--pages 16,128]
                                 [--cases "4kx4,16kx1,2k@16k x2,2k@64k"] [--rounds 3]
                                 [--fp8-variants "queue_with_work+pv_wait_mid+q_tma+lazy_max"]

Contenders per case (same seeded values; testing.cases: permuted pages, NaN in unused slots):
  ours-fp8    our kernel on the e4m3 cache, the key's fp8 serving pick per batch (or each of
              --fp8-variants), k_scale in the softmax scale, v_scale in the epilogue
  FA3-fp8     what FLASH_ATTN serves with --kv-cache-dtype fp8: vLLM's paged FA3 on the same
              cache with Q quantized to e4m3 (per-tensor q_scale 1.0, vLLM's uncalibrated
              default; the quantization is vLLM's attention layer's work, outside the timed
              call) and q/k/v descales expanded to (num_seqs, num_kv_heads)
  ours-bf16   our kernel on a bf16 cache holding the dequantized values (its serving pick):
              what reading fp8 costs our kernel (ours-fp16 with --dtype float16)
  FA3-bf16    vLLM's paged FA3 on that bf16 cache (FA3-fp16)
--window-left N, --softcap C and --sinks give every contender that model feature (as
variants_ab.py; e.g. gpt-oss's windowed layers: --models gpt-oss-20b --window-left 127 --sinks).
Every row shows its time over FA3-fp8's (``/FA3fp8``: > 1 is faster than FA3-fp8).
Times: median over --rounds interleaved rounds of triton's do_bench median.

--accuracy runs each contender once instead of timing and prints its error (issue 30's
long-context check: vLLM's FP8 prefill lost a 128k needle test through FP8 P V sums): against
the float64 reference on the e4m3 cache's dequantized values (what an exact kernel computes
from the FP8 cache) and against the float64 reference on the 16-bit values that cache rounds
(what the FP8 cache as a whole costs, the yardstick of the SmolLM2 rule: ours-fp8's error there
must not exceed FA3-fp8's). Its default cases add 512 queries after 32k and 128k keys:
  python benchmarks/fp8_ab.py --accuracy --models llama-3.1-8b,gemma-2-9b --pages 16

--profile launches each contender once inside a profiler window instead of timing (warmed up
first), for Nsight Compute (the shared-memory traffic of the fp8 path against bf16's):
  ncu --clock-control none --profile-from-start off -k regex:"Sm90PagedPrefill|device_kernel" \
      --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section WarpStateStats \
      python benchmarks/fp8_ab.py --profile --cases 16kx1 --pages 16 --models llama-3.1-8b
"""

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MODELS, attention_flops, one_config_groups, one_config_note  # noqa: E402
from variants_ab import CASES, _softcap, _window_left, mask_header, mask_tag  # noqa: E402

from vllm_fa4.kernels.config import FP8_E4M3, KernelConfig, KernelKey  # noqa: E402
from vllm_fa4.paged_prefill.policy import launchable_configs, serving_configs  # noqa: E402
from vllm_fa4.testing.cases import make_paged_case  # noqa: E402

DT = torch.bfloat16  # the model's dtype (--dtype)
BASELINE = "FA3-fp8"
DEFAULT_CASES = "4kx4,16kx1,2k@16k x2,2k@64k"
# --accuracy: 512 queries after long contexts, where thousands of keys share each row's sum
LONG_CASES = {
    "512@32k": ((16, 128), [(512, 32768 + 512)]),
    "512@128k": ((16, 128), [(512, 131072 + 512)]),
}
ACCURACY_CASES = "512@32k,512@128k,2k@64k"
ALL_CASES = {**CASES, **LONG_CASES}
# --window-left / --softcap / --sinks: the model features every case, ours and FA3 alike, gets
FEATURES = dict(window_left=None, softcap=None, sinks=False)


def _build(entry) -> None:
    from vllm_fa4.kernels.compile import get_kernel

    get_kernel(*entry)


def precompile(models, pages, fp8_variants, jobs: int, e4m3_picks: bool = False) -> None:
    """Every kernel the run can launch (each key's serving picks, 16-bit and fp8, and the
    --fp8-variants; with ``e4m3_picks`` the FP8 keys' picks under VLLM_FA4_FP8_QUERY=e4m3
    too), compiled ``jobs`` at a time into the disk cache, where the timed process loads them
    (tools/precompile.py's way)."""
    entries = set()
    for model in models:
        shape = MODELS[model]
        for page in pages:
            for kv in (None, FP8_E4M3):
                key = KernelKey.for_layer(
                    DT,
                    shape.head_dim,
                    page,
                    shape.num_q_heads,
                    shape.num_kv_heads,
                    sliding_window=FEATURES["window_left"] is not None,
                    softcap=FEATURES["softcap"] is not None,
                    sinks=FEATURES["sinks"],
                    kv_dtype=kv,
                )
                configs = set(serving_configs(key).all)
                if kv is not None:
                    configs |= {c for c in fp8_variants if c is not None}
                    if e4m3_picks:
                        configs |= set(launchable_configs(key))
                entries |= {(key, c, False) for c in configs if c.unsupported_reason(key) is None}
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(_build, sorted(entries, key=repr)))
    print(f"{len(entries)} kernels compiled or loaded in {time.perf_counter() - t0:.0f} s")


def _label(model, name, page) -> str:
    """A row's label: model, case and page, then the model features when there are any."""
    features = mask_tag(**FEATURES)  # the default model's tag: the features only
    return f"{model} {name} p{page}" + (f" {features}" if features else "")


def fa3_fp8_call(case, out):
    """vLLM's FLASH_ATTN FP8 prefill call on ``case``'s e4m3 cache."""
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    q8 = case.q.clamp(-448.0, 448.0).to(torch.float8_e4m3fn)  # q_scale 1.0
    shape = (len(case.specs), case.num_kv_heads)

    def descale(value: float) -> torch.Tensor:
        return torch.tensor(value, dtype=torch.float32, device=case.q.device).expand(shape)

    q_d, k_d, v_d = descale(1.0), descale(case.k_scale), descale(case.v_scale)

    def fn():
        return flash_attn_varlen_func(
            q8,
            case.k_cache,
            case.v_cache,
            max_seqlen_q=case.max_seqlen_q,
            cu_seqlens_q=case.cu_seqlens_q,
            max_seqlen_k=case.max_seqlen_k,
            seqused_k=case.seqused_k,
            softmax_scale=case.softmax_scale,
            causal=True,
            block_table=case.page_table,
            fa_version=3,
            out=out,
            q_descale=q_d,
            k_descale=k_d,
            v_descale=v_d,
            **case.fa3_features,
        )

    return fn


def sixteen_bit_source(case, seed: int = 0):
    """The fp8 case's seed without ``fp8_kv``: the 16-bit values its e4m3 cache holds rounded
    (same pages, q, NaN slots)."""
    c = case
    return make_paged_case(
        c.specs,
        c.num_q_heads,
        c.num_kv_heads,
        c.head_dim,
        c.page_size,
        DT,
        "cuda",
        seed=seed,
        **FEATURES,
    )


def bf16_twin(case, seed: int = 0):
    """A bf16 case with the fp8 case's dequantized values (same pages, q, NaN slots)."""
    twin = sixteen_bit_source(case, seed)
    twin.kv_cache.copy_(case.dequantized_kv_cache().to(DT))
    return twin


def contenders(case, fp8_variants, case_label: str):
    """name -> timed callable, in print order (ours' rows that launch one config noted)."""
    twin = bf16_twin(case)
    out = case.new_out()
    fns, launches = {}, {}
    for config in fp8_variants:
        name = "ours-fp8" if config is None else f"ours-fp8 {config.spec}"
        plan = case.plan(config)
        fns[name] = lambda plan=plan: case.ours(plan, out)
        launches[name] = plan.config
    note = one_config_note(case_label, one_config_groups(launches))
    if note:
        print(note, flush=True)
    fns[BASELINE] = fa3_fp8_call(case, case.new_out().to(torch.bfloat16))  # FA3-FP8 writes bf16
    plan16 = twin.plan()
    tag = "bf16" if DT is torch.bfloat16 else "fp16"  # the 16-bit twin's rows
    fns[f"ours-{tag}"] = lambda: twin.ours(plan16, out)
    fns[f"FA3-{tag}"] = lambda: twin.fa3(out)
    return fns


def make_case(model, specs, page):
    """The seeded fp8-cache case every contender of (model, specs, page) runs on."""
    shape = MODELS[model]
    hq, hkv, hd = shape.num_q_heads, shape.num_kv_heads, shape.head_dim
    return make_paged_case(specs, hq, hkv, hd, page, DT, "cuda", seed=0, fp8_kv=True, **FEATURES)


def profile(model, name, specs, page, fp8_variants):
    """Each contender once between profiler start and stop, in print order."""
    fns = contenders(make_case(model, specs, page), fp8_variants, _label(model, name, page))
    for fn in fns.values():  # compile and warm up outside the window
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"profiled {_label(model, name, page)}, launch order: {', '.join(fns)}", flush=True)


class Errors(NamedTuple):
    """One output's distance from a reference, over the rows both hold as finite."""

    max_abs: float
    mean_abs: float
    nonfinite_rows: int  # rows of the output with a NaN or inf (an exact kernel has none)


def errors(out: torch.Tensor, ref: torch.Tensor) -> Errors:
    """``out`` [rows, heads, D] against ``ref`` (same shape), in float64."""
    out, ref = out.double(), ref.double()
    bad = ~torch.isfinite(out).flatten(1).all(dim=1)
    diff = (out[~bad] - ref[~bad]).abs()
    if diff.numel() == 0:
        return Errors(float("nan"), float("nan"), int(bad.sum()))
    return Errors(float(diff.max()), float(diff.mean()), int(bad.sum()))


def accuracy(model, name, specs, page, fp8_variants) -> dict[str, float]:
    """Each contender once on the case; prints its errors against both float64 references
    and returns, per contender, its mean error against the 16-bit values over FA3-fp8's."""
    case = make_case(model, specs, page)
    ref_fp8, _ = case.reference(compute_dtype=torch.float64)
    ref_16, _ = sixteen_bit_source(case).reference(compute_dtype=torch.float64)
    found = {}
    for n, fn in contenders(case, fp8_variants, _label(model, name, page)).items():
        out = fn()
        torch.cuda.synchronize()
        found[n] = (errors(out, ref_fp8), errors(out, ref_16))
    label = _label(model, name, page)
    base = found[BASELINE][1].mean_abs
    for i, (n, (e8, e16)) in enumerate(found.items()):
        print(
            f"{label if i == 0 else '':>28} | {n:<58} vs fp8 cache: max {e8.max_abs:.2e} mean "
            f"{e8.mean_abs:.2e} | vs 16-bit: max {e16.max_abs:.2e} mean {e16.mean_abs:.2e} "
            f"/FA3fp8 {e16.mean_abs / base:.3f}  nonfinite rows {e16.nonfinite_rows}",
            flush=True,
        )
    return {n: e16.mean_abs / base for n, (_, e16) in found.items()}


def run(model, name, specs, page, fp8_variants, rounds):
    fns = contenders(make_case(model, specs, page), fp8_variants, _label(model, name, page))
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):  # rotated order: drift hits every contender alike
        for n in names[r % len(names) :] + names[: r % len(names)]:
            times[n].append(do_bench(fns[n], return_mode="median") * 1e-3)
    med = {n: statistics.median(ts) for n, ts in times.items()}
    shape = MODELS[model]
    flops = attention_flops(
        specs, shape.num_q_heads, shape.head_dim, window_left=FEATURES["window_left"]
    )
    label = _label(model, name, page)
    for i, n in enumerate(names):
        t = med[n]
        spread = (max(times[n]) - min(times[n])) / t if rounds > 1 else 0.0
        print(
            f"{label if i == 0 else '':>28} | {n:<58} {flops / t / 1e12:6.1f} TFLOP/s "
            f"{t * 1e3:8.3f} ms  spread {spread:5.1%}  /FA3fp8 {med[BASELINE] / t:.3f}",
            flush=True,
        )
    return {n: med[BASELINE] / med[n] for n in names}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="llama-3.1-8b,gemma-2-9b")
    ap.add_argument("--pages", default="16,128")
    ap.add_argument(
        "--cases",
        default=None,
        help=f"of: {', '.join(ALL_CASES)} (default: {DEFAULT_CASES}; with "
        f"--accuracy {ACCURACY_CASES})",
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-j", "--jobs", type=int, default=8, help="parallel compiles before timing")
    ap.add_argument(
        "--fp8-variants",
        default="default",
        help="space-separated fp8 configs to time besides nothing else ('default': the "
        "serving pick per batch)",
    )
    ap.add_argument(
        "--dtype",
        default="bfloat16",
        choices=("bfloat16", "float16"),
        help="the model's dtype (Q, output, the 16-bit twin cache)",
    )
    ap.add_argument(
        "--window-left",
        type=_window_left,
        default=None,
        help="sliding window for every contender (as variants_ab.py)",
    )
    ap.add_argument(
        "--softcap", type=_softcap, default=None, help="logit soft cap (as variants_ab.py)"
    )
    ap.add_argument("--sinks", action="store_true", help="per-head sink logits (as variants_ab.py)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--profile", action="store_true", help="each contender once in a profiler window; no timing"
    )
    mode.add_argument(
        "--accuracy",
        action="store_true",
        help="each contender once: its error against float64 references (see above); no timing",
    )
    args = ap.parse_args(argv)
    if args.cases is None:
        args.cases = ACCURACY_CASES if args.accuracy else DEFAULT_CASES
    unknown = [c for c in args.cases.split(",") if c not in ALL_CASES]
    if unknown:
        ap.error(f"unknown cases {unknown}; known: {', '.join(ALL_CASES)}")
    return args


def main(argv=None):
    global DT
    args = parse_args(argv)
    DT = getattr(torch, args.dtype)
    FEATURES.update(window_left=args.window_left, softcap=args.softcap, sinks=args.sinks)
    variants = [
        None if spec == "default" else KernelConfig.parse(spec)
        for spec in args.fp8_variants.split()
    ]
    pages = [int(p) for p in args.pages.split(",")]
    precompile(args.models.split(","), pages, variants, args.jobs)
    print(
        f"device={torch.cuda.get_device_name()} dtype={args.dtype} kv=float8_e4m3fn "
        f"rounds={args.rounds} {mask_header(**FEATURES)}"
    )
    ratios: dict[str, list[float]] = {}
    for model in args.models.split(","):
        for name in args.cases.split(","):
            case_pages, specs = ALL_CASES[name]
            for page in pages:
                if page not in case_pages:
                    continue
                if args.profile:
                    profile(model, name, specs, page, variants)
                    continue
                if args.accuracy:
                    found = accuracy(model, name, specs, page, variants)
                else:
                    found = run(model, name, specs, page, variants, args.rounds)
                for n, r in found.items():
                    ratios.setdefault(f"{model} {n}", []).append(r)
    if args.profile:
        return
    if args.accuracy:
        print("mean error against the 16-bit values over FA3-fp8's (< 1: closer than FA3-fp8):")
        for n, rs in ratios.items():
            print(f"  {n:<70} worst {max(rs):.3f} (of {len(rs)} cases)")
        return
    print("geomean over FA3-fp8's time (> 1: faster than FA3-fp8):")
    for n, rs in ratios.items():
        print(f"  {n:<70} {statistics.geometric_mean(rs):.3f} (min {min(rs):.3f}, {len(rs)} cases)")


if __name__ == "__main__":
    main()
