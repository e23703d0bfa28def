"""Host-only kernel configuration: the compile key, the tile geometry and the variant flags.

Nothing here imports cutlass, torch or touches a GPU, so the planner (and CPU tests) can ask
which tile a key uses without paying for the DSL import.

    KernelKey      what the model fixes (dtype, head dim, page size, GQA group)
    KernelConfig   how the kernel is built (compile-time performance flags), one spelling each
    TileGeometry   tile sizes derived from a key, in one place (tile_geometry)
    ServingConfigs the configs serving picks from per batch (serving_configs)
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

SUPPORTED_DTYPES = ("bfloat16", "float16")
SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_PAGE_SIZES = (16, 32, 64, 128)
SMEM_BYTES = 227 * 1024  # dynamic shared memory one SM90 CTA may use
KV_STAGES = 2  # K/V pipeline depth (3 measured no faster, docs/perf-notes.md)


def dtype_name(dtype) -> str:
    """The key's spelling of a dtype: ``torch.bfloat16`` or ``"bfloat16"`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class KernelKey:
    """Everything that is baked into one compiled prefill kernel by the model's shape.

    Batch size, sequence lengths, head counts, number of pages and the softmax scale are
    runtime values and must never appear here (a per-call field would recompile per step).
    """

    dtype: str  # "bfloat16" | "float16"
    head_dim: int  # 64 | 128 | 256
    page_size: int  # vLLM kernel block size: 16 | 32 | 64 | 128
    qhead_per_kvhead: int  # GQA group size packed into the M tile
    causal: bool = True
    # Model features (issue 11); their values are runtime arguments, the flags pick the code:
    sliding_window: bool = False  # keys left of each row's window are skipped / masked
    softcap: bool = False  # S <- cap * tanh(S / cap) before the mask (Gemma 2)
    sinks: bool = False  # one learned logit per query head joins each row's denominator

    @classmethod
    def for_layer(
        cls,
        dtype,
        head_dim: int,
        page_size: int,
        num_q_heads: int,
        num_kv_heads: int,
        *,
        sliding_window: bool = False,
        softcap: bool = False,
        sinks: bool = False,
    ) -> KernelKey:
        """The key of an attention layer (``dtype`` as a torch dtype or its name)."""
        if num_q_heads <= 0 or num_kv_heads <= 0 or num_q_heads % num_kv_heads:
            raise ValueError(
                f"num_q_heads ({num_q_heads}) must be a positive multiple of num_kv_heads "
                f"({num_kv_heads})"
            )
        group = num_q_heads // num_kv_heads
        features = dict(sliding_window=sliding_window, softcap=softcap, sinks=sinks)
        return cls(dtype_name(dtype), head_dim, page_size, group, **features)

    def unsupported_reason(self) -> str | None:
        if self.dtype not in SUPPORTED_DTYPES:
            return f"dtype {self.dtype} (supported: {', '.join(SUPPORTED_DTYPES)})"
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            return f"head dim {self.head_dim} (supported: {SUPPORTED_HEAD_DIMS})"
        if self.page_size not in SUPPORTED_PAGE_SIZES:
            return f"page size {self.page_size} (supported: {SUPPORTED_PAGE_SIZES})"
        if not 1 <= self.qhead_per_kvhead <= tile_geometry(self).tile_m:
            return f"GQA group size {self.qhead_per_kvhead}"
        if not self.causal:
            return "non-causal attention"
        return None


@dataclass(frozen=True)
class ModelFeatures:
    """What an attention layer adds to plain causal attention (issue 11), as vLLM states it:
    ``window_left`` (vLLM's sliding_window - 1), the logit soft cap, and whether the layer
    has sink logits (their values are the layer's weights)."""

    window_left: int | None = None
    softcap: float | None = None
    sinks: bool = False

    def key_flags(self) -> dict:
        """The KernelKey.for_layer keywords of these features."""
        return dict(
            sliding_window=self.window_left is not None,
            softcap=self.softcap is not None,
            sinks=self.sinks,
        )


