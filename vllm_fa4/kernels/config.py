"""Host-only kernel configuration: the compile key, the tile geometry and the variant flags.

Nothing here imports cutlass, torch or touches a GPU, so the planner (and CPU tests) can ask
which tile a key uses without paying for the DSL import.

    KernelKey      what the model fixes (dtype, head dim, page size, GQA group, features,
                   KV cache dtype)
    KernelConfig   how the kernel is built: one typed field per axis (Tiles, BlockStep, QLoad,
                   KvBox, PageRead, Epilogue, lazy_max, mma_wgs), spelled for the environment
    TileGeometry   tile sizes derived from a key, in one place (tile_geometry)

What the kernel *can* be; which configs serving runs is paged_prefill/policy.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

SUPPORTED_DTYPES = ("bfloat16", "float16")
SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_PAGE_SIZES = (16, 32, 64, 128)
# KernelKey.kv_dtype: None (the cache holds the model's dtype) or an FP8 e4m3 cache (issue 30).
FP8_E4M3 = "float8_e4m3fn"
SUPPORTED_KV_DTYPES = (None, FP8_E4M3)
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
    # The K/V cache's element type when it is not the model's (None): "float8_e4m3fn" is an
    # FP8 cache read with per-tensor k_scale / v_scale (runtime values, like the softmax scale).
    kv_dtype: str | None = None

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
        kv_dtype=None,
    ) -> KernelKey:
        """The key of an attention layer (``dtype`` and ``kv_dtype`` as torch dtypes or their
        names; a ``kv_dtype`` equal to ``dtype`` is the plain 16-bit cache, None)."""
        if num_q_heads <= 0 or num_kv_heads <= 0 or num_q_heads % num_kv_heads:
            raise ValueError(
                f"num_q_heads ({num_q_heads}) must be a positive multiple of num_kv_heads "
                f"({num_kv_heads})"
            )
        group = num_q_heads // num_kv_heads
        features = dict(sliding_window=sliding_window, softcap=softcap, sinks=sinks)
        name = dtype_name(dtype)
        kv_name = None if kv_dtype is None else dtype_name(kv_dtype)
        kv_name = None if kv_name == name else kv_name
        return cls(name, head_dim, page_size, group, **features, kv_dtype=kv_name)

    @property
    def fp8_kv(self) -> bool:
        """The cache is FP8 e4m3 (K/V are dequantized with k_scale / v_scale on read)."""
        return self.kv_dtype == FP8_E4M3

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
        if self.kv_dtype not in SUPPORTED_KV_DTYPES:
            return f"KV cache dtype {self.kv_dtype} (supported: the model's dtype, {FP8_E4M3})"
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


def tile_geometry(
    key: KernelKey, mma_wgs: int = 2, block_n: int = 0, heads_per_tile: int = 0
) -> TileGeometry:
    """The tile sizes of ``key`` built with ``mma_wgs`` consumer warpgroups (64 rows each) and
    ``block_n`` keys a K/V tile (0: the key's default, 128, or 64 at head dim 256). The default
    is a multiple of every supported page size up to 64 and divides 128, so a K/V tile is a
    whole number of pages or a whole fraction of one; another ``block_n`` must keep that for
    its key's page size (``KernelConfig.unsupported_reason``). ``heads_per_tile``: query heads
    side by side in a tile's rows (0: the key's GQA group; KvShare's pairs pack half of it)."""
    tile_m = 64 * mma_wgs
    tile_n = block_n or (64 if key.head_dim == 256 else 128)
    heads = heads_per_tile or key.qhead_per_kvhead
    return TileGeometry(tile_m, tile_n, tile_m // max(heads, 1))


def grid_shift_keys(key: KernelKey, tile_n: int) -> int:
    """The granularity by which a windowed tile shifts its K/V block grid to start at its
    leftmost window key's page (tile_scheduler.tile_work; plan.build_work_tiles counts the
    same blocks): one page where pages are shorter than a block, else 0 (no shift: a block
    is one TMA box inside a page and cannot start mid-box)."""
    return key.page_size if key.sliding_window and key.page_size < tile_n else 0


class Tiles(Enum):
    """How a CTA gets its work tiles (tile_scheduler.py)."""

    # One CTA per work tile (grid = tiles, tile = blockIdx.x).
    ONE_PER_CTA = "one_per_cta"
    # Persistent grid: min(tiles, SMs) CTAs take tiles in list (L2-section, LPT) order as they
    # become free. The producer warp claims each from a global atomic counter and hands its
    # index to the consumers through a shared-memory ring (TileQueue), and loads the next
    # tile's K/V while the consumers finish the current one.
    QUEUE = "queue"
    # QUEUE whose slots carry the tile's TileWork too (the CTA's first tile included), so the
    # consumers start a tile without global loads (TileQueue.publish_work).
    QUEUE_WITH_WORK = "queue_with_work"


class QLoad(Enum):
    """How a tile's Q reaches shared memory."""

    # Each consumer warpgroup copies its 64 rows at the tile's start.
    CP_ASYNC = "q_cp_async"
    # The producer warp, with TMA, into a two-stage ring at the start of the tile's loads (a
    # whole tile ahead with a queue), on the tile's first K mbarrier; the consumers free the
    # stage after their last Q K^T. One box of G heads x T tokens x 64 columns per 64 columns.
    TMA = "q_tma"
    # cp.async issued for the next tile (taken from the queue) as soon as this tile's last
    # Q K^T has completed, so it lands under the last P V and the epilogue.
    PREFETCH = "q_prefetch"


class BlockStep(Enum):
    """The consumer's step over one K/V block after the tile's first."""

    # Q K^T, softmax, P V, one after the other, no turns: the debug baseline.
    SERIAL = "serial"
    # S_j = Q K_j^T and O += P_{j+1} V_{j+1} back to back in one ping-pong turn (barriers.py),
    # the softmax of S_j under the P V; the softmax sits in both arms of the mask branch,
    # which keeps ptxas from hoisting the P V wait above it (softmax_block).
    OVERLAP = "overlap"
    # OVERLAP with the P V wait after the first row's exponentials: P's packing and the V
    # release run among the second row's, O's rescale moves to the next block's turn.
    OVERLAP_PV_WAIT_MID = "pv_wait_mid"
    # OVERLAP without the turns: each warpgroup issues its GEMMs once its operands are ready
    # (FA3's choice at head dim 256, where a block's GEMMs outlast its softmax; measured in
    # docs/perf-notes.md, 2026-11-27).
    OVERLAP_FREE = "overlap_free"


class KvBox(Enum):
    """The shape of a K/V TMA box."""

    # One box per page (or box_n rows of it) per 64 columns of D.
    PER_CHUNK = "chunk_boxes"
    # One box per page for all of D, over the cache's token slots (paged_kv.slot_view): a
    # page-16 K or V tile is 8 boxes, not 16. Needs the cache's block stride to be a whole
    # number of boxes of token strides (vLLM's is; launch.check_slot_boxes refuses others).
    WIDE = "wide_box"


class PageRead(Enum):
    """When the producer reads a K/V block's page-table entries."""

    # Each box's entry after the stage's acquire.
    AFTER_ACQUIRE = "pages_at_acquire"
    # A block ahead, lane b holding box b's page (one coalesced load per block, shared by K
    # and V), so no load sits between a stage's release and its refill (read_block_pages).
    BLOCK_AHEAD = "pages_ahead"


class Epilogue(Enum):
    """How O reaches global memory."""

    # Each thread stores its accumulator pairs.
    DIRECT = "direct_epilogue"
    # Through the warpgroup's slice of sQ, then 16-byte row stores.
    STAGED = "staged_epilogue"
    # Through the warpgroup's slice of sQ, then TMA stores (one box a 64-column chunk) that
    # drain under the next tile's work; a warpgroup whose rows pass the request's end stores
    # its pairs directly (a box cannot stop at a packed request's last token).
    TMA = "tma_epilogue"


class Fp8Qk(Enum):
    """How S = Q K^T reads an fp8 cache's K (fp8_kv.py)."""

    # The converter warps turn K into fp16 as they do V; Q is converted to fp16 once a tile.
    CONVERTED_K = "k_converted"
    # FP8 wgmma straight from the staged e4m3 K, with Q split once a tile into two e4m3 halves
    # under a power-of-two row scale (hi + lo = Q; fwd_sm90 split_q): the converters
    # convert only V, and K's 16-bit stages and their shared-memory traffic go away.
    SPLIT_Q = "fp8_qk"
    # SPLIT_Q with Q rounded once to e4m3 (the split's hi part alone, under the same row
    # scale): one FP8 GEMM for Q K^T instead of two, Q K^T as precise as FA3-FP8's (whose Q
    # is e4m3 too, with one per-tensor scale), P V still 16-bit (issue 30's true-FP8 question).
    ROUNDED_Q = "fp8_qk_rounded"


class KvShare(Enum):
    """Whether the CTAs on one KV head's tokens share its K/V reads (issue 32)."""

    # Each tile holds the whole GQA group's heads and loads every block it visits.
    OWN = "kv_own"
    # Tiles of half the group's heads over twice the tokens, each twice in the work list as
    # virtual KV heads 2h and 2h + 1 (plan.py), the pair in a two-CTA cluster: each CTA loads
    # half of every K/V block (its 64-column chunks; with `wide_box` its boxes) by TMA and
    # multicasts it to both, so the L2 serves each block once a pair (~27 pJ a byte from L2
    # against ~5 a landed byte on the H200: benchmarks/tma_energy.py); each consumer warp
    # frees the stage in both CTAs. On the persistent grid the cluster's rank 0 claims the
    # next pair from the atomic counter and hands it to rank 1 through distributed shared
    # memory (tile_scheduler.ClaimHandoff), so pairs go in list (LPT) order.
    MULTICAST = "kv_multicast"


class TileProbe(Enum):
    """Test-only instrumentation of the tiles, never spelled (no spec, so no environment, can
    select it); the first consumer thread writes into work_tiles."""

    NONE = "none"
    # Adds 1 to the row's cost column after the tile's epilogue: a test checks each tile ran
    # exactly once (tests/gpu/test_tile_scheduler.py).
    COUNT_VISITS = "count_visits"
    # Columns 4-6 of a work list allocated 12 wide (the kernel reads the [:, :4] view): the
    # SM's id and %globaltimer_lo (ns) at the tile's end and at its start; columns 7-11 of
    # row b: CTA b's sums of its tiles' phases (benchmarks/tile_times.py turns them into
    # per-tile times, per-SM loads and a tile's phases).
    STAMP_TIMES = "stamp_times"


AXES = (Tiles, BlockStep, QLoad, KvBox, PageRead, Epilogue, Fp8Qk, KvShare)
_BY_SPELLING = {member.value: member for axis in AXES for member in axis}


@dataclass(frozen=True)
class KernelConfig:
    """How the kernel is built (every field is part of the compile and disk-cache key).

    Spelled for the environment and test ids as its values joined by ``+``: the tiles and the
    block step always, then the other fields where they differ from the default, e.g.
    ``queue+overlap`` (the default) or ``queue_with_work+pv_wait_mid+q_tma+lazy_max+mma_wgs=3``.
    ``parse`` takes the values in any order; a field left out keeps its default.
    """

    tiles: Tiles = Tiles.QUEUE
    block_step: BlockStep = BlockStep.OVERLAP
    q_load: QLoad = QLoad.CP_ASYNC
    # With QUEUE_WITH_WORK: the producer warpgroup's second warp issues the V loads (it takes
    # each tile from the queue like the consumers), the first keeps Q, K and the queue. A K or
    # V tile at page 16 is 16 TMA boxes of ~10 uniform instructions each; on one warp all of
    # them land on one SMSP, in the issue slots of a consumer warp of each warpgroup.
    v_warp: bool = False
    kv_box: KvBox = KvBox.PER_CHUNK
    page_read: PageRead = PageRead.AFTER_ACQUIRE
    epilogue: Epilogue = Epilogue.DIRECT
    # Conditional rescaling: O is rescaled only by warps where some row's max moved (a warp
    # vote), not on every block. The max moves whenever a block raises it (margin 0: FA3's
    # numerics; FA4's 2^8 margin widened the error tail, softmax.LAZY_MAX_MARGIN_LOG2).
    lazy_max: bool = False
    # Consumer warpgroups, 64 Q rows each (the M tile is 64 * mma_wgs rows). 3 only at head
    # dim 64: there a block's GEMMs take as long as its exponentials, so two warpgroups
    # cannot hide one's softmax under the other's GEMMs; a third keeps the tensor pipe fed.
    mma_wgs: int = 2
    # Keys a K/V tile (0: the key's default, tile_geometry). 80 at head dim 256 and page 16:
    # five pages a block, FA3's block there; Q K^T's m64n64k16 wgmmas read 128 B of shared
    # memory a clock, m64n80k16 112 (session 8). Served for long batches with a soft cap,
    # with and without a window (policy.LONG_BY_PAGE: +1.7 to +7.2 % on the H100); without
    # a cap it lost on the turns' step (sessions 9 and 10) and is served with the P V wait
    # and the TMA store (sessions 25-26, H200, +1.7 to +3.8 % at 4k-16k).
    block_n: int = 0
    # Test-only instrumentation, never spelled (TileProbe).
    tile_probe: TileProbe = TileProbe.NONE
    fp8_qk: Fp8Qk = Fp8Qk.CONVERTED_K
    kv_share: KvShare = KvShare.OWN

    @classmethod
    def parse(cls, spec: str) -> KernelConfig:
        """Values joined by ``+`` (see the class doc); raises ValueError naming the valid
        spellings."""
        return cls(**cls._values(spec))

    def overlaid(self, overlay: str) -> KernelConfig:
        """This config with the values ``overlay`` spells set, each replacing this config's
        value on its axis (the A/B tools' ``default+values``: one axis against the served
        pick, whether or not the pick already has it)."""
        return dataclasses.replace(self, **self._values(overlay))

    @classmethod
    def _values(cls, spec: str) -> dict:
        """The fields ``spec`` sets, by name; each at most once."""
        values: dict = {}
        for token in spec.split("+"):
            token = token.strip()
            if not token:
                continue
            name, eq, number = token.partition("=")
            if name in ("mma_wgs", "block_n") and eq:
                field, value = name, _int_value(name, number, token)
            elif token in ("v_warp", "lazy_max"):
                field, value = token, True
            elif token in _BY_SPELLING:
                value = _BY_SPELLING[token]
                field = _FIELD_OF[type(value)]
            else:
                raise ValueError(
                    f"vllm_fa4: unknown kernel config value {token!r} in {spec!r}; valid: "
                    f"{cls.spellings()}"
                )
            if field in values:
                raise ValueError(f"vllm_fa4: {spec!r} sets {field} twice")
            values[field] = value
        return values

    @classmethod
    def spellings(cls) -> str:
        values = [member.value for axis in AXES for member in axis]
        return ", ".join([*values, "v_warp", "lazy_max", "mma_wgs=N", "block_n=N"])

    @property
    def spec(self) -> str:
        """The spelling ``parse`` reads back (tile_probe, test-only, is never spelled)."""
        default = KernelConfig()
        parts = [self.tiles.value, self.block_step.value]
        for name in (
            "q_load",
            "v_warp",
            "kv_box",
            "page_read",
            "epilogue",
            "lazy_max",
            "fp8_qk",
            "kv_share",
        ):
            value = getattr(self, name)
            if value != getattr(default, name):
                parts.append(name if value is True else value.value)
        if self.mma_wgs != default.mma_wgs:
            parts.append(f"mma_wgs={self.mma_wgs}")
        if self.block_n != default.block_n:
            parts.append(f"block_n={self.block_n}")
        return "+".join(parts)

    def geometry(self, key: KernelKey) -> TileGeometry:
        """The tile sizes this config builds ``key``'s kernel with."""
        return tile_geometry(key, self.mma_wgs, self.block_n, self.heads_per_tile(key))

    def heads_per_tile(self, key: KernelKey) -> int:
        """Query heads side by side in a tile's rows: the GQA group, or half of it where
        tiles pair up (`kv_multicast`: the other half is the paired row's)."""
        return key.qhead_per_kvhead // 2 if self.paired_heads else key.qhead_per_kvhead

    @property
    def kv_multicast(self) -> bool:
        return self.kv_share is KvShare.MULTICAST

    @property
    def paired_heads(self) -> bool:
        """Work rows name virtual KV heads 2h and 2h + 1 (`kv_multicast`'s pairs)."""
        return self.kv_multicast

    def unsupported_reason(self, key: KernelKey) -> str | None:
        """Why this config cannot build ``key``'s kernel, or None."""
        if self.tiles is Tiles.QUEUE_WITH_WORK and self.q_load is not QLoad.TMA:
            # its consumers take Q's stage from the tile's place in the queue (walk_queue_work)
            return "'queue_with_work' needs 'q_tma'"
        if self.v_warp and self.tiles is not Tiles.QUEUE_WITH_WORK:
            return "'v_warp' needs 'queue_with_work' (the V warp takes tiles from the queue)"
        if self.q_load is QLoad.PREFETCH:
            if self.tiles is Tiles.ONE_PER_CTA:
                return "'q_prefetch' needs a queue (it takes the next tile mid-tile)"
            if self.epilogue is Epilogue.STAGED:
                return "'q_prefetch' and 'staged_epilogue' exclude each other (both use sQ)"
        if self.epilogue is Epilogue.TMA:
            if self.q_load is QLoad.PREFETCH:
                # the next tile's Q would land in sQ while O's stores still read it
                return "'tma_epilogue' needs Q by cp.async or 'q_tma', not 'q_prefetch'"
            if self.q_load is QLoad.TMA and key.fp8_kv:
                # O would be staged in the 16-bit Q stage the fp8 kernel converts or splits
                return "'tma_epilogue' with 'q_tma' on an fp8 KV cache"
            if 64 % key.qhead_per_kvhead:
                return "'tma_epilogue' needs a warpgroup's 64 rows to be whole tokens"
        if self.kv_multicast:
            reason = self._multicast_unsupported_reason(key)
            if reason is not None:
                return reason
        if self.mma_wgs not in (2, 3):
            return f"mma_wgs={self.mma_wgs} (supported: 2, 3)"
        if self.mma_wgs == 3 and key.head_dim != 64:
            # 160 registers per consumer thread hold O, S and P at head dim 64; at 128 the
            # block loop spills (128-key blocks) or runs 3-17 % slower (64-key blocks,
            # measured 2026-11-24, docs/perf-notes.md).
            return f"mma_wgs=3 at head dim {key.head_dim} (supported at head dim 64 only)"
        if self.block_n:
            reason = self._block_n_unsupported_reason(key)
            if reason is not None:
                return reason
        if key.fp8_kv:
            reason = self._fp8_unsupported_reason()
            if reason is not None:
                return reason
        if self.fp8_qk is not Fp8Qk.CONVERTED_K:
            reason = self._split_q_unsupported_reason(key)
            if reason is not None:
                return reason
        smem = self._smem_bytes(key, max(self.staging_stages(key), key.fp8_kv))
        if smem > SMEM_BYTES - 1024:  # keep 1 KB for the mbarriers and alignment
            q_stages = self.q_stages
            what = f"{KV_STAGES} K/V stages" + (f" and {q_stages} Q stages" if q_stages > 1 else "")
            if key.fp8_kv:
                what += " and an fp8 staging stage"
            return (
                f"{what} need {smem // 1024} KB of shared memory at head "
                f"dim {key.head_dim} (limit {SMEM_BYTES // 1024} KB)"
            )
        return None

    def _multicast_unsupported_reason(self, key: KernelKey) -> str | None:
        """What `kv_multicast` is built for: pairs of an even GQA group on the persistent
        grid whose slots carry the TileWork (the claims handed within the cluster), 16-bit
        caches without a window, blocks split between the two CTAs by 64-column chunk (with
        `wide_box` by box: an even number a block)."""
        if key.qhead_per_kvhead % 2:
            return f"'kv_multicast' with GQA group {key.qhead_per_kvhead} (an even group)"
        if self.tiles is not Tiles.QUEUE_WITH_WORK:
            return "'kv_multicast' needs 'queue_with_work' (a cluster hands its claims over)"
        if key.head_dim < 128:
            return "'kv_multicast' at head dim 64 (the CTAs split a block by 64-column chunks)"
        if key.fp8_kv or key.sliding_window:
            return "'kv_multicast' with an fp8 cache or a window"
        wide_boxes = self.geometry(key).tile_n // self.box_n(key)
        if self.kv_box is KvBox.WIDE and wide_boxes % 2:
            return f"'kv_multicast' with 'wide_box' at {wide_boxes} box(es) a block (even)"
        return None

    def _block_n_unsupported_reason(self, key: KernelKey) -> str | None:
        """A K/V tile of ``block_n`` keys: whole pages (or a whole fraction of one), whole
        k-steps of P V (16 keys), within one wgmma's N (256)."""
        n, page = self.block_n, key.page_size
        if n % 16 or not 16 <= n <= 256:
            return f"block_n={n} (a multiple of 16 from 16 to 256)"
        if n % page and page % n:
            return f"block_n={n} at page {page} (a tile must be whole pages or divide a page)"
        return None

    def _fp8_unsupported_reason(self) -> str | None:
        """What an fp8 cache's kernel (fp8_kv.py) is not built for yet."""
        if self.kv_box is KvBox.WIDE:
            # the fp8 staging tile is laid out for per-chunk boxes only
            return "'wide_box' with an fp8 KV cache"
        if self.q_load is QLoad.PREFETCH:
            # the converter warps walk tiles as the consumers do, without a mid-tile handoff
            return "'q_prefetch' with an fp8 KV cache"
        return None

    def _split_q_unsupported_reason(self, key: KernelKey) -> str | None:
        """What `fp8_qk` (head dim 128) and `fp8_qk_rounded` (128 and 256) are not built for."""
        name = f"'{self.fp8_qk.value}'"
        if not key.fp8_kv:
            return f"{name} without an fp8 KV cache"
        built = (128, 256) if self.fp8_qk is Fp8Qk.ROUNDED_Q else (128,)  # Q's parts must fit
        if key.head_dim not in built:
            dims = " and ".join(map(str, built))
            return f"{name} at head dim {key.head_dim} (built for head dim {dims})"
        if key.dtype != "bfloat16":
            # a bf16 value's 8 significant bits fit two e4m3 parts; fp16's 11 would need a
            # third (the fp16 rows failed the error rule with two: 1.7x the mean bound)
            return f"{name} with a {key.dtype} model (bfloat16 only)"
        if self.q_load is QLoad.PREFETCH:
            return f"{name} with 'q_prefetch' (the split waits for Q in the tile's first block)"
        if self.staging_stages(key) != KV_STAGES:
            # the producer issues K's ring and V's staging ring with one pipeline state
            return f"{name} with {self.staging_stages(key)} fp8 staging stages"
        return None

    def _smem_bytes(self, key: KernelKey, staging_stages: int) -> int:
        """Q's stages and the K/V stages (16-bit), plus the fp8 staging ring (1 byte each);
        with `fp8_qk` K's stages are fp8, only V is staged, and Q's split halves and row
        scales come on top."""
        geo = self.geometry(key)
        kv_tile = geo.tile_n * key.head_dim  # elements of one K or V tile
        q_bytes = 2 * self.q_stages * geo.tile_m * key.head_dim
        if self.q_e4m3_parts and key.fp8_kv:
            split_q = self.q_e4m3_parts * geo.tile_m * key.head_dim + 4 * geo.tile_m
            return q_bytes + split_q + kv_tile * (KV_STAGES + 2 * KV_STAGES + staging_stages)
        return q_bytes + 2 * 2 * kv_tile * KV_STAGES + 2 * kv_tile * staging_stages

    def staging_stages(self, key: KernelKey) -> int:
        """fp8 cache: slots of the fp8 staging ring per tensor, 2 where shared memory allows
        (TMA of the next tile overlaps the conversion of this one), else 1; 0 for a 16-bit
        cache (no ring)."""
        if not key.fp8_kv:
            return 0
        fits = self._smem_bytes(key, 2) <= SMEM_BYTES - 1024
        return 2 if fits else 1

    # ---- what follows from the fields (read by the kernel and the launch) ----
    @property
    def persistent(self) -> bool:
        """A persistent grid (min(tiles, SMs) CTAs, a tile counter per launch)."""
        return self.tiles is not Tiles.ONE_PER_CTA

    @property
    def turns(self) -> int:
        """Consumer warpgroups taking turns at the tensor pipe (barriers.py): every one with
        an overlapped step (ping-pong), none with the serial one or `overlap_free`."""
        unturned = (BlockStep.SERIAL, BlockStep.OVERLAP_FREE)
        return 0 if self.block_step in unturned else self.mma_wgs

    @property
    def q_stages(self) -> int:
        """Q buffers in shared memory: 2 with `q_tma` (the ring), else 1."""
        return 2 if self.q_load is QLoad.TMA else 1

    @property
    def q_e4m3_parts(self) -> int:
        """Q's e4m3 parts in shared memory on an FP8 cache's Q K^T: hi and lo (`fp8_qk`), hi
        alone (`fp8_qk_rounded`), none where K is converted."""
        return {Fp8Qk.CONVERTED_K: 0, Fp8Qk.SPLIT_Q: 2, Fp8Qk.ROUNDED_Q: 1}[self.fp8_qk]

    def box_n(self, key: KernelKey) -> int:
        """Rows per K/V TMA box: one page, or a tile-sized slice of a larger page."""
        return min(key.page_size, self.geometry(key).tile_n)

    # Reading pages a block ahead keeps two blocks' pages and the next read live across the
    # acquires: at 24 registers the producer's block loop spills (2 per block at page 16), so
    # it takes 16 from the consumers (the head-dim-128 picks use 210 of their 232).
    # With 3 consumer warpgroups the 64 K registers split 32 / 160 (128 * producer + 384 *
    # consumer <= 65536), pages ahead included: 32 hold the producer's loop without local
    # memory, and at 40 / 152 the consumers spilled P and ptxas serialized every wgmma
    # (session 14, head dim 64: -10 to -20 %, docs/perf-notes.md).
    @property
    def producer_regs(self) -> int:
        return self._register_split(self.page_read is PageRead.BLOCK_AHEAD, fp8=False)[0]

    @property
    def mma_regs(self) -> int:
        return self._register_split(self.page_read is PageRead.BLOCK_AHEAD, fp8=False)[1]

    def register_split(self, key: KernelKey) -> tuple[int, int]:
        """(producer, consumer) registers per thread for ``key``'s kernel. An fp8 cache's
        converter warps (fp8_kv.py: a piece's 4 + 8 words, the loop's addresses and the
        four pipeline states) take the larger producer share, as reading pages ahead does
        on two consumer warpgroups."""
        return self._register_split(self.page_read is PageRead.BLOCK_AHEAD, fp8=key.fp8_kv)

    def _register_split(self, pages_ahead: bool, fp8: bool) -> tuple[int, int]:
        if self.mma_wgs == 3:
            return (40, 152) if fp8 else (32, 160)
        return (40, 232) if pages_ahead or fp8 else (24, 240)

    @property
    def num_threads(self) -> int:
        return 128 * (self.mma_wgs + 1)


_FIELD_OF = {
    Tiles: "tiles",
    BlockStep: "block_step",
    QLoad: "q_load",
    KvBox: "kv_box",
    PageRead: "page_read",
    Epilogue: "epilogue",
    Fp8Qk: "fp8_qk",
    KvShare: "kv_share",
}


def _int_value(name: str, text: str, token: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"vllm_fa4: {name} takes an integer, got {token!r}") from None


DEFAULT_CONFIG = KernelConfig()  # queue+overlap
# The debug baseline: one tile per CTA, the serial block step, nothing overlapped.
DEBUG_BASELINE = KernelConfig(tiles=Tiles.ONE_PER_CTA, block_step=BlockStep.SERIAL)
