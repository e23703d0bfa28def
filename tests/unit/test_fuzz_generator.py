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
        assert all(
            0 <= q <= k and k - q <= fuzz.MAX_PREFIX and q <= fuzz.MAX_Q_LEN for q, k in reqs
        )
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
    assert len(shapes) == fuzz.pool_size(COUNT) and fuzz.LLAMA_8B in shapes
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
    assert big[:12] == small and len(set(big)) == 30
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
