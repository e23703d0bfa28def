"""Invariants of the fuzz suite's batch generator and shrinker (testing.fuzz), on the CPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vllm_fa4 import envs
from vllm_fa4.testing import fuzz

COUNT = 300


@pytest.fixture(scope="module")
def run():
    return fuzz.batches(0, COUNT)


def test_seeds_reproducible(run):
    again = fuzz.batches(0, COUNT)
    assert [b.to_json() for b in again] == [b.to_json() for b in run]
    other = fuzz.batches(1, COUNT)
    assert [b.to_json() for b in other] != [b.to_json() for b in run]
    # One batch is a function of its seed, level and shape alone.
    b = run[17]
    assert fuzz.generate(b.seed, b.level, b.shape) == b


def test_every_batch_valid_and_within_limits(run):
    for b in run:
        assert fuzz.batch_problems(b) == [], b.describe()
        q_tokens, kv_tokens, work = fuzz._totals(b.shape, b.decodes + b.prefills)
        limit = fuzz.LIMITS
        max_q = limit.max_backend_q_tokens if b.level == "backend" else limit.max_q_tokens
        assert q_tokens <= max_q and kv_tokens <= limit.max_kv_tokens
        assert work <= limit.max_work
        assert kv_tokens * fuzz._kv_bytes_per_token(b.shape) <= limit.max_kv_bytes


def test_decodes_first_and_lengths_within_bounds(run):
    for b in run:
        reqs = b.requests
        assert 1 <= len(b.decodes) + len(b.prefills) <= fuzz.MAX_REQS
        assert all(0 <= q <= k <= fuzz.MAX_K_LEN and q <= fuzz.MAX_Q_LEN for q, k in reqs)
        if b.level == "backend":
            t = b.decode_threshold
            # vLLM's reordered batch: every decode (q_len <= threshold) before the first prefill,
            # which is where split_decodes_and_prefills cuts.
            assert all(1 <= q <= t for q, _ in b.decodes)
            assert not b.prefills or b.prefills[0][0] > t
            first_prefill = next((i for i, (q, _) in enumerate(reqs) if q > t), len(reqs))
            assert first_prefill == (len(b.decodes) if b.prefills else len(reqs))
            assert all(q >= 1 for q, _ in b.prefills)
            assert reqs[len(reqs) - b.pad_reqs :] == ((0, 0),) * b.pad_reqs
        else:
            assert all(q == 1 for q, _ in b.decodes) and b.spec_tokens == 0 and not b.pad_reqs


def test_run_covers_the_space(run):
    levels = [b.level for b in run]
    assert levels.count("prefill") == 200 and levels.count("backend") == 100
    assert all(fuzz.level_of(i) == b.level and b.index == i for i, b in enumerate(run))
    shapes = {b.shape for b in run}
    # pool_size kernel keys (the compiles), each in up to VARIANTS shapes (cheap)
    assert len({s.key_fields for s in shapes}) == fuzz.pool_size(COUNT)
    assert len(shapes) > 2 * fuzz.pool_size(COUNT)
    assert set(fuzz.NAMED_SHAPES) <= shapes
    assert {s.dtype for s in shapes} == set(fuzz.DTYPES)
    assert {s.head_dim for s in shapes} == set(fuzz.HEAD_DIMS)
    assert {s.page_size for s in shapes} == set(fuzz.PAGE_SIZES)
    assert len({s.qhead_per_kvhead for s in shapes}) >= 4
    reqs = [r for b in run for r in b.decodes + b.prefills]
    assert max(k - q for q, k in reqs) > 32768  # long cached prefixes
    assert max(q for q, _ in reqs) > 2048  # long prompts
    assert any(q == 0 for b in run if b.level == "prefill" for q, _ in b.prefills)
    assert max(len(b.decodes) + len(b.prefills) for b in run) > 32
    assert any(len(b.decodes) + len(b.prefills) == 1 for b in run)
    backend = [b for b in run if b.level == "backend"]
    assert any(b.spec_tokens for b in backend) and any(not b.prefills for b in backend)
    assert any(b.decodes and b.prefills for b in backend)
    assert any(b.pad_rows for b in run) and any(b.pad_reqs for b in backend)
    assert any(b.with_lse for b in run) and not any(b.with_lse for b in backend)


def test_json_roundtrip(run):
    for b in run[:50]:
        again = fuzz.Batch.from_json(b.to_json())
        assert again == b and again.to_json() == b.to_json()
    with pytest.raises(ValueError, match="invalid fuzz batch"):
        bad = replace(run[2], prefills=((1, 1),), decodes=())  # backend: first prefill <= 1
        fuzz.Batch.from_json(bad.to_json())


def test_shape_pool_filter_and_prefix_stability():
    small, big = fuzz.shape_pool(3, 12), fuzz.shape_pool(3, 30)
    assert big[:12] == small and len({s.key_fields for s in big}) == 30
    assert big[: len(fuzz.NAMED_SHAPES)] == list(fuzz.NAMED_SHAPES)
    assert fuzz.run_shapes(3, 300)[:10] == fuzz.run_shapes(3, 1000)[:10]
    no_256 = fuzz.shape_pool(3, 12, accept=lambda s: s.head_dim != 256)
    assert len(no_256) == 12 and all(s.head_dim != 256 for s in no_256)
    assert all(b.shape.head_dim != 256 for b in fuzz.batches(3, 60, lambda s: s.head_dim != 256))
    with pytest.raises(ValueError, match="no fuzz shape"):
        fuzz.shape_pool(0, 4, accept=lambda s: False)


def test_shrink_candidates_are_valid_and_smaller(run):
    for b in run[:60]:
        for c in fuzz.shrink_candidates(b):
            assert fuzz.is_valid(c), c.describe()
            assert c.size() < b.size() and c.level == b.level and c.shape == b.shape


def test_shrinker_terminates_and_minimises(run):
    big = max(run, key=lambda b: len(b.prefills) * (b.level == "backend"))
    # Fails whenever any prefill is at least 100 tokens long: shrinks to one such request.
    res = fuzz.shrink(
        big, lambda c: any(q >= 100 for q, _ in c.prefills), max_tries=10_000, deadline_s=None
    )
    assert res.stopped == "minimal"
    b = res.batch
    assert not b.decodes and len(b.prefills) == 1 and 100 <= b.prefills[0][0] < 200
    assert b.prefills[0][1] == b.prefills[0][0]  # prefix halved away
    assert b.pad_rows == b.pad_reqs == b.spec_tokens == 0
    # Always failing: shrinks to the smallest valid batch of its level.
    for level_batch in (run[0], run[2]):
        res = fuzz.shrink(level_batch, lambda c: True, max_tries=100_000)
        assert res.stopped == "minimal" and len(res.batch.requests) == 1
        assert res.batch.size() <= 3


def test_shrinker_bounded():
    b = fuzz.batches(5, 3)[2]
    calls = []
    res = fuzz.shrink(b, lambda c: calls.append(c) is None and False, max_tries=7)
    assert len(calls) == res.tries <= 7
    assert res.batch == b and res.stopped in ("minimal", "max_tries")
    res = fuzz.shrink(b, lambda c: True, max_tries=10_000, deadline_s=0.0)
    assert res.stopped in ("deadline", "minimal") and res.tries <= 1


def test_env_options(monkeypatch):
    monkeypatch.delenv(envs.FUZZ_COUNT, raising=False)
    monkeypatch.delenv(envs.FUZZ_SEED, raising=False)
    assert envs.fuzz_count() == envs.DEFAULT_FUZZ_COUNT and envs.fuzz_seed() == 0
    monkeypatch.setenv(envs.FUZZ_COUNT, "10000")
    monkeypatch.setenv(envs.FUZZ_SEED, "7")
    assert envs.fuzz_count() == 10000 and envs.fuzz_seed() == 7
    monkeypatch.setenv(envs.FUZZ_COUNT, "many")
    with pytest.raises(ValueError, match=envs.FUZZ_COUNT):
        envs.fuzz_count()
    assert fuzz.pool_size(10000) == 48 and fuzz.pool_size(300) == 12


# ---------------------------------------------------------------------------------------------
# the dimensions added for issue 27: features, heads, layouts, block tables, long contexts

RATE_COUNT = 2000


@pytest.fixture(scope="module")
def big_run():
    return fuzz.batches(0, RATE_COUNT)


def _rate(run, pred) -> float:
    return sum(1 for b in run if pred(b)) / len(run)


def test_new_dimensions_drawn_at_sensible_rates(big_run):
    """Each new dimension shows up often enough to matter in a default run (the rates at seed
    0 are in the comments; the bounds leave room for other seeds)."""
    run = big_run
    longest = [max(k for _, k in b.requests) for b in run]
    rates = {
        "window": (_rate(run, lambda b: b.window_left is not None), 0.12),  # 0.26
        "softcap": (_rate(run, lambda b: b.softcap is not None), 0.06),  # 0.14
        "sinks": (_rate(run, lambda b: b.shape.sinks), 0.06),  # 0.18
        "GQA >= 32": (_rate(run, lambda b: b.shape.qhead_per_kvhead >= 32), 0.05),  # 0.12
        "Hkv > 8": (_rate(run, lambda b: b.shape.num_kv_heads > 8), 0.08),  # 0.21
        "padded": (_rate(run, lambda b: b.shape.layout == "padded"), 0.2),  # 0.34
        "cross-layer": (_rate(run, lambda b: b.shape.layout == "cross-layer"), 0.1),  # 0.20
        "k_len > 72k": (sum(k > fuzz.LONG_K_LEN for k in longest) / len(run), 0.02),  # 0.06
        "junk table": (_rate(run, lambda b: b.junk_table), 0.2),  # 0.30
        "exact-width table": (_rate(run, lambda b: b.table_slack == 0), 0.15),  # 0.23
    }
    low = {name: rate for name, (rate, floor) in rates.items() if rate < floor}
    assert not low, f"dimensions drawn too rarely: {low}"
    windows = {b.window_left for b in run}
    assert {0, 127, 4095} <= windows and max(w for w in windows if w is not None) > 8192
    assert {30.0, 50.0} <= {b.softcap for b in run} and len({b.softcap for b in run}) > 10
    groups = {b.shape.qhead_per_kvhead for b in run}
    assert {16, 32, 64, 128} <= groups
    kv_heads = {b.shape.num_kv_heads for b in run}
    assert len(kv_heads) >= 10 and fuzz.MAX_KV_HEADS in kv_heads
    assert max(longest) > 120_000
    combos = {(b.shape.window, b.shape.softcap, b.shape.sinks) for b in run}
    assert len(combos) >= 6  # features alone and together
    # the shapes of gpt-oss and Gemma 2 with their own windows
    assert any(b.shape == fuzz.GPT_OSS and b.window_left == 127 for b in run)
    assert any(b.shape == fuzz.GEMMA2 and b.window_left == 4095 for b in run)
    # every pad kind: 16-byte units that are not token strides, whole token strides, large
    pads = {(b.shape.block_pad, b.shape.num_kv_heads * 2 * b.shape.head_dim) for b in run}
    assert any(p % t for p, t in pads if p) and any(p and not p % t for p, t in pads)
    assert any(p * 2 % 128 for p, _ in pads if p)  # not a multiple of 128 bytes
    assert len({b.shape.layers for b in run}) >= 5
    assert any(b.layer == b.shape.layers - 1 > 1 for b in run) and any(b.layer == 0 for b in run)


def test_new_dimensions_invariants(big_run):
    from vllm_fa4.kernels.config import KernelKey

    for b in big_run:
        s = b.shape
        assert (b.window_left is not None) == s.window and (b.softcap is not None) == s.softcap
        assert b.softcap is None or b.softcap > 0
        assert b.window_left is None or 0 <= b.window_left <= fuzz.MAX_WINDOW_LEFT
        assert 1 <= s.num_kv_heads <= fuzz.MAX_KV_HEADS and s.num_q_heads <= fuzz.MAX_Q_HEADS
        assert not s.sinks or s.num_q_heads <= fuzz.MAX_SINK_Q_HEADS
        assert s.kv_dtype is None and s.cache_dtype == s.dtype  # the model's: the one served
        # 16-byte aligned block strides only (others are refused at startup), pad <= a page
        assert s.block_pad * 2 % 16 == 0 and 0 <= s.block_pad <= s.page_elems
        assert not (s.block_pad and s.layers > 1)  # vLLM pads a layer's page or packs layers
        assert 0 <= b.layer < s.layers and 0 <= b.table_slack <= fuzz.MAX_TABLE_SLACK
        key = KernelKey.for_layer(
            s.dtype,
            s.head_dim,
            s.page_size,
            s.num_q_heads,
            s.num_kv_heads,
            sliding_window=s.window,
            softcap=s.softcap,
            sinks=s.sinks,
        )
        assert key.unsupported_reason() is None, (str(s), key.unsupported_reason())


def test_variants_share_their_key():
    for j, base in enumerate(fuzz.shape_pool(5, 12)):
        variants = fuzz.shape_variants(5, base, j)
        assert variants[0] == base and len(variants) == fuzz.VARIANTS
        assert {v.key_fields for v in variants} == {base.key_fields}
        assert variants[1].layout == "padded"
        assert all(not fuzz.shape_problems(v) for v in variants)


def test_testing_constants_agree_with_cases():
    from vllm_fa4.testing import cases

    assert fuzz.DEFAULT_TABLE_SLACK == cases.TABLE_SLACK
    assert fuzz.MAX_LAYERS == cases.MAX_LAYERS


OLD_JSON = (  # a batch as the generator before issue 27 wrote it (no feature/layout fields)
    '{"level":"backend","shape":{"dtype":"float16","head_dim":64,"num_q_heads":12,'
    '"num_kv_heads":4,"page_size":32},"seed":7,"decodes":[[1,40],[2,9]],'
    '"prefills":[[300,70000]],"spec_tokens":2,"pad_rows":5,"pad_reqs":1,"with_lse":false}'
)


def test_old_json_still_loads():
    b = fuzz.Batch.from_json(OLD_JSON)
    assert b.shape == fuzz.Shape("float16", 64, 12, 4, 32)
    assert (b.shape.window, b.shape.softcap, b.shape.sinks) == (False, False, False)
    assert (b.shape.block_pad, b.shape.layers, b.shape.kv_dtype) == (0, 1, None)
    assert (b.window_left, b.softcap, b.layer, b.junk_table) == (None, None, 0, False)
    assert b.table_slack == fuzz.DEFAULT_TABLE_SLACK == 3  # the old cases' table width
    assert b.prefills == ((300, 70000),) and b.decodes == ((1, 40), (2, 9))
    assert fuzz.Batch.from_json(b.to_json()) == b


def test_json_roundtrip_new_fields(big_run):
    picked = [
        next(b for b in big_run if pred(b))
        for pred in (
            lambda b: b.window_left is not None and b.softcap is not None,
            lambda b: b.shape.sinks,
            lambda b: b.shape.layout == "padded" and b.junk_table,
            lambda b: b.shape.layout == "cross-layer" and b.layer > 0,
            lambda b: b.table_slack == 0,
        )
    ]
    for b in picked:
        again = fuzz.Batch.from_json(b.to_json())
        assert again == b and again.to_json() == b.to_json()
        assert str(b.shape) in b.describe()


@pytest.mark.parametrize(
    "change, problem",
    [
        (dict(window_left=5), "window_left"),
        (dict(softcap=30.0), "softcap"),
        (dict(layer=1), "layer"),
        (dict(table_slack=fuzz.MAX_TABLE_SLACK + 1), "table_slack"),
        (dict(shape=fuzz.Shape("bfloat16", 128, 32, 8, 16, block_pad=4)), "block pad"),
        (dict(shape=fuzz.Shape("bfloat16", 128, 32, 8, 16, layers=9)), "layers"),
        (dict(shape=fuzz.Shape("bfloat16", 128, 128, 8, 16, sinks=True)), "sinks"),
        (dict(shape=fuzz.Shape("bfloat16", 128, 32, 8, 16, kv_dtype="float16")), "kv_dtype"),
        (dict(shape=fuzz.Shape("bfloat16", 128, 512, 2, 16)), "heads"),
        (dict(shape=fuzz.Shape("bfloat16", 128, 34, 17, 16)), "heads"),
        (dict(prefills=((10, fuzz.MAX_K_LEN + 1),)), "out of bounds"),
    ],
)
def test_invalid_new_fields_are_refused(change, problem):
    plain = fuzz.generate(3, "prefill", fuzz.LLAMA_8B)
    bad = replace(plain, **change)
    assert any(problem in p for p in fuzz.batch_problems(bad)), fuzz.batch_problems(bad)
    with pytest.raises(ValueError, match="invalid fuzz batch"):
        fuzz.Batch.from_json(bad.to_json())


def test_shrinker_keeps_new_dimensions_valid(big_run):
    featured = [
        b
        for b in big_run
        if (b.junk_table or b.table_slack == 0 or b.layer) and (b.shape.window or b.shape.sinks)
    ][:40]
    assert len(featured) == 40
    for b in featured:
        for c in fuzz.shrink_candidates(b):
            assert fuzz.is_valid(c), c.describe()
            assert c.shape == b.shape and c.window_left == b.window_left
            assert c.softcap == b.softcap
    # Always failing: the table and the layer go back to the plain ones; the shape's features
    # and their values stay (they are the kernel key's).
    b = featured[0]
    res = fuzz.shrink(b, lambda c: True, max_tries=100_000)
    m = res.batch
    assert res.stopped == "minimal" and len(m.requests) == 1
    assert (m.junk_table, m.table_slack, m.layer) == (False, fuzz.DEFAULT_TABLE_SLACK, 0)
    assert (m.shape, m.window_left, m.softcap) == (b.shape, b.window_left, b.softcap)
    # Failing only with junk entries: the shrinker keeps them.
    junk = next(b for b in featured if b.junk_table)
    res = fuzz.shrink(junk, lambda c: c.junk_table, max_tries=100_000)
    assert res.batch.junk_table and len(res.batch.requests) == 1


def test_long_contexts_within_limits(big_run):
    long = [b for b in big_run if max(k for _, k in b.requests) > fuzz.LONG_K_LEN]
    assert long
    for b in long:
        assert max(k for _, k in b.requests) <= fuzz.MAX_K_LEN
        assert not fuzz._limit_problems(b.shape, b.decodes + b.prefills, fuzz.LIMITS, b.level)


def test_fp8_caches_are_offered_to_the_filter_only():
    """An FP8 cache (issue 30) only where the caller's filter (the GPU harness: the kernel's
    switch) takes it, bf16 models only, in about 1 of FP8_KV_ONE_IN pool shapes; its block
    pads in 16-byte units of 1-byte elements; batches valid."""
    assert all(s.kv_dtype is None for s in fuzz.run_shapes(0, 3000))  # no filter: none
    pool = fuzz.shape_pool(0, 48, lambda s: True)
    fp8 = [s for s in pool if s.kv_dtype == fuzz.FP8_KV]
    assert fp8 and all(s.dtype == "bfloat16" for s in fp8)
    assert len(fp8) < len(pool) / 2
    run = fuzz.batches(0, 1200, lambda s: True)
    fp8_batches = [b for b in run if b.shape.kv_dtype == fuzz.FP8_KV]
    assert fp8_batches and all(fuzz.is_valid(b) for b in fp8_batches)
    pads = [b.shape.block_pad for b in fp8_batches if b.shape.block_pad]
    assert pads and all(pad % fuzz.BLOCK_PAD_ALIGN_BYTES == 0 for pad in pads)
    assert fuzz.shape_problems(replace(fp8[0], dtype="float16"))  # FP8 under fp16: refused
