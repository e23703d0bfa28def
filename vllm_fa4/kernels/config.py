"""Host-only kernel configuration: the compile key and the tile table.

Nothing here imports cutlass or touches a GPU, so the planner (and CPU tests) can ask
which tile a key uses without paying for the DSL import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SUPPORTED_DTYPES = ("bfloat16", "float16")
SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_PAGE_SIZES = (16, 32, 64, 128)


@dataclass(frozen=True)
class KernelKey:
    """Everything that is baked into one compiled prefill kernel.

    Batch size, sequence lengths, head counts, number of pages and the softmax scale are
    runtime values and must never appear here (a per-call field would recompile per step).
    """

    dtype: str  # "bfloat16" | "float16"
    head_dim: int  # 64 | 128 | 256
    page_size: int  # vLLM kernel block size: 16 | 32 | 64 | 128
    qhead_per_kvhead: int  # GQA group size packed into the M tile
    causal: bool = True

    def unsupported_reason(self) -> str | None:
        if self.dtype not in SUPPORTED_DTYPES:
            return f"dtype {self.dtype} (supported: {', '.join(SUPPORTED_DTYPES)})"
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            return f"head dim {self.head_dim} (supported: {SUPPORTED_HEAD_DIMS})"
        if self.page_size not in SUPPORTED_PAGE_SIZES:
            return f"page size {self.page_size} (supported: {SUPPORTED_PAGE_SIZES})"
        if not 1 <= self.qhead_per_kvhead <= tile_shape(self.head_dim)[0]:
            return f"GQA group size {self.qhead_per_kvhead}"
        if not self.causal:
            return "non-causal attention"
        return None


def tile_shape(head_dim: int) -> tuple[int, int]:
    """(tile_m, tile_n): query rows (packed GQA rows) and keys per CTA tile.

    tile_n is a multiple of every supported page size up to 64 and divides 128, so a K/V tile
    is always a whole number of pages or a whole fraction of one page.
    """
    if head_dim == 256:
        return 128, 64
    return 128, 128


def tokens_per_tile(head_dim: int, qhead_per_kvhead: int) -> int:
    """Query tokens per M tile: the GQA heads of one token sit in adjacent rows."""
    return tile_shape(head_dim)[0] // qhead_per_kvhead


@dataclass(frozen=True)
class Variant:
    """Compile-time performance switches (all part of the compile / disk-cache key).

    Spelled as a string for env vars and test ids: flags joined by '+', e.g.
    ``"overlap+pingpong+smemepi"``; ``"base"`` is no flag. ``boxN`` caps the K/V TMA box rows.
    """

    overlap: bool = False  # intra-WG overlap: S_j and P_{j+1} V_{j+1} issued back to back
    pingpong: bool = False  # inter-WG ping-pong: the two consumer WGs take turns issuing GEMMs
    smem_epilogue: bool = False  # O staged through sQ, 16-byte row stores
    max_box_n: int = 128  # cap on rows per K/V TMA box (pages > cap are split into boxes)
    # Producer reads a tile's page-table entries before waiting for the free stage (their
    # latency hides under the wait) and K and V of one block share one read.
    page_prefetch: bool = False
    kv_stages: int = 2  # K/V pipeline depth; 3 fits shared memory for head dims <= 128
    # Persistent grid: min(tiles, SMs) CTAs stride over the LPT-ordered work list, so the
    # producer loads the next tile's K/V while the consumers finish the current one.
    persistent: bool = False
    # With persistent: alternate the walk direction per round (balances the LPT shares).
    snake: bool = False

    @property
    def name(self) -> str:
        parts = [f for f in ("overlap", "pingpong") if getattr(self, f)]
        if self.smem_epilogue:
            parts.append("smemepi")
        if self.max_box_n != 128:
            parts.append(f"box{self.max_box_n}")
        if self.page_prefetch:
            parts.append("pagepf")
        if self.kv_stages != 2:
            parts.append(f"stages{self.kv_stages}")
        if self.persistent:
            parts.append("persist")
        if self.snake:
            parts.append("snake")
        return "+".join(parts) or "base"

    @classmethod
    def parse(cls, spec: str) -> "Variant":
        flags: dict = {}
        for tok in spec.replace(",", "+").split("+"):
            tok = tok.strip().lower()
            if tok in ("", "base"):
                continue
            if tok in ("overlap", "pingpong"):
                flags[tok] = True
            elif tok == "smemepi":
                flags["smem_epilogue"] = True
            elif tok == "pagepf":
                flags["page_prefetch"] = True
            elif tok == "persist":
                flags["persistent"] = True
            elif tok == "snake":
                flags["snake"] = True
            elif tok in ("stages2", "stages3"):
                flags["kv_stages"] = int(tok[-1])
            elif tok.startswith("box") and tok[3:] in ("16", "32", "64", "128"):
                flags["max_box_n"] = int(tok[3:])
            else:
                raise ValueError(f"vllm_fa4: unknown kernel variant flag {tok!r} in {spec!r}")
        return cls(**flags)


DEFAULT_VARIANT = Variant()

# The set the GPU tests / benchmark sweep with `all` (named, so ids are stable).
ALL_VARIANTS = tuple(
    Variant.parse(s)
    for s in (
        "base",
        "pingpong",
        "overlap",
        "overlap+pingpong",
        "smemepi",
        "overlap+pingpong+smemepi",
        "pingpong+smemepi",
        "pingpong+box64",
        # not yet measured on a GPU (docs/perf-notes.md, "Diagnosis"): producer-side fixes
        "pagepf",
        "pingpong+pagepf",
        "pingpong+stages3",
        "overlap+pingpong+pagepf+stages3",
        "persist",
        "persist+smemepi",
        "overlap+pingpong+persist",
        # not yet run on a GPU: balanced persistent walk
        "persist+snake",
        "persist+snake+smemepi",
    )
)


def parse_variants(spec: str | None) -> tuple[Variant, ...]:
    """``all`` | comma-free list of variant specs separated by spaces or ';'."""
    if not spec:
        return (DEFAULT_VARIANT,)
    if spec.strip() == "all":
        return ALL_VARIANTS
    return tuple(Variant.parse(s) for s in re.split(r"[;\s]+", spec.strip()) if s)


@dataclass(frozen=True)
class KernelConfig:
    """Derived, compile-time launch configuration for one KernelKey (host only)."""

    tile_m: int
    tile_n: int
    box_n: int  # rows per K/V TMA box: one page, or a tile-sized slice of a larger page
    kv_stages: int
    num_mma_wg: int = 2
    producer_regs: int = 24
    mma_regs: int = 240
    # Stage B: issue S_j = Q K_j^T and O += P_{j+1} V_{j+1} back to back (FA3 intra-WG overlap).
    intra_wg_overlap: bool = False
    # Inter-WG ping-pong through two named barriers (one WG's softmax under the other's GEMMs).
    pingpong: bool = False
    # Epilogue: stage O in the WG's own slice of sQ, then 16-byte vector stores per row.
    smem_epilogue: bool = False
    # Producer: page-table reads issued before producer_acquire (see Variant.page_prefetch).
    page_prefetch: bool = False
    # Grid of min(tiles, SMs) CTAs looping over work tiles (see Variant.persistent).
    persistent: bool = False
    snake: bool = False  # persistent walk alternates direction per round (Variant.snake)

    @property
    def num_threads(self) -> int:
        return 128 * (self.num_mma_wg + 1)


SMEM_BYTES = 227 * 1024  # dynamic shared memory one SM90 CTA may use


def kernel_config(key: KernelKey, variant: Variant = DEFAULT_VARIANT) -> KernelConfig:
    tile_m, tile_n = tile_shape(key.head_dim)
    # smem: Q tile_m*D + (K+V) per stage 2*tile_n*D elements (16-bit); 2 stages fit every
    # head dim, 3 fit head dims <= 128 (224 KB at 128).
    smem = 2 * key.head_dim * (tile_m + 2 * tile_n * variant.kv_stages)
    if variant.snake and not variant.persistent:
        raise ValueError("vllm_fa4: kernel variant flag 'snake' needs 'persist'")
    if smem > SMEM_BYTES - 1024:  # keep 1 KB for the mbarriers and alignment
        raise ValueError(
            f"vllm_fa4: {variant.kv_stages} K/V stages need {smem // 1024} KB of shared memory "
            f"at head dim {key.head_dim} (limit {SMEM_BYTES // 1024} KB)"
        )
    return KernelConfig(
        tile_m=tile_m,
        tile_n=tile_n,
        box_n=min(key.page_size, tile_n, variant.max_box_n),
        kv_stages=variant.kv_stages,
        intra_wg_overlap=variant.overlap,
        pingpong=variant.pingpong,
        smem_epilogue=variant.smem_epilogue,
        page_prefetch=variant.page_prefetch,
        persistent=variant.persistent,
        snake=variant.snake,
        # pagepf keeps a tile's page indices live across the acquire: at 24 registers the
        # producer spills them (page 16), so it takes 16 from the consumers (they use < 190).
        **({"producer_regs": 40, "mma_regs": 232} if variant.page_prefetch else {}),
    )
