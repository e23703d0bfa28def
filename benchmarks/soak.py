#!/usr/bin/env python3
"""Serving soak (issue 12, part 3): `vllm serve` under FA4, then FLASH_ATTN, at saturation.

Per backend: start `vllm serve MODEL --load-format dummy --attention-backend B` with prefix
caching on (and --enable-prompt-tokens-details, so every response says how many of its prompt
tokens came from the cache), warm it up, read GPU memory (nvidia-smi), then CONCURRENCY
streaming clients send /v1/completions requests back to back for --minutes. The requests are a
seeded mix: ~100-token prompts (one of a few shared 48-token prefixes + a tail of their own) and
~32k-token prompts (one of a few shared documents + a question of their own, or now and then a
fresh document that nothing else shares); outputs of 8-64 tokens with ignore_eos. About 10% of
the requests are cancelled by closing the stream after a random short delay, most before their
first token (mid-prefill). Then: drain, GPU memory again, /health and one more short request,
and the server log is searched for Tracebacks.

A request has failed when it was not cancelled by us and got a non-200 answer, an error in the
stream, a connection error or timeout, or a stream that ended without a finish_reason of
"length", its usage chunk (completion_tokens == max_tokens) or `[DONE]`.

Pass rules, per backend (the exit status is FA4's: 1 when FA4 breaks one):
  server started; requests completed (short and long); no failed requests (warmup included);
  none left unfinished after the drain; cancellations exercised (>= 1 before its first token);
  healthy after (/health 200, one more short request served, server process alive); no
  Traceback in the server log up to then; GPU memory flat (after the load minus after the
  warmup <= --memory-tolerance-mib on every GPU); prefix cache hits (cached prompt tokens > 0).
Also measured, without a rule until runs calibrate one: the resident host memory of the
server's process group (the API server and its engine cores, from /proc) after the warmup, at
its peak during the load and after the drain.

    python3 benchmarks/soak.py                                # FA4, then FLASH_ATTN, 5 min each
    python3 benchmarks/soak.py --backends FA4 --minutes 30    # longer, one backend
    python3 benchmarks/soak.py --backends FLASH_ATTN --merge  # add to OUT's earlier FA4 run
    python3 benchmarks/soak.py --report-only                  # OUT/soak.md from OUT/soak-*.json
    python3 benchmarks/soak.py --dry-run                      # print the plan (no GPU)

Outputs in --out: soak-<BACKEND>.json (one backend's result), soak.json + soak.md (all backends
of this run, with --merge or --report-only also the others found in OUT), requests-<BACKEND>.csv
(one row per request), server-<BACKEND>.log.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import re
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serving  # noqa: E402  (the vllm serve process helpers: start, health, stop)
from _common import (  # noqa: E402
    fmt_num,
    log,
    markdown_table,
    resolve_names,
    short_error,
    software_versions,
    write_csv,
    write_json,
)

FA4 = "FA4"
BASELINE = serving.BASELINE  # FLASH_ATTN
DEFAULT_BACKENDS = f"{FA4},{BASELINE}"
RESULT_GLOB = "soak-*.json"
POST_RESERVE_S = 45.0  # after the drain: settle, health, probe, log scan, server stop


def parse_pair(text: str, kind=int) -> tuple:
    lo, _, hi = str(text).partition(",")
    lo_v = kind(lo)
    hi_v = kind(hi) if hi.strip() else lo_v
    if hi_v < lo_v:
        raise argparse.ArgumentTypeError(f"{text!r}: MIN,MAX with MIN <= MAX")
    return lo_v, hi_v


def _int_pair(text):
    return parse_pair(text, int)


def _float_pair(text):
    return parse_pair(text, float)


class _HelpFormatter(argparse.RawTextHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=_HelpFormatter)
    ap.add_argument("--model", default="configs/llama-3.1-8b", help="model folder or name")
    ap.add_argument("--backends", default=DEFAULT_BACKENDS, help=", ".join(serving.BACKENDS))
    ap.add_argument("--minutes", type=float, default=5.0, help="load per backend")
    ap.add_argument("--concurrency", type=int, default=64, help="streaming clients, back to back")
    ap.add_argument("--out", default="bench-out/soak", help="output folder")
    ap.add_argument("--dry-run", action="store_true", help="print the plan only (no server)")
    ap.add_argument(
        "--merge", action="store_true", help="report other backends' soak-*.json in OUT too"
    )
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: write soak.md/soak.json from every soak-*.json in OUT",
    )
    mix = ap.add_argument_group("load mix")
    mix.add_argument("--seed", type=int, default=0)
    mix.add_argument("--long-fraction", type=float, default=0.2, help="requests with ~32k tokens")
    mix.add_argument("--long-tokens", type=int, default=32768, help="longest long prompt")
    mix.add_argument(
        "--question-tokens", type=_int_pair, default=(32, 128), help="MIN,MAX after a document"
    )
    mix.add_argument("--docs", type=int, default=4, help="shared long documents")
    mix.add_argument(
        "--fresh-doc-fraction",
        type=float,
        default=0.1,
        help="of the long requests: a document of their own (full prefill, no cache hit)",
    )
    mix.add_argument("--short-tokens", type=_int_pair, default=(80, 120), help="MIN,MAX")
    mix.add_argument("--short-prefix-tokens", type=int, default=48)
    mix.add_argument("--short-prefixes", type=int, default=4, help="shared short prefixes")
    mix.add_argument("--output-tokens", type=_int_pair, default=(8, 64), help="MIN,MAX")
    mix.add_argument("--cancel-fraction", type=float, default=0.1)
    mix.add_argument(
        "--cancel-delay", type=_float_pair, default=(0.02, 0.5), help="MIN,MAX seconds"
    )
    srv = ap.add_argument_group("server")
    srv.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    srv.add_argument("--block-size", type=int, default=None, help="KV block size (vLLM default)")
    srv.add_argument("--extra-args", default="", help="more engine args, one shell-quoted string")
    srv.add_argument("--port", type=int, default=8766)
    srv.add_argument("--server-timeout", type=float, default=900, help="seconds to /health")
    srv.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall seconds per backend, server start to stop: the load is shortened to fit",
    )
    srv.add_argument(
        "--drain-timeout", type=float, default=90, help="seconds for in-flight requests at end"
    )
    srv.add_argument("--request-timeout", type=float, default=300, help="seconds per request")
    srv.add_argument("--sample-s", type=float, default=15, help="GPU memory + /metrics samples")
    srv.add_argument("--settle-s", type=float, default=5, help="pause before memory readings")
    srv.add_argument("--memory-tolerance-mib", type=float, default=512)
    srv.add_argument("--no-memory-check", action="store_true", help="no nvidia-smi rule")
    srv.add_argument(
        "--server-command",
        default=None,
        help="(tests) a command instead of vllm serve; {port} {backend} {python} filled in",
    )
    args = ap.parse_args(argv)
    for name in ("long_fraction", "fresh_doc_fraction", "cancel_fraction"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            ap.error(f"--{name.replace('_', '-')} must be within [0, 1]")
    if args.long_tokens - args.question_tokens[1] < 1:
        ap.error("--long-tokens must exceed the longest question")
    if args.short_tokens[0] <= args.short_prefix_tokens:
        ap.error("--short-tokens MIN must exceed --short-prefix-tokens")
    return args


# --------------------------------------------------------------------------------------------
# Load mix: a pure function of (seed, request index)


@dataclass(frozen=True)
class MixConfig:
    seed: int = 0
    long_fraction: float = 0.2
    long_tokens: int = 32768
    question_tokens: tuple[int, int] = (32, 128)
    docs: int = 4
    fresh_doc_fraction: float = 0.1
    short_tokens: tuple[int, int] = (80, 120)
    short_prefix_tokens: int = 48
    short_prefixes: int = 4
    output_tokens: tuple[int, int] = (8, 64)
    cancel_fraction: float = 0.1
    cancel_delay: tuple[float, float] = (0.02, 0.5)
    token_range: tuple[int, int] = (32, 127)  # printable bytes: valid in any Llama vocab

    @property
    def doc_tokens(self) -> int:
        """Length of every long document (shared or fresh): the longest prompt minus the
        longest question, so no long prompt exceeds --long-tokens."""
        return self.long_tokens - self.question_tokens[1]

    @property
    def max_prompt_tokens(self) -> int:
        return max(self.doc_tokens + self.question_tokens[1], self.short_tokens[1])

    @classmethod
    def from_args(cls, args) -> MixConfig:
        return cls(
            seed=args.seed,
            long_fraction=args.long_fraction,
            long_tokens=args.long_tokens,
            question_tokens=tuple(args.question_tokens),
            docs=args.docs,
            fresh_doc_fraction=args.fresh_doc_fraction,
            short_tokens=tuple(args.short_tokens),
            short_prefix_tokens=args.short_prefix_tokens,
            short_prefixes=args.short_prefixes,
            output_tokens=tuple(args.output_tokens),
            cancel_fraction=args.cancel_fraction,
            cancel_delay=tuple(args.cancel_delay),
        )


@dataclass(frozen=True)
class RequestSpec:
    index: int
    kind: str  # "short" | "long"
    prefix: str  # "sys<k>" | "doc<k>" shared; "fresh<index>" a document of its own
    prefix_tokens: int
    suffix_tokens: int
    max_tokens: int
    cancel_after_s: float | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.prefix_tokens + self.suffix_tokens

    @property
    def shared(self) -> bool:
        return not self.prefix.startswith("fresh")


def make_spec(mix: MixConfig, index: int) -> RequestSpec:
    """Request `index` of the mix: the same for a seed, whatever order clients take them in.

    Every draw is made whatever the earlier ones gave, so changing one knob (say the cancel
    fraction) leaves the rest of each request as it was."""
    rng = random.Random(f"{mix.seed}:spec:{index}")
    u_long, u_fresh, u_cancel = rng.random(), rng.random(), rng.random()
    delay = round(rng.uniform(*mix.cancel_delay), 4)
    out = rng.randint(*mix.output_tokens)
    doc, question = rng.randrange(max(1, mix.docs)), rng.randint(*mix.question_tokens)
    short_prefix, short_total = (
        rng.randrange(max(1, mix.short_prefixes)),
        rng.randint(*mix.short_tokens),
    )
    cancel = delay if u_cancel < mix.cancel_fraction else None
    if u_long < mix.long_fraction:
        fresh = mix.docs == 0 or u_fresh < mix.fresh_doc_fraction
        prefix = f"fresh{index}" if fresh else f"doc{doc}"
        return RequestSpec(index, "long", prefix, mix.doc_tokens, question, out, cancel)
    if mix.short_prefixes > 0:
        prefix, prefix_len = f"sys{short_prefix}", mix.short_prefix_tokens
    else:
        prefix, prefix_len = f"fresh{index}", 0
    return RequestSpec(index, "short", prefix, prefix_len, short_total - prefix_len, out, cancel)


def warmup_specs(mix: MixConfig) -> list[RequestSpec]:
    """Every shared document and short prefix once (so the load starts with a warm prefix
    cache, as a long-running server has), and one fresh document; no cancellations."""
    specs, index = [], -1
    out = mix.output_tokens[1]
    q = mix.question_tokens[0]
    for d in range(mix.docs):
        specs.append(RequestSpec(index, "long", f"doc{d}", mix.doc_tokens, q, out))
        index -= 1
    specs.append(RequestSpec(index, "long", f"fresh{index}", mix.doc_tokens, q, out))
    index -= 1
    for k in range(max(1, mix.short_prefixes)):
        prefix = f"sys{k}" if mix.short_prefixes else f"fresh{index}"
        plen = mix.short_prefix_tokens if mix.short_prefixes else 0
        specs.append(RequestSpec(index, "short", prefix, plen, mix.short_tokens[0] - plen, out))
        index -= 1
    return specs


def probe_spec(mix: MixConfig) -> RequestSpec:
    """The one short request after the load (health check); an index of its own."""
    return RequestSpec(-(10**6), "short", "fresh-probe", 0, mix.short_tokens[0], 8)


def random_tokens(mix: MixConfig, key: str, n: int) -> list[int]:
    lo, hi = mix.token_range
    span = hi - lo + 1
    data = random.Random(f"{mix.seed}:{key}").randbytes(n)
    return [lo + b % span for b in data]


class PromptBuilder:
    """Token ids of a request: its prefix (shared ones built once) + its own suffix."""

    def __init__(self, mix: MixConfig):
        self.mix = mix
        self._shared: dict[str, list[int]] = {}

    def prefix(self, spec: RequestSpec) -> list[int]:
        if not spec.shared:
            return random_tokens(self.mix, spec.prefix, spec.prefix_tokens)
        key = (spec.prefix, spec.prefix_tokens)
        ids = self._shared.get(key)
        if ids is None:
            ids = self._shared[key] = random_tokens(self.mix, spec.prefix, spec.prefix_tokens)
        return ids

    def prompt(self, spec: RequestSpec) -> list[int]:
        return self.prefix(spec) + random_tokens(
            self.mix, f"suffix:{spec.index}", spec.suffix_tokens
        )


def describe_mix(mix: MixConfig, sample: int = 5000) -> dict:
    """What the first `sample` requests of this seed hold (the plan; unit tests)."""
    specs = [make_spec(mix, i) for i in range(sample)]
    long = [s for s in specs if s.kind == "long"]
    return {
        "requests": sample,
        "long": len(long),
        "fresh_docs": sum(not s.shared for s in long),
        "short": sample - len(long),
        "cancel": sum(s.cancel_after_s is not None for s in specs),
        "prompt_tokens": sum(s.prompt_tokens for s in specs),
        "max_prompt_tokens": max(s.prompt_tokens for s in specs),
    }


# --------------------------------------------------------------------------------------------
# One request: stream, check, maybe cancel


@dataclass
class Record:
    index: int
    kind: str
    prefix: str
    prompt_tokens: int  # as planned
    max_tokens: int
    cancel_after_s: float | None = None
    phase: str = "load"  # "warmup" | "load" | "probe"
    t_send: float | None = None  # seconds after the phase started
    ttft_s: float | None = None
    latency_s: float | None = None
    status: int | None = None
    outcome: str | None = None  # "completed" | "failed" | "cancelled"; None: unfinished
    error: str = ""
    first_token_before_cancel: bool | None = None
    finish_reason: str | None = None
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    cached_tokens: int | None = None
    chunks: int = 0

    @classmethod
    def from_spec(cls, spec: RequestSpec, phase: str = "load") -> Record:
        return cls(
            spec.index,
            spec.kind,
            spec.prefix,
            spec.prompt_tokens,
            spec.max_tokens,
            spec.cancel_after_s,
            phase,
        )


def request_body(model: str, prompt: list[int], max_tokens: int) -> dict:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


class StreamCheck:
    """Feeds on the stream's `data:` payloads; `finish` says whether it was a whole answer."""

    def __init__(self, rec: Record):
        self.rec = rec
        self.done = False
        self.errors: list[str] = []

    def feed(self, payload: str, now_s: float) -> None:
        if payload == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            self.errors.append(f"unparsable chunk {short_error(payload, 80)!r}")
            return
        if not isinstance(obj, dict):
            self.errors.append(f"unexpected chunk {short_error(payload, 80)!r}")
            return
        if obj.get("error") or obj.get("object") == "error":
            err = obj.get("error", obj)
            msg = err.get("message", err) if isinstance(err, dict) else err
            self.errors.append(f"error in stream: {short_error(str(msg), 160)}")
            return
        choices = obj.get("choices") or []
        if choices:
            self.rec.chunks += 1
            if self.rec.ttft_s is None:
                self.rec.ttft_s = now_s
            for c in choices:
                if c.get("finish_reason") is not None:
                    self.rec.finish_reason = c["finish_reason"]
        usage = obj.get("usage")
        if usage:
            self.rec.usage_prompt_tokens = usage.get("prompt_tokens")
            self.rec.usage_completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                self.rec.cached_tokens = details["cached_tokens"]

    def finish(self) -> None:
        rec = self.rec
        if self.errors:
            why = self.errors[0]
        elif not self.done:
            why = "truncated stream (no [DONE])"
        elif rec.finish_reason is None:
            why = "no finish_reason"
        elif rec.finish_reason != "length":
            why = f"finish_reason {rec.finish_reason!r} (ignore_eos: expected 'length')"
        elif rec.usage_completion_tokens is None:
            why = "no usage chunk"
        elif rec.usage_completion_tokens != rec.max_tokens:
            why = f"completion_tokens {rec.usage_completion_tokens} != max_tokens {rec.max_tokens}"
        else:
            rec.outcome = "completed"
            return
        rec.outcome, rec.error = "failed", why


