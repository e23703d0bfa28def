"""Random vLLM-shaped batches for the fuzz suite (``tests/gpu/test_fuzz.py``) and a shrinker.

Pure Python: no torch, no vLLM, no GPU, so the generator's invariants are unit-tested on the CPU
(``tests/unit/test_fuzz_generator.py``).

A ``Batch`` is what vLLM's scheduler hands one attention layer in one step, reordered the way
the FA4 builder asks for (``reorder_batch_threshold``): decode requests first (q_len 1, or up
to 1 + k with k speculative tokens), then prefill requests (the first one longer than that
threshold: that is where vLLM's ``split_decodes_and_prefills`` cuts), optionally followed by
CUDA-graph padding (rows after the last request; with ``pad_reqs``, zero-length padded
requests as well, the full-graph layout). Lengths are skewed the way serving skews them: many
short requests, some long ones, cached prefixes from none up to 64k tokens, 1 to 64 requests.

Two levels use the same batches:

- ``"prefill"``: ``plan_prefill`` + ``run_prefill`` on the prefill requests alone (q_len 0
  requests allowed anywhere among them); the decode requests' tokens are the rows before the
  call in q and out, which the call must leave alone, ``pad_rows`` the rows after it.
- ``"backend"``: vLLM's cache write, ``FA4MetadataBuilder.build`` and ``FA4AttentionImpl.forward``
  on the whole batch, decodes included.

Batch ``i`` of a run is a function of (base seed, count, the filter on shapes) alone; the
JSON form (``Batch.to_json``) is self-contained and replays one batch.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace

LEVELS = ("prefill", "backend")
DTYPES = ("bfloat16", "float16")
HEAD_DIMS = (64, 128, 256)
PAGE_SIZES = (16, 32, 64, 128)
KV_HEADS = (1, 2, 4, 8)
GQA_GROUPS = (1, 2, 3, 4, 5, 6, 7, 8, 16)  # query heads per KV head
SPEC_TOKENS = (1, 2, 3, 4, 7)  # num_speculative_tokens when a batch uses spec decode

MAX_REQS = 64
MAX_PREFIX = 65536  # cached tokens before a request's new ones
MAX_Q_LEN = 8192
MAX_PAD_ROWS = 256
MAX_PAD_REQS = 4


@dataclass(frozen=True)
class Limits:
    """Per-batch caps that bound memory and time (one H100 runs the default count in ~2-3 min).

    ``max_work`` caps sum(q_len * k_len) * Hq * D, the multiply-adds of one of Q·K^T and P·V
    without the causal halving: it bounds the fp32 reference, the dominant cost.
    """

    max_q_tokens: int = 16384
    max_backend_q_tokens: int = 8192  # a vLLM step: max_num_batched_tokens' usual default
    max_kv_tokens: int = 131072  # sum of k_len
    max_kv_bytes: int = 1 << 30  # K and V of every request's keys, in the batch's dtype
    max_work: int = 1 << 40


LIMITS = Limits()


@dataclass(frozen=True)
class Shape:
    """What the model fixes: one compiled kernel key per (dtype, head dim, page size, group)."""

    dtype: str
    head_dim: int
    num_q_heads: int
    num_kv_heads: int
    page_size: int

    @property
    def qhead_per_kvhead(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    def __str__(self) -> str:
        return (
            f"{self.dtype} hd{self.head_dim} {self.num_q_heads}/{self.num_kv_heads} heads "
            f"page {self.page_size}"
        )


LLAMA_8B = Shape("bfloat16", 128, 32, 8, 16)


@dataclass(frozen=True)
class Batch:
    level: str  # "prefill" | "backend"
    shape: Shape
    seed: int  # tensor contents (testing.cases.make_paged_case)
    decodes: tuple[tuple[int, int], ...]  # (q_len, k_len), first in the batch
    prefills: tuple[tuple[int, int], ...]  # (q_len, k_len), after the decodes
    spec_tokens: int = 0  # speculative tokens: decode threshold 1 + spec_tokens
    pad_rows: int = 0  # rows after the last request's tokens (CUDA-graph padding)
    pad_reqs: int = 0  # backend: trailing (0, 0) requests; the padded rows count as actual
    with_lse: bool = False  # prefill: run_prefill also writes lse
    index: int = field(default=-1, compare=False)  # position in its run (reports only)

    @property
    def decode_threshold(self) -> int:
        return 1 + self.spec_tokens

    @property
    def requests(self) -> tuple[tuple[int, int], ...]:
        """Every request in batch order: decodes, prefills, then zero-length padding."""
        return self.decodes + self.prefills + ((0, 0),) * self.pad_reqs

    @property
    def num_decode_tokens(self) -> int:
        return sum(q for q, _ in self.decodes)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(q for q, _ in self.prefills)

    @property
    def num_tokens(self) -> int:
        return self.num_decode_tokens + self.num_prefill_tokens

    def size(self) -> int:
        """A non-negative integer every shrink step strictly decreases."""
        reqs = self.decodes + self.prefills
        return (
            len(reqs)
            + sum(q for q, _ in reqs)
            + sum(k - q for q, k in reqs)
            + self.spec_tokens
            + self.pad_rows
            + self.pad_reqs
            + int(self.with_lse)
        )

    def describe(self) -> str:
        def fmt(reqs):
            return "[" + ", ".join(f"({q}, {k})" for q, k in reqs) + "]"

        extras = []
        if self.spec_tokens:
            extras.append(f"spec_tokens={self.spec_tokens}")
        if self.pad_rows:
            extras.append(f"pad_rows={self.pad_rows}")
        if self.pad_reqs:
            extras.append(f"pad_reqs={self.pad_reqs}")
        if self.with_lse:
            extras.append("lse")
        return (
            f"{self.level} batch, {self.shape}, {len(self.decodes)} decodes "
            f"{fmt(self.decodes)}, {len(self.prefills)} prefills {fmt(self.prefills)}"
            + (", " + ", ".join(extras) if extras else "")
            + f", data seed {self.seed}"
        )

    def to_json(self) -> str:
        d = asdict(self)
        d.pop("index")
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Batch:
        d = json.loads(text)
        d["shape"] = Shape(**d["shape"])
        d["decodes"] = tuple(tuple(r) for r in d["decodes"])
        d["prefills"] = tuple(tuple(r) for r in d["prefills"])
        batch = cls(**d)
        validate(batch)
        return batch


# ---------------------------------------------------------------------------------------------
# validity


def batch_problems(batch: Batch, limits: Limits = LIMITS) -> list[str]:
    """Every way ``batch`` breaks the generator's invariants (empty: valid)."""
    p = []
    b, s = batch, batch.shape
    if b.level not in LEVELS:
        p.append(f"level {b.level!r}")
    if s.dtype not in DTYPES or s.head_dim not in HEAD_DIMS or s.page_size not in PAGE_SIZES:
        p.append(f"shape {s}")
    if s.num_kv_heads < 1 or s.num_q_heads < 1 or s.num_q_heads % s.num_kv_heads:
        p.append(f"heads {s.num_q_heads}/{s.num_kv_heads}")
    reqs = b.decodes + b.prefills
    if not 1 <= len(reqs) <= MAX_REQS:
        p.append(f"{len(reqs)} requests (1..{MAX_REQS})")
    for q, k in reqs:
        if not (0 <= q <= MAX_Q_LEN and q <= k and k - q <= MAX_PREFIX):
            p.append(f"request ({q}, {k}) out of bounds")
    if not 0 <= b.pad_rows <= MAX_PAD_ROWS or not 0 <= b.pad_reqs <= MAX_PAD_REQS:
        p.append(f"padding {b.pad_rows} rows, {b.pad_reqs} requests")
    if b.spec_tokens < 0:
        p.append(f"spec_tokens {b.spec_tokens}")
    if b.level == "backend":
        t = b.decode_threshold
        if any(not 1 <= q <= t for q, _ in b.decodes):
            p.append(f"a decode outside q_len 1..{t}")
        if b.prefills and b.prefills[0][0] <= t:
            p.append(f"first prefill q_len {b.prefills[0][0]} <= decode threshold {t}")
        if any(q < 1 for q, _ in b.prefills):
            p.append("zero-length prefill (only trailing pad_reqs may be empty)")
        if b.with_lse:
            p.append("with_lse at backend level")
    else:
        if any(q != 1 for q, _ in b.decodes) or b.spec_tokens or b.pad_reqs:
            p.append("prefill level: decodes are q_len 1 guard rows, no spec tokens or pad_reqs")
    p.extend(_limit_problems(b.shape, reqs, limits, b.level))
    return p