def check_window(key: KernelKey, window_left) -> int | None:
    """``window_left`` as the key's kernel takes it (given iff ``key.sliding_window``, an int
    >= 0); the planner and the launch share this one check."""
    if key.sliding_window != (window_left is not None):
        raise ValueError(
            f"key.sliding_window={key.sliding_window} but window_left={window_left!r}: a "
            "windowed key needs window_left and window_left needs a windowed key"
        )
    if window_left is None:
        return None
    if isinstance(window_left, bool) or int(window_left) != window_left or window_left < 0:
        raise ValueError(f"window_left must be an int >= 0, got {window_left!r}")
    return int(window_left)


def check_features(key: KernelKey, window_left, softcap, sinks) -> None:
    """The model-feature values must match the key's flags (a flag without its value, or a
    value the compiled kernel would ignore, is a caller bug)."""
    check_window(key, window_left)
    for name, present in (("softcap", softcap is not None), ("sinks", sinks is not None)):
        if present != getattr(key, name):
            raise ValueError(
                f"vllm_fa4: key.{name}={getattr(key, name)} but the {name} value is "
                f"{'given' if present else 'missing'}"
            )
    if softcap is not None and not softcap > 0:
        raise ValueError(f"vllm_fa4: softcap must be positive, got {softcap}")


@dataclass(frozen=True)
class TileGeometry:
    tile_m: int  # packed (token, q-head) rows per CTA tile
    tile_n: int  # keys per K/V tile
    tokens_per_tile: int  # query tokens per M tile: the GQA heads of a token sit in adjacent rows