async def sse_payloads(content):
    """`data:` payloads of a server-sent-event stream (own line splitting: no line limit)."""
    buf = b""
    async for chunk in content.iter_any():
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                yield line[5:].strip().decode("utf-8", "replace")
    line = buf.strip()
    if line.startswith(b"data:"):
        yield line[5:].strip().decode("utf-8", "replace")


async def _stream(session, url: str, body: dict, rec: Record, start: float) -> None:
    import aiohttp

    loop = asyncio.get_running_loop()
    try:
        async with session.post(url, json=body) as resp:
            rec.status = resp.status
            if resp.status != 200:
                text = await resp.text()
                rec.outcome, rec.error = "failed", f"HTTP {resp.status}: {short_error(text, 200)}"
                return
            check = StreamCheck(rec)
            try:
                async for payload in sse_payloads(resp.content):
                    check.feed(payload, loop.time() - start)
                    if check.done:
                        break
            except asyncio.CancelledError:
                resp.close()  # drop the connection: the server sees the client go away
                raise
            check.finish()
    except (aiohttp.ClientError, ConnectionError, OSError) as exc:
        rec.outcome, rec.error = "failed", f"{type(exc).__name__}: {short_error(str(exc), 160)}"


async def issue(
    session,
    base_url: str,
    model: str,
    spec: RequestSpec,
    prompt: list[int],
    request_timeout: float,
    t0: float,
    records: list[Record],
    phase: str = "load",
) -> Record:
    """Send one request and classify it; cancel it after spec.cancel_after_s if still going.

    The record joins `records` before anything is awaited, so a request cut off by the end of
    the drain is still counted (outcome None: unfinished)."""
    loop = asyncio.get_running_loop()
    rec = Record.from_spec(spec, phase)
    records.append(rec)
    start = loop.time()
    rec.t_send = round(start - t0, 4)
    body = request_body(model, prompt, spec.max_tokens)
    task = asyncio.ensure_future(
        asyncio.wait_for(
            _stream(session, f"{base_url}/v1/completions", body, rec, start), request_timeout
        )
    )
    try:
        if spec.cancel_after_s is not None:
            done, _ = await asyncio.wait({task}, timeout=spec.cancel_after_s)
            if not done:
                rec.first_token_before_cancel = rec.ttft_s is not None
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                rec.outcome, rec.error = "cancelled", ""
                rec.latency_s = loop.time() - start
                return rec
        await task
    except TimeoutError:
        rec.outcome, rec.error = "failed", f"no answer within {request_timeout:g} s"
    finally:
        if not task.done():  # this coroutine was cancelled (end of the drain)
            task.cancel()
    if rec.outcome is None:  # _stream returned without a verdict: should not happen
        rec.outcome, rec.error = "failed", "no verdict"
    rec.latency_s = loop.time() - start
    return rec


