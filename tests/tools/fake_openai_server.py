"""A tiny stand-in for `vllm serve` (CPU tests of benchmarks/soak.py): /health, /metrics and a
streaming /v1/completions that answers like vLLM's (one chunk per token, finish_reason
"length" on the last, a usage chunk with prompt_tokens_details.cached_tokens, `[DONE]`).

"Prefill" sleeps in proportion to the prompt tokens not found in its prefix cache (16-token
blocks, chained hashes, as vLLM's); each token then takes `token_delay_s`. A client that goes
away is noticed at the next read or write (its body's, the headers') and counted in
`aborted`. Faults on request: every Nth request answers HTTP 500 (`fail_every`), ends its
stream without `[DONE]` (`truncate_every`), or sends an error chunk (`error_every`), among
the first `faults_until` requests (0: all); `traceback_at` prints a Traceback to stderr once.

In-process: `start(FakeConfig(...))` in a running loop -> (state, port, runner). As a process
(the soak's --server-command): `python fake_openai_server.py --port N [--fail-every N ...]`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import traceback
from dataclasses import dataclass, field

from aiohttp import web

BLOCK = 16
STATE = web.AppKey("state", object)


@dataclass
class FakeConfig:
    prefill_base_s: float = 0.01
    prefill_per_token_s: float = 2e-5
    token_delay_s: float = 0.002
    fail_every: int = 0
    truncate_every: int = 0
    error_every: int = 0
    traceback_at: int = 0
    faults_until: int = 0  # faults only in the first N requests (0: all)


@dataclass
class FakeState:
    config: FakeConfig
    requests: int = 0
    running: int = 0
    completed: int = 0
    aborted: int = 0
    queries: int = 0
    hits: int = 0
    blocks: set = field(default_factory=set)
    bad_bodies: list = field(default_factory=list)


def _block_hashes(ids: list[int]) -> list[str]:
    out, prev = [], ""
    for i in range(0, len(ids) - len(ids) % BLOCK, BLOCK):
        prev = hashlib.sha1((prev + json.dumps(ids[i : i + BLOCK])).encode()).hexdigest()
        out.append(prev)
    return out


def _chunk(text: str, finish=None) -> bytes:
    obj = {
        "id": "cmpl-fake",
        "object": "text_completion",
        "model": "fake",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
    }
    return f"data: {json.dumps(obj)}\n\n".encode()


async def completions(request: web.Request) -> web.StreamResponse:
    st: FakeState = request.app[STATE]
    cfg = st.config
    st.requests += 1
    n = st.requests
    try:
        body = await request.json()
    except ConnectionError:  # gone while its body was still arriving (long prompts, CPU load)
        st.aborted += 1
        return web.Response(status=499)  # raising would log a Traceback
    except asyncio.CancelledError:
        st.aborted += 1
        raise
    prompt, max_tokens = body.get("prompt"), body.get("max_tokens")
    if not isinstance(prompt, list) or not body.get("stream") or not body.get("ignore_eos"):
        st.bad_bodies.append(body)
        return web.json_response({"error": {"message": "bad request"}}, status=400)
    if cfg.traceback_at and n == cfg.traceback_at:
        try:
            raise RuntimeError("injected fault")
        except RuntimeError:
            traceback.print_exc()
            sys.stderr.flush()
    faulty = not cfg.faults_until or n <= cfg.faults_until
    if faulty and cfg.fail_every and n % cfg.fail_every == 0:
        return web.json_response({"error": {"message": "injected 500"}}, status=500)
    hashes = _block_hashes(prompt)
    cached = 0
    for h in hashes:
        if h not in st.blocks:
            break
        cached += BLOCK
    st.queries += len(prompt)
    st.hits += cached
    st.blocks.update(hashes)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    st.running += 1
    try:
        await resp.prepare(request)  # a client cancelled at once may be gone already
        await asyncio.sleep(cfg.prefill_base_s + cfg.prefill_per_token_s * (len(prompt) - cached))
        for i in range(max_tokens):
            if faulty and cfg.error_every and n % cfg.error_every == 0 and i == 1:
                await resp.write(b'data: {"error": {"message": "injected stream error"}}\n\n')
                await resp.write(b"data: [DONE]\n\n")
                return resp
            if (
                faulty
                and cfg.truncate_every
                and n % cfg.truncate_every == 0
                and i == max_tokens // 2
            ):
                return resp  # the stream ends: no finish_reason, no usage, no [DONE]
            await resp.write(_chunk("x", "length" if i == max_tokens - 1 else None))
            await asyncio.sleep(cfg.token_delay_s)
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": max_tokens,
            "total_tokens": len(prompt) + max_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        tail = {"id": "cmpl-fake", "object": "text_completion", "choices": [], "usage": usage}
        await resp.write(f"data: {json.dumps(tail)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        st.completed += 1
        return resp
    except ConnectionError:  # aiohttp's ClientConnectionResetError too
        st.aborted += 1  # the client went away (a cancelled request); as vLLM, no traceback
        return resp
    except asyncio.CancelledError:
        st.aborted += 1
        raise
    finally:
        st.running -= 1


async def health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def metrics(request: web.Request) -> web.Response:
    st: FakeState = request.app[STATE]
    lines = [
        "# TYPE vllm:prefix_cache_queries_total counter",
        f'vllm:prefix_cache_queries_total{{engine="0",model_name="fake"}} {float(st.queries)}',
        'vllm:prefix_cache_queries_created{engine="0",model_name="fake"} 1.7e9',
        f'vllm:prefix_cache_hits_total{{engine="0",model_name="fake"}} {float(st.hits)}',
        f'vllm:num_requests_running{{engine="0",model_name="fake"}} {float(st.running)}',
        'vllm:num_requests_waiting{engine="0",model_name="fake"} 0.0',
        f'vllm:request_success_total{{engine="0",finished_reason="abort"}} {float(st.aborted)}',
        f'vllm:request_success_total{{engine="0",finished_reason="length"}} {float(st.completed)}',
    ]
    return web.Response(text="\n".join(lines) + "\n")


def make_app(config: FakeConfig) -> web.Application:
    app = web.Application()
    app[STATE] = FakeState(config)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


async def start(config: FakeConfig, port: int = 0):
    """Serve in the running loop: (state, port, runner); `await runner.cleanup()` stops it."""
    app = make_app(config)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return app[STATE], port, runner


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    for name in ("fail_every", "truncate_every", "error_every", "traceback_at", "faults_until"):
        ap.add_argument(f"--{name.replace('_', '-')}", type=int, default=0)
    ap.add_argument("--token-delay-s", type=float, default=0.002)
    args = ap.parse_args(argv)
    cfg = FakeConfig(
        token_delay_s=args.token_delay_s,
        fail_every=args.fail_every,
        truncate_every=args.truncate_every,
        error_every=args.error_every,
        traceback_at=args.traceback_at,
        faults_until=args.faults_until,
    )
    print(f"INFO fake OpenAI server on port {args.port}: {cfg}", flush=True)
    web.run_app(make_app(cfg), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