def _limit_problems(
    shape: Shape, reqs: Sequence[tuple[int, int]], limits: Limits, level: str
) -> list[str]:
    q_tokens, kv_tokens, work = _totals(shape, reqs)
    kv_bytes = kv_tokens * _kv_bytes_per_token(shape)
    max_q = limits.max_backend_q_tokens if level == "backend" else limits.max_q_tokens
    p = []
    if q_tokens > max_q:
        p.append(f"{q_tokens} query tokens > {max_q}")
    if kv_tokens > limits.max_kv_tokens:
        p.append(f"{kv_tokens} keys > {limits.max_kv_tokens}")
    if kv_bytes > limits.max_kv_bytes:
        p.append(f"{kv_bytes} KV bytes > {limits.max_kv_bytes}")
    if work > limits.max_work:
        p.append(f"work {work} > {limits.max_work}")
    return p


def validate(batch: Batch, limits: Limits = LIMITS) -> None:
    problems = batch_problems(batch, limits)
    if problems:
        raise ValueError(f"invalid fuzz batch ({'; '.join(problems)}): {batch.describe()}")


def is_valid(batch: Batch, limits: Limits = LIMITS) -> bool:
    return not batch_problems(batch, limits)


def _kv_bytes_per_token(shape: Shape) -> int:
    return 2 * shape.num_kv_heads * shape.head_dim * 2  # K and V, 16-bit