async def drive(
    session,
    base_url: str,
    model: str,
    mix: MixConfig,
    concurrency: int,
    load_s: float,
    drain_s: float,
    request_timeout: float,
    sampler=None,
    sample_s: float = 15.0,
    first_index: int = 0,
    max_failures: int = 500,
) -> dict:
    """`concurrency` clients send requests back to back for `load_s`, then get `drain_s` to
    finish what is in flight; what is still running after that is cut (unfinished). After
    `max_failures` failed requests the load stops early (`stopped_early`)."""
    loop = asyncio.get_running_loop()
    records: list[Record] = []
    prompts = PromptBuilder(mix)
    counter = itertools.count(first_index)
    t0 = loop.time()
    stop_at = t0 + load_s
    samples: list[dict] = []

    failures = 0

    async def client():
        nonlocal failures, stop_at
        while loop.time() < stop_at:
            spec = make_spec(mix, next(counter))
            rec = await issue(
                session, base_url, model, spec, prompts.prompt(spec), request_timeout, t0, records
            )
            if rec.outcome == "failed":
                failures += 1
                if failures >= max_failures and stop_at > loop.time():
                    stop_at = loop.time()  # a dead server: stop, do not spin for minutes
                    log(f"  {failures} failed requests: load stopped early")
                await asyncio.sleep(0.1)  # no tight loop against a server that refuses

    async def sample_loop():
        while True:
            await asyncio.sleep(sample_s)
            with contextlib.suppress(Exception):
                samples.append({"t": round(loop.time() - t0, 1), **(await sampler())})

    clients = [asyncio.create_task(client()) for _ in range(concurrency)]
    sampling = asyncio.create_task(sample_loop()) if sampler else None
    try:
        done, pending = await asyncio.wait(clients, timeout=load_s + drain_s)
    finally:
        if sampling:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
    wall_s = loop.time() - t0
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for t in done:
        if t.exception() is not None:  # a bug in this script, not a server failure
            raise t.exception()
    return {
        "records": records,
        "load_s": load_s,
        "wall_s": wall_s,
        "drained": not pending,
        "stopped_early": failures >= max_failures,
        "samples": samples,
    }


