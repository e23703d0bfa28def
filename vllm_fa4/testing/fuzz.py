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
# An FP8 e4m3 cache (issue 30; KernelKey.kv_dtype's spelling): bf16 models only (FA3's FP8
# decode writes bf16), offered to the caller's shape filter in 1 of FP8_KV_ONE_IN pool shapes.
FP8_KV = "float8_e4m3fn"
FP8_KV_ONE_IN = 4
HEAD_DIMS = (64, 128, 256)
PAGE_SIZES = (16, 32, 64, 128)
KV_HEADS = (1, 2, 4, 8, 16)  # the common counts; any of 1..MAX_KV_HEADS is drawn too
# Query heads per KV head: up to the kernel's M tile (128 rows at two warpgroups, where
# KernelKey.unsupported_reason stops).
GQA_GROUPS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 64, 128)
SPEC_TOKENS = (1, 2, 3, 4, 7)  # num_speculative_tokens when a batch uses spec decode
MAX_KV_HEADS = 16
MAX_Q_HEADS = 256  # bounds q/out memory (models have up to 128 query heads per rank)
# vLLM's FA3 takes sinks (s_aux) for at most 64 query heads ("We only support query heads <=
# 64 with S aux"), and FA4's decode rows are FA3's: no deployment has more with sinks.
MAX_SINK_Q_HEADS = 64

MAX_REQS = 64
MAX_PREFIX = 65536  # cached tokens before a request's new ones (the common draw)
MAX_K_LEN = 131072  # a request's keys; LONG_K_LEN and beyond only in long-context batches
LONG_K_LEN = 73728  # 72k: above the common draw's largest (MAX_PREFIX + MAX_Q_LEN)
MAX_Q_LEN = 8192
MAX_PAD_ROWS = 256
MAX_PAD_REQS = 4

# Cache layouts: block stride = layers * page_size * token stride + block_pad elements. The
# kernel (and FA3) need 16-byte aligned strides; vLLM pads that break it are refused at
# startup (issue 27), so the fuzz draws only 16-byte multiples.
MAX_LAYERS = 8  # testing.cases.MAX_LAYERS
BLOCK_PAD_ALIGN_BYTES = 16
DEFAULT_TABLE_SLACK = 3  # testing.cases.TABLE_SLACK: the block table's spare columns
MAX_TABLE_SLACK = 8
MAX_WINDOW_LEFT = MAX_K_LEN
VARIANTS = 3  # shapes per kernel key in a run's pool


@dataclass(frozen=True)
class Limits:
    """Per-batch caps that bound memory and time (one H100 runs the default count in ~2-3 min).

    ``max_work`` caps sum(q_len * k_len) * Hq * D, the multiply-adds of one of Q·K^T and P·V
    without the causal halving: it bounds the fp32 reference, the dominant cost.
    """

    max_q_tokens: int = 16384
    max_backend_q_tokens: int = 8192  # a vLLM step: max_num_batched_tokens' usual default
    max_kv_tokens: int = 262144  # sum of k_len
    # The cache blocks of every request's keys, in the cache dtype, with the layout's pad and
    # other layers (what the harness allocates and copies, ~1.5x with the spare blocks)
    max_kv_bytes: int = 1 << 30
    max_out_bytes: int = 2 << 30  # the fp32 reference output: q tokens * Hq * D * 4
    max_work: int = 1 << 40


LIMITS = Limits()