def _totals(shape: Shape, reqs: Sequence[tuple[int, int]]) -> tuple[int, int, int]:
    q_tokens = sum(q for q, _ in reqs)
    kv_tokens = sum(k for _, k in reqs)
    work = sum(q * k for q, k in reqs) * shape.num_q_heads * shape.head_dim
    return q_tokens, kv_tokens, work


# ---------------------------------------------------------------------------------------------
# generation


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    """An integer in [lo, hi], log-uniformly (lo >= 1): short values are as likely per octave
    as long ones."""
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def _snap(rng: random.Random, n: int, lo: int) -> int:
    """Sometimes move ``n`` next to a tile or page boundary (the off-by-one places)."""
    if n < 16 or rng.random() >= 0.2:
        return n
    m = rng.choice((16, 32, 64, 128, 256))
    return max(lo, (n // m) * m + rng.choice((-1, 0, 0, 1)))


def _prefill_q_len(rng: random.Random) -> int:
    u = rng.random()
    if u < 0.25:
        lo, hi = 1, 16
    elif u < 0.55:
        lo, hi = 17, 256
    elif u < 0.85:
        lo, hi = 257, 2048
    else:
        lo, hi = 2049, MAX_Q_LEN
    return _snap(rng, _log_uniform(rng, lo, hi), 1)


def _prefix(rng: random.Random, page_size: int, p_none: float) -> int:
    u = rng.random()
    if u < p_none:
        return 0
    if u < p_none + 0.15:  # a prefix-cache hit: whole pages
        return page_size * _log_uniform(rng, 1, MAX_PREFIX // page_size)
    return _snap(rng, _log_uniform(rng, 1, MAX_PREFIX), 0)


def _fit(shape, reqs, q, prefix, limits, level, min_q) -> tuple[int, int] | None:
    """(q, prefix) cut down until the batch with it stays within ``limits``; None if even
    (min_q, 0) does not fit."""
    while True:
        if not _limit_problems(shape, [*reqs, (q, q + prefix)], limits, level):
            return q, prefix
        if prefix > 0:
            prefix //= 2
        elif q > min_q:
            q = max(min_q, q // 2)
        else:
            return None


def shape_of(rng: random.Random, j: int | None = None) -> Shape:
    """A random shape; with ``j`` (the pool position) dtype, head dim and page size are
    stratified, so any 12 consecutive positions hold every head dim and page size and both
    dtypes, whatever the seed."""
    hkv = rng.choice(KV_HEADS)
    qpk = rng.choice(GQA_GROUPS)
    if j is None:
        dtype = "bfloat16" if rng.random() < 0.7 else "float16"
        u = rng.random()
        head_dim = 128 if u < 0.5 else (64 if u < 0.75 else 256)
        page = 16 if rng.random() < 0.4 else rng.choice(PAGE_SIZES[1:])
    else:
        dtype = DTYPES[1] if (j + j // 3) % 3 == 1 else DTYPES[0]  # a third, every head dim
        head_dim = HEAD_DIMS[j % len(HEAD_DIMS)]
        page = PAGE_SIZES[(j // len(HEAD_DIMS)) % len(PAGE_SIZES)]
    return Shape(dtype, head_dim, hkv * qpk, hkv, page)


def pool_size(count: int) -> int:
    """Distinct shapes (so compiled kernels, ~2-3 s each) a run of ``count`` batches uses."""
    return max(1, min(48, max(12, count // 25)))


def shape_pool(seed: int, n: int, accept: Callable[[Shape], bool] | None = None) -> list[Shape]:
    """``n`` distinct shapes, Llama-3.1-8B's first; with ``accept``, only shapes it accepts.
    Prefix-stable: the first m shapes of a pool of n > m are the pool of m."""
    rng = random.Random(f"fa4-fuzz-shapes:{seed}")
    pool: list[Shape] = []
    for j in range(200 * n):
        if len(pool) >= n:
            break
        shape = LLAMA_8B if j == 0 else shape_of(rng, j if j < 100 * n else None)
        if shape not in pool and (accept is None or accept(shape)):
            pool.append(shape)
    if not pool:
        raise ValueError("no fuzz shape passes the filter")
    return pool


def generate(
    seed: int, level: str, shape: Shape, limits: Limits = LIMITS, index: int = -1
) -> Batch:
    """One random batch at ``level`` for ``shape`` (deterministic in its arguments)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    rng = random.Random(f"fa4-fuzz-batch:{seed}:{level}")
    backend = level == "backend"
    num_reqs = min(MAX_REQS, int(2 ** rng.uniform(0, math.log2(MAX_REQS) + 1)))
    spec = rng.choice(SPEC_TOKENS) if backend and rng.random() < 0.35 else 0
    threshold = 1 + spec
    u = rng.random()
    if u < 0.3:
        num_decodes = 0
    elif backend and u < 0.36:
        num_decodes = num_reqs  # decode-only step: FA3 takes it whole
    else:
        num_decodes = rng.randint(0, num_reqs - 1)

    reqs: list[tuple[int, int]] = []
    for _ in range(num_decodes):
        q = rng.randint(1, threshold) if backend else 1
        fit = _fit(shape, reqs, q, _prefix(rng, shape.page_size, 0.05), limits, level, q)
        if fit is None:
            break
        reqs.append((fit[0], fit[0] + fit[1]))
    decodes = tuple(reqs)

    prefills: list[tuple[int, int]] = []
    for j in range(num_reqs - len(decodes)):
        if backend:
            min_q = threshold + 1 if j == 0 else 1
            q = max(min_q, _prefill_q_len(rng))
        else:
            q = 0 if rng.random() < 0.05 else _prefill_q_len(rng)
            min_q = min(q, 1)  # a drawn q_len 0 stays; others are not cut to 0
        fit = _fit(
            shape,
            [*decodes, *prefills],
            q,
            _prefix(rng, shape.page_size, 0.4),
            limits,
            level,
            min_q,
        )
        if fit is None:
            break
        prefills.append((fit[0], fit[0] + fit[1]))
    if not decodes and not prefills:  # nothing fitted (cannot happen with sane limits)
        prefills.append((threshold + 1 if backend else 1, threshold + 1 if backend else 1))

    pad_rows = 0
    if rng.random() < 0.35:  # pad to a captured size, or a few rows
        tokens = sum(q for q, _ in decodes) + sum(q for q, _ in prefills)
        m = rng.choice((8, 16, 64, 256))
        pad_rows = min(MAX_PAD_ROWS, -tokens % m or rng.randint(1, 7))
    pad_reqs = rng.randint(1, MAX_PAD_REQS) if backend and rng.random() < 0.1 else 0
    batch = Batch(
        level=level,
        shape=shape,
        seed=seed,
        decodes=decodes,
        prefills=tuple(prefills),
        spec_tokens=spec,
        pad_rows=pad_rows,
        pad_reqs=pad_reqs,
        with_lse=(not backend) and rng.random() < 0.5,
        index=index,
    )
    validate(batch, limits)
    return batch


def batch_seed(base_seed: int, index: int) -> int:
    return base_seed * 1_000_003 + index


def level_of(index: int) -> str:
    """Two prefill-level batches, then one backend-level batch (the costlier level)."""
    return "backend" if index % 3 == 2 else "prefill"


def batches(
    base_seed: int,
    count: int,
    accept: Callable[[Shape], bool] | None = None,
    limits: Limits = LIMITS,
) -> list[Batch]:
    """The run's ``count`` batches (see ``level_of``), shapes drawn from ``shape_pool``."""
    pool = shape_pool(base_seed, pool_size(count), accept)
    out = []
    for i in range(count):
        s = batch_seed(base_seed, i)
        shape = pool[random.Random(f"fa4-fuzz-pick:{s}").randrange(len(pool))]
        out.append(generate(s, level_of(i), shape, limits, index=i))
    return out


# ---------------------------------------------------------------------------------------------
# shrinking


def _with_q(batch: Batch, where: str, i: int, q: int) -> Batch:
    reqs = list(getattr(batch, where))
    old_q, old_k = reqs[i]
    reqs[i] = (q, old_k - old_q + q)  # same cached prefix
    return replace(batch, **{where: tuple(reqs)})


def _with_prefix(batch: Batch, where: str, i: int, prefix: int) -> Batch:
    reqs = list(getattr(batch, where))
    q, _ = reqs[i]
    reqs[i] = (q, q + prefix)
    return replace(batch, **{where: tuple(reqs)})


def _drops(reqs: tuple) -> Iterator[tuple]:
    """``reqs`` without a run of requests: halves first, then quarters, ... single ones
    (ddmin order: the biggest cuts are tried first)."""
    n = len(reqs)
    size = max(n // 2, 1)
    while True:
        for start in reversed(range(0, n, size)):
            yield reqs[:start] + reqs[start + size :]
        if size == 1:
            return
        size //= 2


def _raw_candidates(b: Batch) -> Iterator[Batch]:
    # Whole requests first (largest steps).
    for prefills in _drops(b.prefills):
        yield replace(b, prefills=prefills)
    for decodes in _drops(b.decodes):
        yield replace(b, decodes=decodes)
    if b.pad_reqs:
        yield replace(b, pad_reqs=0)
    if b.pad_rows:
        yield replace(b, pad_rows=0)
    if b.with_lse:
        yield replace(b, with_lse=False)
    if b.spec_tokens:  # decodes must stay within the lower threshold
        t = b.spec_tokens // 2 + 1
        yield replace(
            b,
            spec_tokens=b.spec_tokens // 2,
            decodes=tuple((min(q, t), k - q + min(q, t)) for q, k in b.decodes),
        )
    for where in ("prefills", "decodes"):
        reqs = getattr(b, where)
        for i, (q, k) in enumerate(reqs):
            if k - q:
                yield _with_prefix(b, where, i, (k - q) // 2)
        for i, (q, _) in enumerate(reqs):
            if q > 1:
                floor = (
                    b.decode_threshold + 1
                    if (b.level == "backend" and where == "prefills" and i == 0)
                    else 1
                )
                if q // 2 >= floor:
                    yield _with_q(b, where, i, q // 2)
                elif q - 1 >= floor:
                    yield _with_q(b, where, i, q - 1)


def shrink_candidates(batch: Batch, limits: Limits = LIMITS) -> Iterator[Batch]:
    """Valid batches strictly smaller than ``batch`` (``Batch.size``), biggest cuts first."""
    size = batch.size()
    seen = set()
    for c in _raw_candidates(batch):
        key = c.to_json()
        if key in seen or c.size() >= size or not is_valid(c, limits):
            continue
        seen.add(key)
        yield replace(c, index=batch.index)


@dataclass
class ShrinkResult:
    batch: Batch
    tries: int  # predicate calls
    steps: int  # accepted shrinks
    stopped: str  # "minimal" | "max_tries" | "deadline"


def shrink(
    batch: Batch,
    fails: Callable[[Batch], bool],
    *,
    max_tries: int = 100,
    deadline_s: float | None = None,
    limits: Limits = LIMITS,
) -> ShrinkResult:
    """Greedy shrink: take the first smaller candidate that still ``fails``, repeat.

    Terminates: every accepted step strictly decreases ``Batch.size`` (a non-negative
    integer), and ``max_tries`` / ``deadline_s`` bound the predicate calls.
    """
    start = time.monotonic()
    tries = steps = 0
    current = batch
    while True:
        for cand in shrink_candidates(current, limits):
            if tries >= max_tries:
                return ShrinkResult(current, tries, steps, "max_tries")
            if deadline_s is not None and time.monotonic() - start > deadline_s:
                return ShrinkResult(current, tries, steps, "deadline")
            tries += 1
            if fails(cand):
                current = cand
                steps += 1
                break
        else:
            return ShrinkResult(current, tries, steps, "minimal")