# --------------------------------------------------------------------------------------------
# Aggregation and pass rules (pure: unit-tested on synthetic records)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _get(rec, name):
    return rec.get(name) if isinstance(rec, dict) else getattr(rec, name)


def summarize(records, wall_s: float) -> dict:
    """Counts, tokens, throughput and TTFT of one load phase's records (Record or dicts)."""
    outcome = [_get(r, "outcome") for r in records]
    completed = [r for r, o in zip(records, outcome) if o == "completed"]
    failed = [r for r, o in zip(records, outcome) if o == "failed"]
    cancelled = [r for r, o in zip(records, outcome) if o == "cancelled"]
    unfinished = [r for r, o in zip(records, outcome) if o is None]
    prompt = sum(_get(r, "usage_prompt_tokens") or 0 for r in completed)
    output = sum(_get(r, "usage_completion_tokens") or 0 for r in completed)
    cached = sum(_get(r, "cached_tokens") or 0 for r in completed)
    cached_reported = any(_get(r, "cached_tokens") is not None for r in completed)

    def ttft(kind=None):
        xs = [
            _get(r, "ttft_s") * 1e3
            for r in completed
            if _get(r, "ttft_s") is not None and kind in (None, _get(r, "kind"))
        ]
        return {"n": len(xs), "p50": percentile(xs, 50), "p99": percentile(xs, 99)}

    errors: dict[str, int] = {}
    for r in failed:
        key = re.sub(r"\d+", "N", _get(r, "error") or "?")[:120]
        errors[key] = errors.get(key, 0) + 1
    per = wall_s if wall_s and wall_s > 0 else float("nan")
    return {
        "counts": {
            "sent": len(records),
            "completed": len(completed),
            "completed_short": sum(_get(r, "kind") == "short" for r in completed),
            "completed_long": sum(_get(r, "kind") == "long" for r in completed),
            "failed": len(failed),
            "cancelled": len(cancelled),
            "cancelled_before_first_token": sum(
                _get(r, "first_token_before_cancel") is False for r in cancelled
            ),
            "cancel_scheduled": sum(_get(r, "cancel_after_s") is not None for r in records),
            "unfinished": len(unfinished),
        },
        "tokens": {
            "prompt": prompt,
            "output": output,
            "cached_prompt": cached if cached_reported else None,
        },
        "throughput": {
            "wall_s": wall_s,
            "total_tok_s": (prompt + output) / per,
            "uncached_prompt_plus_output_tok_s": (prompt - cached + output) / per,
            "output_tok_s": output / per,
            "requests_s": len(completed) / per,
        },
        "ttft_ms": {"all": ttft(), "short": ttft("short"), "long": ttft("long")},
        "error_kinds": errors,
        "failures": [_as_dict(r) for r in failed[:20]],
    }


def _as_dict(rec) -> dict:
    return dict(rec) if isinstance(rec, dict) else asdict(rec)


def memory_growth(before: list | None, after: list | None) -> float | None:
    """Largest per-GPU growth in MiB (None when either reading is missing)."""
    if not before or not after or len(before) != len(after):
        return None
    return max(a - b for a, b in zip(after, before))


def evaluate(result: dict) -> list[dict]:
    """The pass rules of one backend's result: [{rule, ok, detail}]."""
    rules: list[dict] = []

    def add(rule, ok, detail=""):
        rules.append({"rule": rule, "ok": bool(ok), "detail": detail})

    if result.get("error"):
        add("server started", False, result["error"])
        return rules
    add("server started", True, f"healthy after {fmt_num(result.get('startup_s'), 0)} s")
    st, s = result["settings"], result["summary"]
    c = s["counts"]
    add(
        "requests completed",
        c["completed_short"] > 0 and c["completed_long"] > 0,
        f"{c['completed']} ({c['completed_short']} short, {c['completed_long']} long)",
    )
    warm = result.get("warmup", {})
    warm_failed = warm.get("failed", 0)
    detail = f"{c['failed']} in the load, {warm_failed} in the warmup"
    first = (s.get("failures") or warm.get("failures") or [{}])[0].get("error")
    if first:
        detail += f"; first: {first}"
    add("no failed requests", c["failed"] == 0 and warm_failed == 0, detail)
    add(
        "nothing unfinished after the drain",
        c["unfinished"] == 0,
        f"{c['unfinished']} still running {fmt_num(st.get('drain_timeout'), 0)} s after the load",
    )
    if st.get("cancel_fraction", 0) > 0:
        add(
            "cancellations exercised",
            c["cancelled_before_first_token"] > 0,
            f"{c['cancelled']} cancelled, {c['cancelled_before_first_token']} before their "
            "first token",
        )
    h = result.get("health_after") or {}
    add(
        "healthy after the load",
        h.get("status") == 200 and h.get("probe") == "ok" and h.get("process_alive"),
        f"/health {h.get('status')}, probe {h.get('probe')}, process "
        + ("alive" if h.get("process_alive") else "gone"),
    )
    lg = result.get("log") or {}
    add(
        "no Traceback in the server log",
        lg.get("tracebacks") == 0,
        f"{lg.get('tracebacks')} Tracebacks, {lg.get('error_lines')} ERROR lines",
    )
    m = result.get("memory") or {}
    if not st.get("memory_check", True):
        add("GPU memory flat", True, "not checked (--no-memory-check)")
    elif m.get("growth_mib") is None:
        add("GPU memory flat", False, "not measured (nvidia-smi)")
    else:
        tol = st.get("memory_tolerance_mib")
        add(
            "GPU memory flat",
            m["growth_mib"] <= tol,
            f"{_mib(m.get('after_warmup'))} -> {_mib(m.get('after'))} MiB after the warmup / "
            "the load "
            f"(+{fmt_num(m['growth_mib'])}; tolerance {fmt_num(tol)})",
        )
    pc = result.get("prefix_cache") or {}
    cached, hits = s["tokens"].get("cached_prompt"), pc.get("hits")
    add(
        "prefix cache hits",
        (cached or 0) > 0 or (hits or 0) > 0,
        f"{fmt_num(cached)} cached prompt tokens in completed requests; /metrics: "
        f"{fmt_num(hits)} hits of {fmt_num(pc.get('queries'))} queried",
    )
    return rules