def tile_geometry(key: KernelKey, mma_wgs: int = 2) -> TileGeometry:
    """The tile sizes of ``key`` built with ``mma_wgs`` consumer warpgroups (64 rows each).
    tile_n is a multiple of every supported page size up to 64 and divides 128, so a K/V tile
    is a whole number of pages or a whole fraction of one."""
    tile_m, tile_n = 64 * mma_wgs, (64 if key.head_dim == 256 else 128)
    return TileGeometry(tile_m, tile_n, tile_m // max(key.qhead_per_kvhead, 1))


@dataclass(frozen=True)
class KernelConfig:
    """Compile-time performance flags (all part of the compile and disk-cache key).

    Spelled as a string for the environment and test ids: the field names joined by ``+``,
    numbers as ``field=value``, e.g. ``"overlap+pingpong+softmax_per_arm+mma_wgs=3"``; ``"base"`` is the
    default (no flag).
    """

    # Intra-WG overlap: S_j = Q K_j^T and O += P_{j+1} V_{j+1} issued back to back.
    overlap: bool = False
    # Inter-WG ping-pong: the two consumer WGs take turns issuing GEMMs (barriers.py).
    pingpong: bool = False
    # Epilogue: O staged through the WG's slice of sQ, then 16-byte row stores.
    smem_epilogue: bool = False
    # The producer warp reads each block's page-table entries one block ahead (lane b: box
    # b's page, one coalesced load per block; K and V of a block share it), so no load sits
    # between a stage's release and its refill (paged_kv.read_block_pages, session 11).
    page_prefetch: bool = False
    # Persistent grid: min(tiles, SMs) CTAs claim tiles from a global atomic counter in list
    # (L2-section, LPT) order as they become free (tile_scheduler.TileQueue); the producer
    # loads the next tile's K/V while the consumers finish the current one.
    persistent: bool = False
    # With persistent: a warpgroup takes its next tile from the queue as soon as its last
    # Q K^T of the tile has completed and starts that tile's Q copies, which then land under
    # the last P V and the epilogue instead of stalling the next tile's start.
    q_prefetch: bool = False
    # The producer warp loads Q with TMA into a two-stage ring, at the start of the tile's
    # loads (a whole tile ahead of the consumers with `persistent`), on the mbarrier of the
    # tile's first K block; the consumers free the stage after their last Q K^T. One 3-D box
    # per 64 columns of D (64 x G heads x tokens) lands as the packed (token, head) rows.
    q_tma: bool = False
    # With persistent + q_tma: the producer publishes each tile (the CTA's first too) with
    # its TileWork in the tile queue's shared-memory slot, so the consumers start a tile
    # without global loads (tile_scheduler.TileQueue.publish_work).
    queue_work: bool = False
    # With queue_work: the producer warpgroup's second warp issues the V loads (it takes each
    # tile from the queue like the consumers), the first keeps Q, K and the queue. A K or V
    # tile at page 16 is 16 TMA boxes of ~10 uniform instructions each; on one warp all of
    # them land on one SMSP, in the issue slots of a consumer warp of each warpgroup.
    v_warp: bool = False
    # A K/V TMA box spans the whole head dim (every 64-column chunk) instead of one chunk:
    # the pool is described to TMA as 5-D (64 columns, 8 rows, chunk, 8-row group of the
    # cache's token slots, head) and sK/sV hold each 8-row group's chunks side by side, so
    # a page-16 K or V tile is 8 boxes, not 16 (paged_kv.py). Needs the cache's block
    # stride to be a whole number of boxes of token strides (vLLM's is page_size of them;
    # compile.check_slot_boxes refuses other layouts at launch).
    wide_box: bool = False
    # With overlap: the softmax sits in both arms of the causal-mask branch, which keeps
    # ptxas from hoisting the P V wgmma wait above it (fwd_sm90.softmax_block).
    softmax_per_arm: bool = False
    # With softmax_per_arm: the P V wait sits after the first row's exponentials (every
    # row's max before them), not after all of them, so the bf16 packing of P and the
    # V release run among the other row's exp2s instead of after the last one.
    pv_wait_mid: bool = False
    # FA4's conditional rescaling: a row's running max moves only when a block raises it by
    # more than 2^8 (exp2 units), so after the first blocks O is rescaled only by warps where
    # some row moved (a warp vote), not on every block.
    lazy_max: bool = False
    # Test-only instrumentation: a consumer thread adds 1 to its tile's cost column of
    # work_tiles after the tile's epilogue, so a test can check each tile ran exactly once.
    count_visits: bool = False
    # Consumer warpgroups, 64 Q rows each (the M tile is 64 * mma_wgs rows). 3 only at head
    # dim 64: there a block's GEMMs take as long as its exponentials, so two warpgroups
    # cannot hide one's softmax under the other's GEMMs; a third keeps the tensor pipe fed.
    mma_wgs: int = 2

    @classmethod
    def parse(cls, spec: str) -> KernelConfig:
        """``"base"`` or flags joined by ``+``; raises ValueError naming the valid spellings."""
        flags: dict = {}
        by_name = {f.name: f for f in fields(cls)}
        for token in spec.split("+"):
            token = token.strip()
            if token in ("", "base"):
                continue
            name, _, value = token.partition("=")
            field = by_name.get(name)
            if field is None or (field.type == "bool") == bool(value):
                raise ValueError(
                    f"vllm_fa4: unknown kernel config flag {token!r} in {spec!r}; valid: "
                    f"{cls.spellings()}"
                )
            try:
                flags[name] = int(value) if value else True
            except ValueError:
                raise ValueError(f"vllm_fa4: {name} takes an integer, got {token!r}") from None
        return cls(**flags)

    @classmethod
    def spellings(cls) -> str:
        return "base, " + ", ".join(
            f.name if f.type == "bool" else f"{f.name}=N" for f in fields(cls)
        )

    @property
    def spec(self) -> str:
        default = KernelConfig()
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                parts.append(f.name if f.type == "bool" else f"{f.name}={value}")
        return "+".join(parts) or "base"

    def unsupported_reason(self, key: KernelKey) -> str | None:
        """Why this config cannot build ``key``'s kernel, or None."""
        if self.q_prefetch and not self.persistent:
            return "flag 'q_prefetch' needs 'persistent'"
        if self.q_prefetch and self.smem_epilogue:
            return "flags 'q_prefetch' and 'smem_epilogue' exclude each other (both use sQ)"
        if self.q_tma and self.q_prefetch:
            return "flags 'q_tma' and 'q_prefetch' exclude each other (both load Q)"
        if self.queue_work and not (self.persistent and self.q_tma):
            return "flag 'queue_work' needs 'persistent' and 'q_tma'"
        if self.v_warp and not self.queue_work:
            return "flag 'v_warp' needs 'queue_work'"
        if not self.overlap == self.pingpong == self.softmax_per_arm:
            # the block loops left: serial, or overlapped with both
            return "flags 'overlap', 'pingpong' and 'softmax_per_arm' go together"
        if self.pv_wait_mid and not self.softmax_per_arm:
            return "flag 'pv_wait_mid' needs 'softmax_per_arm'"
        if self.mma_wgs not in (2, 3):
            return f"mma_wgs={self.mma_wgs} (supported: 2, 3)"
        if self.mma_wgs == 3 and key.head_dim != 64:
            # 160 registers per consumer thread hold O, S and P at head dim 64; at 128 the
            # block loop spills (128-key blocks) or runs 3-17 % slower (64-key blocks,
            # measured 2026-11-24, docs/perf-notes.md).
            return f"mma_wgs=3 at head dim {key.head_dim} (supported at head dim 64 only)"
        geo = tile_geometry(key, self.mma_wgs)
        # smem: Q tile_m*D per Q stage + (K+V) per stage 2*tile_n*D elements (16-bit)
        q_stages = self.q_stages
        smem = 2 * key.head_dim * (q_stages * geo.tile_m + 2 * geo.tile_n * KV_STAGES)
        if smem > SMEM_BYTES - 1024:  # keep 1 KB for the mbarriers and alignment
            what = f"{KV_STAGES} K/V stages" + (f" and {q_stages} Q stages" if q_stages > 1 else "")
            return (
                f"{what} need {smem // 1024} KB of shared memory at head "
                f"dim {key.head_dim} (limit {SMEM_BYTES // 1024} KB)"
            )
        return None

    @property
    def q_stages(self) -> int:
        """Q buffers in shared memory: 2 with `q_tma` (the ring), else 1."""
        return 2 if self.q_tma else 1

    def box_n(self, key: KernelKey) -> int:
        """Rows per K/V TMA box: one page, or a tile-sized slice of a larger page."""
        return min(key.page_size, tile_geometry(key).tile_n)

    # page_prefetch keeps two blocks' pages and the next read live across the acquires: at
    # 24 registers the producer's block loop spills (2 per block at page 16), so it takes 16
    # from the consumers (PERSISTENT_OVERLAP_QWORK uses 210 of their 232).
    # With 3 consumer warpgroups the 64 K registers split 32 / 160 (40 / 152 with page_prefetch):
    # 128 * producer + 384 * consumer <= 65536.
    @property
    def producer_regs(self) -> int:
        if self.mma_wgs == 3:
            return 40 if self.page_prefetch else 32
        return 40 if self.page_prefetch else 24

    @property
    def mma_regs(self) -> int:
        if self.mma_wgs == 3:
            return 152 if self.page_prefetch else 160
        return 232 if self.page_prefetch else 240

    @property
    def num_threads(self) -> int:
        return 128 * (self.mma_wgs + 1)


DEFAULT_CONFIG = KernelConfig()  # "base": no flag
# The measured serving defaults (docs/perf-notes.md, H100 and H200, one process each).
# Overlap + ping-pong on the persistent grid: every batch below page 128 (H200 page 16:
# 0.99-1.04 of FA3; base 0.86-1.02) and short batches at page 128, where paying the CTA
# start-up once per SM lifts 512x32 from 0.85 to 0.99.
PERSISTENT_OVERLAP = KernelConfig(
    overlap=True, pingpong=True, persistent=True, softmax_per_arm=True
)
# Long batches at page 128 (head dims other than 128): the one-CTA-per-tile grid is 0-3 %
# ahead on 16k and chunks after 64k. softmax_per_arm keeps ptxas from serializing the
# softmax behind the P V GEMM.
OVERLAP_PINGPONG = KernelConfig(overlap=True, pingpong=True, softmax_per_arm=True)
# PERSISTENT_OVERLAP whose warpgroups start the next tile's Q copies after their last Q K^T.
# Measured at head dim 128 (H100 and H200, 2026-11-23): short batches +1-7 % at both page
# sizes (512x32: 1.04-1.06 of FA3), long batches at page 128 +1-5 % over OVERLAP_PINGPONG,
# long batches at page 16 0.5-1 % behind PERSISTENT_OVERLAP.
PERSISTENT_OVERLAP_QPF = KernelConfig(
    overlap=True, pingpong=True, persistent=True, q_prefetch=True, softmax_per_arm=True
)
# Head dim 64: PERSISTENT_OVERLAP_QPF on three consumer warpgroups (192-row tiles), every
# batch and page size. Measured 2026-11-24 (H100 and H200): Llama-3.2-1B shape 1.00-1.17 of
# FA3 on 16 cases at pages 16 and 128 (two warpgroups: 0.87-1.00), gpt-oss shape 0.93-1.10.
PERSISTENT_OVERLAP_QPF_3WG = replace(PERSISTENT_OVERLAP_QPF, mma_wgs=3)
# PERSISTENT_OVERLAP whose Q the producer loads with TMA a tile ahead (session 9, H100 and
# H200): head dims 128 and 64 (three warpgroups) without a window, every batch and page size.
PERSISTENT_OVERLAP_QTMA = replace(PERSISTENT_OVERLAP, q_tma=True)
# PERSISTENT_OVERLAP_QTMA whose producer hands each tile over with its TileWork (session 10,
# H100 and H200): the serving default wherever PERSISTENT_OVERLAP_QTMA was.
PERSISTENT_OVERLAP_QWORK = replace(PERSISTENT_OVERLAP_QTMA, queue_work=True)
PERSISTENT_OVERLAP_QWORK_3WG = replace(PERSISTENT_OVERLAP_QWORK, mma_wgs=3)
# ... with O staged through the tile's own Q stage and written in 16-byte rows: short batches
# at head dim 128 (session 10: 512x32-1kx16 +4-10 %, 2kx8 0 to +2.4 %; long batches -0.1 to -6 %).
PERSISTENT_OVERLAP_QWORK_STAGED = replace(PERSISTENT_OVERLAP_QWORK, smem_epilogue=True)
# ... with the V loads on the producer warpgroup's second warp (session 12, H100 and H200):
# long batches at head dim 128, below page 128 with the page table read a block ahead
# (page 16, 4k+ tokens: +0.5-0.9 % over PERSISTENT_OVERLAP_QWORK), at page 128 without it
# (there each warp reads its block's one entry after the acquire; -0.1 to +0.7 % over
# session 11's page_prefetch pick, which v_warp + page_prefetch did not beat).
PERSISTENT_OVERLAP_QWORK_V_WARP = replace(PERSISTENT_OVERLAP_QWORK, v_warp=True)
PERSISTENT_OVERLAP_QWORK_V_WARP_PAGES_AHEAD = replace(
    PERSISTENT_OVERLAP_QWORK_V_WARP, page_prefetch=True
)
# ... with one TMA box per page for all of D (session 13, H100 and H200): long batches at
# head dim 128 below page 128 (page 16, 4k+ tokens: +0.8-1.1 %). At page 128 (2 boxes per
# block instead of 4) it measured -0.6 to +0.7 %, and the staged epilogue of short batches
# lost 0-2 % with it: both keep the per-chunk boxes.
PERSISTENT_OVERLAP_QWORK_V_WARP_PAGES_AHEAD_WIDE = replace(
    PERSISTENT_OVERLAP_QWORK_V_WARP_PAGES_AHEAD, wide_box=True
)


# Every head-dim-128 pick above (long and short, no window) with the P V wait after the first
# row's exponentials and O's rescale in the next block's turn (session 14, H100, 8 rounds:
# page-16 4k+ 1.051 -> 1.111 of FA3, page-128 long 1.005 -> 1.043, short 1.110 -> 1.139;
# 70B at TP 8 likewise). Head dim 64's three warpgroups: short batches only (two H100 runs:
# short +1.5 % and +1.9 %, long page-128 batches -1.3 % and -1.6 %).
def with_pv_wait_mid(config: KernelConfig) -> KernelConfig:
    return replace(config, pv_wait_mid=True)


LONG_BATCH_MIN_PAGE = 128  # pages this large run a different config for long batches
SHORT_BATCH_MAX_BLOCKS = 16  # mean KV tiles visited per work tile (2k tokens at tile_n 128)
QPF_HEAD_DIMS = (128,)  # where q_prefetch and q_tma were measured; others keep the old picks
THREE_WG_HEAD_DIMS = (64,)  # PERSISTENT_OVERLAP_QPF_3WG for every batch


def with_lazy_max(config: KernelConfig, key: KernelKey) -> KernelConfig:
    """``config`` with `lazy_max` where it was measured to win (session 7, H100 and H200):
    every key without a sliding window. With gpt-oss's 128-key window a row visits about two
    blocks and its max moves on most of them, so there is nothing to skip (0 to -1.8 %)."""
    return replace(config, lazy_max=not key.sliding_window)


@dataclass(frozen=True)
class ServingConfigs:
    """The configs serving may launch for one key, picked per batch on the host (the plan):
    batches whose work tiles visit on average at most ``short_max_blocks`` K/V tiles run
    ``short``, the others ``long``. Warmup compiles every one of ``all``."""

    long: KernelConfig
    short: KernelConfig
    short_max_blocks: int = SHORT_BATCH_MAX_BLOCKS

    def __post_init__(self):
        # The plan tiles the batch before it picks, so both must tile the same way.
        if self.long.mma_wgs != self.short.mma_wgs:
            raise ValueError(
                f"serving configs {self.long.spec!r} and {self.short.spec!r} differ in "
                "mma_wgs (the M tile): one plan cannot serve both"
            )

    def geometry(self, key: KernelKey) -> TileGeometry:
        """The tile geometry every config here runs ``key`` with."""
        return tile_geometry(key, self.long.mma_wgs)

    def pick(self, num_tiles: int, total_work: int) -> KernelConfig:
        """The config of a batch of ``num_tiles`` tiles visiting ``total_work`` K/V tiles."""
        if num_tiles and total_work <= self.short_max_blocks * num_tiles:
            return self.short
        return self.long

    @property
    def all(self) -> tuple[KernelConfig, ...]:
        return (self.long,) if self.short == self.long else (self.long, self.short)


def serving_configs(key: KernelKey, fixed: KernelConfig | None = None) -> ServingConfigs:
    """What serving runs for ``key``: ``fixed`` (VLLM_FA4_VARIANT) for every batch, else
    the measured per-head-dim and per-page-size defaults (docs/perf-notes.md, sessions 3-14):

    head dim 64    three consumer warpgroups, every batch: PERSISTENT_OVERLAP_QWORK_3WG +
                   lazy_max, short batches with pv_wait_mid (sliding window:
                   PERSISTENT_OVERLAP_QPF_3WG)
    head dim 128   long batches PERSISTENT_OVERLAP_QWORK + lazy_max with the V loads on a
                   second producer warp, below page 128 with the page table read a block
                   ahead and whole-row K/V boxes (PERSISTENT_OVERLAP_QWORK_V_WARP_PAGES_AHEAD_WIDE),
                   at 128 and more without both (PERSISTENT_OVERLAP_QWORK_V_WARP); short
                   batches with the staged epilogue (PERSISTENT_OVERLAP_QWORK_STAGED), every
                   page size; both with pv_wait_mid (sliding window: the session-4 picks)
    head dim 256   page 128: long OVERLAP_PINGPONG, short PERSISTENT_OVERLAP (session 3);
                   smaller pages: long PERSISTENT_OVERLAP + lazy_max, short without lazy_max
                   (512x32 lost 1.5-2.6 % with it)
    """
    if fixed is not None:
        return ServingConfigs(long=fixed, short=fixed)
    if key.head_dim in THREE_WG_HEAD_DIMS:
        # q_tma not measured with a window (gpt-oss's windowed layers keep q_prefetch)
        if key.sliding_window:
            three = with_lazy_max(PERSISTENT_OVERLAP_QPF_3WG, key)
            return ServingConfigs(long=three, short=three)
        three = with_lazy_max(PERSISTENT_OVERLAP_QWORK_3WG, key)
        return ServingConfigs(long=three, short=with_pv_wait_mid(three))
    long_page = key.page_size >= LONG_BATCH_MIN_PAGE
    if key.head_dim in QPF_HEAD_DIMS:
        if key.sliding_window:  # the session-4 picks (lazy_max, q_tma not measured there)
            long = PERSISTENT_OVERLAP_QPF if long_page else PERSISTENT_OVERLAP
            return ServingConfigs(long=long, short=PERSISTENT_OVERLAP_QPF)
        long = (
            PERSISTENT_OVERLAP_QWORK_V_WARP
            if long_page
            else PERSISTENT_OVERLAP_QWORK_V_WARP_PAGES_AHEAD_WIDE
        )
        long = with_pv_wait_mid(with_lazy_max(long, key))
        short = with_pv_wait_mid(with_lazy_max(PERSISTENT_OVERLAP_QWORK_STAGED, key))
        return ServingConfigs(long=long, short=short)
    if long_page:
        return ServingConfigs(long=OVERLAP_PINGPONG, short=PERSISTENT_OVERLAP)
    return ServingConfigs(long=with_lazy_max(PERSISTENT_OVERLAP, key), short=PERSISTENT_OVERLAP)
