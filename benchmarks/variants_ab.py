"""Variant A/B timing: our SM90 paged prefill (one or more compile-time variants) vs vLLM's FA3
on one model's attention shape (default Llama-3.1-8B: Hq 32, Hkv 8, D 128; bf16, causal), in
one process.

Run: python benchmarks/variants_ab.py [--variants "one_per_cta+serial queue+overlap@l2=32"|all]
                                      [--pages 16,128] [--cases 512x32,16kx1] [--rounds 3]
                                      [--model llama-3.2-1b] [--window-left 4095]
                                      [--softcap 30] [--sinks]
Default variants: $VLLM_FA4_TEST_VARIANTS, else the process config (VLLM_FA4_VARIANT).
A contender is a config spec, optionally with a planner option: ``@l2=N`` orders the work list
in L2 sections of N MiB of K/V (``@l2=0`` plain LPT; default: the planner's default);
``@tail=N`` runs the last N sections as one LPT stretch; options join with commas.
Inputs are vLLM-shaped (testing.cases: permuted pages, NaN in unused slots, q a strided view);
each config runs the planner's own work list.
Contenders besides ours: FA3 (vLLM's paged call, the same cache and block table) and FA3c
(FA3 on the same K/V gathered into contiguous varlen tensors: FA3 at its best). Each row of
ours shows both ratios (``/FA3``, ``/FA3c``: their time over ours).
Times: median over --rounds interleaved rounds of triton's do_bench median; spread is
(max - min) / median over the rounds. TFLOP/s counts only the (query, key) pairs a row sees.
--window-left N (keys left of the diagonal a row sees: vLLM's sliding_window - 1) and
--softcap X give both our kernel (key flags, plan, launch) and FA3 (window_size=[N, 0],
softcap) the feature; TFLOP/s then counts only the pairs inside the window. --sinks gives
both seeded per-head sink logits (gpt-oss). The header line and every row label name the
model, window, cap and sinks, so such a log cannot pass for a plain Llama-8B causal one.
--clocks adds each contender's mean SM clock while do_bench timed it (NVML, as
power_clocks.py) and its cycles a launch (time x clock): on a power-capped GPU a change that
saves cycles without saving energy comes back as a lower clock (docs/perf-notes.md, session 28).
"""

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench

from vllm_fa4 import envs
from vllm_fa4.kernels.config import KernelConfig
from vllm_fa4.testing.cases import make_paged_case
from vllm_fa4.testing.variants import config_id, parse_configs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import MODELS, attention_flops, one_config_groups, one_config_note  # noqa: E402

DT = torch.bfloat16
FA3_CONTIGUOUS = "FA3c"  # FA3 on the same K/V laid out contiguously (no block table)
DEFAULT_MODEL = "llama-3.1-8b"

# name -> (page sizes it runs at unless --pages names others, [(q_len, k_len)] * batch)
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
DEFAULT_CASES = tuple(CASES)  # the names behind the README kernel rows (19 case-page pairs)
# What vLLM sends when it serves long prompts (chunked prefill, max_num_batched_tokens 16384):
# one 16k chunk after a prefix of the same prompt. Served 8B at 64k prompts runs the chunks
# after 0, 16k, 32k and 48k; at 128k after 0 to 112k (docs/perf-notes.md, session 18).
CASES.update(
    {
        "16k@16k": ((16,), [(16384, 16384 + 16384)]),
        "16k@48k": ((16,), [(16384, 49152 + 16384)]),
        "16k@112k": ((16,), [(16384, 114688 + 16384)]),
    }
)


def parse_contender(text: str) -> tuple[KernelConfig | None, dict]:
    """``"spec[@l2=MiB][,tail=N]"`` -> (config, ``PagedCase.plan`` options); spec ``default``: None,
    the key's served configs; ``default+values``: the served configs with ``values`` set, each
    replacing the pick's value on its axis (an ``overlay``, e.g. one axis against the served
    pick)."""
    spec, _, option = text.partition("@")
    options = {}
    if spec.startswith("default+"):
        options["overlay"] = spec.removeprefix("default+")
        KernelConfig.parse(options["overlay"])  # a misspelling fails before any GPU work
        spec = "default"
    for item in filter(None, option.split(",")):
        name, _, value = item.partition("=")
        if name == "l2":
            options["l2_section_bytes"] = int(value) << 20 if int(value) else None
        elif name == "tail":
            options["tail_sections"] = int(value)
        else:
            raise ValueError(
                f"unknown planner option {item!r} in {text!r} (known: l2=MiB, tail=sections)"
            )
    return (None if spec == "default" else KernelConfig.parse(spec)), options