def _mib(values) -> str:
    """GPU memory readings, one per GPU: '71234' or '71234, 71302'."""
    return "—" if not values else ", ".join(f"{v:.0f}" for v in values)


def finalize(result: dict) -> dict:
    result["rules"] = evaluate(result)
    result["passed"] = all(r["ok"] for r in result["rules"])
    return result


# --------------------------------------------------------------------------------------------
# Server-side readings


def scan_log(text: str) -> dict:
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    first = "\n".join(lines[starts[0] : starts[0] + 30]) if starts else ""
    return {
        "tracebacks": len(starts),
        "error_lines": sum(bool(re.search(r"\bERROR\b", line)) for line in lines),
        "first_traceback": first,
    }


_METRICS = {
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:num_preemptions",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:corrupted_requests",
}


def parse_metrics(text: str) -> dict[str, float]:
    """The Prometheus text's values of interest, summed over label sets (engines);
    vllm:request_success also per finished_reason (`vllm:request_success:abort`)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0]
        if name.endswith("_created"):
            continue
        if name.endswith("_total"):
            name = name[: -len("_total")]
        try:
            v = float(value)
        except ValueError:
            continue
        if name in _METRICS:
            out[name] = out.get(name, 0.0) + v
        elif name == "vllm:request_success":
            m = re.search(r'finished_reason="([^"]*)"', head)
            key = f"{name}:{m.group(1) if m else '?'}"
            out[key] = out.get(key, 0.0) + v
    return out


def metrics_delta(before: dict | None, after: dict | None) -> dict:
    if before is None or after is None:
        return {}
    keys = [k for k in after if k.startswith(("vllm:prefix", "vllm:num_pre", "vllm:request_s"))]
    keys += ["vllm:corrupted_requests"] if "vllm:corrupted_requests" in after else []
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys}


def gpu_memory_mib() -> list[float] | None:
    """memory.used of each visible GPU (nvidia-smi), None where it cannot be read."""
    cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if re.fullmatch(r"\d+(,\d+)*", visible):
        cmd += ["-i", visible]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            return None
        return [float(x) for x in proc.stdout.split()]
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def host_rss_mib(pgid: int) -> float | None:
    """Resident host memory of every process in process group ``pgid`` (the server and its
    engine-core children: ``serving.start_group`` starts a session), MiB; None without /proc."""
    page = os.sysconf("SC_PAGE_SIZE")
    total, found = 0, False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            # fields after "(comm)": state ppid pgrp ...; comm may hold spaces or parens
            if int(stat[stat.rindex(")") + 2 :].split()[2]) != pgid:
                continue
            resident = int(Path(f"/proc/{entry}/statm").read_text().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        total, found = total + resident * page, True
    return total / 2**20 if found else None


def gpu_names() -> str:
    try:
        proc = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        lines = [x.strip() for x in proc.stdout.splitlines() if x.strip()]
        if proc.returncode == 0 and lines:
            return f"{len(lines)} x {lines[0]}" if len(lines) > 1 else lines[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "no nvidia-smi"


# --------------------------------------------------------------------------------------------
# One backend: server, warmup, load, checks


def max_model_len(mix: MixConfig) -> int:
    return serving.max_model_len(mix.max_prompt_tokens, mix.output_tokens[1])


def serve_command(args, backend: str, mix: MixConfig) -> list[str]:
    if args.server_command:
        text = args.server_command.format(
            port=args.port, backend=backend, python=shlex.quote(sys.executable)
        )
        return shlex.split(text)
    cmd = [*serving.VLLM_CLI, "serve", args.model, "--host", "127.0.0.1", "--port", str(args.port)]
    cmd += ["--enable-prefix-caching", "--enable-prompt-tokens-details"]
    return cmd + serving.engine_args(args, backend, max_model_len(mix))


def settings(args, mix: MixConfig) -> dict:
    return {
        "model": args.model,
        "minutes": args.minutes,
        "concurrency": args.concurrency,
        "mix": asdict(mix),
        "doc_tokens": mix.doc_tokens,
        "max_model_len": max_model_len(mix),
        "tensor_parallel_size": args.tensor_parallel_size,
        "block_size": args.block_size,
        "extra_args": args.extra_args,
        "cancel_fraction": mix.cancel_fraction,
        "drain_timeout": args.drain_timeout,
        "request_timeout": args.request_timeout,
        "memory_check": not args.no_memory_check,
        "memory_tolerance_mib": args.memory_tolerance_mib,
    }


async def _get_text(session, url: str) -> tuple[int | None, str]:
    import aiohttp

    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=30)) as resp:
            return resp.status, await resp.text()
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


async def _metrics(session, base_url: str) -> dict | None:
    status, text = await _get_text(session, f"{base_url}/metrics")
    return parse_metrics(text) if status == 200 else None


async def soak_phases(
    args, mix: MixConfig, base_url: str, deadline: float | None, pgid: int | None = None
) -> dict:
    """Warmup, memory, load + drain, memory, health; `deadline` (time.monotonic) shortens the
    load so that the drain and the checks after it still fit. ``pgid``: the server's process
    group, whose host memory is read beside the GPU's."""

    def rss():
        return None if pgid is None else host_rss_mib(pgid)

    import aiohttp

    out: dict = {}
    connector = aiohttp.TCPConnector(limit=args.concurrency + 16)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        prompts = PromptBuilder(mix)
        warm: list[Record] = []
        t0 = loop.time()
        specs = warmup_specs(mix)
        log(f"  warmup: {len(specs)} requests (every shared prefix, one fresh document)")
        await asyncio.gather(
            *(
                issue(
                    session,
                    base_url,
                    args.model,
                    s,
                    prompts.prompt(s),
                    args.request_timeout,
                    t0,
                    warm,
                    phase="warmup",
                )
                for s in specs
            )
        )
        wfail = [r for r in warm if r.outcome != "completed"]
        out["warmup"] = {
            "requests": len(warm),
            "failed": len(wfail),
            "seconds": loop.time() - t0,
            "failures": [asdict(r) for r in wfail[:10]],
        }
        await asyncio.sleep(args.settle_s)
        out["mem_after_warmup"] = await asyncio.to_thread(gpu_memory_mib)
        out["rss_after_warmup"] = await asyncio.to_thread(rss)
        metrics_before = await _metrics(session, base_url)

        load_s = args.minutes * 60.0
        if deadline is not None:
            room = deadline - time.monotonic() - args.drain_timeout - POST_RESERVE_S
            load_s = max(min(load_s, room), min(load_s, 30.0))
        out["requested_load_s"], out["load_s"] = args.minutes * 60.0, load_s
        if load_s < args.minutes * 60.0:
            log(f"  load shortened to {load_s:.0f} s to fit --budget-s")

        async def sampler():
            mem = await asyncio.to_thread(gpu_memory_mib)
            met = await _metrics(session, base_url) or {}
            return {
                "gpu_mib": mem,
                "host_rss_mib": await asyncio.to_thread(rss),
                "running": met.get("vllm:num_requests_running"),
                "waiting": met.get("vllm:num_requests_waiting"),
                "kv_cache_usage": met.get("vllm:kv_cache_usage_perc"),
            }

        log(f"  load: {args.concurrency} clients for {load_s:.0f} s")
        out["load"] = await drive(
            session,
            base_url,
            args.model,
            mix,
            args.concurrency,
            load_s,
            args.drain_timeout,
            args.request_timeout,
            sampler=sampler,
            sample_s=args.sample_s,
        )
        await asyncio.sleep(args.settle_s)
        out["mem_after"] = await asyncio.to_thread(gpu_memory_mib)
        out["rss_after"] = await asyncio.to_thread(rss)
        metrics_after = await _metrics(session, base_url)
        out["metrics_delta"] = metrics_delta(metrics_before, metrics_after)

        status, _ = await _get_text(session, f"{base_url}/health")
        probe_recs: list[Record] = []
        spec = probe_spec(mix)
        rec = await issue(
            session,
            base_url,
            args.model,
            spec,
            prompts.prompt(spec),
            120,
            loop.time(),
            probe_recs,
            phase="probe",
        )
        out["health"] = {
            "status": status,
            "probe": "ok" if rec.outcome == "completed" else (rec.error or str(rec.outcome)),
        }
    return out


