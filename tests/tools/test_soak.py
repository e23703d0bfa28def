"""CPU tests of benchmarks/soak.py (the serving soak): the load mix, the stream checks and
cancellation, aggregation and pass rules, the report, the CLI; and the async client end to end
against a small fake OpenAI server (tests/tools/fake_openai_server.py), in this process and as
the server process the soak starts, stops and reads the log of.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
FAKE = Path(__file__).resolve().with_name("fake_openai_server.py")


def _load(name: str, path: Path):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


soak = _load("bench_soak", BENCH / "soak.py")
fake = _load("fake_openai_server", FAKE)

MIX = soak.MixConfig()  # the defaults of the CLI
# scaled down for the fake server: "long" = 512 tokens, so nothing here is slow
SMALL = replace(
    MIX,
    long_tokens=512,
    question_tokens=(8, 32),
    docs=2,
    short_tokens=(24, 40),
    short_prefix_tokens=16,
    short_prefixes=2,
    output_tokens=(8, 16),
    cancel_fraction=0.3,
    cancel_delay=(0.001, 0.05),
    long_fraction=0.3,
)


# --------------------------------------------------------------------------------------------
# The load mix


def test_mix_defaults_match_the_cli():
    assert soak.MixConfig.from_args(soak.parse_args([])) == MIX
    assert MIX.long_tokens == 32768 and MIX.max_prompt_tokens == 32768
    assert soak.max_model_len(MIX) >= 32768 + MIX.output_tokens[1]
    assert MIX.doc_tokens % 16 == 0  # whole KV blocks: every block of a document can be cached


def test_mix_is_a_pure_function_of_seed_and_index():
    a = [soak.make_spec(MIX, i) for i in range(300)]
    assert a == [soak.make_spec(MIX, i) for i in range(300)]
    assert list(reversed(a)) == [soak.make_spec(MIX, i) for i in reversed(range(300))]
    other = [soak.make_spec(replace(MIX, seed=1), i) for i in range(300)]
    assert a != other
    build = soak.PromptBuilder(MIX)
    assert build.prompt(a[7]) == soak.PromptBuilder(MIX).prompt(a[7])


def test_mix_proportions_and_lengths():
    n = 5000
    specs = [soak.make_spec(MIX, i) for i in range(n)]
    long = [s for s in specs if s.kind == "long"]
    short = [s for s in specs if s.kind == "short"]
    assert abs(len(long) / n - 0.2) < 0.025
    fresh = [s for s in long if not s.shared]
    assert abs(len(fresh) / len(long) - 0.1) < 0.035
    for s in long:
        assert s.prefix_tokens == MIX.doc_tokens
        assert 32 <= s.suffix_tokens <= 128 and s.prompt_tokens <= 32768
        assert s.prompt_tokens >= 32768 - 128 + 32  # "~32k"
    for s in short:
        assert 80 <= s.prompt_tokens <= 120 and s.prefix_tokens == 48
        assert s.prefix in {f"sys{k}" for k in range(4)}
    assert {s.prefix for s in long if s.shared} == {f"doc{k}" for k in range(4)}
    assert all(8 <= s.max_tokens <= 64 for s in specs)
    d = soak.describe_mix(MIX, n)
    assert d["long"] == len(long) and d["fresh_docs"] == len(fresh)


def test_cancellation_schedule():
    n = 5000
    specs = [soak.make_spec(MIX, i) for i in range(n)]
    cancel = [s for s in specs if s.cancel_after_s is not None]
    assert abs(len(cancel) / n - 0.1) < 0.02
    assert all(0.02 <= s.cancel_after_s <= 0.5 for s in cancel)
    assert {s.kind for s in cancel} == {"short", "long"}  # both kinds get cancelled
    assert len({s.cancel_after_s for s in cancel}) > len(cancel) // 2  # random delays
    none = [soak.make_spec(replace(MIX, cancel_fraction=0.0), i) for i in range(500)]
    assert all(s.cancel_after_s is None for s in none)
    # the same requests, with or without cancellation: only the cancel field differs
    assert [replace(s, cancel_after_s=None) for s in specs[:500]] == none
    assert all(s.cancel_after_s is None for s in soak.warmup_specs(MIX))


def test_shared_prefixes_hit_and_fresh_documents_do_not():
    build = soak.PromptBuilder(MIX)
    specs = [soak.make_spec(MIX, i) for i in range(400)]
    by_doc: dict[str, list] = {}
    for s in specs:
        by_doc.setdefault(s.prefix, []).append(s)
    doc0 = by_doc["doc0"][:2]
    p0, p1 = build.prompt(doc0[0]), build.prompt(doc0[1])
    assert len(p0) == doc0[0].prompt_tokens and len(p1) == doc0[1].prompt_tokens
    n = MIX.doc_tokens
    assert p0[:n] == p1[:n] and p0[n:] != p1[n:]  # same document, different questions
    doc1 = build.prompt(by_doc["doc1"][0])
    assert doc1[:64] != p0[:64]
    fresh = [s for s in specs if s.kind == "long" and not s.shared][:2]
    f0, f1 = build.prompt(fresh[0]), build.prompt(fresh[1])
    assert f0[:64] != f1[:64] and f0[:64] != p0[:64]
    short = [s for s in specs if s.prefix == "sys1"][:2]
    s0, s1 = build.prompt(short[0]), build.prompt(short[1])
    assert s0[:48] == s1[:48] and s0[48:] != s1[48:]
    lo, hi = MIX.token_range
    assert all(lo <= t <= hi for t in p0 + s0)
    warm = {s.prefix for s in soak.warmup_specs(MIX)}
    assert {f"doc{k}" for k in range(4)} | {f"sys{k}" for k in range(4)} <= warm


# --------------------------------------------------------------------------------------------
# One stream's verdict


def _rec(max_tokens=3, **kw):
    spec = soak.RequestSpec(5, "short", "sys0", 48, 50, max_tokens, kw.pop("cancel", None))
    return soak.Record.from_spec(spec)


def _chunk(finish=None):
    return json.dumps({"choices": [{"index": 0, "text": "x", "finish_reason": finish}]})


USAGE = json.dumps(
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 98,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 48},
        },
    }
)


def _feed(payloads, max_tokens=3):
    rec = _rec(max_tokens)
    check = soak.StreamCheck(rec)
    for i, p in enumerate(payloads):
        check.feed(p, 0.1 * (i + 1))
    check.finish()
    return rec


def test_stream_check_whole_answer():
    rec = _feed([_chunk(), _chunk(), _chunk("length"), USAGE, "[DONE]"])
    assert rec.outcome == "completed" and rec.error == ""
    assert rec.ttft_s == pytest.approx(0.1) and rec.chunks == 3
    assert (rec.usage_prompt_tokens, rec.usage_completion_tokens, rec.cached_tokens) == (98, 3, 48)


@pytest.mark.parametrize(
    "payloads, why",
    [
        ([_chunk(), _chunk(), _chunk("length"), USAGE], "truncated"),
        ([_chunk(), _chunk()], "truncated"),
        ([_chunk(), '{"error": {"message": "boom"}}', "[DONE]"], "error in stream: boom"),
        ([_chunk(), _chunk(), _chunk("stop"), USAGE, "[DONE]"], "finish_reason 'stop'"),
        ([_chunk(), _chunk(), _chunk(), USAGE, "[DONE]"], "no finish_reason"),
        ([_chunk(), _chunk(), _chunk("length"), "[DONE]"], "no usage chunk"),
        (["{not json", _chunk("length"), USAGE, "[DONE]"], "unparsable"),
        (["[DONE]"], "no finish_reason"),
    ],
)
def test_stream_check_failures(payloads, why):
    rec = _feed(payloads)
    assert rec.outcome == "failed" and why in rec.error


def test_stream_check_counts_tokens():
    rec = _feed([_chunk(), _chunk(), _chunk("length"), USAGE, "[DONE]"], max_tokens=4)
    assert rec.outcome == "failed" and "completion_tokens 3 != max_tokens 4" in rec.error


def test_sse_payloads_split_across_reads():
    class Content:
        async def iter_any(self):
            for part in (b'data: {"a"', b": 1}\n\ndata: [DO", b"NE]\n\n", b": ping\n"):
                yield part

    async def collect():
        return [p async for p in soak.sse_payloads(Content())]

    assert asyncio.run(collect()) == ['{"a": 1}', "[DONE]"]


def test_request_body_and_chunks_are_vllms():
    try:
        from vllm.entrypoints.openai.completion.protocol import (
            CompletionRequest,
            CompletionResponseStreamChoice,
            CompletionStreamResponse,
        )

        try:  # vLLM 0.26
            from vllm.entrypoints.openai.engine.protocol import PromptTokenUsageInfo, UsageInfo
        except ImportError:  # vLLM 0.33 moved them
            from vllm.entrypoints.serve.engine.protocol import PromptTokenUsageInfo, UsageInfo
    except ImportError as exc:
        pytest.skip(f"vLLM's OpenAI protocol not importable: {exc}")
    body = soak.request_body("configs/llama-3.1-8b", [40, 41, 42], 16)
    assert set(body) <= set(CompletionRequest.model_fields)  # nothing vLLM would ignore
    req = CompletionRequest.model_validate(body)
    assert req.ignore_eos and req.stream and req.stream_options.include_usage
    assert req.prompt == [40, 41, 42] and req.max_tokens == 16
    # chunks serialized as vLLM's completion_stream_generator does
    rec = _rec(2)
    check = soak.StreamCheck(rec)
    for i, finish in enumerate((None, "length")):
        choice = CompletionResponseStreamChoice(index=0, text="", finish_reason=finish)
        chunk = CompletionStreamResponse(id="c", created=0, model="m", choices=[choice])
        check.feed(chunk.model_dump_json(exclude_unset=True), 0.5 + i)
    usage = UsageInfo(prompt_tokens=98, completion_tokens=2, total_tokens=100)
    usage.prompt_tokens_details = PromptTokenUsageInfo(cached_tokens=32)
    last = CompletionStreamResponse(id="c", created=0, model="m", choices=[], usage=usage)
    check.feed(last.model_dump_json(exclude_unset=False, exclude_none=True), 3.0)
    check.feed("[DONE]", 3.1)
    check.finish()
    assert rec.outcome == "completed", rec.error
    assert rec.ttft_s == 0.5 and rec.cached_tokens == 32 and rec.usage_completion_tokens == 2


# --------------------------------------------------------------------------------------------
# Aggregation and pass rules, on synthetic records


def _synthetic(kind, outcome, i, ttft=None, first=None, error=""):
    return {
        "index": i,
        "kind": kind,
        "outcome": outcome,
        "ttft_s": ttft,
        "first_token_before_cancel": first,
        "cancel_after_s": 0.1 if outcome == "cancelled" else None,
        "error": error,
        "usage_prompt_tokens": 100 if kind == "short" else 32000,
        "usage_completion_tokens": 10 if outcome == "completed" else None,
        "cached_tokens": 48 if kind == "short" else 31000,
    }


def _records(failed=0, cancelled=3, unfinished=0):
    recs = [_synthetic("short", "completed", i, ttft=0.01 * (i + 1)) for i in range(100)]
    recs += [_synthetic("long", "completed", 100 + i, ttft=1.0 + i) for i in range(10)]
    recs += [_synthetic("long", "cancelled", 200 + i, first=False) for i in range(cancelled)]
    recs.append(_synthetic("short", "cancelled", 300, first=True))
    recs += [_synthetic("short", "failed", 400 + i, error="HTTP 500: x") for i in range(failed)]
    recs += [_synthetic("long", None, 500 + i) for i in range(unfinished)]
    return recs


def _result(records, **over):
    result = {
        "backend": "FA4",
        "error": "",
        "startup_s": 60.0,
        "load_s": 10.0,
        "requested_load_s": 10.0,
        "settings": soak.settings(soak.parse_args([]), MIX),
        "meta": {"gpu": "test", "versions": {}},
        "warmup": {"requests": 9, "failed": 0, "failures": []},
        "summary": soak.summarize(records, 10.0),
        "memory": {"after_warmup": [70000.0], "after": [70100.0], "growth_mib": 100.0},
        "prefix_cache": {"queries": 1000.0, "hits": 800.0},
        "health_after": {"status": 200, "probe": "ok", "process_alive": True},
        "log": {"tracebacks": 0, "error_lines": 0, "first_traceback": ""},
    }
    result.update(over)
    return soak.finalize(result)


def _failed_rules(result):
    return [r["rule"] for r in result["rules"] if not r["ok"]]


def test_summarize_counts_tokens_and_percentiles():
    s = soak.summarize(_records(failed=2, cancelled=3, unfinished=1), 10.0)
    c = s["counts"]
    assert c["completed"] == 110 and c["completed_short"] == 100 and c["completed_long"] == 10
    assert c["failed"] == 2 and c["cancelled"] == 4 and c["cancelled_before_first_token"] == 3
    assert c["unfinished"] == 1 and c["sent"] == 117 and c["cancel_scheduled"] == 4
    cached = 100 * 48 + 10 * 31000
    assert s["tokens"] == {
        "prompt": 100 * 100 + 10 * 32000,
        "output": 1100,
        "cached_prompt": cached,
    }
    assert s["throughput"]["total_tok_s"] == pytest.approx((10000 + 320000 + 1100) / 10.0)
    assert s["ttft_ms"]["short"]["p50"] == pytest.approx(505.0)  # 10..1000 ms
    assert s["ttft_ms"]["long"]["p50"] == pytest.approx(5500.0)
    assert s["ttft_ms"]["all"]["n"] == 110
    assert s["error_kinds"] == {"HTTP N: x": 2} and len(s["failures"]) == 2
    assert soak.percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert soak.percentile([], 50) is None


def test_pass_rules_clean_run_passes_with_cancellations():
    res = _result(_records(cancelled=20))
    assert res["passed"], _failed_rules(res)
    assert {r["rule"] for r in res["rules"]} >= {
        "no failed requests",
        "cancellations exercised",
        "GPU memory flat",
        "prefix cache hits",
        "no Traceback in the server log",
        "healthy after the load",
    }


def test_pass_rules_one_failure_fails():
    res = _result(_records(failed=1))
    assert _failed_rules(res) == ["no failed requests"]
    assert "HTTP 500" in next(r for r in res["rules"] if not r["ok"])["detail"]
    warm = _result(_records(), warmup={"requests": 9, "failed": 1, "failures": [{"error": "e"}]})
    assert _failed_rules(warm) == ["no failed requests"]


@pytest.mark.parametrize(
    "over, rule",
    [
        ({"memory": {"after_warmup": [7e4], "after": [7.1e4], "growth_mib": 1000.0}}, "GPU memory"),
        ({"memory": {"growth_mib": None}}, "GPU memory flat"),
        ({"log": {"tracebacks": 1, "error_lines": 3}}, "no Traceback in the server log"),
        ({"health_after": {"status": 200, "probe": "HTTP 500", "process_alive": True}}, "healthy"),
        ({"health_after": {"status": None, "probe": "ok", "process_alive": False}}, "healthy"),
        ({"prefix_cache": {"queries": 10.0, "hits": 0.0}}, None),  # cached tokens still count
    ],
)
def test_pass_rules_each_check(over, rule):
    res = _result(_records(), **over)
    failed = _failed_rules(res)
    if rule is None:
        assert failed == []
    else:
        assert len(failed) == 1 and failed[0].startswith(rule), failed


def test_pass_rules_unfinished_no_cancel_and_no_hits():
    assert _failed_rules(_result(_records(unfinished=2))) == ["nothing unfinished after the drain"]
    only_after_first = [r for r in _records(cancelled=0)]
    assert _failed_rules(_result(only_after_first)) == ["cancellations exercised"]
    cold = [{**r, "cached_tokens": 0} for r in _records()]
    assert _failed_rules(_result(cold, prefix_cache={})) == ["prefix cache hits"]
    no_long = [r for r in _records() if r["kind"] == "short"]
    assert "requests completed" in _failed_rules(_result(no_long))
    settings = {**soak.settings(soak.parse_args(["--no-memory-check"]), MIX)}
    assert _result(_records(), memory={}, settings=settings)["passed"]


def test_server_that_never_started_fails():
    res = soak.finalize({"backend": "FA4", "error": "server: exited with rc 1", "settings": {}})
    assert not res["passed"] and _failed_rules(res) == ["server started"]
    assert soak.summary_rows(res)["verdict"] == "FAIL"


def test_host_rss_sums_the_process_group():
    """A child session with two processes: the group's RSS counts both (one holding ~64 MiB
    more), and a group with no process reads as None."""
    code = "import time; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(30)"
    lead = subprocess.Popen(
        ["bash", "-c", f'{sys.executable} -c "{code}" & sleep 30'], start_new_session=True
    )
    try:
        for _ in range(100):  # until the child has touched its pages
            rss = soak.host_rss_mib(lead.pid)
            if rss is not None and rss > 64:
                break
            time.sleep(0.05)
        assert rss is not None and 64 < rss < 1024, rss
    finally:
        os.killpg(lead.pid, signal.SIGKILL)
        lead.wait()
    assert soak.host_rss_mib(2**22 + 12345) is None  # no such group


def test_host_memory_is_reported_without_a_rule():
    phases = {"rss_after_warmup": 900.0, "rss_after": 1000.0}
    samples = [{"host_rss_mib": 950.0}, {"host_rss_mib": None}, {"host_rss_mib": 1100.0}]
    assert soak.host_memory(phases, samples) == {
        "after_warmup": 900.0,
        "peak_during_load": 1100.0,
        "after": 1000.0,
        "growth_mib": 100.0,
    }
    assert soak.host_memory({}, [])["growth_mib"] is None
    rules = {r["rule"] for r in soak.evaluate(_result(_records()))}
    assert not any("host" in rule.lower() for rule in rules)


def test_memory_growth_is_per_gpu():
    assert soak.memory_growth([100.0, 200.0], [150.0, 190.0]) == 50.0
    assert soak.memory_growth(None, [1.0]) is None and soak.memory_growth([1.0], [1.0, 2.0]) is None


def test_scan_log_and_parse_metrics():
    log = "INFO start\nERROR x\nTraceback (most recent call last):\n  File a\nValueError: y\n"
    found = soak.scan_log(log)
    assert found["tracebacks"] == 1 and found["error_lines"] == 1
    assert (
        found["first_traceback"].startswith("Traceback")
        and "ValueError" in found["first_traceback"]
    )
    text = (
        "# HELP x\n"
        'vllm:prefix_cache_queries_total{engine="0"} 100.0\n'
        'vllm:prefix_cache_queries_total{engine="1"} 50.0\n'
        'vllm:prefix_cache_queries_created{engine="0"} 1.7e9\n'
        'vllm:prefix_cache_hits_total{engine="0"} 1.2e2\n'
        'vllm:request_success_total{engine="0",finished_reason="abort"} 7.0\n'
        'vllm:request_success_total{engine="0",finished_reason="length"} 70.0\n'
        'vllm:num_requests_waiting{engine="0"} 3.0\n'
        "vllm:unrelated 9\n"
    )
    m = soak.parse_metrics(text)
    assert m["vllm:prefix_cache_queries"] == 150.0 and m["vllm:prefix_cache_hits"] == 120.0
    assert m["vllm:request_success:abort"] == 7.0 and m["vllm:num_requests_waiting"] == 3.0
    assert "vllm:unrelated" not in m
    d = soak.metrics_delta({"vllm:prefix_cache_hits": 20.0}, m)
    assert d["vllm:prefix_cache_hits"] == 100.0 and "vllm:num_requests_waiting" not in d


# --------------------------------------------------------------------------------------------
# Report, merge, exit status, CLI


def _write(tmp_path, backend, res):
    (tmp_path / f"soak-{backend}.json").write_text(json.dumps({**res, "backend": backend}))


def test_report_merges_backends_and_exit_status_is_fa4s(tmp_path):
    good = _result(_records())
    _write(tmp_path, "FA4", good)
    base = _result(_records())
    base["summary"]["throughput"]["total_tok_s"] /= 1.25
    _write(tmp_path, "FLASH_ATTN", base)
    assert soak.main(["--report-only", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "soak.md").read_text()
    assert "| FA4 | FLASH_ATTN | FA4 / FLASH_ATTN |" in text and "1.250" in text
    assert "## Pass rules" in text and "✗" not in text
    report = json.loads((tmp_path / "soak.json").read_text())
    assert report["passed"] == {"FA4": True, "FLASH_ATTN": True}
    # FLASH_ATTN failing does not fail the run; FA4 failing does
    _write(tmp_path, "FLASH_ATTN", _result(_records(failed=1)))
    assert soak.main(["--report-only", "--out", str(tmp_path)]) == 0
    _write(tmp_path, "FA4", _result(_records(failed=1)))
    assert soak.main(["--report-only", "--out", str(tmp_path)]) == 1
    text = (tmp_path / "soak.md").read_text()
    assert "✗ 1 in the load" in text and "## FA4: problems" in text and "1 x HTTP N: x" in text


def test_report_only_without_results(tmp_path):
    assert soak.main(["--report-only", "--out", str(tmp_path)]) == 2


def test_dry_run_prints_the_plan(capsys):
    assert soak.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--attention-backend FA4" in out and "--attention-backend FLASH_ATTN" in out
    assert "--enable-prefix-caching" in out and "--load-format dummy" in out
    assert "--max-model-len 32960" in out and "5 min each, 64 streaming clients" in out
    assert "20% long" in out and "10% cancelled" in out and "tolerance" not in out
    assert soak.main(["--dry-run", "--backends", "FA4", "--minutes", "30", "-tp", "2"]) == 0
    out = capsys.readouterr().out
    assert "FLASH_ATTN" not in out and "--tensor-parallel-size 2" in out and "30 min" in out


def test_serve_command_parses_with_vllms_serve_parser():
    # vLLM's parser needs a platform; force the CPU one in a child (as test_registration.py)
    cmds = {b: soak.serve_command(soak.parse_args([]), b, MIX) for b in ("FA4", "FLASH_ATTN")}
    for cmd in cmds.values():
        assert cmd[:4] == [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    script = textwrap.dedent(f"""
        import vllm.platforms as platforms
        from vllm.platforms.cpu import CpuPlatform
        platforms._current_platform = CpuPlatform()
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        root = FlexibleArgumentParser()
        ServeSubcommand().subparser_init(root.add_subparsers(dest="subcommand"))
        for cmd in {[c[3:] for c in cmds.values()]!r}:
            a = root.parse_args(cmd)
            print("RESULT", a.model_tag, a.attention_backend, a.load_format, a.max_model_len,
                  a.enable_prefix_caching, a.enable_prompt_tokens_details, a.port)
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("RESULT")]
    assert results == [
        ["configs/llama-3.1-8b", b, "dummy", "32960", "True", "True", "8766"]
        for b in ("FA4", "FLASH_ATTN")
    ]


