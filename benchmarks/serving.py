#!/usr/bin/env python3
"""End to end: vLLM with dummy weights under each attention backend, same load, one run.

serve mode (default): start `vllm serve MODEL --load-format dummy --attention-backend B` per
backend, wait for /health, drive it with `vllm bench serve` (random dataset) for each input
length x output length x request rate, stop it (whole process group). Reports total token
throughput, TTFT and TPOT p50/p99 per backend and as ratios to FLASH_ATTN from the same run,
plus PNG plots against input length.

throughput mode: `vllm bench throughput --dataset-name random --output-len 1` per backend and
input length (offline engine; the anchors file's end-to-end table).

    python3 benchmarks/serving.py serve --model configs/llama-3.1-8b
    python3 benchmarks/serving.py throughput --model configs/llama-3.1-8b
    python3 benchmarks/serving.py serve --model configs/llama-3.1-8b --dry-run
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    fmt_num,
    gpu_description,
    log,
    markdown_table,
    resolve_names,
    software_versions,
    split_list,
    write_csv,
    write_json,
)

VLLM_CLI = [sys.executable, "-m", "vllm.entrypoints.cli.main"]
BASELINE = "FLASH_ATTN"
BACKENDS: dict[str, list[str]] = {
    "FA4": ["--attention-backend", "FA4"],
    "FLASH_ATTN": ["--attention-backend", "FLASH_ATTN"],
    "FLASH_ATTN_V4": [
        "--attention-backend",
        "FLASH_ATTN",
        "--attention-config.flash_attn_version=4",
    ],
    "FLASHINFER": ["--attention-backend", "FLASHINFER"],
}
DISTS = ("torch", "vllm", "flashinfer-python", "nvidia-cutlass-dsl", "vllm-fa4")
PLUGIN_BACKENDS = frozenset({"FA4"})  # what vLLM knows only through this package's entry point

# Lists the `fa4` entry points of vLLM's plugin group as the benchmark's vLLM runs would see
# them (same interpreter, environment and working directory).
_LIST_PLUGIN = (
    "from importlib.metadata import entry_points\n"
    "print(sorted(e.value for e in entry_points(group='vllm.general_plugins') if e.name == 'fa4'))"
)


def plugin_problem(python: str = sys.executable) -> str | None:
    """Why the vLLM that ``python`` runs would refuse ``--attention-backend FA4``, or None.

    Without the package's `vllm.general_plugins` entry point vLLM answers "Unknown attention
    backend: 'FA4'" only after loading the model, and the other backends run on alone: a GPU
    session's minutes spent on a comparison with one side missing."""
    out = subprocess.run([python, "-c", _LIST_PLUGIN], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return f"{python} could not list its vLLM plugins: {out.stderr.strip()[-500:]}"
    if out.stdout.strip() == "[]":
        return (
            f"{python} has no 'fa4' entry point in vllm.general_plugins, so vLLM would refuse "
            "--attention-backend FA4. Install the package (pip install -e . or the wheel); a "
            "source tree on PYTHONPATH needs its vllm_fa4.egg-info (an editable install's) "
            "beside it"
        )
    return None


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number of at least 1")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("mode", nargs="?", default="serve", choices=("serve", "throughput"))
    ap.add_argument("--model", default="configs/llama-3.1-8b", help="model folder or name")
    ap.add_argument("--backends", default=",".join(BACKENDS), help=", ".join(BACKENDS))
    ap.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    ap.add_argument("--block-size", type=int, default=None, help="KV block size (vLLM default)")
    ap.add_argument("--extra-args", default="", help="more engine args, one shell-quoted string")
    ap.add_argument("--out", default="bench-out/serving", help="output folder")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    ap.add_argument("--quick", action="store_true", help="one small point per backend")
    ap.add_argument(
        "--merge",
        action="store_true",
        help="keep other backends' results from OUT's earlier run (same machine, same settings)",
    )
    serve = ap.add_argument_group("serve mode")
    serve.add_argument("--input-lens", default="2048,8192,32768")
    serve.add_argument("--output-lens", default="1,128")
    serve.add_argument(
        "--token-rates",
        default="16000,inf",
        help="offered load, prompt tokens/s (request rate = this / input len); inf: all at t=0",
    )
    serve.add_argument("--request-rates", default=None, help="absolute req/s; overrides tokens")
    serve.add_argument(
        "--num-prompts", type=int, default=None, help="per point (default: from --point-tokens)"
    )
    serve.add_argument(
        "--point-tokens",
        type=int,
        default=262144,
        help="prompt tokens per point when --num-prompts is not given (8 to 256 prompts)",
    )
    serve.add_argument("--num-warmups", type=int, default=2)
    serve.add_argument("--port", type=int, default=8765)
    serve.add_argument("--server-timeout", type=int, default=1800, help="seconds to /health")
    serve.add_argument("--bench-timeout", type=int, default=1800, help="seconds per bench run")
    serve.add_argument(
        "--prefix-caching",
        action="store_true",
        help="keep prefix caching on (off by default: points reuse the same random prompts)",
    )
    thr = ap.add_argument_group("throughput mode")
    thr.add_argument("--cases", default="4096:300,16384:100", help="input_len:num_prompts list")
    thr.add_argument("--max-num-batched-tokens", type=int, default=None)
    thr.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        help="run the backends this many times, the order reversed every other round; the\n"
        "tables show each backend's median and a table lists every round's ratio (one run a\n"
        "backend moved 3-7 %% between back-to-back runs on one H100, docs/perf-notes.md)",
    )
    thr.add_argument(
        "--budget-s",
        type=positive_int,
        default=None,
        help="wall-clock seconds for every run of this call: a round starts only if the longest\n"
        "run so far times the round's runs still fits, so a time limit (a device call's) never\n"
        "cuts a round in half; the report says how many rounds ran (default: no limit)",
    )
    args = ap.parse_args(argv)
    args.context = model_context(args.model)
    if args.quick:
        args.input_lens, args.output_lens, args.token_rates = "2048", "1", "inf"
        args.num_prompts = args.num_prompts or 32
        args.cases = "4096:50"
    return args


