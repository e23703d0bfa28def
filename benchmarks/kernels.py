#!/usr/bin/env python3
"""Paged, varlen, causal prefill attention: ours against its peers, on the same inputs.

One process, one GPU. Every peer's output is checked against the fp32 reference before it is
timed (triton do_bench, median). The upstream flash-attn-4 package needs a newer CuTe-DSL than
vLLM's, so it runs in a second process whose PYTHONPATH holds only its own kit.

    python3 benchmarks/kernels.py                      # anchors' baseline sweep (Llama-3.1-8B)
    python3 benchmarks/kernels.py --quick              # 3-case smoke run
    python3 benchmarks/kernels.py --models all --cases all --block-sizes 16,128
    python3 benchmarks/kernels.py --dry-run --cases all  # list cases and FLOPs, no GPU needed
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    CASE_GROUPS,
    CASES,
    MODELS,
    REPO_ROOT,
    attention_flops,
    case_pairs,
    fmt_num,
    gpu_description,
    log,
    markdown_table,
    resolve_names,
    short_error,
    software_versions,
    split_list,
    write_csv,
    write_json,
)
from _peers import ALL_PEERS, IN_PROCESS_PEERS  # noqa: E402

DEFAULT_FA4_SITE = "/tmp/site-fa4"
VLLM_DISTS = ("torch", "vllm", "flashinfer-python", "nvidia-cutlass-dsl", "triton")
FA4_DISTS = ("torch", "flash-attn-4", "nvidia-cutlass-dsl", "triton")


@dataclass(frozen=True)
class Run:
    model: str
    case: str
    block: int

    @property
    def key(self) -> str:
        return f"{self.model}|{self.case}|{self.block}"


@dataclass
class Settings:
    dtype: str = "bfloat16"
    seed: int = 0
    poison: bool = True
    warmup_ms: int = 25
    rep_ms: int = 100
    check_rows: int = 128
    check_requests: int = 4
    device: str = "cuda"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--models", default="llama-3.1-8b", help=f"comma list or 'all': {', '.join(MODELS)}"
    )
    ap.add_argument(
        "--cases",
        default="baseline",
        help=f"comma list of cases or groups ({', '.join(CASE_GROUPS)}): {', '.join(CASES)}",
    )
    ap.add_argument("--block-sizes", default="16,128", help="KV block (page) sizes")
    ap.add_argument(
        "--peers", default=",".join(ALL_PEERS), help=f"comma list: {', '.join(ALL_PEERS)}"
    )
    ap.add_argument("--quick", action="store_true", help="3-case smoke run (Llama-3.1-8B, page 16)")
    ap.add_argument("--dry-run", action="store_true", help="list cases and FLOPs; no GPU")
    ap.add_argument("--no-poison", action="store_true", help="unused KV slots hold zeros, not NaN")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=25, help="do_bench warmup, ms")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    ap.add_argument(
        "--check-rows", type=int, default=128, help="rows checked at each end of a long request"
    )
    ap.add_argument("--check-requests", type=int, default=4, help="requests checked per case")
    ap.add_argument("--out", default="bench-out", help="output folder")
    ap.add_argument(
        "--fa4-site",
        default=DEFAULT_FA4_SITE,
        help="site folder of the flash-attn-4 kit (its own CuTe-DSL)",
    )
    ap.add_argument(
        "--peer-timeout",
        type=int,
        default=3600,
        help="seconds for the whole flash_attn_4 peer process",
    )
    # internal: the flash_attn_4 peer process
    ap.add_argument("--peer-process", choices=("flash_attn_4",), help=argparse.SUPPRESS)
    ap.add_argument("--peer-input", help=argparse.SUPPRESS)
    ap.add_argument("--peer-output", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.cases, args.block_sizes = "quick", "16"
        args.models = "llama-3.1-8b"
        args.warmup, args.rep = 10, 40
    return args


def select_runs(args) -> list[Run]:
    models = resolve_names(args.models, MODELS, {"all": list(MODELS)})
    cases = resolve_names(args.cases, CASES, CASE_GROUPS)
    blocks = [int(b) for b in split_list(args.block_sizes)]
    return [Run(m, c, b) for m in models for b in blocks for c in cases]


def settings_from(args) -> Settings:
    return Settings(
        args.dtype,
        args.seed,
        not args.no_poison,
        args.warmup,
        args.rep,
        args.check_rows,
        args.check_requests,
    )


def run_flops(run: Run) -> int:
    m = MODELS[run.model]
    return attention_flops(CASES[run.case].specs, m.num_q_heads, m.head_dim)


def print_dry_run(runs: list[Run], peers: list[str]) -> None:
    rows = []
    for r in runs:
        m, c = MODELS[r.model], CASES[r.case]
        rows.append(
            [
                r.case,
                c.label,
                r.model,
                f"{m.num_q_heads}/{m.num_kv_heads}/{m.head_dim}",
                r.block,
                len(c.specs),
                c.num_q_tokens,
                c.max_k,
                case_pairs(c.specs),
                f"{run_flops(r) / 1e9:,.1f}",
            ]
        )
    header = [
        "case",
        "shape",
        "model",
        "Hq/Hkv/D",
        "block",
        "batch",
        "q tokens",
        "max k",
        "causal pairs",
        "GFLOP",
    ]
    log(markdown_table(header, rows))
    log(f"\n{len(runs)} runs; peers: {', '.join(peers)}")


# --------------------------------------------------------------------------------------------
# GPU side


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def build_problem(run: Run, s: Settings):
    import torch
    from _peers import problem_from_case

    from vllm_fa4.testing.cases import make_paged_case

    m, c = MODELS[run.model], CASES[run.case]
    paged = make_paged_case(
        specs=list(c.specs),
        num_q_heads=m.num_q_heads,
        num_kv_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        page_size=run.block,
        dtype=torch_dtype(s.dtype),
        device=torch.device(s.device),
        seed=s.seed,
        poison_unused=s.poison,
    )
    return problem_from_case(paged, c.specs, run.block), paged


def import_testing_or_exit() -> None:
    try:
        import vllm_fa4.paged_prefill.reference  # noqa: F401
        import vllm_fa4.testing.cases  # noqa: F401
        import vllm_fa4.testing.checks  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        sys.exit(
            f"error: cannot import vllm_fa4.testing ({type(exc).__name__}: {exc}). Run from the "
            "repository root (or `pip install -e .`) with the kit on PYTHONPATH."
        )


def time_ms(fn, s: Settings) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=s.warmup_ms, rep=s.rep_ms, return_mode="median"))


def matmul_ceiling(s: Settings) -> float:
    """TFLOP/s of one 8192^3 torch.matmul in the benchmark dtype."""
    import torch

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch_dtype(s.dtype))
    b = torch.randn(n, n, device="cuda", dtype=torch_dtype(s.dtype))
    ms = time_ms(lambda: torch.matmul(a, b), s)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def _error(exc: BaseException, stage: str) -> str:
    return f"error: {stage}: {type(exc).__name__}: {' '.join(str(exc).split())}"[:400]


def bench_peer(name: str, problem, ref, flops: int, s: Settings) -> dict:
    import torch
    from _check import check_output
    from _peers import PREPARE

    rec = {
        "peer": name,
        "ms": None,
        "tflops": None,
        "check": None,
        "max_abs_err": None,
        "check_detail": "",
        "error": "",
    }
    stage, t0 = "prepare", time.perf_counter()
    try:
        fn = PREPARE[name](problem)
        stage = "first run"
        out = fn()
        if out.is_cuda:
            torch.cuda.synchronize()
        rec["setup_s"] = round(time.perf_counter() - t0, 2)  # planning + JIT compile + 1 run
        stage = "check"
        result = check_output(out, ref)
        rec.update(check=result.status, max_abs_err=result.max_abs_err, check_detail=result.detail)
        stage = "timing"
        rec["ms"] = time_ms(fn, s)
        rec["tflops"] = flops / (rec["ms"] * 1e-3) / 1e12
    except Exception as exc:  # noqa: BLE001 - a peer failure must never stop the sweep
        rec["error"] = _error(exc, stage)
        if rec["check"] is None:
            rec["check"] = "error"
    return rec


def bench_run(run: Run, peers: list[str], s: Settings) -> list[dict]:
    import torch
    from _check import build_reference

    base = {"model": run.model, "case": run.case, "block": run.block, "flops": run_flops(run)}
    try:
        problem, paged = build_problem(run, s)
        ref = build_reference(problem, s.check_rows, s.check_requests)
    except Exception as exc:  # noqa: BLE001
        msg = _error(exc, "input/reference")
        return [{**base, "peer": p, "check": "error", "error": msg} for p in peers]
    records = [{**base, **bench_peer(p, problem, ref, base["flops"], s)} for p in peers]
    del problem, paged, ref
    torch.cuda.empty_cache()
    return records


def progress_line(i: int, n: int, run: Run, records: list[dict]) -> str:
    parts = [f"[{i}/{n}] {run.model} {run.case} page{run.block} {run_flops(run) / 1e12:.2f} TFLOP"]
    for r in records:
        if r.get("error"):
            parts.append(f"{r['peer']} {short_error(r['error'], 80)}")
        else:
            parts.append(f"{r['peer']} {r['tflops']:.0f} TFLOP/s ({r['check']})")
    return " | ".join(parts)


# --------------------------------------------------------------------------------------------
# flash_attn_4 peer process


def fa4_peer_env(fa4_site: str, base_env: dict | None = None) -> dict:
    """The peer's environment: PYTHONPATH holds only the flash-attn-4 kit, never vLLM's."""
    env = dict(os.environ if base_env is None else base_env)
    for var in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP"):
        env.pop(var, None)
    # Importing vLLM's CuTe-DSL (4.6.0) exports CUTE_DSL_LIBS=<its runtime>; inherited, it makes
    # the peer's newer DSL load the wrong runtime ("runtime library could not be resolved").
    for var in [v for v in env if v.startswith(("CUTE_DSL_", "CUTLASS_"))]:
        env.pop(var)
    paths = [fa4_site]
    dsl = Path(fa4_site) / "nvidia_cutlass_dsl" / "dsl_packages"
    if dsl.is_dir():
        paths.append(str(dsl))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def fa4_peer_command(input_path: Path, output_path: Path, args) -> list[str]:
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--peer-process",
        "flash_attn_4",
        "--peer-input",
        str(input_path),
        "--peer-output",
        str(output_path),
        "--fa4-site",
        args.fa4_site,
    ]


def _fa4_base(r: Run) -> dict:
    return {
        "model": r.model,
        "case": r.case,
        "block": r.block,
        "flops": run_flops(r),
        "peer": "flash_attn_4",
    }


def run_flash_attn_4(runs: list[Run], s: Settings, args, out_dir: Path):
    """Launch the peer process; returns (records, versions). Never raises."""
    if not Path(args.fa4_site, "flash_attn").is_dir():
        msg = f"skipped: flash-attn-4 kit not found at {args.fa4_site} (see docs/benchmarks.md)"
        log(f"flash_attn_4: {msg}")
        return [{**_fa4_base(r), "check": "skipped", "error": msg} for r in runs], {}
    in_path, out_path = out_dir / "flash_attn_4-input.json", out_dir / "flash_attn_4-output.json"
    write_json(in_path, {"runs": [asdict(r) for r in runs], "settings": asdict(s)})
    out_path.unlink(missing_ok=True)
    log(f"flash_attn_4: starting the peer process (PYTHONPATH={args.fa4_site})")
    rc = None
    try:
        proc = subprocess.run(
            fa4_peer_command(in_path, out_path, args),
            env=fa4_peer_env(args.fa4_site),
            timeout=args.peer_timeout,
        )
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    except OSError as exc:
        rc = f"could not start: {exc}"
    data = json.loads(out_path.read_text()) if out_path.exists() else {}
    got = {f"{r['model']}|{r['case']}|{r['block']}": r for r in data.get("results", [])}
    if data.get("fatal"):
        rc = f"{rc}; {data['fatal']}"
    missing = f"error: peer process ended (rc {rc}) before this case"
    records = [got.get(r.key) or {**_fa4_base(r), "check": "error", "error": missing} for r in runs]
    return records, data.get("versions", {})


def peer_process_main(args) -> int:
    import importlib.util
    import site

    if Path(args.fa4_site).is_dir():
        site.addsitedir(args.fa4_site)  # runs the kit's .pth files (CuTe-DSL's package path)
    sys.path.insert(0, str(REPO_ROOT))
    spec = json.loads(Path(args.peer_input).read_text())
    out_path = Path(args.peer_output)
    s, runs = Settings(**spec["settings"]), [Run(**r) for r in spec["runs"]]
    state = {"versions": software_versions(FA4_DISTS), "gpu": gpu_description(), "results": []}
    if importlib.util.find_spec("vllm") is not None:
        log("flash_attn_4 peer: warning: vllm is importable here; PYTHONPATH is not clean")
    try:
        import_testing_or_exit()
        import flash_attn.cute.interface  # noqa: F401
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        state["fatal"] = f"import failed: {exc}"
        write_json(out_path, state)
        log(f"flash_attn_4 peer: {state['fatal']}")
        return 1
    for i, run in enumerate(runs, 1):
        records = bench_run(run, ["flash_attn_4"], s)
        state["results"] += records
        write_json(out_path, state)
        log("flash_attn_4 peer " + progress_line(i, len(runs), run, records))
    return 0


# --------------------------------------------------------------------------------------------
# Report


def tflops_cell(rec: dict | None) -> str:
    if rec is None:
        return "—"
    if rec.get("error") and rec.get("tflops") is None:
        return short_error(rec["error"])
    cell = fmt_num(rec.get("tflops"))
    return cell if rec.get("check") == "ok" else f"{cell} ({rec.get('check')})"


def ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or not a.get("tflops") or not b.get("tflops"):
        return "—"
    return f"{a['tflops'] / b['tflops']:.3f}"


def render_report(runs, peers, records, meta) -> str:
    by = {(r["model"], r["case"], r["block"], r["peer"]): r for r in records}
    perf_rows, check_rows = [], []
    for run in runs:
        names = dict.fromkeys([*peers, *ALL_PEERS])
        get = {p: by.get((run.model, run.case, run.block, p)) for p in names}.get
        ours = get("ours")
        pct = "—"
        if ours and ours.get("tflops") and meta.get("ceiling_tflops"):
            pct = f"{100 * ours['tflops'] / meta['ceiling_tflops']:.0f}%"
        head = [CASES[run.case].label, run.model, run.block]
        perf_rows.append(
            head
            + [tflops_cell(get(p)) for p in peers]
            + [ratio(ours, get("fa3")), ratio(ours, get("fa4_vllm")), pct]
        )
        check_rows.append(head + [_check_cell(get(p)) for p in peers])
    lines = [
        "# Prefill attention kernels: TFLOP/s (median of do_bench; higher is better)",
        "",
        f"GPU: {meta['gpu']}. Versions: "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
        + (f"; flash-attn-4 process: {meta['fa4_versions']}" if meta.get("fa4_versions") else ""),
        f"Matmul ceiling (8192³ {meta['dtype']} torch.matmul): {fmt_num(meta['ceiling_tflops'])} "
        f"TFLOP/s. Unused KV slots: {'NaN' if meta['poison'] else 'zero'}. "
        "FLOPs = 4 · exact causal (query, key) pairs · query heads · head dim.",
        "",
        markdown_table(
            ["case", "model", "block", *peers, "ours/fa3", "ours/fa4_vllm", "ours % of matmul"],
            perf_rows,
        ),
        "",
        "## Correctness against the fp32 reference (status, max abs error on the checked rows)",
        "",
        markdown_table(["case", "model", "block", *peers], check_rows),
    ]
    return "\n".join(lines) + "\n"


def _check_cell(rec: dict | None) -> str:
    if rec is None:
        return "—"
    if rec.get("check") in ("error", "skipped", None):
        return short_error(rec.get("error") or "error")
    err = rec.get("max_abs_err")
    return f"{rec['check']} {err:.1e}" if isinstance(err, float) else str(rec["check"])


def write_outputs(out_dir: Path, runs, peers, records, meta) -> str:
    text = render_report(runs, peers, records, meta)
    (out_dir / "kernels.md").write_text(text)
    pct = meta.get("ceiling_tflops")
    for r in records:
        r["pct_of_matmul"] = 100 * r["tflops"] / pct if r.get("tflops") and pct else None
        r["label"] = CASES[r["case"]].label
    write_csv(out_dir / "kernels.csv", records)
    write_json(out_dir / "kernels.json", {"meta": meta, "records": records})
    return text


# --------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.peer_process:
        return peer_process_main(args)
    try:
        runs = select_runs(args)
        peers = resolve_names(args.peers, ALL_PEERS)
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    if args.dry_run:
        print_dry_run(runs, peers)
        return 0
    return run_sweep(args, runs, peers)


def run_sweep(args, runs: list[Run], peers: list[str]) -> int:
    import torch

    if not torch.cuda.is_available():
        sys.exit("error: no CUDA device (use --dry-run to list the cases)")
    import_testing_or_exit()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    s = settings_from(args)
    meta = {
        "gpu": gpu_description(),
        "versions": software_versions(VLLM_DISTS),
        "dtype": s.dtype,
        "poison": s.poison,
        "settings": asdict(s),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    log(f"GPU: {meta['gpu']}; {meta['versions']}")
    try:
        meta["ceiling_tflops"] = matmul_ceiling(s)
    except Exception as exc:  # noqa: BLE001
        meta["ceiling_tflops"] = None
        log(_error(exc, "matmul ceiling"))
    log(f"matmul ceiling: {fmt_num(meta['ceiling_tflops'])} TFLOP/s")
    local = [p for p in peers if p in IN_PROCESS_PEERS]
    records: list[dict] = []
    for i, run in enumerate(runs, 1):
        if local:
            recs = bench_run(run, local, s)
            records += recs
            log(progress_line(i, len(runs), run, recs))
    if "flash_attn_4" in peers:
        torch.cuda.empty_cache()
        fa4_records, meta["fa4_versions"] = run_flash_attn_4(runs, s, args, out_dir)
        records += fa4_records
    text = write_outputs(out_dir, runs, peers, records, meta)
    log("\n" + text)
    log(f"wrote {out_dir}/kernels.md, kernels.csv, kernels.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