def host_memory(phases: dict, samples: list[dict]) -> dict:
    """The server group's resident host memory (MiB) after the warmup, its peak during the
    load and after the drain. Measured and reported, no pass rule yet: vLLM's host memory
    has no calibrated tolerance (its first soak runs set one)."""
    after_warmup, after = phases.get("rss_after_warmup"), phases.get("rss_after")
    seen = [x["host_rss_mib"] for x in samples if x.get("host_rss_mib") is not None]
    growth = None if after_warmup is None or after is None else after - after_warmup
    return {
        "after_warmup": after_warmup,
        "peak_during_load": max(seen) if seen else None,
        "after": after,
        "growth_mib": growth,
    }


def run_backend(args, backend: str, mix: MixConfig, out_dir: Path) -> dict:
    cmd = serve_command(args, backend, mix)
    log_path = out_dir / f"server-{backend}.log"
    pgid_path = out_dir / f"server-{backend}.pgid"
    result: dict = {
        "backend": backend,
        "command": shlex.join(cmd),
        "server_log": str(log_path),
        "settings": settings(args, mix),
        "meta": meta(),
        "error": "",
    }
    start = time.monotonic()
    deadline = start + args.budget_s if args.budget_s else None
    log(f"[{backend}] starting server: {shlex.join(cmd)}")
    proc = serving.start_group(cmd, log_path)
    pgid_path.write_text(f"{proc.pid}\n")  # for a harness that must clean up after a kill
    try:
        health_timeout = args.server_timeout
        if deadline is not None:
            health_timeout = min(health_timeout, max(30.0, deadline - start - 120.0))
        poll = 3.0 if args.server_command is None else 0.2
        why = serving.wait_healthy(proc, args.port, health_timeout, poll_s=poll)
        result["startup_s"] = time.monotonic() - start
        if why:
            log(f"[{backend}] server failed: {why}; last lines:\n{serving.tail(log_path)}")
            result["error"] = f"server: {why}"
            return finalize(result)
        log(f"[{backend}] healthy after {result['startup_s']:.0f} s")
        mem_healthy = gpu_memory_mib()
        base_url = f"http://127.0.0.1:{args.port}"
        phases = asyncio.run(soak_phases(args, mix, base_url, deadline, pgid=proc.pid))
        load = phases["load"]
        records: list[Record] = load["records"]
        write_csv(out_dir / f"requests-{backend}.csv", [asdict(r) for r in records])
        alive = proc.poll() is None
        log_text = log_path.read_text(errors="replace")
        samples = load["samples"]
        peak = None
        mems = [s["gpu_mib"] for s in samples if s.get("gpu_mib")]
        if mems and all(len(m) == len(mems[0]) for m in mems):
            peak = [max(col) for col in zip(*mems)]
        delta = phases["metrics_delta"]
        result.update(
            {
                "requested_load_s": phases["requested_load_s"],
                "load_s": phases["load_s"],
                "shortened": phases["load_s"] < phases["requested_load_s"],
                "drained": load["drained"],
                "stopped_early": load["stopped_early"],
                "warmup": phases["warmup"],
                "summary": summarize(records, load["wall_s"]),
                "memory": {
                    "at_healthy": mem_healthy,
                    "after_warmup": phases["mem_after_warmup"],
                    "peak_during_load": peak,
                    "after": phases["mem_after"],
                    "growth_mib": memory_growth(phases["mem_after_warmup"], phases["mem_after"]),
                },
                "host_memory": host_memory(phases, samples),
                "prefix_cache": {
                    "queries": delta.get("vllm:prefix_cache_queries"),
                    "hits": delta.get("vllm:prefix_cache_hits"),
                },
                "server_metrics_delta": delta,
                "health_after": {**phases["health"], "process_alive": alive},
                "log": scan_log(log_text),
                "timeline": samples,
            }
        )
        return finalize(result)
    finally:
        before_stop = result.get("log", {}).get("tracebacks")
        serving.stop_group(proc)
        pgid_path.unlink(missing_ok=True)
        if before_stop is not None:
            total = scan_log(log_path.read_text(errors="replace"))["tracebacks"]
            result["log"]["tracebacks_at_shutdown"] = total - before_stop
        result["total_s"] = time.monotonic() - start