# --------------------------------------------------------------------------------------------
# Points and command lines


@dataclass(frozen=True)
class Point:
    input_len: int
    output_len: int
    request_rate: float  # req/s; inf = all requests at t=0
    num_prompts: int
    seed: int
    load: str = ""  # offered load as given: "16000 tok/s", "2 req/s" or "inf"

    @property
    def tag(self) -> str:
        return f"in{self.input_len}-out{self.output_len}-rate{rate_text(self.request_rate)}"


def rate_text(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:.4g}"


def default_num_prompts(input_len: int, budget_tokens: int = 262144) -> int:
    return max(8, min(256, budget_tokens // input_len))


def load_text(value: str, unit: str) -> str:
    return "inf" if math.isinf(float(value)) else f"{float(value):g} {unit}"


def serve_points(args) -> list[Point]:
    points = []
    for asked in (int(x) for x in split_list(args.input_lens)):
        for o_len in (int(x) for x in split_list(args.output_lens)):
            i_len = fit_input_len(args, asked, o_len)
            if any((p.input_len, p.output_len) == (i_len, o_len) for p in points):
                context_note(args, asked, o_len, "is a point already listed: skipped")
                continue
            if i_len != asked:
                context_note(args, asked, o_len, f"runs as input {i_len}")
            if args.request_rates:
                rates = [(float(r), load_text(r, "req/s")) for r in split_list(args.request_rates)]
            else:
                rates = [
                    (float(t) / i_len, load_text(t, "tok/s")) for t in split_list(args.token_rates)
                ]
            for rate, load in rates:
                n = args.num_prompts or default_num_prompts(i_len, args.point_tokens)
                points.append(Point(i_len, o_len, rate, n, seed=len(points), load=load))
    return points


def throughput_cases(args) -> list[tuple[int, int]]:
    out = []
    for item in split_list(args.cases):
        length, _, prompts = item.partition(":")
        case = (fit_input_len(args, int(length), 1), int(prompts or 100))
        if case in out:
            context_note(args, int(length), 1, "is a case already listed: skipped")
            continue
        if case[0] != int(length):
            context_note(args, int(length), 1, f"runs as input {case[0]}")
        out.append(case)
    return out


def model_context(model: str) -> int | None:
    """A model folder's context, config.json's max_position_embeddings (vLLM refuses a longer
    --max-model-len); None for a hub name or a config without it."""
    try:
        return int(json.loads((Path(model) / "config.json").read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# Tokens a prompt may grow by between the benchmark's count and the engine's: the tokenizer's
# BOS (the random dataset counts without special tokens and hands the engine text) and
# re-encoding. vLLM refuses a prompt as long as max_model_len (no room for one output token):
# 131,071 tokens + BOS on Llama-3.1-8B's 131,072 failed on both backends (2026-11-27).
CONTEXT_SLACK = 32


def fit_input_len(args, input_len: int, output_len: int) -> int:
    """The prompt length to run: the one asked for, or as long as the model's context allows
    with output_len tokens and CONTEXT_SLACK after it (vLLM rejects a prompt that leaves no
    room)."""
    context = args.context
    if context is None or input_len + output_len + CONTEXT_SLACK <= context:
        return input_len
    if output_len + CONTEXT_SLACK >= context:
        raise SystemExit(f"error: output {output_len} does not fit {args.model}'s {context} tokens")
    return context - output_len - CONTEXT_SLACK


def context_note(args, input_len: int, output_len: int, what: str) -> None:
    log(
        f"note: {args.model} holds {args.context} tokens (max_position_embeddings): input "
        f"{input_len} + output {output_len} {what}"
    )


def max_model_len(input_len: int, output_len: int, context: int | None = None) -> int:
    wanted = input_len + output_len + 128
    return wanted if context is None else min(wanted, context)


def engine_args(args, backend: str, model_len: int) -> list[str]:
    cmd = ["--load-format", "dummy", *BACKENDS[backend]]
    cmd += ["--tensor-parallel-size", str(args.tensor_parallel_size)]
    cmd += ["--max-model-len", str(model_len)]
    if args.block_size:
        cmd += ["--block-size", str(args.block_size)]
    return cmd + shlex.split(args.extra_args)


def serve_command(args, backend: str, points: list[Point]) -> list[str]:
    model_len = max(max_model_len(p.input_len, p.output_len, args.context) for p in points)
    cmd = [*VLLM_CLI, "serve", args.model, "--host", "127.0.0.1", "--port", str(args.port)]
    cmd += engine_args(args, backend, model_len)
    if not args.prefix_caching:
        cmd.append("--no-enable-prefix-caching")
    return cmd


def bench_serve_command(args, point: Point, result_dir: Path, filename: str) -> list[str]:
    return [
        *VLLM_CLI,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        f"http://127.0.0.1:{args.port}",
        "--model",
        args.model,
        "--tokenizer",
        args.model,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(point.input_len),
        "--random-output-len",
        str(point.output_len),
        "--num-prompts",
        str(point.num_prompts),
        "--request-rate",
        rate_text(point.request_rate),
        "--seed",
        str(point.seed),
        "--ignore-eos",
        "--num-warmups",
        str(args.num_warmups),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        filename,
    ]


def bench_throughput_command(args, backend: str, input_len: int, prompts: int, out_json: Path):
    cmd = [*VLLM_CLI, "bench", "throughput", "--backend", "vllm", "--model", args.model]
    # The random dataset's own flags: vLLM 0.26 gives --random-input-len/--random-output-len
    # defaults (1024/128) that override --input-len/--output-len with only a warning.
    cmd += ["--dataset-name", "random", "--random-input-len", str(input_len)]
    cmd += ["--random-output-len", "1"]
    cmd += ["--num-prompts", str(prompts), "--output-json", str(out_json)]
    if args.max_num_batched_tokens:
        cmd += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    return cmd + engine_args(args, backend, max_model_len(input_len, 1, args.context))


# --------------------------------------------------------------------------------------------
# Processes: servers live in their own process group and are always taken down with it

_ACTIVE: list[subprocess.Popen] = []


def start_group(cmd: list[str], log_path: Path) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    _ACTIVE.append(proc)
    return proc


def stop_group(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGTERM the process group this script started, then SIGKILL whatever is left of it."""
    if proc in _ACTIVE:
        _ACTIVE.remove(proc)
    _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and _group_alive(proc.pid):
        proc.poll()  # reap the leader so a zombie does not keep the group "alive"
        time.sleep(0.5)
    if _group_alive(proc.pid):
        _signal_group(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        log(f"warning: process {proc.pid} did not exit after SIGKILL")


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _stop_all(*_):
    for proc in list(_ACTIVE):
        stop_group(proc, grace_s=20.0)


def install_cleanup() -> None:
    atexit.register(_stop_all)

    def on_signal(signum, _frame):
        _stop_all()
        sys.exit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


ERROR_LINE = re.compile(r"^\w*(Error|Exception)\b|\bError: |\bERROR\b")


def failure_reason(path: Path) -> str:
    """What a failed run's log says went wrong: its last error line (an exception's message,
    or an ERROR log record), else its last three lines (a run's tail is often only the
    engine's shutdown messages)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line.strip() for line in lines if ERROR_LINE.search(line.strip())]
    return errors[-1] if errors else " ".join(lines[-3:])


def wait_healthy(
    proc: subprocess.Popen, port: int, timeout_s: float, poll_s: float = 3.0
) -> str | None:
    """None once /health answers 200; else the reason it never will."""
    url, start = f"http://127.0.0.1:{port}/health", time.time()
    while time.time() - start < timeout_s:
        if proc.poll() is not None:
            return f"server exited with rc {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return None
        except OSError:
            pass
        time.sleep(poll_s)
    return f"no /health after {timeout_s:g} s"


def run_logged(cmd: list[str], log_path: Path, timeout_s: int) -> int | str:
    """Run a command in its own process group, output to a log; rc or 'timeout'."""
    proc = start_group(cmd, log_path)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "timeout"
    finally:
        stop_group(proc, grace_s=10.0)


# --------------------------------------------------------------------------------------------
# serve mode


def parse_serve_result(path: Path) -> dict:
    data = json.loads(path.read_text())

    def pick(*keys):
        return next((data[k] for k in keys if data.get(k) is not None), None)

    return {
        "completed": data.get("completed"),
        "failed": data.get("failed"),
        "duration_s": data.get("duration"),
        "total_token_throughput": data.get("total_token_throughput"),
        "output_throughput": data.get("output_throughput"),
        "request_throughput": data.get("request_throughput"),
        "ttft_p50_ms": pick("p50_ttft_ms", "median_ttft_ms"),
        "ttft_p99_ms": pick("p99_ttft_ms"),
        "tpot_p50_ms": pick("p50_tpot_ms", "median_tpot_ms"),
        "tpot_p99_ms": pick("p99_tpot_ms"),
    }


def point_record(backend: str, p: Point) -> dict:
    return {
        "backend": backend,
        "input_len": p.input_len,
        "output_len": p.output_len,
        "request_rate": rate_text(p.request_rate),
        "load": p.load,
        "num_prompts": p.num_prompts,
        "error": "",
    }


def run_point(args, backend: str, p: Point, out_dir: Path) -> dict:
    rec = point_record(backend, p)
    name = f"{backend}-{p.tag}.json"
    (out_dir / name).unlink(missing_ok=True)
    cmd = bench_serve_command(args, p, out_dir, name)
    rc = run_logged(cmd, out_dir / f"{backend}-{p.tag}.log", args.bench_timeout)
    if rc != 0 or not (out_dir / name).exists():
        rec["error"] = f"error: bench serve rc {rc}; see {out_dir / (backend + '-' + p.tag)}.log"
        return rec
    try:
        rec.update(parse_serve_result(out_dir / name))
    except (OSError, ValueError) as exc:
        rec["error"] = f"error: unreadable result: {exc}"
    return rec


def run_backend_serve(args, backend: str, points: list[Point], out_dir: Path) -> list[dict]:
    log_path = out_dir / f"server-{backend}.log"
    log(f"[{backend}] starting server: {shlex.join(serve_command(args, backend, points))}")
    proc = start_group(serve_command(args, backend, points), log_path)
    records = []
    try:
        t0 = time.time()
        why = wait_healthy(proc, args.port, args.server_timeout)
        if why:
            log(f"[{backend}] server failed: {why}; last lines of {log_path}:\n{tail(log_path)}")
            return [{**point_record(backend, p), "error": f"error: {why}"} for p in points]
        log(f"[{backend}] healthy after {time.time() - t0:.0f} s")
        for i, p in enumerate(points, 1):
            rec = run_point(args, backend, p, out_dir)
            records.append(rec)
            log(f"[{backend}] {i}/{len(points)} {p.tag}: " + summary(rec))
    finally:
        stop_group(proc)
        time.sleep(5)  # let the GPU memory go before the next server
    return records


def summary(rec: dict) -> str:
    if rec.get("error"):
        return rec["error"]
    return (
        f"{fmt_num(rec.get('total_token_throughput'))} tok/s, "
        f"TTFT p50 {fmt_num(rec.get('ttft_p50_ms'), 1)} ms p99 {fmt_num(rec.get('ttft_p99_ms'), 1)}"
        f", TPOT p50 {fmt_num(rec.get('tpot_p50_ms'), 2)} ms, "
        f"{rec.get('completed')} ok / {rec.get('failed')} failed"
    )


SERVE_METRICS = (
    ("total_token_throughput", "Total token throughput (tok/s, higher is better)", 0),
    ("ttft_p50_ms", "TTFT p50 (ms, lower is better)", 1),
    ("ttft_p99_ms", "TTFT p99 (ms)", 1),
    ("tpot_p50_ms", "TPOT p50 (ms, output 128 only)", 2),
    ("tpot_p99_ms", "TPOT p99 (ms, output 128 only)", 2),
)


def value_cell(rec: dict | None, metric: str, digits: int) -> str:
    if rec is None:
        return "—"
    if rec.get("error"):
        return "error"
    if metric.startswith("tpot") and rec.get("output_len") == 1:
        return "—"
    return fmt_num(rec.get(metric), digits)


def ratio_cell(rec: dict | None, base: dict | None, metric: str) -> str:
    try:
        a, b = rec[metric], base[metric]
        if rec.get("error") or base.get("error") or not b or a is None:
            return "—"
        if metric.startswith("tpot") and rec.get("output_len") == 1:
            return "—"
        return f"{a / b:.3f}"
    except (TypeError, KeyError):
        return "—"


def comparison_tables(records, backends, keys, metrics, key_header) -> str:
    """One Markdown table per metric: a row per key, a column per backend, then ratios."""
    by = {(r["backend"], *(r[k] for k in keys)): r for r in records}
    rows_keys = list(dict.fromkeys(tuple(r[k] for k in keys) for r in records))
    others = [b for b in backends if b != BASELINE]
    blocks = []
    for metric, title, digits in metrics:
        header = [*key_header, *backends]
        if BASELINE in backends:
            header += [f"{b} / {BASELINE}" for b in others]
        rows = []
        for rk in rows_keys:
            row = list(rk) + [value_cell(by.get((b, *rk)), metric, digits) for b in backends]
            if BASELINE in backends:
                base = by.get((BASELINE, *rk))
                row += [ratio_cell(by.get((b, *rk)), base, metric) for b in others]
            rows.append(row)
        blocks.append(f"### {title}\n\n" + markdown_table(header, rows))
    return "\n\n".join(blocks)


def plot_serve(records, backends, out_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        log(f"plots skipped: {exc}")
        return []
    combos = list(dict.fromkeys((r["output_len"], r.get("load", "")) for r in records))
    written = []
    for metric, ylabel, fname in (
        ("total_token_throughput", "total tokens/s", "throughput.png"),
        ("ttft_p50_ms", "TTFT p50 (ms)", "ttft.png"),
    ):
        fig, axes = plt.subplots(1, len(combos), figsize=(5 * len(combos), 4), squeeze=False)
        for ax, (o_len, load) in zip(axes[0], combos, strict=True):
            for b in backends:
                pts = sorted(
                    (r["input_len"], r.get(metric))
                    for r in records
                    if r["backend"] == b
                    and r["output_len"] == o_len
                    and r.get("load", "") == load
                    and r.get(metric) is not None
                    and not r.get("error")
                )
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=b)
            lengths = sorted({r["input_len"] for r in records})
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [str(n) for n in lengths])
            ax.set_title(f"output {o_len}, load {load}")
            ax.set_xlabel("input tokens")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=120)
        plt.close(fig)
        written.append(str(out_dir / fname))
    return written


def run_serve(args, backends: list[str], out_dir: Path) -> int:
    points = serve_points(args)
    if args.dry_run:
        for b in backends:
            log(shlex.join(serve_command(args, b, points)))
            for p in points:
                log("  " + shlex.join(bench_serve_command(args, p, out_dir, f"{b}-{p.tag}.json")))
        return 0
    install_cleanup()
    records, shown = earlier_records(args, out_dir / "serving.json", backends)
    for backend in backends:
        records += run_backend_serve(args, backend, points, out_dir)
        write_json(out_dir / "serving.json", {"meta": meta(args), "records": records})
    keys = ("input_len", "output_len", "load", "request_rate")
    header = ["input", "output", "offered load", "req/s"]
    text = report_header(args, "serve") + comparison_tables(
        records, shown, keys, SERVE_METRICS, header
    )
    finish(out_dir, "serving", records, text)
    for path in plot_serve(records, shown, out_dir):
        log(f"wrote {path}")
    return 0


def earlier_records(args, path: Path, backends: list[str]) -> tuple[list[dict], list[str]]:
    """With --merge: the other backends' records from an earlier run into the same folder."""
    if not args.merge or not path.exists():
        return [], list(backends)
    old = [
        r
        for r in json.loads(path.read_text()).get("records", [])
        if r.get("backend") not in backends
    ]
    shown = [b for b in BACKENDS if b in backends or any(r["backend"] == b for r in old)]
    log(f"merging {len(old)} earlier records from {path} ({', '.join(shown)})")
    return old, shown


# --------------------------------------------------------------------------------------------
# throughput mode


THROUGHPUT_METRICS = (
    ("tokens_per_second", "Total tokens/s (`bench throughput`, output 1; higher is better)", 0),
    ("requests_per_second", "Requests/s", 2),
    (
        "steady_input_tps",
        "Input tokens/s at three quarters of the prompts (vLLM's progress bar: the run "
        "without its last prompts, which move a small run's total by several percent)",
        0,
    ),
)
# vLLM's offline progress bar: "... 18/24 [00:10<00:03, 1.61it/s, est. speed input: 55561.42
# toks/s, ..." (tqdm, updates separated by carriage returns)
_PROGRESS = re.compile(r"(\d+)/(\d+) \[[^\]]*?est\. speed input: ([\d.]+) toks/s")
STEADY_SHARE = 0.75


def steady_input_rate(log_text: str, share: float = STEADY_SHARE) -> float | None:
    """vLLM's running input rate at its last progress update with at most ``share`` of the
    prompts done, or None when the log has no such update. At 24 prompts of 32k the last six
    moved gpt-oss-20b's totals by up to 9 % between runs whose rates at 75 % agreed within
    1.4 % (docs/perf-notes.md, session 37): a steady figure to read beside the total."""
    rate = None
    for done, total, value in _PROGRESS.findall(log_text):
        if 0 < int(done) <= share * int(total):
            rate = float(value)
    return rate


def round_orders(backends: list[str], rounds: int) -> list[list[str]]:
    """The backends' order in each round: as given, then reversed, alternating, so that neither
    backend always runs first (a machine's throughput drifts over its first runs)."""
    return [list(backends) if r % 2 == 0 else list(reversed(backends)) for r in range(rounds)]


def median_records(records: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """One record per (backend, *keys): the median of its error-free rounds' metrics (an error
    record when every round failed). Records without a round pass through unchanged."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["backend"], *(r[k] for k in keys)), []).append(r)
    out = []
    for group in groups.values():
        if len(group) == 1 and "round" not in group[0]:
            out.append(group[0])
            continue
        ok = [r for r in group if not r.get("error")]
        rec = {k: group[0][k] for k in ("backend", *keys)}
        rec["rounds"] = len(ok)
        rec["error"] = "" if ok else group[-1]["error"]
        for metric, _, _ in THROUGHPUT_METRICS:
            values = [r[metric] for r in ok if r.get(metric) is not None]
            if values:
                rec[metric] = statistics.median(values)
        out.append(rec)
    return out


def rounds_table(records: list[dict], backends: list[str]) -> str:
    """Every round's tokens/s per backend and each backend's ratio to the baseline in that round,
    a row per (case, round); ``backends`` in the order the run was given them."""
    orders = round_orders(backends, 1 + max(r["round"] for r in records))
    others = [b for b in backends if b != BASELINE]
    by = {(r["backend"], r["input_len"], r["num_prompts"], r["round"]): r for r in records}
    keys = sorted({(r["input_len"], r["num_prompts"], r["round"]) for r in records})
    header = ["input", "prompts", "round", "order", *backends]
    header += [f"{b} / {BASELINE}" for b in others] if BASELINE in backends else []
    rows = []
    for length, n, rnd in keys:
        recs = [by.get((b, length, n, rnd)) for b in backends]
        row = [length, n, rnd + 1, ", ".join(orders[rnd])]
        row += [value_cell(r, "tokens_per_second", 0) for r in recs]
        if BASELINE in backends:
            base = by.get((BASELINE, length, n, rnd))
            row += [
                ratio_cell(by.get((b, length, n, rnd)), base, "tokens_per_second") for b in others
            ]
        rows.append(row)
    return "### Every round (tokens/s)\n\n" + markdown_table(header, rows)


@dataclass
class RoundBudget:
    """Whether another round of runs fits ``budget_s`` seconds from ``start`` (None: always),
    judged by the longest run so far; the first round always starts."""

    budget_s: float | None
    start: float
    longest_run_s: float = 0.0

    def record(self, run_s: float) -> None:
        self.longest_run_s = max(self.longest_run_s, run_s)

    def round_fits(self, runs: int, now: float) -> bool:
        if self.budget_s is None or self.longest_run_s == 0.0:
            return True
        return now - self.start + runs * self.longest_run_s <= self.budget_s


def throughput_run(args, backend: str, length: int, n: int, tag: str, out_dir: Path) -> dict:
    """One `vllm bench throughput` run: its record (the bench's JSON, or the error)."""
    out_json = out_dir / f"{tag}.json"
    out_json.unlink(missing_ok=True)
    cmd = bench_throughput_command(args, backend, length, n, out_json)
    log(f"[{backend}] {shlex.join(cmd)}")
    rc = run_logged(cmd, out_dir / f"{tag}.log", args.bench_timeout)
    rec = {"backend": backend, "input_len": length, "num_prompts": n, "error": ""}
    if rc == 0 and out_json.exists():
        rec.update(json.loads(out_json.read_text()))
        log_text = (out_dir / f"{tag}.log").read_text(errors="replace")
        rec["steady_input_tps"] = steady_input_rate(log_text)
    else:
        reason = failure_reason(out_dir / f"{tag}.log")
        rec["error"] = f"error: rc {rc}; see {out_dir / tag}.log: {reason}"
    return rec


def run_throughput(args, backends: list[str], out_dir: Path) -> int:
    cases = throughput_cases(args)
    rounds = args.rounds
    if args.dry_run:
        for order in round_orders(backends, rounds):
            for b in order:
                for length, n in cases:
                    cmd = bench_throughput_command(args, b, length, n, out_dir / "x.json")
                    log(shlex.join(cmd))
        return 0
    install_cleanup()
    records, shown = earlier_records(args, out_dir / "throughput.json", backends)
    budget = RoundBudget(args.budget_s, time.monotonic())
    rounds_run = 0
    for rnd, order in enumerate(round_orders(backends, rounds)):
        runs = len(order) * len(cases)
        if not budget.round_fits(runs, time.monotonic()):
            left = args.budget_s - (time.monotonic() - budget.start)
            log(
                f"--budget-s {args.budget_s}: round {rnd + 1} of {rounds} not started ({runs} "
                f"runs of up to {budget.longest_run_s:.0f} s each, {left:.0f} s left)"
            )
            break
        rounds_run += 1
        for b in order:
            for length, n in cases:
                tag = f"throughput-{b}-in{length}-n{n}" + (f"-r{rnd + 1}" if rounds > 1 else "")
                t0 = time.monotonic()
                rec = throughput_run(args, b, length, n, tag, out_dir)
                budget.record(time.monotonic() - t0)
                if rounds > 1:
                    rec["round"] = rnd
                records.append(rec)
                where = f" (round {rnd + 1} of {rounds})" if rounds > 1 else ""
                steady = rec.get("steady_input_tps")
                log(
                    f"[{b}] in {length} × {n}{where}: "
                    + (rec["error"] or f"{fmt_num(rec.get('tokens_per_second'))} tok/s")
                    + (f" (input {fmt_num(steady)} tok/s at 75 % of the prompts)" if steady else "")
                )
                write_json(out_dir / "throughput.json", {"meta": meta(args), "records": records})
    keys = ("input_len", "num_prompts")
    text = report_header(args, "throughput")
    if rounds > 1:
        ran = f"{rounds}" if rounds_run == rounds else f"{rounds_run} (of {rounds}; --budget-s)"
        text += f"Each backend's median of {ran} rounds (the order reversed every other round).\n\n"
    text += comparison_tables(
        median_records(records, keys), shown, keys, THROUGHPUT_METRICS, ["input", "prompts"]
    )
    if rounds > 1:
        text += "\n\n" + rounds_table([r for r in records if "round" in r], backends)
    finish(out_dir, "throughput", records, text)
    return 0


# --------------------------------------------------------------------------------------------


def meta(args) -> dict:
    return {
        "gpu": gpu_description(),
        "versions": software_versions(DISTS),
        "model": args.model,
        "tensor_parallel_size": args.tensor_parallel_size,
        "block_size": args.block_size,
        "extra_args": args.extra_args,
        "prefix_caching": args.prefix_caching,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def report_header(args, mode: str) -> str:
    m = meta(args)
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    return (
        f"# End to end, {mode} mode: {args.model} (dummy weights), "
        f"TP {args.tensor_parallel_size}\n\n"
        f"GPU: {m['gpu']}. {versions}. Ratios are to {BASELINE} from the same run.\n\n"
    )


def finish(out_dir: Path, name: str, records: list[dict], text: str) -> None:
    (out_dir / f"{name}.md").write_text(text + "\n")
    write_csv(out_dir / f"{name}.csv", records)
    log("\n" + text)
    log(f"wrote {out_dir}/{name}.md, {name}.csv, {name}.json")


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        backends = resolve_names(args.backends, BACKENDS)
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    out_dir = Path(args.out)
    if not args.dry_run:
        if PLUGIN_BACKENDS & set(backends) and (problem := plugin_problem()):
            sys.exit(f"error: {problem}")
        out_dir.mkdir(parents=True, exist_ok=True)
    if args.mode == "throughput":
        return run_throughput(args, backends, out_dir)
    return run_serve(args, backends, out_dir)


if __name__ == "__main__":
    sys.exit(main())