def fa3_call(case, out=None):
    """vLLM's FA3 on a testing.cases PagedCase (the baseline of every ratio)."""
    return lambda: case.fa3(out)


def contiguous_kv(case):
    """The case's K and V gathered into contiguous varlen tensors [total_k, Hkv, D] (request
    after request, no unused slots) and their cu_seqlens_k [B+1] int32."""
    page = case.page_size
    ks, vs, cu_k = [], [], [0]
    for b, (_, k_len) in enumerate(case.specs):
        blocks = case.page_table[b, : -(-k_len // page)].long()
        ks.append(case.k_cache[blocks].flatten(0, 1)[:k_len])
        vs.append(case.v_cache[blocks].flatten(0, 1)[:k_len])
        cu_k.append(cu_k[-1] + k_len)
    k, v = torch.cat(ks).contiguous(), torch.cat(vs).contiguous()
    return k, v, torch.tensor(cu_k, dtype=torch.int32, device=k.device)


def fa3_contiguous_call(case):
    """FA3 at its best: the same K/V gathered once (outside the timed region) into contiguous
    varlen tensors and run with ``cu_seqlens_k``, no block table. vLLM's paged call at page 16
    takes a slower gather path; this is the bar for "faster than FA3"."""
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    k, v, cu_seqlens_k = contiguous_kv(case)
    out = torch.empty_like(case.q)
    features = case.fa3_features

    def fn():
        return flash_attn_varlen_func(
            case.q,
            k,
            v,
            max_seqlen_q=case.max_seqlen_q,
            cu_seqlens_q=case.cu_seqlens_q,
            max_seqlen_k=case.max_seqlen_k,
            cu_seqlens_k=cu_seqlens_k,
            softmax_scale=case.softmax_scale,
            causal=True,
            fa_version=3,
            out=out,
            **features,
        )

    fn.out = out  # profile_case.py checks it against FA3's
    return fn


def ours_call(case, plan, out):
    """Our kernel on the same case (``PagedCase.ours``: launched directly, no route)."""
    return lambda: case.ours(plan, out)


def mask_header(window_left=None, softcap=None, sinks=False) -> str:
    """The log header's mask fields; all always printed, so "none" is explicit too."""
    window = "none" if window_left is None else window_left
    cap = "none" if softcap is None else f"{softcap:g}"
    return f"mask=causal window_left={window} softcap={cap} sinks={'yes' if sinks else 'none'}"


def mask_tag(window_left=None, softcap=None, sinks=False, model=DEFAULT_MODEL) -> str:
    """Short suffix of every row label ("" for Llama-8B causal, so those logs keep their
    format)."""
    parts = [] if model == DEFAULT_MODEL else [model]
    if window_left is not None:
        parts.append(f"w{window_left}")
    if softcap is not None:
        parts.append(f"cap{softcap:g}")
    if sinks:
        parts.append("sinks")
    return " ".join(parts)


def run(
    name,
    specs,
    page,
    contenders,
    rounds=1,
    window_left=None,
    softcap=None,
    sinks=False,
    model=DEFAULT_MODEL,
    sampler=None,
):
    shape = MODELS[model]
    hq, hkv, hd = shape.num_q_heads, shape.num_kv_heads, shape.head_dim
    case = make_paged_case(
        specs,
        *(hq, hkv, hd, page, DT, "cuda"),
        seed=0,
        window_left=window_left,
        softcap=softcap,
        sinks=sinks,
    )
    out = case.new_out()
    plans, launches = {}, {}
    for text in contenders:
        config, options = parse_contender(text)
        plans[text] = case.plan(config, **options)
        planner = tuple(sorted((k, v) for k, v in options.items() if k != "overlay"))
        launches[text] = (plans[text].config, planner)  # the overlay is in the plan's config
    note = one_config_note(f"{name} p{page}", one_config_groups(launches))
    if note:
        print(note, flush=True)
    flops = attention_flops(specs, hq, hd, window_left=window_left)

    fns = {"FA3": fa3_call(case), FA3_CONTIGUOUS: fa3_contiguous_call(case)}
    for spec, p in plans.items():
        fns[spec] = ours_call(case, p, out)
    # Interleave: every round times each contender once, in a rotated order, so clock or power
    # drift over the run hits all of them alike; report the median round.
    names = list(fns)
    times = {n: [] for n in names}
    mhz = {n: [] for n in names}  # --clocks: mean SM clock over each do_bench call
    for r in range(rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            times[n].append(do_bench(fns[n], return_mode="median") * 1e-3)
            if sampler is not None:
                clocks = [s[0] for s in sampler.between(t0, time.perf_counter())]
                mhz[n].append(statistics.fmean(clocks) if clocks else float("nan"))
    med = {n: statistics.median(ts) for n, ts in times.items()}
    tag = mask_tag(window_left, softcap, sinks, model)
    label = f"{name} p{page}" + (f" {tag}" if tag else "")
    width = 16 + (len(tag) + 1 if tag else 0)  # same for every case of a run: columns align
    for i, n in enumerate(names):
        t = med[n]
        spread = (max(times[n]) - min(times[n])) / t if rounds > 1 else 0.0
        ratio = (
            ""
            if n == "FA3"
            else f"  /FA3 {med['FA3'] / t:.3f}"
            + ("" if n == FA3_CONTIGUOUS else f"  /FA3c {med[FA3_CONTIGUOUS] / t:.3f}")
        )
        cycles = ""
        if sampler is not None:
            clock = statistics.median(mhz[n])
            cycles = f"  {clock:5.0f} MHz {t * clock:7.3f} Mcyc"
        print(
            f"{label if i == 0 else '':>{width}} | {n:<34} {flops / t / 1e12:6.1f} TFLOP/s "
            f"{t * 1e3:8.3f} ms  spread {spread:5.1%}{ratio}{cycles}"
        )


def _window_left(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _softcap(text: str) -> float:
    value = float(text)
    if not value > 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _pages(text: str) -> tuple[int, ...]:
    try:
        pages = tuple(dict.fromkeys(int(p) for p in text.split(",") if p.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: page sizes, e.g. 16,128") from None
    if not pages or any(p <= 0 or p & (p - 1) for p in pages):
        raise argparse.ArgumentTypeError(f"{text!r}: page sizes are powers of two, e.g. 16,128")
    return pages


def case_pages(name: str, pages: tuple[int, ...] | None) -> tuple[int, ...]:
    """The page sizes case ``name`` runs at: ``--pages`` when given (every case at each),
    else the case's own."""
    return pages if pages is not None else CASES[name][0]


def parse_args(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=envs.sweep_variants_spec())
    ap.add_argument(
        "--pages",
        type=_pages,
        default=None,
        help="page sizes every case runs at (default: each case's own, 16 and/or 128)",
    )
    ap.add_argument(
        "--cases",
        default=",".join(DEFAULT_CASES),
        help=f"comma-separated (default: the README's kernel cases); all: {', '.join(CASES)}",
    )
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per case")
    ap.add_argument(
        "--window-left",
        type=_window_left,
        default=None,
        help="sliding window for ours and FA3: keys left of the diagonal a row sees "
        "(vLLM's sliding_window - 1); default none (plain causal)",
    )
    ap.add_argument(
        "--softcap", type=_softcap, default=None, help="logit soft cap for ours and FA3"
    )
    ap.add_argument("--sinks", action="store_true", help="per-head sink logits for ours and FA3")
    ap.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        choices=list(MODELS),
        help="attention shape (query heads, KV heads, head dim); default %(default)s",
    )
    ap.add_argument(
        "--clocks",
        action="store_true",
        help="also each contender's mean SM clock while timed and its cycles a launch (NVML)",
    )
    args = ap.parse_args(argv)
    unknown = [name for name in args.cases.split(",") if name not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; valid: {', '.join(CASES)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    # Planner options (`@`) and overlays (`default+`) are read per contender by parse_contender.
    if args.variants and ("@" in args.variants or "default+" in args.variants):
        contenders = list(dict.fromkeys(args.variants.split()))
    else:
        contenders = list(dict.fromkeys(config_id(c) for c in parse_configs(args.variants)))
    print(
        f"device={torch.cuda.get_device_name()} model={args.model} contenders={contenders} "
        f"{mask_header(args.window_left, args.softcap, args.sinks)}"
    )
    with contextlib.ExitStack() as stack:
        sampler = None
        if args.clocks:
            from power_clocks import Nvml, Sampler

            sampler = stack.enter_context(Sampler(Nvml()))
        for name in args.cases.split(","):
            specs = CASES[name][1]
            for page in case_pages(name, args.pages):
                run(
                    name,
                    specs,
                    page,
                    contenders,
                    args.rounds,
                    args.window_left,
                    args.softcap,
                    args.sinks,
                    args.model,
                    sampler,
                )


if __name__ == "__main__":
    main()
