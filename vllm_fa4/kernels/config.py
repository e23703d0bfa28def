"""Host-only kernel configuration: the compile key and the tile table.

Nothing here imports cutlass or touches a GPU, so the planner (and CPU tests) can ask
which tile a key uses without paying for the DSL import.
"""

from __future__ import annotations

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

    @property
    def num_threads(self) -> int:
        return 128 * (self.num_mma_wg + 1)


def kernel_config(key: KernelKey, intra_wg_overlap: bool = False) -> KernelConfig:
    tile_m, tile_n = tile_shape(key.head_dim)
    # smem: Q tile_m*D + (K+V) per stage 2*tile_n*D elements; 2 stages fit all head dims.
    return KernelConfig(
        tile_m=tile_m,
        tile_n=tile_n,
        box_n=min(key.page_size, tile_n),
        kv_stages=2,
        intra_wg_overlap=intra_wg_overlap,
    )
