"""tools/padded_serve.py on the CPU: the tiny hybrid (NemotronH target + Llama draft) it writes,
and the layout vLLM 0.26's own code gives it: the target's attention pages padded (32 KiB pages
in 48 KiB blocks, kernel block = block), read by FA4 as announced, the wide_box config refitted
with the startup log line the GPU run looks for; without the draft, no padding. The serving
half (log and response checks, the command) is tested on canned text."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from helpers.modules import load_file

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "padded_serve.py"
BYTE_TOKENIZER = ROOT / "configs" / "llama-3.2-1b"


tool = load_file("padded_serve", TOOL)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    out = tmp_path_factory.mktemp("padded-serve")
    return tool.write_models(out, draft=True, tokenizer=str(BYTE_TOKENIZER), smol_site=None)


@pytest.fixture(scope="module")
def target_only(tmp_path_factory):
    out = tmp_path_factory.mktemp("hybrid-only")
    return tool.write_models(out, draft=False, tokenizer=str(BYTE_TOKENIZER), smol_site=None)


def _layout_or_skip(dirs, backend="FA4"):
    why = tool.vllm_layout_supported()
    if why is not None:
        pytest.skip(why)
    return tool.vllm_layout(dirs, backend)


@pytest.fixture(scope="module")
def padded(dirs):
    return _layout_or_skip(dirs)


# What vLLM 0.26 gives the tool's model (test_vllm_pads_the_targets_attention_pages_to_the_drafts
# checks it against vLLM), for the tests that judge logs without vLLM's internals.
EXPECTED = tool.Layout(
    backend="FA4",
    block_size=32,
    kernel_block_size=32,
    mamba_page_bytes=19264,
    attn_page_bytes=32768,
    page_size_padded=49152,
    draft_page_bytes=49152,
    num_kv_heads=2,
    head_size=128,
    view_strides_bytes=(49152, 1024, 512),
    fa4_refits=["x+wide_box -> x"],
)


# --------------------------------------------------------------------------------------------
# The configs and folders


def test_configs_give_a_hybrid_with_fa4_head_dims_and_a_non_multiple_draft_page():
    target, draft = tool.TARGET_CONFIG, tool.DRAFT_CONFIG
    assert tool.config_problems(target, draft) == []
    assert {"M", "*"} <= set(target["hybrid_override_pattern"])
    assert tool.page_bytes_per_token(target) == 1024
    assert tool.page_bytes_per_token(draft) == 1536  # 1.5x: padded, not scaled


@pytest.mark.parametrize(
    "target_change, draft_change, words",
    [
        ({"head_dim": 96}, {}, "head_dim 96"),
        ({}, {"num_key_value_heads": 4, "num_attention_heads": 8}, "query-head count"),
        ({}, {"num_key_value_heads": 6}, "not be a multiple"),  # 2x the target: scaled
        ({}, {"num_key_value_heads": 2}, "must exceed"),  # same page: nothing to pad
        ({"hybrid_override_pattern": "**-**-"}, {}, "Mamba"),
        ({"vocab_size": 1000}, {}, "vocab_size"),
    ],
)
def test_config_problems_name_what_would_not_pad(target_change, draft_change, words):
    problems = tool.config_problems(
        tool.TARGET_CONFIG | target_change, tool.DRAFT_CONFIG | draft_change
    )
    assert any(words in p for p in problems), problems


def test_folders_hold_the_configs_and_a_tokenizer(dirs, target_only):
    assert json.loads((dirs.target / "config.json").read_text()) == tool.TARGET_CONFIG
    assert json.loads((dirs.draft / "config.json").read_text()) == tool.DRAFT_CONFIG
    for folder in (dirs.target, dirs.draft):
        assert (folder / "tokenizer.json").exists()
        assert not list(folder.glob("*.safetensors"))  # --load-format dummy: no weights
    assert "258 tokens" in dirs.tokenizer
    assert dirs.speculative_config(3) == {
        "method": "draft_model",
        "model": str(dirs.draft),
        "num_speculative_tokens": 3,
    }
    assert target_only.draft is None and target_only.speculative_config() is None


def test_without_smollm2_the_repos_byte_tokenizer_is_used(tmp_path, monkeypatch):
    monkeypatch.setattr(tool, "tokenizer_source", lambda explicit, site: None)
    made = tool.write_models(tmp_path, draft=False, smol_site=None)
    assert "no SmolLM2 tokenizer found" in made.tokenizer
    assert (made.target / "tokenizer.json").read_text() == (
        BYTE_TOKENIZER / "tokenizer.json"
    ).read_text()


def test_a_missing_explicit_tokenizer_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="--tokenizer"):
        tool.write_models(tmp_path, tokenizer=str(tmp_path / "nothing"), smol_site=None)


# --------------------------------------------------------------------------------------------
# The layout, from vLLM's own code


def test_vllm_pads_the_targets_attention_pages_to_the_drafts(padded):
    assert padded.block_size == 32 and padded.kernel_block_size == 32
    assert padded.mamba_page_bytes < padded.attn_page_bytes == 32 * 1024
    assert padded.page_size_padded == padded.draft_page_bytes == 48 * 1024
    # vLLM's runner view: blocks 48 KiB apart, tokens 1 KiB, heads 2 * 128 * 2 bytes
    assert padded.view_strides_bytes == (48 * 1024, 1024, 512)
    assert padded.view_problem is None
    assert tool.layout_problems(padded, draft=True) == []
    assert dataclasses.replace(padded, groups=[], fa4_refits=[], fa4_log=[]) == dataclasses.replace(
        EXPECTED, fa4_refits=[]
    )


def test_fa4_refits_wide_box_and_says_so_at_startup(padded):
    assert padded.fa4_refits and all("wide_box" in r.split(" -> ")[0] for r in padded.fa4_refits)
    assert not any("wide_box" in r.split(" -> ")[1] for r in padded.fa4_refits)
    assert any("FA4: padded KV pages (49152 bytes per block)" in m for m in padded.fa4_log)


def test_flash_attn_gets_the_same_layout(dirs, padded):
    fa = _layout_or_skip(dirs, "FLASH_ATTN")
    assert (fa.block_size, fa.kernel_block_size, fa.page_size_padded) == (
        padded.block_size,
        padded.kernel_block_size,
        padded.page_size_padded,
    )
    assert fa.view_strides_bytes == padded.view_strides_bytes and not fa.fa4_refits


def test_the_hybrid_alone_pads_mamba_not_attention(target_only):
    plain = _layout_or_skip(target_only)
    assert plain.page_size_padded is None and plain.block_size == 32
    assert plain.mamba_page_bytes < plain.attn_page_bytes
    assert any(g.startswith(f"MambaSpec padded {plain.attn_page_bytes}") for g in plain.groups)
    assert plain.view_strides_bytes == (32 * 1024, 1024, 512)
    assert not plain.fa4_refits and tool.layout_problems(plain, draft=False) == []
    assert tool.layout_problems(plain, draft=True) == [
        "the target's attention pages are not padded"
    ]


def test_layout_problems_catch_split_padded_blocks_and_a_silent_fa4():
    assert tool.layout_problems(EXPECTED, True) == []
    split = dataclasses.replace(EXPECTED, kernel_block_size=16)
    assert any("kernel block 16 < block 32" in p for p in tool.layout_problems(split, True))
    silent = dataclasses.replace(EXPECTED, fa4_refits=[])
    assert any("refits no config" in p for p in tool.layout_problems(silent, True))


# --------------------------------------------------------------------------------------------
# Serving: the command, and judging responses and the server's log


def test_serve_command(dirs):
    cmd = tool.serve_command(dirs, "FA4", 8123)
    text = " ".join(cmd)
    assert cmd[1:5] == ["-m", "vllm.entrypoints.cli.main", "serve", str(dirs.target)]
    for part in ("--load-format dummy", "--attention-backend FA4", "--max-model-len 8192"):
        assert part in text
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec["method"] == "draft_model" and spec["model"] == str(dirs.draft)
    assert "--enforce-eager" not in cmd
    assert "--enforce-eager" in tool.serve_command(dirs, "FA4", 1, enforce_eager=True)


def test_prompts_are_token_ids_of_the_listed_lengths():
    batch = tool.prompts()
    assert [len(p) for p in batch] == list(tool.PROMPT_LENS)
    assert max(tool.PROMPT_LENS) > 4096  # several prefill chunks
    assert all(3 <= t < tool.VOCAB_SIZE for p in batch for t in p)
    assert batch == tool.prompts()  # the same for every backend


def _response(prompt_tokens=10, completion_tokens=24, finish="length"):
    return {
        "choices": [{"finish_reason": finish, "token_ids": [1] * completion_tokens}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
    }


def test_response_problem():
    assert tool.response_problem(_response(), 10, 24) is None
    assert "prompt_tokens" in tool.response_problem(_response(prompt_tokens=9), 10, 24)
    assert "completion_tokens" in tool.response_problem(_response(completion_tokens=3), 10, 24)
    assert "finish_reason" in tool.response_problem(_response(finish="stop"), 10, 24)
    assert "HTTP 500" in tool.response_problem({"error": "HTTP 500: b'boom'"}, 10, 24)
    assert "malformed" in tool.response_problem({"id": 1}, 10, 24)


GOOD_LOG = """\
INFO [interface.py:905] Setting attention block size to 32 tokens to ensure that attention page size is >= mamba page size.
INFO [cuda.py:422] Using AttentionBackendEnum.FA4 backend.
INFO FA4: padded KV pages (49152 bytes per block): a+wide_box runs as a
INFO FA4 prefill: KernelKey(head_dim=128, page_size=32) on cuda:0 -> kernel
"""  # noqa: E501


def test_log_findings_pass_a_good_fa4_log():
    seen, problems = tool.log_findings(GOOD_LOG, "FA4", EXPECTED)
    assert problems == []
    assert seen["backend_selected"] and seen["fa4_kernel_route"]
    assert seen["fa4_padded_bytes"] == [49152] and seen["attention_block_size"] == 32


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda t: t.replace("49152", "32768"), "no 'FA4: padded KV pages (49152"),
        (lambda t: t.replace("FA4 backend", "FLASH_ATTN backend"), "Using ... FA4 backend"),
        (lambda t: t.replace("-> kernel", "-> PyTorch reference: x"), "fp32 reference"),
        (lambda t: t + "WARNING FA4 prefill: ... are not whole wide_box boxes\n", "announced"),
        (lambda t: t + "Traceback (most recent call last):\n", "traceback"),
        (lambda t: t.replace("size to 32", "size to 48"), "block size 48 != 32"),
    ],
)
def test_log_findings_fail_a_bad_fa4_log(edit, words):
    _, problems = tool.log_findings(edit(GOOD_LOG), "FA4", EXPECTED)
    assert any(words in p for p in problems), problems


def test_log_findings_for_flash_attn_need_no_fa4_lines():
    text = "INFO Using AttentionBackendEnum.FLASH_ATTN backend.\n"
    assert tool.log_findings(text, "FLASH_ATTN", EXPECTED)[1] == []
    # the hybrid alone: FA4 must not report padded pages
    plain = dataclasses.replace(EXPECTED, page_size_padded=None, fa4_refits=[])
    assert tool.log_findings(GOOD_LOG, "FA4", plain)[1] == [
        "FA4 saw padded pages [49152]; none expected"
    ]


def test_log_findings_without_a_computed_layout():
    """Where the CPU prediction failed: a draft needs some padded line, no draft none."""
    assert tool.log_findings(GOOD_LOG, "FA4", None, draft=True)[1] == []
    unpadded = GOOD_LOG.replace("FA4: padded KV pages", "FA4: KV pages")
    assert "no 'FA4: padded KV pages (some" in tool.log_findings(unpadded, "FA4", None)[1][0]
    assert tool.log_findings(unpadded, "FA4", None, draft=False)[1] == []
    assert tool.log_findings(GOOD_LOG, "FA4", None, draft=False)[1] == [
        "FA4 saw padded pages [49152]; none expected"
    ]


# --------------------------------------------------------------------------------------------
# serve_and_check end to end against a stand-in server (stdlib HTTP): process group, /health,
# requests alone and together, the log read up to shutdown

FAKE_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, short = int(sys.argv[1]), sys.argv[2] == "short"
print(sys.argv[3], flush=True)  # the log lines a real server would print


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = body["max_tokens"] - (len(body["prompt"]) > 4000 and short)
        out = {"choices": [{"finish_reason": "length", "token_ids": [5] * n}],
               "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}}
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.mark.parametrize("short", [False, True])
def test_serve_and_check_against_a_stand_in_server(tmp_path, monkeypatch, dirs, short):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    monkeypatch.setattr(
        tool,
        "serve_command",
        lambda d, backend, port, **kw: [
            sys.executable,
            str(script),
            str(port),
            "short" if short else "full",
            GOOD_LOG,
        ],
    )
    args = tool.parse_args(["--out", str(tmp_path / "out"), "--startup-timeout", "60"])
    rec = tool.serve_and_check(args, dirs, "FA4", EXPECTED)
    assert len(rec["requests"]) == 2 * len(tool.PROMPT_LENS)
    assert rec["log_findings"]["fa4_padded_bytes"] == [49152]
    if short:  # the prompts over 4,000 tokens come back one token short, alone and together
        assert len(rec["problems"]) == 2 * sum(n > 4000 for n in tool.PROMPT_LENS)
        assert all("completion_tokens 23 != 24" in p for p in rec["problems"])
    else:
        assert rec["problems"] == []