@dataclass(frozen=True)
class Shape:
    """What the model and the deployment fix: one compiled kernel key per (dtype, head dim,
    page size, group, features); head counts and the layout are runtime values."""

    dtype: str
    head_dim: int
    num_q_heads: int
    num_kv_heads: int
    page_size: int
    # Model features the layer has (their values are the batch's: Batch.window_left,
    # Batch.softcap; sink logits come from the data seed).
    window: bool = False
    softcap: bool = False
    sinks: bool = False
    kv_dtype: str | None = None  # the KV cache's dtype: None (the model's) or FP8_KV
    block_pad: int = 0  # elements after each block's pages (vLLM's page_size_padded)
    layers: int = 1  # pages per block: > 1 is a cross-layer layout

    @property
    def qhead_per_kvhead(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @property
    def cache_dtype(self) -> str:
        return self.kv_dtype or self.dtype

    @property
    def layout(self) -> str:
        if self.layers > 1:
            return "cross-layer"
        return "padded" if self.block_pad else "contiguous"

    @property
    def page_elems(self) -> int:
        """Elements of one layer's page: page_size token strides of Hkv * 2 * D."""
        return self.page_size * self.num_kv_heads * 2 * self.head_dim

    @property
    def key_fields(self) -> tuple:
        """What the compiled kernel depends on (shapes equal here share kernels)."""
        return (
            self.dtype,
            self.head_dim,
            self.page_size,
            self.qhead_per_kvhead,
            self.window,
            self.softcap,
            self.sinks,
            self.kv_dtype,
        )

    def __str__(self) -> str:
        features = [name for name in ("window", "softcap", "sinks") if getattr(self, name)]
        text = (
            f"{self.dtype} hd{self.head_dim} {self.num_q_heads}/{self.num_kv_heads} heads "
            f"page {self.page_size}"
        )
        if features:
            text += " " + "+".join(features)
        if self.kv_dtype:
            text += f" kv {self.kv_dtype}"
        if self.block_pad:
            text += f" block pad {self.block_pad}"
        if self.layers > 1:
            text += f" {self.layers} layers"
        return text


LLAMA_8B = Shape("bfloat16", 128, 32, 8, 16)
# gpt-oss-20b's windowed layers (128-key window: window_left 127) and Gemma-2-9B's (4k window,
# cap 50): the shapes their values come from (windows and caps are drawn per batch).
GPT_OSS = Shape("bfloat16", 64, 64, 8, 16, window=True, sinks=True)
GEMMA2 = Shape("bfloat16", 256, 16, 8, 16, window=True, softcap=True)
NAMED_SHAPES = (LLAMA_8B, GPT_OSS, GEMMA2)  # the first pool positions of every run
# The models' own values, drawn for their kernel keys in 3 of 5 batches (the model-exact cases).
MODEL_VALUES = {
    GPT_OSS.key_fields: dict(window_left=127),
    GEMMA2.key_fields: dict(window_left=4095, softcap=50.0),
}


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
    window_left: int | None = None  # shape.window: keys a row sees left of its diagonal
    softcap: float | None = None  # shape.softcap: the logit cap
    layer: int = 0  # cross-layer layout: the layer whose page of each block is the cache
    table_slack: int = DEFAULT_TABLE_SLACK  # block-table columns beyond the longest request
    junk_table: bool = False  # unused table entries: NaN blocks and ids past the cache
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
            + int(self.layer != 0)
            + int(self.table_slack != DEFAULT_TABLE_SLACK)
            + int(self.junk_table)
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
        if self.window_left is not None:
            extras.append(f"window_left={self.window_left}")
        if self.softcap is not None:
            extras.append(f"softcap={self.softcap}")
        if self.shape.layers > 1:
            extras.append(f"layer {self.layer}")
        if self.table_slack != DEFAULT_TABLE_SLACK:
            extras.append(f"table_slack={self.table_slack}")
        if self.junk_table:
            extras.append("junk table entries")
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
        """A batch from ``to_json``; JSON written before a field existed loads with the
        field's default (the batch it described)."""
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
    p.extend(shape_problems(s))
    if s.window != (b.window_left is not None) or (
        b.window_left is not None
        and (not isinstance(b.window_left, int) or not 0 <= b.window_left <= MAX_WINDOW_LEFT)
    ):
        p.append(f"window_left {b.window_left!r} with shape.window={s.window}")
    if s.softcap != (b.softcap is not None) or (b.softcap is not None and not b.softcap > 0):
        p.append(f"softcap {b.softcap!r} with shape.softcap={s.softcap}")
    if not 0 <= b.layer < s.layers:
        p.append(f"layer {b.layer} of {s.layers}")
    if not 0 <= b.table_slack <= MAX_TABLE_SLACK:
        p.append(f"table_slack {b.table_slack} (0..{MAX_TABLE_SLACK})")
    reqs = b.decodes + b.prefills
    if not 1 <= len(reqs) <= MAX_REQS:
        p.append(f"{len(reqs)} requests (1..{MAX_REQS})")
    for q, k in reqs:
        if not (0 <= q <= MAX_Q_LEN and q <= k <= MAX_K_LEN):
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


def shape_problems(s: Shape) -> list[str]:
    """Every way ``s`` breaks the generator's invariants (empty: valid)."""
    p = []
    if s.dtype not in DTYPES or s.head_dim not in HEAD_DIMS or s.page_size not in PAGE_SIZES:
        p.append(f"shape {s}")
    if (
        not 1 <= s.num_kv_heads <= MAX_KV_HEADS
        or not 1 <= s.num_q_heads <= MAX_Q_HEADS
        or s.num_q_heads % s.num_kv_heads
        or s.qhead_per_kvhead > max(GQA_GROUPS)
    ):
        p.append(f"heads {s.num_q_heads}/{s.num_kv_heads}")
    if s.sinks and s.num_q_heads > MAX_SINK_Q_HEADS:
        p.append(f"sinks with {s.num_q_heads} query heads (FA3: <= {MAX_SINK_Q_HEADS})")
    if s.kv_dtype is not None and (s.kv_dtype != FP8_KV or s.dtype != "bfloat16"):
        # Other KV dtypes, and FP8 under an fp16 model, are refused at startup (issue 30).
        p.append(f"kv_dtype {s.kv_dtype} with a {s.dtype} model")
    if not 1 <= s.layers <= MAX_LAYERS:
        p.append(f"{s.layers} layers (1..{MAX_LAYERS})")
    pad_bytes = s.block_pad * _elem_bytes(s)
    if not 0 <= s.block_pad <= s.page_elems or pad_bytes % BLOCK_PAD_ALIGN_BYTES:
        p.append(
            f"block pad {s.block_pad} elements ({pad_bytes} bytes: 0 to one page, "
            f"a multiple of {BLOCK_PAD_ALIGN_BYTES} bytes)"
        )
    return p


def _limit_problems(
    shape: Shape, reqs: Sequence[tuple[int, int]], limits: Limits, level: str
) -> list[str]:
    q_tokens, kv_tokens, work = _totals(shape, reqs)
    kv_bytes = kv_tokens * _kv_bytes_per_token(shape)
    out_bytes = q_tokens * shape.num_q_heads * shape.head_dim * 4
    max_q = limits.max_backend_q_tokens if level == "backend" else limits.max_q_tokens
    p = []
    if q_tokens > max_q:
        p.append(f"{q_tokens} query tokens > {max_q}")
    if kv_tokens > limits.max_kv_tokens:
        p.append(f"{kv_tokens} keys > {limits.max_kv_tokens}")
    if kv_bytes > limits.max_kv_bytes:
        p.append(f"{kv_bytes} KV bytes > {limits.max_kv_bytes}")
    if out_bytes > limits.max_out_bytes:
        p.append(f"{out_bytes} output bytes > {limits.max_out_bytes}")
    if work > limits.max_work:
        p.append(f"work {work} > {limits.max_work}")
    return p


def validate(batch: Batch, limits: Limits = LIMITS) -> None:
    problems = batch_problems(batch, limits)
    if problems:
        raise ValueError(f"invalid fuzz batch ({'; '.join(problems)}): {batch.describe()}")


def is_valid(batch: Batch, limits: Limits = LIMITS) -> bool:
    return not batch_problems(batch, limits)


def _elem_bytes(shape: Shape) -> int:
    """Bytes of one cache element: bf16 / fp16, or 1 for an FP8 cache."""
    return 1 if shape.kv_dtype == FP8_KV else 2


def _kv_bytes_per_token(shape: Shape) -> float:
    """Cache bytes allocated per key: K and V, times the layers sharing a block, plus the
    block's pad spread over its page."""
    block_elems = shape.layers * shape.page_elems + shape.block_pad
    return block_elems * _elem_bytes(shape) / shape.page_size


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


def _fit(shape, reqs, q, prefix, limits, level, min_q, q_first=False) -> tuple[int, int] | None:
    """(q, prefix) cut down until the batch with it stays within ``limits``; None if even
    (min_q, 0) does not fit. The prefix is halved first, or with ``q_first`` (a long-context
    request, whose point is its keys) the query length."""
    while True:
        if not _limit_problems(shape, [*reqs, (q, q + prefix)], limits, level):
            return q, prefix
        if q_first and q > min_q:
            q = max(min_q, q // 2)
        elif prefix > 0:
            prefix //= 2
        elif q > min_q:
            q = max(min_q, q // 2)
        else:
            return None


def _kv_heads(rng: random.Random) -> int:
    return rng.choice(KV_HEADS) if rng.random() < 0.75 else rng.randint(1, MAX_KV_HEADS)


def _heads_cap(sinks: bool) -> int:
    return MAX_SINK_Q_HEADS if sinks else MAX_Q_HEADS


# Pool positions (mod 12) whose GQA group is fixed: every 12 keys hold groups 16, 32, 64, 128.
BIG_GROUPS_AT = {3: 16, 5: 128, 7: 32, 11: 64}


def shape_of(rng: random.Random, j: int | None = None) -> Shape:
    """A random shape (contiguous layout); with ``j`` (the pool position) dtype, head dim and
    page size are stratified, so any 12 consecutive positions hold every head dim and page
    size and both dtypes, whatever the seed, and four of them the large GQA groups
    (BIG_GROUPS_AT). Each feature is drawn independently: window 1 in 4, soft cap 1 in 7,
    sinks 1 in 5 (with at most MAX_SINK_Q_HEADS query heads)."""
    hkv = _kv_heads(rng)
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
    window = rng.random() < 0.25
    softcap = rng.random() < 1 / 7
    sinks = rng.random() < 0.2
    if j is not None and j % 12 in BIG_GROUPS_AT:
        qpk = BIG_GROUPS_AT[j % 12]
        sinks = sinks and qpk <= MAX_SINK_Q_HEADS
    if qpk > _heads_cap(sinks):
        qpk = rng.choice([g for g in GQA_GROUPS if g <= _heads_cap(sinks)])
    hkv = min(hkv, _heads_cap(sinks) // qpk)
    return Shape(dtype, head_dim, hkv * qpk, hkv, page, window=window, softcap=softcap, sinks=sinks)


def _block_pad(rng: random.Random, shape: Shape) -> int:
    """A pad (elements) of whole 16-byte units: mostly 16-256 bytes (what issue 27 tried, none
    a whole token stride), some whole token strides (16 at page 16: the block stride stays a
    whole number of wide_box boxes), some up to a second page (a Mamba state's page)."""
    unit = BLOCK_PAD_ALIGN_BYTES // _elem_bytes(shape)
    token = shape.num_kv_heads * 2 * shape.head_dim
    u = rng.random()
    if u < 0.6:
        pad = unit * _log_uniform(rng, 1, 16)
    elif u < 0.75:
        pad = token * rng.choice((1, 3, 16))
    else:
        pad = unit * _log_uniform(rng, 17, shape.page_elems // unit)
    return min(pad, shape.page_elems)


def shape_variants(seed: int, base: Shape, j: int) -> list[Shape]:
    """``base`` and VARIANTS - 1 shapes with its kernel key (other KV-head counts, as other
    tensor-parallel splits give): the second padded, the third cross-layer (3 in 5) or
    contiguous."""
    rng = random.Random(f"fa4-fuzz-variants:{seed}:{j}")
    group = base.qhead_per_kvhead
    out = [base]
    for v in range(1, VARIANTS):
        hkv = min(_kv_heads(rng), _heads_cap(base.sinks) // group)
        shape = replace(base, num_q_heads=hkv * group, num_kv_heads=hkv)
        if v == 1:
            shape = replace(shape, block_pad=_block_pad(rng, shape))
        elif rng.random() < 0.6:
            shape = replace(shape, layers=rng.randint(2, MAX_LAYERS))
        out.append(shape)
    return out


def pool_size(count: int) -> int:
    """Distinct kernel keys (compiled kernels, ~3-10 s per key and config) a run of ``count``
    batches uses; each comes in up to VARIANTS shapes (``run_shapes``)."""
    return max(1, min(48, max(12, count // 25)))


def shape_pool(seed: int, n: int, accept: Callable[[Shape], bool] | None = None) -> list[Shape]:
    """``n`` shapes of distinct kernel keys, NAMED_SHAPES first (Llama-3.1-8B, gpt-oss,
    Gemma 2); with ``accept``, only shapes it accepts. Prefix-stable: the first m shapes of a
    pool of n > m are the pool of m.

    An FP8 cache is offered to ``accept`` for 1 in FP8_KV_ONE_IN bf16 shapes (its own random
    stream: the shapes drawn do not move), the model's cache where it declines; without
    ``accept``, never (whether the kernel reads FP8 is the caller's question: torch-free here,
    ``route.kernel_reads_fp8`` there)."""
    rng = random.Random(f"fa4-fuzz-shapes:{seed}")
    pool: list[Shape] = []
    keys = set()
    for j in range(200 * n):
        if len(pool) >= n:
            break
        shape = (
            NAMED_SHAPES[j] if j < len(NAMED_SHAPES) else shape_of(rng, j if j < 100 * n else None)
        )
        for candidate in _with_kv_dtypes(seed, j, shape, accept):
            if candidate.key_fields not in keys and (accept is None or accept(candidate)):
                pool.append(candidate)
                keys.add(candidate.key_fields)
                break
    if not pool:
        raise ValueError("no fuzz shape passes the filter")
    return pool


def _with_kv_dtypes(
    seed: int, j: int, shape: Shape, accept: Callable[[Shape], bool] | None
) -> list[Shape]:
    """Pool position ``j``'s candidates, in order: the FP8-cache shape where drawn, then
    ``shape``."""
    fp8 = (
        accept is not None
        and shape.dtype == "bfloat16"
        and random.Random(f"fa4-fuzz-kv:{seed}:{j}").randrange(FP8_KV_ONE_IN) == 0
    )
    return [replace(shape, kv_dtype=FP8_KV), shape] if fp8 else [shape]


def run_shapes(seed: int, count: int, accept: Callable[[Shape], bool] | None = None) -> list[Shape]:
    """The shapes a run of ``count`` batches draws from: ``shape_variants`` of each of the
    ``pool_size(count)`` keys of ``shape_pool`` (those ``accept`` takes), distinct."""
    shapes: list[Shape] = []
    for j, base in enumerate(shape_pool(seed, pool_size(count), accept)):
        for shape in shape_variants(seed, base, j):
            if shape not in shapes and (accept is None or accept(shape)):
                shapes.append(shape)
    return shapes


def _window_left(rng: random.Random) -> int:
    """gpt-oss's 127 and Gemma's 4095 (a third of draws), 0 (the diagonal alone), values next
    to tile edges, small and large ones (up to the longest context)."""
    u = rng.random()
    if u < 0.2:
        return 127
    if u < 0.35:
        return 4095
    if u < 0.45:
        return 0
    if u < 0.6:
        return max(0, rng.choice((63, 64, 128, 255, 256, 1023)) + rng.choice((-1, 0, 1)))
    if u < 0.8:
        return _log_uniform(rng, 1, 1024)
    return _log_uniform(rng, 1024, MAX_WINDOW_LEFT)


def _softcap(rng: random.Random) -> float:
    """Gemma 2's caps (30 final, 50 attention), or a random one in [1, 100]."""
    u = rng.random()
    if u < 0.3:
        return 30.0
    if u < 0.6:
        return 50.0
    return round(math.exp(rng.uniform(0.0, math.log(100.0))), 2)


LONG_CONTEXT_RATE = 0.08  # batches with one request drawn at LONG_K_LEN..MAX_K_LEN keys


def generate(
    seed: int, level: str, shape: Shape, limits: Limits = LIMITS, index: int = -1
) -> Batch:
    """One random batch at ``level`` for ``shape`` (deterministic in its arguments)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    problems = shape_problems(shape)
    if problems:
        raise ValueError(f"invalid fuzz shape ({'; '.join(problems)}): {shape}")
    rng = random.Random(f"fa4-fuzz-batch:{seed}:{level}")
    # The dimensions added for issue 27 draw from their own stream, so the requests of a
    # shape without them are what the earlier generator drew.
    extra = random.Random(f"fa4-fuzz-extra:{seed}:{level}")
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
    long_batch = extra.random() < LONG_CONTEXT_RATE
    long_at = int(extra.random() * num_reqs) if long_batch else -1
    long_k = _log_uniform(extra, LONG_K_LEN + 1, MAX_K_LEN)
    model_values = MODEL_VALUES.get(replace(shape, kv_dtype=None).key_fields, {})

    def prefix_of(i: int, q: int, p_none: float) -> int:
        drawn = _prefix(rng, shape.page_size, p_none)  # drawn either way: the stream stays
        return max(0, long_k - q) if i == long_at else drawn

    reqs: list[tuple[int, int]] = []
    for i in range(num_decodes):
        q = rng.randint(1, threshold) if backend else 1
        fit = _fit(shape, reqs, q, prefix_of(i, q, 0.05), limits, level, q, q_first=i == long_at)
        if fit is None:
            break
        reqs.append((fit[0], fit[0] + fit[1]))
    decodes = tuple(reqs)

    prefills: list[tuple[int, int]] = []
    for j in range(num_reqs - len(decodes)):
        i = len(decodes) + j
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
            prefix_of(i, q, 0.4),
            limits,
            level,
            min_q,
            q_first=i == long_at,
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
    with_lse = (not backend) and rng.random() < 0.5
    features = dict(
        window_left=_window_left(extra) if shape.window else None,
        softcap=_softcap(extra) if shape.softcap else None,
    )
    if extra.random() < 0.6:
        features.update(model_values)
    batch = Batch(
        level=level,
        shape=shape,
        seed=seed,
        decodes=decodes,
        prefills=tuple(prefills),
        spec_tokens=spec,
        pad_rows=pad_rows,
        pad_reqs=pad_reqs,
        with_lse=with_lse,
        **features,
        layer=extra.randrange(shape.layers),
        table_slack=0 if extra.random() < 0.25 else DEFAULT_TABLE_SLACK,
        junk_table=extra.random() < 0.3,
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
    """The run's ``count`` batches (see ``level_of``), shapes drawn from ``run_shapes``."""
    pool = run_shapes(base_seed, count, accept)
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
    if b.junk_table:
        yield replace(b, junk_table=False)
    if b.table_slack != DEFAULT_TABLE_SLACK:
        yield replace(b, table_slack=DEFAULT_TABLE_SLACK)
    if b.layer:
        yield replace(b, layer=0)
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