# --------------------------------------------------------------------------------------------
# Report


def meta() -> dict:
    return {
        "gpu": gpu_names(),
        "versions": software_versions(serving.DISTS),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _pair(a, b, digits=0) -> str:
    return f"{fmt_num(a, digits)} / {fmt_num(b, digits)}"


def _max(samples, key):
    values = [x[key] for x in samples or [] if x.get(key) is not None]
    return max(values) if values else None


def _ratio(a, b) -> str:
    try:
        return f"{a / b:.3f}" if a is not None and b else "—"
    except TypeError:
        return "—"


def summary_rows(res: dict) -> dict[str, str]:
    """The report's rows for one backend: label -> cell."""
    if res.get("error"):
        return {"verdict": "FAIL", "error": res["error"]}
    s, c = res["summary"], res["summary"]["counts"]
    t, tt, m = s["throughput"], s["ttft_ms"], res.get("memory") or {}
    hm = res.get("host_memory") or {}
    pc, lg, h = res.get("prefix_cache") or {}, res.get("log") or {}, res.get("health_after") or {}
    hit = None
    if pc.get("queries"):
        hit = f"{100 * pc['hits'] / pc['queries']:.1f}%"
    cached = s["tokens"].get("cached_prompt")
    delta = res.get("server_metrics_delta") or {}
    return {
        "verdict": "PASS" if res["passed"] else "FAIL",
        "load (s; + drain)": f"{fmt_num(res['load_s'])} ({fmt_num(t['wall_s'])} with the drain)"
        + (" shortened" if res.get("shortened") else "")
        + (" stopped early (failures)" if res.get("stopped_early") else ""),
        "requests sent": fmt_num(c["sent"]),
        "completed (short / long)": f"{c['completed']} ({c['completed_short']} / "
        f"{c['completed_long']})",
        "failed (load / warmup)": f"{c['failed']} / {res['warmup']['failed']}",
        "cancelled (before first token)": f"{c['cancelled']} ({c['cancelled_before_first_token']})",
        "server-side aborts / errors": f"{fmt_num(delta.get('vllm:request_success:abort'))} / "
        f"{fmt_num(delta.get('vllm:request_success:error'))}",
        "server queue, max running / waiting": _pair(
            _max(res.get("timeline"), "running"), _max(res.get("timeline"), "waiting")
        ),
        "unfinished after the drain": str(c["unfinished"]),
        "throughput, prompt + output tok/s": fmt_num(t["total_tok_s"]),
        "throughput, uncached prompt + output tok/s": fmt_num(
            t["uncached_prompt_plus_output_tok_s"]
        ),
        "output tok/s": fmt_num(t["output_tok_s"]),
        "requests/s": fmt_num(t["requests_s"], 2),
        "TTFT p50 / p99 ms, all": _pair(tt["all"]["p50"], tt["all"]["p99"]),
        "TTFT p50 / p99 ms, short": _pair(tt["short"]["p50"], tt["short"]["p99"]),
        "TTFT p50 / p99 ms, long": _pair(tt["long"]["p50"], tt["long"]["p99"]),
        "prefix cache hit rate (/metrics)": hit or "—",
        "cached prompt tokens": fmt_num(cached),
        "preemptions": fmt_num(delta.get("vllm:num_preemptions")),
        "GPU MiB: after warmup -> peak -> after": f"{_mib(m.get('after_warmup'))} -> "
        f"{_mib(m.get('peak_during_load'))} -> {_mib(m.get('after'))}",
        "host RSS MiB, server group: after warmup -> peak -> after (no rule yet)": " -> ".join(
            fmt_num(hm.get(k)) for k in ("after_warmup", "peak_during_load", "after")
        ),
        "health after (/health, probe)": f"{h.get('status')}, {h.get('probe')}",
        "Tracebacks (load / shutdown)": f"{lg.get('tracebacks')} / "
        f"{lg.get('tracebacks_at_shutdown', '—')}",
    }


RATIO_ROWS = {
    "throughput, prompt + output tok/s": lambda r: r["summary"]["throughput"]["total_tok_s"],
    "throughput, uncached prompt + output tok/s": lambda r: r["summary"]["throughput"][
        "uncached_prompt_plus_output_tok_s"
    ],
    "output tok/s": lambda r: r["summary"]["throughput"]["output_tok_s"],
    "TTFT p50 / p99 ms, short": lambda r: r["summary"]["ttft_ms"]["short"]["p50"],
    "TTFT p50 / p99 ms, long": lambda r: r["summary"]["ttft_ms"]["long"]["p50"],
}


def render(results: dict[str, dict]) -> str:
    backends = list(results)
    any_res = next(iter(results.values()))
    st, mt = any_res["settings"], any_res.get("meta", {})
    mix = st["mix"]
    versions = ", ".join(f"{k} {v}" for k, v in mt.get("versions", {}).items())
    lines = [
        f"# Serving soak: {st['model']} (dummy weights), prefix caching on",
        "",
        f"GPU: {mt.get('gpu')}. {versions}. {mt.get('date', '')}.",
        "",
        f"Load: {st['concurrency']} streaming clients back to back, {st['minutes']:g} min per "
        f"backend; {100 * mix['long_fraction']:g}% long prompts (a {st['doc_tokens']}-token "
        "document, one of "
        f"{mix['docs']} shared or {100 * mix['fresh_doc_fraction']:g}% fresh, + a "
        f"{mix['question_tokens'][0]}-{mix['question_tokens'][1]}-token question), the rest "
        f"{mix['short_tokens'][0]}-{mix['short_tokens'][1]} tokens (one of "
        f"{mix['short_prefixes']} shared {mix['short_prefix_tokens']}-token prefixes + a tail); "
        f"output {mix['output_tokens'][0]}-{mix['output_tokens'][1]} tokens (ignore_eos); "
        f"{100 * mix['cancel_fraction']:g}% cancelled after {mix['cancel_delay'][0]:g}-"
        f"{mix['cancel_delay'][1]:g} s; max-model-len {st['max_model_len']}; seed {mix['seed']}.",
        "",
    ]
    same = ("model", "minutes", "concurrency", "mix", "max_model_len", "extra_args")
    for b in backends[1:]:
        other = results[b].get("settings") or {}
        differ = [k for k in same if k in other and other.get(k) != st.get(k)]
        if differ:
            lines += [f"Note: {b} ran with other settings ({', '.join(differ)}).", ""]
    rows = {b: summary_rows(results[b]) for b in backends}
    labels = list(dict.fromkeys(k for b in backends for k in rows[b]))
    ratio = FA4 in results and BASELINE in results
    ok = lambda b: not results[b].get("error")  # noqa: E731
    header = ["", *backends] + ([f"{FA4} / {BASELINE}"] if ratio else [])
    table = []
    for label in labels:
        row = [label, *(rows[b].get(label, "—") for b in backends)]
        if ratio:
            fn = RATIO_ROWS.get(label)
            row.append(
                _ratio(fn(results[FA4]), fn(results[BASELINE]))
                if fn and ok(FA4) and ok(BASELINE)
                else ""
            )
        table.append(row)
    lines += [markdown_table(header, table), "", "## Pass rules", ""]
    rule_names = list(dict.fromkeys(r["rule"] for b in backends for r in results[b]["rules"]))
    by = {b: {r["rule"]: r for r in results[b]["rules"]} for b in backends}
    rule_rows = []
    for name in rule_names:
        cells = []
        for b in backends:
            r = by[b].get(name)
            cells.append("—" if r is None else ("✓ " if r["ok"] else "✗ ") + r["detail"])
        rule_rows.append([name, *cells])
    lines += [markdown_table(["rule", *backends], rule_rows), ""]
    lines.append(
        f"The exit status follows {FA4}'s rules. Ratios are informational (same machine, "
        "same load); TTFT ratios are of p50."
    )
    for b in backends:
        res = results[b]
        fails = (res.get("summary") or {}).get("error_kinds") or {}
        tb = (res.get("log") or {}).get("first_traceback")
        if fails or tb:
            lines += ["", f"## {b}: problems", ""]
            for kind, n in sorted(fails.items(), key=lambda kv: -kv[1]):
                lines.append(f"- {n} x {kind}")
            if tb:
                lines += ["", "First Traceback in the server log:", "", "```", tb, "```"]
    return "\n".join(lines) + "\n"


def collect(out_dir: Path, backends: list[str] | None) -> dict[str, dict]:
    """Per-backend results in OUT: these backends, or (None) every soak-*.json there."""
    found = {}
    for path in sorted(out_dir.glob(RESULT_GLOB)):
        try:
            res = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log(f"skipping {path}: {exc}")
            continue
        b = res.get("backend")
        if b and (backends is None or b in backends):
            found[b] = res
    order = list(serving.BACKENDS)
    return dict(sorted(found.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99))


def write_report(out_dir: Path, results: dict[str, dict]) -> int:
    if not results:
        log(f"no soak-*.json results in {out_dir}")
        return 2
    text = render(results)
    (out_dir / "soak.md").write_text(text)
    write_json(
        out_dir / "soak.json",
        {"results": results, "passed": {b: r["passed"] for b, r in results.items()}},
    )
    log("\n" + text)
    log(f"wrote {out_dir}/soak.md, soak.json")
    if FA4 in results and not results[FA4]["passed"]:
        failed = [r["rule"] for r in results[FA4]["rules"] if not r["ok"]]
        log(f"{FA4} FAILED: {', '.join(failed)}")
        return 1
    return 0


# --------------------------------------------------------------------------------------------


def plan_text(args, backends: list[str], mix: MixConfig) -> str:
    d = describe_mix(mix)
    lines = [
        f"soak plan: {', '.join(backends)}; {args.minutes:g} min each, {args.concurrency} "
        "streaming clients back to back (saturation)"
        + (f"; budget {args.budget_s:g} s per backend" if args.budget_s else ""),
    ]
    for b in backends:
        lines.append(f"  [{b}] {shlex.join(serve_command(args, b, mix))}")
    lines += [
        f"load mix (seed {mix.seed}): {100 * mix.long_fraction:g}% long: a {mix.doc_tokens}-token "
        f"document ({mix.docs} shared; {100 * mix.fresh_doc_fraction:g}% of long ones fresh) + a "
        f"{mix.question_tokens[0]}-{mix.question_tokens[1]}-token question; the rest short: "
        f"{mix.short_tokens[0]}-{mix.short_tokens[1]} tokens ({mix.short_prefixes} shared "
        f"{mix.short_prefix_tokens}-token prefixes + a tail); output {mix.output_tokens[0]}-"
        f"{mix.output_tokens[1]} tokens, ignore_eos; {100 * mix.cancel_fraction:g}% cancelled "
        f"after {mix.cancel_delay[0]:g}-{mix.cancel_delay[1]:g} s",
        f"first {d['requests']} requests: {d['long']} long ({d['fresh_docs']} fresh documents), "
        f"{d['short']} short, {d['cancel']} to cancel; longest prompt {d['max_prompt_tokens']} "
        f"tokens (max-model-len {max_model_len(mix)})",
        f"warmup: {len(warmup_specs(mix))} requests; then GPU memory (nvidia-smi), the load, a "
        f"drain of up to {args.drain_timeout:g} s, GPU memory, /health and one short request",
        "pass rules: server started; short and long requests completed; no failed requests; "
        "nothing unfinished; >= 1 cancelled before its first token; healthy after; no Traceback "
        f"in the server log; GPU memory growth <= {args.memory_tolerance_mib:g} MiB"
        + (" (not checked)" if args.no_memory_check else "")
        + "; prefix cache hits > 0",
        f"out: {args.out}/soak-<BACKEND>.json, soak.json, soak.md, requests-<BACKEND>.csv, "
        "server-<BACKEND>.log",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        backends = resolve_names(args.backends, serving.BACKENDS)
    except ValueError as exc:
        sys.exit(f"error: {exc}")
    out_dir = Path(args.out)
    if args.report_only:
        return write_report(out_dir, collect(out_dir, None))
    mix = MixConfig.from_args(args)
    if args.dry_run:
        log(plan_text(args, backends, mix))
        return 0
    # FA4 must be visible to the `vllm serve` we start, else that fails after loading the model
    needs_plugin = args.server_command is None and serving.PLUGIN_BACKENDS & set(backends)
    if needs_plugin and (problem := serving.plugin_problem()):
        sys.exit(f"error: {problem}")
    out_dir.mkdir(parents=True, exist_ok=True)
    serving.install_cleanup()
    for b in backends:
        try:
            res = run_backend(args, b, mix, out_dir)
        except Exception as exc:  # noqa: BLE001 - a bug here must still leave a report
            traceback.print_exc()
            res = {"backend": b, "settings": settings(args, mix), "meta": meta()}
            res = finalize({**res, "error": f"soak script: {type(exc).__name__}: {exc}"})
        write_json(out_dir / f"soak-{b}.json", res)
        failed = [r["rule"] for r in res["rules"] if not r["ok"]]
        log(f"[{b}] " + ("PASS" if res["passed"] else f"FAIL: {', '.join(failed)}"))
        if b != backends[-1]:
            time.sleep(args.settle_s)  # let the GPU memory go before the next server
    results = collect(out_dir, None if args.merge else backends)
    return write_report(out_dir, results)


if __name__ == "__main__":
    sys.exit(main())
