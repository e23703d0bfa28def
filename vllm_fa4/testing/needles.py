"""Needles planted in an FP8 paged case (issue 30's long-context retrieval check).

``plant`` rewrites one request of a ``cases.make_paged_case`` FP8 case: its values get a shared
mean per KV head (as real values have one), and each query row and head points at one key of
the context, drawn at random, with a softmax weight of about 10-90 % while the other logits
spread around it. ``shares`` fits an output on (the needle's value, the context's mean);
``read`` compares a kernel's shares and output with a reference's. A kernel that drops the
context's many tiny weights (P rounded to e4m3 underflows them) moves the context's share; a
coarse Q K^T moves the needle's. benchmarks/fp8_needle.py runs the contenders.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from vllm_fa4.testing.cases import FP8_MAX, PagedCase

MISREAD = 0.05  # a needle share off by more than this counts as misread
DELTA = 2.0  # the needle's logit margin over the others' log-partition, drawn in [-DELTA, DELTA]


class Needles(NamedTuple):
    """What ``plant`` set: every query row (token) and head of request 0 has one needle."""

    rows: slice  # the query rows of case.q that carry needles (all of request 0's)
    keys: torch.Tensor  # [R, Hq] int64: the needle's key position in request 0
    value: torch.Tensor  # [R, Hq, D] float64: the needle's dequantized value
    mean: torch.Tensor  # [R, Hq, D] float64: the context's mean value for the row's KV head


class Shares(NamedTuple):
    """Least-squares coefficients of O on (the needle's value, the context's mean)."""

    needle: torch.Tensor  # [R, Hq] float64
    context: torch.Tensor  # [R, Hq] float64


class Readout(NamedTuple):
    needle_mean: float
    needle_max: float
    context_mean: float
    context_max: float
    misread: int
    out_rel: float
    nonfinite_rows: int


def request_slots(case: PagedCase, b: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks, offsets) of request ``b``'s keys in token order."""
    t = torch.arange(case.specs[b][1], device=case.kv_cache.device)
    return case.block_table[b].long()[t // case.page_size], t % case.page_size


def plant(case: PagedCase, spread: float = 1.5, mean_scale: float = 0.5, seed: int = 0):
    """Rewrite request 0 of the FP8 ``case`` in place: its values get a shared mean per KV
    head (re-rounded to e4m3 at the case's v_scale), its queries point at one needle each.
    Returns the Needles (for ``shares``)."""
    if not case.fp8_kv or len(case.specs) != 1:
        raise ValueError("plant takes a one-request FP8 case")
    dev = case.kv_cache.device
    gen = torch.Generator(device=dev).manual_seed(seed + 7)
    d, hq, hkv = case.head_dim, case.num_q_heads, case.num_kv_heads
    group = hq // hkv
    q_len, k_len = case.specs[0]
    prefix = k_len - q_len
    if prefix < 1:
        raise ValueError("the request needs a context before its queries")
    blk, off = request_slots(case)
    raw = case.kv_cache.view(torch.uint8)  # e4m3 has no index_put; its bytes do
    kv = case.kv_cache[blk, off].float()  # [k_len, Hkv, 2D]
    mean = torch.randn(hkv, d, generator=gen, device=dev) * mean_scale
    v = kv[..., d:] * case.v_scale + mean
    kv[..., d:] = (v / case.v_scale).clamp(-FP8_MAX, FP8_MAX)
    raw[blk, off] = kv.to(torch.float8_e4m3fn).view(torch.uint8)

    keys = case.kv_cache[blk, off, :, :d].double() * case.k_scale  # [k_len, Hkv, D]
    values = case.kv_cache[blk, off, :, d:].double() * case.v_scale
    pos = prefix + torch.arange(q_len, device=dev)  # each query row's key position
    lo = torch.zeros_like(pos)
    if case.window_left is not None:
        lo = (pos - case.window_left).clamp(min=0)
    if bool((lo >= prefix).any()):
        raise ValueError("a window shorter than the queries leaves some rows no context key")
    # the needle: a context key the row sees, drawn per (row, head)
    u = torch.rand(q_len, hq, generator=gen, device=dev, dtype=torch.float64)
    span = (prefix - lo).unsqueeze(1)
    needle = lo.unsqueeze(1) + (u * span).long().clamp(max=span - 1)  # [R, Hq]
    kv_head = torch.arange(hq, device=dev) // group
    k_needle = keys[needle, kv_head]  # [R, Hq, D]
    # logit target: log(visible keys) + spread^2 / 2 (the others' log-partition) + delta
    visible = (pos - lo + 1).double().unsqueeze(1)
    delta = (torch.rand(q_len, hq, generator=gen, device=dev, dtype=torch.float64) * 2 - 1) * DELTA
    target = visible.log() + spread**2 / 2 + delta
    norm2 = (k_needle * k_needle).sum(-1)  # [R, Hq]
    c = target / (case.softmax_scale * norm2)
    # the others' logits, scale * (c K_needle + b n) . K_j with K_j ~ N(0, 1) per element,
    # have variance along + (scale b)^2 d: b makes up the rest of spread^2 (a quarter at least)
    along = (c * case.softmax_scale) ** 2 * norm2
    rest = (spread**2 - along).clamp(min=0.25 * spread**2)
    b = (rest / d).sqrt() / case.softmax_scale
    noise = torch.randn(q_len, hq, d, generator=gen, device=dev, dtype=torch.float64)
    q = c.unsqueeze(-1) * k_needle + b.unsqueeze(-1) * noise
    rows = slice(0, q_len)
    case.q[rows] = q.to(case.q.dtype)
    return Needles(
        rows=rows,
        keys=needle,
        value=values[needle, kv_head],
        mean=mean.double()[kv_head].unsqueeze(0).expand(q_len, hq, d),
    )


def shares(out: torch.Tensor, needles: Needles) -> Shares:
    """Least squares of each (row, head) of ``out`` on (needle value, context mean)."""
    o = out[needles.rows].double()
    a, m = needles.value, needles.mean
    g11, g12, g22 = (a * a).sum(-1), (a * m).sum(-1), (m * m).sum(-1)
    r1, r2 = (a * o).sum(-1), (m * o).sum(-1)
    det = g11 * g22 - g12 * g12
    return Shares(needle=(g22 * r1 - g12 * r2) / det, context=(g11 * r2 - g12 * r1) / det)


def read(out: torch.Tensor, ref: torch.Tensor, needles: Needles) -> Readout:
    """A contender's shares and output against the reference's, over finite (row, head)s."""
    o, r = out[needles.rows].double(), ref[needles.rows].double()
    finite = torch.isfinite(o).all(-1)  # [R, Hq]
    got, want = shares(out, needles), shares(ref, needles)
    dn = (got.needle - want.needle).abs()[finite]
    dc = (got.context - want.context).abs()[finite]
    rel = ((o - r).norm(dim=-1) / r.norm(dim=-1))[finite]
    bad_rows = int((~finite).any(-1).sum())
    if dn.numel() == 0:
        nan = float("nan")
        return Readout(nan, nan, nan, nan, 0, nan, bad_rows)
    return Readout(
        float(dn.mean()),
        float(dn.max()),
        float(dc.mean()),
        float(dc.max()),
        int((dn > MISREAD).sum()),
        float(rel.mean()),
        bad_rows,
    )