def test_cli_help_and_bad_arguments(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(BENCH / "soak.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "--minutes" in proc.stdout and "Pass rules" in proc.stdout
    for bad in (["--cancel-fraction", "2"], ["--short-tokens", "20,30"], ["--backends", "X"]):
        with pytest.raises(SystemExit):
            soak.main(["--dry-run", *bad])


# --------------------------------------------------------------------------------------------
# The async client against a fake server


async def _against_fake(config, mix, load_s=1.0, concurrency=8):
    import aiohttp

    state, port, runner = await fake.start(config)
    try:
        async with aiohttp.ClientSession() as session:
            samples = []

            async def sampler():
                samples.append(1)
                return {"gpu_mib": [1.0]}

            out = await soak.drive(
                session,
                f"http://127.0.0.1:{port}",
                "fake",
                mix,
                concurrency,
                load_s,
                drain_s=5.0,
                request_timeout=10.0,
                sampler=sampler,
                sample_s=0.3,
            )
        await asyncio.sleep(0.3)  # handlers still in "prefill" notice their client is gone
    finally:
        await runner.cleanup()
    return state, out


def test_drive_cancels_and_accounts_end_to_end():
    state, out = asyncio.run(_against_fake(fake.FakeConfig(), SMALL))
    recs = out["records"]
    s = soak.summarize(recs, out["wall_s"])
    c = s["counts"]
    assert out["drained"] and c["unfinished"] == 0
    assert c["failed"] == 0, s["error_kinds"]
    assert c["completed_short"] > 10 and c["completed_long"] > 3
    assert c["cancelled"] > 3 and c["cancelled_before_first_token"] > 0
    # a cancellation closes its connection: the server sees the stream break off, unless it
    # had written the whole answer already (the client had not read it yet); one cancelled at
    # once may close before the server has read its request at all (seen under CPU load: the
    # server saw 179 of 180, then 175 of 176), which only a cancellation before the first
    # token can do
    assert state.aborted + state.completed == state.requests <= c["sent"]
    assert c["sent"] - state.requests <= c["cancelled_before_first_token"]
    assert 0 < state.aborted <= c["cancelled"] and state.completed >= c["completed"]
    assert state.bad_bodies == [] and len(out["samples"]) >= 2
    assert s["tokens"]["cached_prompt"] > 0  # shared documents and prefixes hit the cache
    for r in recs:
        if r.outcome == "cancelled":
            assert r.latency_s == pytest.approx(r.cancel_after_s, abs=0.2)
        if r.outcome == "completed":
            assert r.usage_completion_tokens == r.max_tokens and r.ttft_s < r.latency_s
    assert sorted(r.index for r in recs) == list(range(len(recs)))  # the seeded sequence


def test_drive_reports_injected_faults_and_not_cancellations():
    cfg = fake.FakeConfig(fail_every=7, truncate_every=11, error_every=13)
    state, out = asyncio.run(_against_fake(cfg, SMALL, load_s=0.8))
    s = soak.summarize(out["records"], out["wall_s"])
    kinds = " ".join(s["error_kinds"])
    assert s["counts"]["failed"] > 3
    assert "HTTP N" in kinds and "truncated" in kinds and "error in stream" in kinds
    for r in out["records"]:
        if r.outcome == "failed":
            assert r.error.startswith(("HTTP 500", "truncated", "error in stream")), r.error
    assert s["counts"]["cancelled"] > 0
    res = _result(out["records"], summary=s)
    assert "no failed requests" in _failed_rules(res)


def test_drive_stops_early_against_a_server_that_only_fails():
    async def run():
        import aiohttp

        state, port, runner = await fake.start(fake.FakeConfig(fail_every=1))
        try:
            async with aiohttp.ClientSession() as session:
                return await soak.drive(
                    session, f"http://127.0.0.1:{port}", "fake", SMALL, 4, 30.0, 5.0, 10.0,
                    max_failures=12,
                )  # fmt: skip
        finally:
            await runner.cleanup()

    out = asyncio.run(run())
    assert out["stopped_early"] and out["wall_s"] < 5.0
    assert all(r.outcome in ("failed", "cancelled") for r in out["records"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_fake_server_counts_a_client_gone_before_the_headers(monkeypatch):
    """A request cancelled at once can be gone before the stream's headers are written (seen
    under CPU load); the fake server counts it as aborted, like vLLM, with no Traceback (the
    soak's log check would fail the FLASH_ATTN phase)."""
    from aiohttp import web
    from aiohttp.client_exceptions import ClientConnectionResetError

    async def gone(self, request):
        raise ClientConnectionResetError("Cannot write to closing transport")

    class Request:
        app = {fake.STATE: fake.FakeState(fake.FakeConfig())}

        async def json(self):
            return {"prompt": [1, 2, 3], "max_tokens": 4, "stream": True, "ignore_eos": True}

    monkeypatch.setattr(web.StreamResponse, "prepare", gone)
    request = Request()
    asyncio.run(fake.completions(request))
    state = request.app[fake.STATE]
    assert (state.aborted, state.running, state.completed) == (1, 0, 0)


@pytest.mark.parametrize("gone", ["reset", "cancelled"])
def test_fake_server_counts_a_client_gone_before_its_body_arrived(gone):
    """A cancelled request can be gone while the server still reads its body (a long prompt's
    token list under CPU load); it is counted as aborted, so that every request the server saw
    is aborted or completed."""
    from aiohttp.client_exceptions import ClientConnectionResetError

    class Request:
        app = {fake.STATE: fake.FakeState(fake.FakeConfig())}

        async def json(self):
            if gone == "reset":
                raise ClientConnectionResetError("Connection lost")
            raise asyncio.CancelledError

    request = Request()
    if gone == "reset":
        assert asyncio.run(fake.completions(request)).status == 499  # no Traceback logged
    else:
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(fake.completions(request))
    state = request.app[fake.STATE]
    assert (state.requests, state.aborted, state.running, state.completed) == (1, 1, 0, 0)


def test_soak_stops_before_any_server_when_vllm_cannot_see_fa4(tmp_path, monkeypatch):
    """Without the package's entry point `vllm serve --attention-backend FA4` fails only after
    loading the model: the soak refuses at once, naming why, and starts nothing."""
    monkeypatch.setattr(soak.serving, "plugin_problem", lambda: "no plugin here")

    def must_not_run(*_):
        raise AssertionError("a server started")

    monkeypatch.setattr(soak, "run_backend", must_not_run)
    with pytest.raises(SystemExit, match="no plugin here"):
        soak.main(["--out", str(tmp_path / "o"), "--backends", "FA4,FLASH_ATTN"])
    assert not (tmp_path / "o").exists()
    # FLASH_ATTN alone, or a stand-in server command, does not need the plugin
    ran = []
    passed = {"rules": [], "passed": True}
    monkeypatch.setattr(soak, "run_backend", lambda args, b, mix, out: ran.append(b) or passed)
    monkeypatch.setattr(soak, "write_json", lambda *a: None)
    monkeypatch.setattr(soak, "write_report", lambda *a: 0)
    for argv in (["--backends", "FLASH_ATTN"], ["--backends", "FA4", "--server-command", "x"]):
        assert soak.main(["--out", str(tmp_path / "p"), "--settle-s", "0", *argv]) == 0
    assert ran == ["FLASH_ATTN", "FA4"]


def test_soak_main_with_a_fake_server_process(tmp_path, monkeypatch):
    """The whole cycle per backend (start, /health, warmup, load, drain, probe, log scan, stop,
    report); the FA4 'server' injects HTTP 500s (during the load, not into the probe after it)
    and a Traceback, so FA4 fails and the run exits 1; FLASH_ATTN's passes."""
    monkeypatch.setattr(soak, "gpu_memory_mib", lambda: [1000.0])
    command = (
        "{python} " + str(FAKE) + " --port {port} "
        "$([ {backend} = FA4 ] && echo --fail-every 9 --faults-until 40 --traceback-at 5)"
    )
    args = [
        "--out", str(tmp_path),
        "--port", str(_free_port()),
        "--server-command", f"bash -c {command!r}",
        "--minutes", str(0.8 / 60),
        "--concurrency", "6",
        "--settle-s", "0", "--sample-s", "0.3", "--drain-timeout", "5",
        "--long-tokens", "512", "--question-tokens", "8,32", "--docs", "2",
        "--short-tokens", "24,40", "--short-prefix-tokens", "16", "--short-prefixes", "2",
        "--output-tokens", "8,16", "--cancel-fraction", "0.3", "--cancel-delay", "0.001,0.05",
    ]  # fmt: skip
    assert soak.main(args) == 1
    report = json.loads((tmp_path / "soak.json").read_text())
    fa4, base = report["results"]["FA4"], report["results"]["FLASH_ATTN"]
    assert base["passed"], _failed_rules(base)
    assert set(_failed_rules(fa4)) == {"no failed requests", "no Traceback in the server log"}
    assert fa4["summary"]["counts"]["failed"] > 0 and fa4["log"]["tracebacks"] == 1
    assert base["health_after"] == {"status": 200, "probe": "ok", "process_alive": True}
    assert base["memory"]["growth_mib"] == 0.0 and base["prefix_cache"]["hits"] > 0
    assert base["summary"]["counts"]["cancelled"] > 0 and base["timeline"]
    # the fake server's own process group, read from /proc: a Python process holds MiBs
    host = base["host_memory"]
    assert 5 < host["after_warmup"] < 4096 and host["peak_during_load"] >= 5
    assert host["growth_mib"] == host["after"] - host["after_warmup"]
    assert any(x.get("host_rss_mib") for x in base["timeline"])
    text = (tmp_path / "soak.md").read_text()
    assert "| FA4 | FLASH_ATTN | FA4 / FLASH_ATTN |" in text and "injected fault" in text
    for b in ("FA4", "FLASH_ATTN"):
        assert (tmp_path / f"requests-{b}.csv").exists()
        assert (tmp_path / f"server-{b}.log").exists()
        assert not (tmp_path / f"server-{b}.pgid").exists()  # the server was stopped
