"""SM90 (Hopper) paged, varlen, causal GQA prefill forward kernel in CuTe-DSL.

One CTA per work tile (batch, kv_head, m_block), or on a persistent grid min(tiles, SMs)
CTAs that take tiles of the ordered list as they become free. 1 + `mma_wgs` warpgroups:
  WG0  producer: warp 0 issues per-page K/V TMA boxes into a two-stage ring
       (one PipelineTmaAsync for K, one for V), registers lowered to `producer_regs`.
  WG1 .. consumers (2, or 3 at head dim 64): 64 packed (token, q-head) rows each; Q rows
       loaded by cp.async (or by the producer's TMA), then per KV block (last block first):
       S = Q K^T (SS wgmma), causal mask on the diagonal blocks, online softmax (exp2),
       O += P V (RS wgmma, P from registers). Epilogue: normalize, store O and LSE.

The config's axes (kernels/config.py describes each value) and where they live here:
  tiles       tile_walk picks walk_one_tile (ONE_PER_CTA), walk_queue (QUEUE:
              TileQueue.claim/publish/receive) or walk_queue_work (QUEUE_WITH_WORK);
              walk_v_loads (v_warp)
  q_load      load_q / issue_q (CP_ASYNC), prefetch_next_q (PREFETCH), issue_q_boxes and
              free_q_stage (TMA: the consumer's tile body exists once per Q stage)
  block_step  consume's serial loop (SERIAL) or overlap_step (OVERLAP, OVERLAP_PV_WAIT_MID,
              OVERLAP_FREE); ping-pong turns (barriers.py) with every overlapped step but
              OVERLAP_FREE
  kv_box      make_kv_tma, _kv_source (WIDE: paged_kv.slot_view, kv_smem_order)
  page_read   _block_pages (BLOCK_AHEAD: paged_kv.read_block_pages)
  epilogue    epilogue.write_output (STAGED: through the warpgroup's slice of sQ)
  lazy_max    rescale_o and the softmax steps
"""

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple, Optional

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as cutlass_utils
import cutlass.utils.hopper_helpers as sm90_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.utils import LayoutEnum

from vllm_fa4.kernels.barriers import turn_pass, turn_wait, turns_begin, wg_sync
from vllm_fa4.kernels.config import (
    KV_STAGES,
    BlockStep,
    Epilogue,
    Fp8Qk,
    KernelConfig,
    KernelKey,
    KvBox,
    PageRead,
    QLoad,
    TileProbe,
    Tiles,
    grid_shift_keys,
)
from vllm_fa4.kernels.epilogue import write_output
from vllm_fa4.kernels.fp8_kv import (
    Converter,
    KvStaging,
    convert_block,
    converter_warps,
    halves,
    row_scale_pow2,
    split_pair,
)
from vllm_fa4.kernels.mask import apply_causal_mask
from vllm_fa4.kernels.paged_kv import (
    D_CHUNK,
    block_first_key,
    issue_paged_tile,
    kv_smem_order,
    load_paged_tile,
    partition_pool_tiles,
    partition_slot_boxes,
    pool_view,
    read_block_pages,
    slot_view,
    wide_box_coords,
)
from vllm_fa4.kernels.regs import computed_here
from vllm_fa4.kernels.softmax import (
    LOG2_E,
    acc_as_operand_a,
    acc_rows_view,
    rescale_needed,
    scale_rows,
    softcap_for,
    softmax_head,
    softmax_rest,
    softmax_step,
)
from vllm_fa4.kernels.tile_scheduler import (
    TILE_QUEUE_STAGES,
    ClaimHandoff,
    TileQueue,
    WorkList,
    queue_work_words,
    tile_work,
)

CUTLASS_DTYPES = {"bfloat16": cutlass.BFloat16, "float16": cutlass.Float16}


@cute.jit
def _wgmma(
    tiled_mma: cute.TiledMma,
    acc: cute.Tensor,
    tA: cute.Tensor,
    tB: cute.Tensor,
    zero_init: cutlass.Constexpr[bool],
    wait: cutlass.Constexpr[int],
):
    """Issue one warpgroup GEMM over all k slices; wait < 0 leaves it in flight. `tA` may be
    a tuple of A operands (`fp8_qk`'s Q halves): their products accumulate, one group."""
    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    parts = tA if isinstance(tA, tuple) else (tA,)
    for k in cutlass.range_constexpr(cute.size(parts[0].shape[2])):
        for part in parts:  # hi then lo on the same K slice
            cute.gemm(atom, acc, part[None, None, k], tB[None, None, k], acc)
            atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
    if cutlass.const_expr(wait >= 0):
        warpgroup.wait_group(wait)


@dataclass
class QTmaLoad:
    """What the producer needs to load Q with TMA (`q_tma`)."""

    atom: cute.CopyAtom
    mQ_tma: cute.Tensor  # (G, total_q, D, Hkv) coordinates
    sQ: cute.Tensor  # (tile_m, D, q_stages)
    empty: cute.Pointer  # q_stages mbarriers: the consumers are done with the stage


@dataclass
class OTmaStore:
    """What a consumer warpgroup needs to store O with TMA (`tma_epilogue`)."""

    atom: cute.CopyAtom
    mO_tma: cute.Tensor  # (G, total_q, D, Hkv) coordinates


@dataclass
class KvPool:
    """The K/V cache pool's runtime sizes the producer's loads need."""

    num_blocks: Int32  # cache blocks (a box aimed at this block is past the end: zero fill)
    boxes_per_block: Optional[Int32]  # `wide_box`: slot boxes per cache block, else None


@dataclass
class KvSource:
    """Where one of K and V comes from and goes to: its pipeline, TMA atom and partitioned
    views (partition_pool_tiles, or with `wide_box` partition_slot_boxes)."""

    pipe: pipeline.PipelineTmaAsync
    atom: cute.CopyAtom
    smem: cute.Tensor
    gmem: cute.Tensor
    boxes_per_block: Optional[Int32]  # `wide_box`: slot boxes per cache block, else None


class ProducerArgs(NamedTuple):
    """What the K/V producer warp's produce takes besides the tile and its pipeline state."""

    mPageTable: cute.Tensor
    mK_tma: cute.Tensor
    mV_tma: cute.Tensor
    tma_atom_K: cute.CopyAtom
    tma_atom_V: cute.CopyAtom
    sK: cute.Tensor
    sV: cute.Tensor
    pool: KvPool
    pipe_k: pipeline.PipelineTmaAsync
    pipe_v: pipeline.PipelineTmaAsync


class VLoadArgs(NamedTuple):
    """What the V warp's produce_v takes besides the tile and its pipeline state (`v_warp`)."""

    mPageTable: cute.Tensor
    mV_tma: cute.Tensor
    tma_atom_V: cute.CopyAtom
    sV: cute.Tensor
    pool: KvPool
    pipe_v: pipeline.PipelineTmaAsync


F16_MAX = 65504.0  # fp16's largest finite value (convert_q saturates Q there)


class ConsumerArgs(NamedTuple):
    """What a consumer warpgroup's consume takes besides the tile and its pipeline state."""

    mQ: cute.Tensor
    mO: cute.Tensor
    mLSE: Optional[cute.Tensor]
    sQ: cute.Tensor
    sK: cute.Tensor
    sV: cute.Tensor
    tiled_mma_qk: cute.TiledMma
    tiled_mma_pv: cute.TiledMma
    pipe_k: pipeline.PipelineTmaAsync
    pipe_v: pipeline.PipelineTmaAsync
    mSinks: Optional[cute.Tensor]  # key.sinks only
    window_left: Optional[Int32]  # key.sliding_window only
    softcap_prescale: Optional[Float32]  # key.softcap only
    scale_log2: Float32
    tidx: Int32  # the thread's index among the consumer threads
    o_scale: Optional[Float32]  # an fp8 cache's v_scale, applied to O (else None)
    sQ_mma: Optional[cute.Tensor]  # `q_converts`: sQ typed as the GEMMs read it (else None)
    q_split: Optional[tuple]  # `fp8_qk`: (sQ8 (tile_m, D, 2) e4m3 halves, row scales)
    # TileProbe.STAMP_TIMES: work_tiles, whose row blockIdx.x sums the tiles' phases (else None)
    probe_rows: Optional[cute.Tensor] = None


class SoftmaxArgs(NamedTuple):
    """What every block's softmax takes besides S (softmax_block's arguments, in order)."""

    tScS: cute.Tensor  # S's (row, column) coordinates, for the mask
    work: object  # the tile's TileWork
    diag: Int32  # k_len - q_len: the causal diagonal's key offset
    row_max: cute.Tensor
    row_sum: cute.Tensor
    row_scale: cute.Tensor  # the block's O factors
    scale_log2: Float32
    feats: tuple  # (window_left, softcap_prescale)


@dataclass
class BlockGemms:
    """One consumer warpgroup's operands of a K/V block's two GEMMs: the MMAs, K and V^T over
    the K/V stages, P (the P V A operand, from registers) and the O accumulator."""

    mma_qk: cute.TiledMma
    mma_pv: cute.TiledMma
    thr_pv: cute.TiledMma  # this thread's slice of mma_pv (the epilogue's O coordinates)
    tSrQ: object  # (...), with `q_tma` (..., q stage), with `fp8_qk` (hi, lo)
    tSrK: cute.Tensor  # (..., kv stage)
    tOrVt: cute.Tensor  # (..., kv stage)
    tOrP: cute.Tensor
    acc_O: cute.Tensor
    tScS: cute.Tensor  # identity coordinates of S in this thread's accumulator layout


class Sm90PagedPrefill:
    def __init__(self, key: KernelKey, cfg: KernelConfig, has_lse: bool):
        self.key = key
        self.cfg = cfg
        self.has_lse = has_lse
        self.dtype = CUTLASS_DTYPES[key.dtype]
        self.head_dim = key.head_dim
        # Query heads a tile holds: the GQA group, or half of it where tiles pair up
        # (KvShare), whose work rows name virtual KV heads 2h and 2h + 1 (K/V read head h).
        self.qhead_per_kvhead = cfg.heads_per_tile(key)
        self.paired_heads = cfg.paired_heads
        self.kv_multicast = cfg.kv_multicast
        geometry = cfg.geometry(key)
        self.tile_m = geometry.tile_m
        self.tile_n = geometry.tile_n
        self.tokens_per_tile = geometry.tokens_per_tile
        self.box_n = cfg.box_n(key)
        self.page_size = key.page_size
        # (tile_n, box_n, page_size): the trailing arguments of the paged_kv helpers
        self.paged_tile_geometry = (self.tile_n, self.box_n, self.page_size)
        # A window's tiles shift their block grid by whole pages where a page is shorter
        # than a block (tile_scheduler.tile_work).
        self.shift_keys = grid_shift_keys(key, self.tile_n)
        self.stages = KV_STAGES
        # An fp8 cache: TMA fills a staging ring of fp8 tiles that converter warps turn
        # into the 16-bit K/V stages (fp8_kv.py); the TMA ring is the staging ring then.
        self.fp8_kv = key.fp8_kv
        self.cache_dtype = cutlass.Float8E4M3FN if key.fp8_kv else self.dtype
        # The GEMMs' dtype: the model's, except for a bf16 model with an fp8 cache, whose
        # GEMMs run in fp16. e4m3 -> fp16 is one F2FP per pair (-> bf16 took four
        # instructions and the converter warps bound the kernel, docs/perf-notes.md); every
        # e4m3 value is exact in fp16, P in [0, 2^8] keeps more bits, and Q is converted in
        # shared memory once per tile (convert_q). Q and O stay in the model's dtype.
        self.mma_dtype = self.dtype
        if key.fp8_kv and self.dtype is cutlass.BFloat16:
            self.mma_dtype = cutlass.Float16
        # `fp8_qk` / `fp8_qk_rounded`: S = Q K^T on FP8 wgmma from the staged e4m3 K; Q split
        # into two e4m3 halves once a tile (split_q), K never converted.
        self.fp8_qk = key.fp8_kv and cfg.fp8_qk is not Fp8Qk.CONVERTED_K
        # Q's e4m3 parts read: hi and lo (`fp8_qk`) or hi alone (rounded: lo computed, not kept)
        self.q_parts = cfg.q_e4m3_parts
        self.qk_dtype = self.cache_dtype if self.fp8_qk else self.mma_dtype
        self.q_converts = self.mma_dtype is not self.dtype and not self.fp8_qk
        self.staging_stages = cfg.staging_stages(key)
        self.load_stages = self.staging_stages or KV_STAGES
        self.converter_warps = converter_warps(cfg.v_warp) if key.fp8_kv else ()
        self.converter_threads = 32 * len(self.converter_warps)
        self.producer_regs, self.mma_regs = cfg.register_split(key)
        self.num_mma_threads = 128 * cfg.mma_wgs
        self.turns = cfg.turns  # warpgroups taking turns (barriers.py): ping-pong
        # What the config's axes mean for this kernel, decided once.
        self.q_tma = cfg.q_load is QLoad.TMA
        self.q_prefetch = cfg.q_load is QLoad.PREFETCH
        self.stamps_times = cfg.tile_probe is TileProbe.STAMP_TIMES
        self.queue_work = cfg.tiles is Tiles.QUEUE_WITH_WORK
        self.overlap = cfg.block_step is not BlockStep.SERIAL
        self.pv_wait_mid = cfg.block_step is BlockStep.OVERLAP_PV_WAIT_MID
        self.wide_box = cfg.kv_box is KvBox.WIDE
        self.pages_ahead = cfg.page_read is PageRead.BLOCK_AHEAD
        self.staged_epilogue = cfg.epilogue is Epilogue.STAGED
        self.tma_epilogue = cfg.epilogue is Epilogue.TMA
        # O is staged in this tile's rows of sQ (with q_tma: its Q stage, freed after O)
        self.o_in_q_stage = cfg.epilogue in (Epilogue.STAGED, Epilogue.TMA)
        # `queue_work`: the TileWork fields a tile-queue slot carries after the tile index
        self.queue_work_words = queue_work_words(
            self.queue_work, key.sliding_window, bool(self.shift_keys)
        )
        assert self.tile_n % self.box_n == 0 and self.head_dim % D_CHUNK == 0

    # ---------------------------------------------------------------- host-side helpers
    def _smem_layout(
        self, rows: int, cols: int, stages: Optional[int] = None, kv: bool = False, dtype=None
    ):
        """A swizzled (rows, cols[, stages]) tile of `dtype` (the model's by default); `kv`: a
        K/V tile, whose atoms follow kv_smem_order (`wide_box`). An fp8 tile's atoms are one
        TMA box (64 columns, 64-byte swizzle) wide, as a 16-bit tile's are."""
        dtype = self.dtype if dtype is None else dtype
        atom_cols = cols if dtype.width == 16 else D_CHUNK
        atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, dtype, atom_cols), dtype
        )
        wide = kv and self.wide_box
        if stages is None:
            return cute.tile_to_shape(atom, (rows, cols), kv_smem_order(wide, False))
        return cute.tile_to_shape(atom, (rows, cols, stages), kv_smem_order(wide, True))

    def make_kv_tma(self, mX: cute.Tensor, tma_op, boxes_per_block):
        """TMA atom and coordinate tensor of a K or V pool: per-chunk boxes over
        (row_in_page, D, head, page), or with `wide_box` whole-row boxes over the slots."""
        if not self.wide_box:
            box_layout = self._smem_layout(self.box_n, D_CHUNK, dtype=self.cache_dtype)
            return cpasync.make_tiled_tma_atom(
                tma_op, pool_view(mX), box_layout, (self.box_n, D_CHUNK)
            )
        coords = wide_box_coords(self.box_n, self.head_dim, self.box_n)
        box_layout = cute.composition(self._smem_layout(self.box_n, self.head_dim, kv=True), coords)
        view = slot_view(mX, self.box_n, boxes_per_block)
        return cpasync.make_tiled_tma_atom(tma_op, view, box_layout, coords.shape)

    def _storage_cls(self, sQ_layout, sK_layout, sV_layout, staging_layout=None, sQ8_layout=None):
        """The shared-memory struct: mbarriers (K, V, then the tile queue's, Q's and the fp8
        staging rings' where the kernel has them) in the first 1 KB, then sQ, sK, sV (and the
        fp8 sK8, sV8; with `fp8_qk` sK is fp8, there is no sK8, and Q's halves sQ8 and row
        scales q_row_scale follow) on 1 KB boundaries."""
        dt, stages = self.dtype, self.stages
        mem, align = cute.struct.MemRange, cute.struct.Align
        fields = {
            "mbar_k": mem[cutlass.Int64, stages * 2],
            "mbar_v": mem[cutlass.Int64, stages * 2],
        }
        if self.cfg.persistent:  # the tile queue's ring
            fields["mbar_queue"] = mem[cutlass.Int64, TILE_QUEUE_STAGES * 2]
            words = 1 + len(self.queue_work_words)
            fields["queue_slots"] = mem[cutlass.Int32, TILE_QUEUE_STAGES * words]
        if self.kv_multicast:  # ClaimHandoff's mbarriers (full, empty), its slot
            fields["mbar_claim"] = mem[cutlass.Int64, 2]
            fields["claim_slot"] = align[mem[cutlass.Int32, 4], 16]
        if self.q_tma:
            fields["mbar_q_empty"] = mem[cutlass.Int64, self.cfg.q_stages]
        staged = ("sV8",) if self.fp8_qk else ("sK8", "sV8")
        if self.fp8_kv:
            for name in staged:
                fields["mbar_" + name[1:].lower()] = mem[cutlass.Int64, self.staging_stages * 2]
        fields["sQ"] = align[mem[dt, cute.cosize(sQ_layout)], 1024]
        k_dtype = self.cache_dtype if self.fp8_qk else self.mma_dtype
        for name, layout, dtype in (("sK", sK_layout, k_dtype), ("sV", sV_layout, self.mma_dtype)):
            fields[name] = align[mem[dtype, cute.cosize(layout)], 1024]
        if self.fp8_kv:
            for name in staged:
                fields[name] = align[mem[self.cache_dtype, cute.cosize(staging_layout)], 1024]
        if self.fp8_qk:
            fields["sQ8"] = align[mem[self.cache_dtype, cute.cosize(sQ8_layout)], 1024]
            fields["q_row_scale"] = align[mem[Float32, self.tile_m], 16]
        return cute.struct(type("Storage", (), {"__annotations__": fields}))

    def qk_mma(self, n: int):
        """The S = Q K^T tiled MMA over n keys: 64 x n per consumer warpgroup, both operands
        K-major from shared memory."""
        major = cute.nvgpu.OperandMajorMode.K
        wgs = (self.cfg.mma_wgs, 1, 1)
        return sm90_utils.make_trivial_tiled_mma(
            self.qk_dtype, self.qk_dtype, major, major, Float32, wgs, (64, n)
        )

    def q_boxes_in_tile(self):
        """(G heads, T tokens, 64 of D, chunk, stage) -> element of the Q ring (tile_m, D,
        stages): row h + G * t, so tile row r is token r // G, head r % G, as the cp.async
        loads place them (rows G * T .. tile_m are never written). Its first three modes are
        one TMA box, one 64-column chunk of a stage."""
        g, t, m = self.qhead_per_kvhead, self.tokens_per_tile, self.tile_m
        shape = (g, t, D_CHUNK, self.head_dim // D_CHUNK, self.cfg.q_stages)
        return cute.make_layout(shape, stride=(1, g, m, m * D_CHUNK, m * self.head_dim))

    def q_box_layout(self):
        """The swizzled shared-memory layout of one Q box (q_boxes_in_tile's first modes)."""
        box = cute.select(self.q_boxes_in_tile(), mode=[0, 1, 2])
        return cute.composition(self._smem_layout(self.tile_m, D_CHUNK), box)

    def grouped_rows(self, mX: cute.Tensor) -> cute.Tensor:
        """Q or O ([total_q, Hq, D]) viewed as (G, total_q, D, Hkv): a KV head's G query heads
        side by side, as a packed M tile holds them (the TMA view of `q_tma`, `tma_epilogue`)."""
        g = self.qhead_per_kvhead
        s_tok, s_head, s_d = mX.layout.stride
        view = cute.make_layout(
            (g, mX.shape[0], mX.shape[2], mX.shape[1] // g),
            stride=(s_head, s_tok, s_d, s_head * g),
        )
        return cute.make_tensor(mX.iterator, view)

    def make_q_tma(self, mQ: cute.Tensor, tma_op):
        """TMA atom and coordinate tensor of Q viewed as (G, total_q, D, Hkv): a box of G
        heads x T tokens x 64 columns is one 64-column chunk of a packed M tile."""
        box = (self.qhead_per_kvhead, self.tokens_per_tile, D_CHUNK)
        return cpasync.make_tiled_tma_atom(tma_op, self.grouped_rows(mQ), self.q_box_layout(), box)

    def o_boxes_in_tile(self):
        """(G heads, T tokens, 64 of D, chunk, warpgroup) -> element of sQ (tile_m, D), T = 64 / G:
        a warpgroup's 64 rows (token r // G, head r % G) of one 64-column chunk are one TMA
        box (`tma_epilogue`), laid out as q_boxes_in_tile lays out Q's."""
        g, m = self.qhead_per_kvhead, self.tile_m
        shape = (g, 64 // g, D_CHUNK, self.head_dim // D_CHUNK, self.cfg.mma_wgs)
        return cute.make_layout(shape, stride=(1, g, m, m * D_CHUNK, 64))

    def make_o_tma(self, mO: cute.Tensor):
        """TMA store atom and coordinate tensor of O viewed as (G, total_q, D, Hkv): a box of
        G heads x 64 / G tokens x 64 columns is one chunk of a warpgroup's rows."""
        g = self.qhead_per_kvhead
        box = (g, 64 // g, D_CHUNK)
        box_layout = cute.composition(
            self._smem_layout(64, D_CHUNK), cute.make_layout(box, stride=(1, g, 64))
        )
        return cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), self.grouped_rows(mO), box_layout, box
        )

    def box_partition(self, atom, mX_tma, s_boxes, work, tok0, tokens: int):
        """(shared, global) TMA partitions of a tile's boxes of `tokens` tokens from packed
        token `tok0` of its KV head; `s_boxes` maps (G, tokens, 64 of D, chunk, ...) into
        shared memory. Each side is (box, chunk[, ...])."""
        g = self.qhead_per_kvhead
        gX = cute.domain_offset((0, tok0, 0), mX_tma[None, None, None, work.kv_head])
        gX = cute.local_tile(gX, (g, tokens, D_CHUNK), (0, 0, None))  # (G, T, 64, chunk)
        return cpasync.tma_partition(
            atom,
            0,
            cute.make_layout(1),
            cute.group_modes(s_boxes, 0, 3),
            cute.group_modes(gX, 0, 3),
        )

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # [total_q, Hq, D]
        mK: cute.Tensor,  # [num_blocks, page, Hkv, D] (strided)
        mV: cute.Tensor,
        mO: cute.Tensor,  # [total_q, Hq, D]
        mLSE: Optional[cute.Tensor],  # [Hq, total_q] fp32
        mCuSeqlensQ: cute.Tensor,  # [B+1] int32
        mSeqUsedK: cute.Tensor,  # [B] int32
        mPageTable: cute.Tensor,  # [B, max_pages] int32
        mWorkTiles: cute.Tensor,  # [num_tiles, 4] int32
        mTileCounters: Optional[cute.Tensor],  # [2] int32, zero at launch; `persistent` only
        mSinks: Optional[cute.Tensor],  # [Hq] fp32 sink logits; key.sinks only
        softmax_scale: Float32,
        num_ctas: Int32,  # persistent grid size, min(num_tiles, SMs); unused otherwise
        window_left: Int32,  # key.sliding_window: keys a row sees left of its diagonal
        softcap: Float32,  # key.softcap: the cap (> 0)
        v_scale: Float32,  # an fp8 cache's V scale (O *= v_scale); unused for 16-bit caches
        stream,
    ):
        q_stages = self.cfg.q_stages if self.q_tma else None
        sQ_layout = self._smem_layout(self.tile_m, self.head_dim, q_stages)
        k_dtype = self.cache_dtype if self.fp8_qk else None
        sK_layout = self._smem_layout(
            self.tile_n, self.head_dim, self.stages, kv=True, dtype=k_dtype
        )
        sV_layout = self._smem_layout(self.tile_n, self.head_dim, self.stages, kv=True)
        staging_layout = None
        if cutlass.const_expr(self.fp8_kv):
            staging_layout = self._smem_layout(
                self.tile_n, self.head_dim, self.staging_stages, kv=True, dtype=self.cache_dtype
            )
        sQ8_layout, q8 = None, self.cache_dtype  # Q's e4m3 parts (tile_m, D, q_parts: hi, lo)
        if cutlass.const_expr(self.fp8_qk):
            sQ8_layout = self._smem_layout(self.tile_m, self.head_dim, self.q_parts, dtype=q8)
        self.storage_cls = self._storage_cls(
            sQ_layout, sK_layout, sV_layout, staging_layout, sQ8_layout
        )

        kv_boxes_per_block = None
        if cutlass.const_expr(self.wide_box):
            # Checked on the host (prefill_forward): the block stride is a whole number of
            # boxes of token slots. K and V share strides.
            s_blk, s_tok = mK.layout.stride[0], mK.layout.stride[1]
            kv_boxes_per_block = Int32(s_blk // (s_tok * self.box_n))
        tma_op = cpasync.CopyBulkTensorTileG2SOp()
        kv_op = tma_op
        if cutlass.const_expr(self.kv_multicast):
            kv_op = cpasync.CopyBulkTensorTileG2SMulticastOp()
        tma_atom_K, mK_tma = self.make_kv_tma(mK, kv_op, kv_boxes_per_block)
        tma_atom_V, mV_tma = self.make_kv_tma(mV, kv_op, kv_boxes_per_block)

        tma_atom_Q, mQ_tma = None, None
        if cutlass.const_expr(self.q_tma):
            tma_atom_Q, mQ_tma = self.make_q_tma(mQ, tma_op)
        tma_atom_O, mO_tma = None, None
        if cutlass.const_expr(self.tma_epilogue):
            tma_atom_O, mO_tma = self.make_o_tma(mO)

        mma_layout = (self.cfg.mma_wgs, 1, 1)
        tiled_mma_qk = self.qk_mma(self.tile_n)
        tiled_mma_pv = sm90_utils.make_trivial_tiled_mma(
            self.mma_dtype,
            self.mma_dtype,
            cute.nvgpu.OperandMajorMode.K,
            cute.nvgpu.OperandMajorMode.MN,
            Float32,
            mma_layout,
            (64, self.head_dim),
            a_source=warpgroup.OperandSource.RMEM,
        )
        # Features the key leaves out reach the kernel as None (compile-time: no code).
        softcap_prescale = None
        if cutlass.const_expr(self.key.softcap):
            # tanh(S * scale / cap) in the kernel; the cap multiplies back in log2 space.
            softcap_prescale = softmax_scale / softcap
            scale_log2 = softcap * Float32(LOG2_E)
        else:
            scale_log2 = softmax_scale * Float32(LOG2_E)
        window = window_left if cutlass.const_expr(self.key.sliding_window) else None
        sinks = mSinks if cutlass.const_expr(self.key.sinks) else None
        o_scale = v_scale if cutlass.const_expr(self.fp8_kv) else None
        self.kernel(
            mQ,
            mO,
            mLSE,
            mCuSeqlensQ,
            mSeqUsedK,
            mPageTable,
            mWorkTiles,
            mTileCounters,
            mK_tma,
            mV_tma,
            tma_atom_K,
            tma_atom_V,
            mQ_tma,
            tma_atom_Q,
            mO_tma,
            tma_atom_O,
            mK.shape[0],
            kv_boxes_per_block,
            scale_log2,
            sinks,
            window,
            softcap_prescale,
            o_scale,
            sQ_layout,
            sK_layout,
            sV_layout,
            staging_layout,
            sQ8_layout,
            tiled_mma_qk,
            tiled_mma_pv,
        ).launch(
            grid=[num_ctas if self.cfg.persistent else mWorkTiles.shape[0], 1, 1],
            block=[self.cfg.num_threads, 1, 1],
            stream=stream,
            min_blocks_per_mp=1,
            **({"cluster": [2, 1, 1]} if self.kv_multicast else {}),
        )

    # ---------------------------------------------------------------- device code
    @cute.kernel
    def kernel(
        self,
        # global memory: Q, O, LSE (or None), the requests' lengths, the page table, the
        # work list and (persistent) the tile counters
        mQ,
        mO,
        mLSE,
        mCuSeqlensQ,
        mSeqUsedK,
        mPageTable,
        mWorkTiles,
        mTileCounters,
        # TMA views and atoms: the K/V pools, Q (q_tma; else None), O (tma_epilogue; else None)
        mK_tma,
        mV_tma,
        tma_atom_K,
        tma_atom_V,
        mQ_tma,
        tma_atom_Q,
        mO_tma,
        tma_atom_O,
        # scalars; the model features' operands are None where the key has none
        num_blocks: Int32,
        kv_boxes_per_block,  # `wide_box`: slot boxes per cache block (else None)
        scale_log2: Float32,
        mSinks,
        window_left,
        softcap_prescale,
        o_scale,  # an fp8 cache's v_scale (else None)
        # shared-memory layouts and the two GEMMs' tiled MMAs (compile time)
        sQ_layout,
        sK_layout,
        sV_layout,
        staging_layout,  # an fp8 cache's staging ring (else None)
        sQ8_layout,  # `fp8_qk`: Q's e4m3 halves (else None)
        tiled_mma_qk,
        tiled_mma_pv,
    ):
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_atom_K)
            cpasync.prefetch_descriptor(tma_atom_V)
            if cutlass.const_expr(tma_atom_Q is not None):
                cpasync.prefetch_descriptor(tma_atom_Q)
            if cutlass.const_expr(tma_atom_O is not None):
                cpasync.prefetch_descriptor(tma_atom_O)

        storage = cutlass_utils.SmemAllocator().allocate(self.storage_cls)
        # K and V ride separate pipelines so S = QK^T can start before V lands: TMA ones,
        # or with an fp8 cache TMA staging ones feeding the converters' (make_fp8_pipelines).
        if cutlass.const_expr(self.fp8_qk):
            load_k, load_v, pipe_k, pipe_v = self.make_split_q_pipelines(storage)
        elif cutlass.const_expr(self.fp8_kv):
            load_k, load_v, pipe_k, pipe_v = self.make_fp8_pipelines(storage)
        else:
            # consumer_release arrives once per warp (lane 0), so count warps; with
            # `kv_multicast` each warp also frees the partner CTA's stage (lane 1), whose
            # producer writes into this CTA's stages too.
            cluster = 2 if self.kv_multicast else 1
            mma_warps = pipeline.CooperativeGroup(
                pipeline.Agent.Thread, cluster * self.num_mma_threads // 32
            )
            pipe_k, pipe_v = self.make_tma_pipelines(storage.mbar_k, storage.mbar_v, mma_warps)
            load_k, load_v = pipe_k, pipe_v
        q_empty = None
        if cutlass.const_expr(self.q_tma):
            # Q's "full" is the tile's first K stage mbarrier (produce); "empty" takes one
            # arrive per consumer warp after the warp's last Q K^T.
            q_empty = storage.mbar_q_empty.data_ptr()
            if tidx == 0:
                for stage in cutlass.range_constexpr(self.cfg.q_stages):
                    cute.arch.mbarrier_init(q_empty + stage, self.num_mma_threads // 32)
        queue = None
        if cutlass.const_expr(self.cfg.persistent):
            pipe_queue = pipeline.PipelineAsync.create(
                barrier_storage=storage.mbar_queue.data_ptr(),
                num_stages=TILE_QUEUE_STAGES,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32),
                # every consumer thread arrives on "empty"; with `v_warp` the V warp's too,
                # with an fp8 cache the converters'
                consumer_group=pipeline.CooperativeGroup(
                    pipeline.Agent.Thread,
                    self.num_mma_threads + 32 * self.cfg.v_warp + self.converter_threads,
                ),
                defer_sync=True,
            )
            words = self.queue_work_words
            if cutlass.const_expr(words):
                slot_layout = cute.make_layout(
                    (TILE_QUEUE_STAGES, 1 + len(words)), stride=(1 + len(words), 1)
                )
            else:
                slot_layout = cute.make_layout(TILE_QUEUE_STAGES)
            slots = storage.queue_slots.get_tensor(slot_layout)
            num_ctas = cute.arch.grid_dim()[0]
            handoff = None  # `kv_multicast`: the cluster's claims, made by rank 0
            if cutlass.const_expr(self.kv_multicast):
                full = storage.mbar_claim.data_ptr()
                if tidx == 0:
                    cute.arch.mbarrier_init(full, 1)
                    cute.arch.mbarrier_init(full + 1, 1)
                rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
                handoff = ClaimHandoff(storage.claim_slot.data_ptr(), full, full + 1, rank)
            queue = TileQueue(
                *(mTileCounters, pipe_queue, slots, num_ctas),
                work_words=words,
                handoff=handoff,
            )
        pipeline.pipeline_init_arrive(self.cluster_shape())

        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sQ_mma = None  # `q_converts`: the same bytes as the GEMMs read them (fp16)
        if cutlass.const_expr(self.q_converts):
            sQ_mma = storage.sQ.get_tensor(
                sQ_layout.outer, swizzle=sQ_layout.inner, dtype=self.mma_dtype
            )
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sK_load, sV_load = sK, sV  # what the producer's TMA writes
        q_split = None  # `fp8_qk`: (Q's e4m3 halves, their row scales)
        if cutlass.const_expr(self.fp8_qk):
            sV_load = storage.sV8.get_tensor(staging_layout.outer, swizzle=staging_layout.inner)
            sQ8 = storage.sQ8.get_tensor(sQ8_layout.outer, swizzle=sQ8_layout.inner)
            q_split = (sQ8, storage.q_row_scale.get_tensor(cute.make_layout(self.tile_m)))
        elif cutlass.const_expr(self.fp8_kv):
            outer, inner = staging_layout.outer, staging_layout.inner
            sK_load = storage.sK8.get_tensor(outer, swizzle=inner)
            sV_load = storage.sV8.get_tensor(outer, swizzle=inner)

        tile_args = WorkList(
            mWorkTiles,
            mCuSeqlensQ,
            mSeqUsedK,
            mO.shape[0],
            self.tokens_per_tile,
            self.tile_n,
            window_left,
            self.shift_keys,
        )
        first_tile = cute.arch.block_idx()[0]
        pipeline.pipeline_init_wait(self.cluster_shape())

        if warp_idx < 4:
            cute.arch.setmaxregister_decrease(self.producer_regs)
            if warp_idx == 0:
                pool = KvPool(num_blocks, kv_boxes_per_block)
                prod_args = ProducerArgs(
                    *(mPageTable, mK_tma, mV_tma, tma_atom_K, tma_atom_V, sK_load, sV_load),
                    *(pool, load_k, load_v),
                )
                produce = self.produce
                if cutlass.const_expr(self.q_tma):
                    produce = partial(produce, q_load=QTmaLoad(tma_atom_Q, mQ_tma, sQ, q_empty))
                state = pipeline.make_pipeline_state(
                    pipeline.PipelineUserType.Producer, self.load_stages
                )
                walk = self.tile_walk()
                walk(produce, prod_args, state, tile_args, first_tile, queue, True)
            if cutlass.const_expr(self.cfg.v_warp):
                if warp_idx == 1:
                    pool = KvPool(num_blocks, kv_boxes_per_block)
                    v_args = VLoadArgs(mPageTable, mV_tma, tma_atom_V, sV_load, pool, load_v)
                    self.walk_v_loads(v_args, tile_args, queue)
            if cutlass.const_expr(self.fp8_kv):
                if warp_idx >= self.converter_warps[0]:
                    k_kv = None  # `fp8_qk`: K is read as staged
                    if cutlass.const_expr(not self.fp8_qk):
                        k_kv = KvStaging(load_k, sK_load, pipe_k, sK)
                    v_kv = KvStaging(load_v, sV_load, pipe_v, sV)
                    self.walk_conversions((k_kv, v_kv), tile_args, first_tile, queue)
        else:
            cute.arch.setmaxregister_increase(self.mma_regs)
            wg = cute.arch.make_warp_uniform((tidx - 128) // 128)
            turns_begin(self.turns, wg)  # once per CTA: turns alternate across tiles
            cons_args = ConsumerArgs(
                *(mQ, mO, mLSE, sQ, sK, sV, tiled_mma_qk, tiled_mma_pv, pipe_k, pipe_v),
                *(mSinks, window_left, softcap_prescale, scale_log2, tidx - 128, o_scale),
                sQ_mma,
                q_split,
                tile_args.work_tiles if cutlass.const_expr(self.stamps_times) else None,
            )
            consume = self.consume
            if cutlass.const_expr(self.q_tma):
                consume = partial(consume, q_empty=q_empty)
            if cutlass.const_expr(self.tma_epilogue):
                consume = partial(consume, o_tma=OTmaStore(tma_atom_O, mO_tma))
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            walk = self.tile_walk()
            walk(consume, cons_args, state, tile_args, first_tile, queue, False)
            if cutlass.const_expr(self.tma_epilogue):
                cute.arch.cp_async_bulk_wait_group(0, read=True)  # sQ outlives O's last stores
        if cutlass.const_expr(self.kv_multicast):
            # The partner's consumers arrive on this CTA's empty barriers until their last
            # block: neither CTA leaves before both are done.
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()

    def cluster_shape(self):
        """The cluster's (M, N) shape for the pipelines' init sync (None: no cluster)."""
        return cute.make_layout((2, 1)) if self.kv_multicast else None

    def cache_head(self, kv_head):
        """The K/V cache head of a work row's KV head (paired rows: virtual head // 2)."""
        return kv_head // 2 if self.paired_heads else kv_head

    def make_tma_pipelines(self, mbar_k, mbar_v, consumers):
        """K's and V's TMA pipelines over the load ring (transaction bytes of a cache tile)."""
        return tuple(self.make_tma_pipeline(b, consumers) for b in (mbar_k, mbar_v))

    def make_tma_pipeline(self, barriers, consumers):
        """One TMA pipeline over the load ring (transaction bytes of a cache tile)."""
        kv_bytes = self.tile_n * self.head_dim * (self.cache_dtype.width // 8)
        cluster = {}
        if self.kv_multicast:  # each CTA's stage gets its half and the partner's
            cluster = {"cta_layout_vmnk": cute.make_layout((1, 2, 1, 1))}
        return pipeline.PipelineTmaAsync.create(
            barrier_storage=barriers.data_ptr(),
            num_stages=self.load_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            consumer_group=consumers,
            tx_count=kv_bytes,
            defer_sync=True,
            **cluster,
        )

    def make_fp8_pipelines(self, storage):
        """An fp8 cache's four pipelines: K's and V's TMA staging rings (consumed by the
        converter warps, one release per warp) and K's and V's 16-bit stages
        (make_converted_pipeline)."""
        warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, len(self.converter_warps))
        load_k, load_v = self.make_tma_pipelines(storage.mbar_k8, storage.mbar_v8, warps)
        pipe_k = self.make_converted_pipeline(storage.mbar_k)
        pipe_v = self.make_converted_pipeline(storage.mbar_v)
        return load_k, load_v, pipe_k, pipe_v

    def make_split_q_pipelines(self, storage):
        """`fp8_qk`: K's TMA pipeline straight to the consumers (one release per warp, as for
        a 16-bit cache), V's as make_fp8_pipelines makes it: a TMA staging ring to the
        converter warps and 16-bit stages from them to the consumers."""
        mma_warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_threads // 32)
        warps = pipeline.CooperativeGroup(pipeline.Agent.Thread, len(self.converter_warps))
        pipe_k = self.make_tma_pipeline(storage.mbar_k, mma_warps)
        load_v = self.make_tma_pipeline(storage.mbar_v8, warps)
        return pipe_k, load_v, pipe_k, self.make_converted_pipeline(storage.mbar_v)

    def make_converted_pipeline(self, barriers):
        """16-bit stages the converter warps fill: "full" takes every converter thread's
        arrival, "empty" every consumer thread's (the consumers release from all threads)."""
        return pipeline.PipelineAsync.create(
            barrier_storage=barriers.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.converter_threads),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_threads),
            defer_sync=True,
        )

    @cute.jit
    def walk_conversions(self, kv, tile_args, first_tile: Int32, queue):
        """An fp8 cache's converter warps: every tile the consumers run, in the consumers'
        tile walk, converting its K/V blocks (convert)."""
        users = pipeline.PipelineUserType
        states = (
            pipeline.make_pipeline_state(users.Consumer, self.staging_stages),
            pipeline.make_pipeline_state(users.Producer, self.stages),
        )
        walk = self.tile_walk()
        walk(self.convert, kv, states, tile_args, first_tile, queue, False)

    @cute.jit
    def convert(self, work, kv, states, q_stage: cutlass.Constexpr[int] = 0):
        """One tile's K/V blocks, fp8 staging -> 16-bit stages, in the order the producer
        issues them (so in the consumers' order): overlapped, K_{j-1} before V_j; else K_j,
        V_j. `states` = (staging ring, 16-bit ring), K's; V's run one block behind with
        overlap. Returns the advanced states."""
        kv_k, kv_v = kv
        staged, stage = states
        tidx, _, _ = cute.arch.thread_idx()
        first = self.converter_warps[0]
        rank = cute.arch.make_warp_uniform(cute.arch.warp_idx()) - first
        me = Converter(tidx % 32, rank, len(self.converter_warps))
        n_count = work.n_block_max - work.n_block_min
        if cutlass.const_expr(kv_k is None):  # `fp8_qk`: V only, block by block
            for _ in cutlass.range(n_count, unroll=1):
                convert_block(kv_v, staged, stage, me)
                staged.advance()
                stage.advance()
        elif cutlass.const_expr(self.overlap):
            if n_count > 0:
                staged_v, stage_v = staged.clone(), stage.clone()
                convert_block(kv_k, staged, stage, me)
                staged.advance()
                stage.advance()
                for _ in cutlass.range(1, n_count, unroll=1):
                    convert_block(kv_k, staged, stage, me)
                    convert_block(kv_v, staged_v, stage_v, me)
                    staged.advance()
                    stage.advance()
                    staged_v.advance()
                    stage_v.advance()
                convert_block(kv_v, staged_v, stage_v, me)
        else:
            for _ in cutlass.range(n_count, unroll=1):
                convert_block(kv_k, staged, stage, me)
                convert_block(kv_v, staged, stage, me)
                staged.advance()
                stage.advance()
        return staged, stage

    def tile_walk(self):
        """The tile loop of the config's `tiles`, picked once (all take the same arguments:
        role, role_args, state, tile_args, first_tile, queue, is_producer)."""
        return {
            Tiles.ONE_PER_CTA: self.walk_one_tile,
            Tiles.QUEUE: self.walk_queue,
            Tiles.QUEUE_WITH_WORK: self.walk_queue_work,
        }[self.cfg.tiles]

    def q_ring_state(self, is_producer: bool):
        """`q_tma`: the producer's Q ring state, carried like its K/V state; else None."""
        if self.q_tma and is_producer:
            return pipeline.make_pipeline_state(
                pipeline.PipelineUserType.Producer, self.cfg.q_stages
            )
        return None

    @cute.jit
    def walk_one_tile(
        self,
        role,
        role_args,
        state,
        tile_args,
        first_tile: Int32,
        queue,
        is_producer: cutlass.Constexpr[bool],
    ):
        """ONE_PER_CTA: run one role (produce or consume) on the CTA's one tile (no queue)."""
        q_state = self.q_ring_state(is_producer)
        if cutlass.const_expr(not is_producer):
            if cutlass.const_expr(self.stamps_times):
                self._stamp_tile_start(tile_args.work_tiles, first_tile)
        if cutlass.const_expr(self.q_tma):
            work = self.tile_work_q_tma(tile_args, first_tile)
            if cutlass.const_expr(is_producer):
                role(work, role_args, state, q_state=q_state)
            else:
                role(work, role_args, state, q_stage=0)
                self._probe_tile_end(tile_args.work_tiles, first_tile)
        else:
            role(tile_work(*tile_args, first_tile), role_args, state)
            if cutlass.const_expr(not is_producer):
                self._probe_tile_end(tile_args.work_tiles, first_tile)

    @cute.jit
    def walk_queue(
        self,
        role,
        role_args,
        state,
        tile_args,
        first_tile: Int32,
        queue,
        is_producer: cutlass.Constexpr[bool],
    ):
        """QUEUE: run one role over `first_tile` and then the tiles the producer claims and
        `queue` hands out, carrying its pipeline state across them."""
        num_tiles = tile_args.work_tiles.shape[0]
        users = pipeline.PipelineUserType
        user = users.Producer if is_producer else users.Consumer
        q_state = self.q_ring_state(is_producer)
        tile = first_tile
        queue_state = pipeline.make_pipeline_state(user, TILE_QUEUE_STAGES)
        # Bound methods: the DSL's while would try to carry `queue` itself.
        claim, publish, receive = queue.claim, queue.publish, queue.receive
        if cutlass.const_expr(self.q_prefetch and not is_producer):
            mQ, sQ, tidx = role_args.mQ, role_args.sQ, role_args.tidx
            wg = cute.arch.make_warp_uniform(tidx // 128)
            if tile < num_tiles:  # a grid larger than the list (tests) has idle CTAs
                self.issue_q(tile_work(*tile_args, tile), mQ, sQ, tidx, wg)
        while tile < num_tiles:
            if cutlass.const_expr(is_producer):
                claimed = claim()  # in flight while this tile's loads issue
                if cutlass.const_expr(self.q_tma):
                    work = self.tile_work_q_tma(tile_args, tile)
                    state, q_state = role(work, role_args, state, q_state=q_state)
                else:
                    state = role(tile_work(*tile_args, tile), role_args, state)
                tile, queue_state = publish(claimed, queue_state)
            elif cutlass.const_expr(self.q_prefetch):
                done = tile
                if cutlass.const_expr(self.stamps_times):
                    self._stamp_tile_start(tile_args.work_tiles, done)
                state, tile, queue_state = role(
                    tile_work(*tile_args, tile),
                    role_args,
                    state,
                    receive,
                    queue_state,
                    tile_args,
                )
                self._probe_tile_end(tile_args.work_tiles, done)
            elif cutlass.const_expr(self.q_tma):
                # One copy of the tile per Q stage, so each reads its stage at a constant
                # address: a runtime stage index (or any Q pipeline state live across the
                # block loop) moves the wgmma descriptors out of the uniform registers, 4
                # R2UR in front of every wgmma, -2 to -7 % (session 9).
                for q_stage in cutlass.range_constexpr(self.cfg.q_stages):
                    if tile < num_tiles:
                        if cutlass.const_expr(self.stamps_times):
                            self._stamp_tile_start(tile_args.work_tiles, tile)
                        state = role(
                            self.tile_work_q_tma(tile_args, tile),
                            role_args,
                            state,
                            q_stage=q_stage,
                        )
                        self._probe_tile_end(tile_args.work_tiles, tile)
                        tile, queue_state = receive(queue_state)
            else:
                if cutlass.const_expr(self.stamps_times):
                    self._stamp_tile_start(tile_args.work_tiles, tile)
                state = role(tile_work(*tile_args, tile), role_args, state)
                self._probe_tile_end(tile_args.work_tiles, tile)
                tile, queue_state = receive(queue_state)
        if cutlass.const_expr(is_producer):
            queue.finish()

    @cute.jit
    def walk_queue_work(
        self,
        role,
        role_args,
        state,
        tile_args,
        first_tile: Int32,
        queue,
        is_producer: cutlass.Constexpr[bool],
    ):
        """QUEUE_WITH_WORK (with `q_tma`): the producer publishes every tile, the CTA's first
        included, with its TileWork; the consumers start each tile from the slot, without
        the two dependent global loads (work_tiles row, then the request's lengths) that
        would stand before its first block."""
        num_tiles = tile_args.work_tiles.shape[0]
        users = pipeline.PipelineUserType
        user = users.Producer if is_producer else users.Consumer
        q_state = self.q_ring_state(is_producer)
        queue_state = pipeline.make_pipeline_state(user, TILE_QUEUE_STAGES)
        publish_work, wait_tile, take_work = queue.publish_work, queue.wait_tile, queue.take_work
        tile = first_tile
        if cutlass.const_expr(is_producer):
            claim, next_tile = queue.claim, queue.next_tile
            last = num_tiles - 1  # a tile past the list (the consumers' stop) reads the last row
            work = self.tile_work_q_tma(tile_args, cutlass.min(tile, last))
            queue_state = publish_work(tile, work, queue_state)
            claims = Int32(0)  # ClaimHandoff's phase (`kv_multicast`)
            while tile < num_tiles:
                claimed = claim(claims)  # in flight while this tile's loads issue
                # `work` is the tile's, as published (carried from the previous publish).
                state, q_state = role(work, role_args, state, q_state=q_state)
                tile = next_tile(claimed, claims)
                claims += 1
                work = self.tile_work_q_tma(tile_args, cutlass.min(tile, last))
                queue_state = publish_work(tile, work, queue_state)
        else:
            tile = wait_tile(queue_state)
            while tile < num_tiles:
                # One copy of the tile per Q stage (constant addresses, see walk_queue).
                for q_stage in cutlass.range_constexpr(self.cfg.q_stages):
                    if tile < num_tiles:
                        if cutlass.const_expr(self.stamps_times):
                            self._stamp_tile_start(tile_args.work_tiles, tile)
                        # Its own name: `work` of the producer's branch would be carried.
                        received, queue_state = take_work(queue_state)
                        state = role(received, role_args, state, q_stage=q_stage)
                        self._probe_tile_end(tile_args.work_tiles, tile)
                        tile = wait_tile(queue_state)
        if cutlass.const_expr(is_producer):
            queue.finish()

    @cute.jit
    def tile_work_q_tma(self, tile_args, tile: Int32):
        """`q_tma`: the tile's TileWork, visiting at least one K/V block: Q arrives on the
        first K block's mbarrier and the consumers alternate Q stages tile by tile, so every
        tile must load one. The planner never makes a tile without rows; a hand-made list's
        empty tile then computes one block of rows it never stores."""
        work = tile_work(*tile_args, tile)
        work.n_block_max = cutlass.max(work.n_block_max, work.n_block_min + 1)
        return work

    @cute.jit
    def _probe_tile_end(self, mWorkTiles: cute.Tensor, tile: Int32):
        """The tile's end, for a test-only probe (TileProbe): the first consumer thread adds 1
        to the row's cost, or stamps its SM and %globaltimer_lo into columns 4 and 5."""
        probe = self.cfg.tile_probe
        if cutlass.const_expr(probe is not TileProbe.NONE):
            tidx, _, _ = cute.arch.thread_idx()
            if tidx == 128:
                row = mWorkTiles[tile, None].iterator
                if cutlass.const_expr(probe is TileProbe.COUNT_VISITS):
                    cute.arch.atomic_add(row + 3, Int32(1), sem="relaxed", scope="gpu")
                else:
                    stamps = cute.make_tensor(row + 4, cute.make_layout(2))
                    stamps[0] = cute.arch.smid()
                    stamps[1] = cute.arch.globaltimer_lo()

    @cute.jit
    def _stamp_tile_start(self, mWorkTiles: cute.Tensor, tile: Int32):
        """TileProbe.STAMP_TIMES: %globaltimer_lo as the consumers start the tile (before its
        TileWork and Q), into column 6 of its row."""
        if cutlass.const_expr(self.cfg.tile_probe is TileProbe.STAMP_TIMES):
            tidx, _, _ = cute.arch.thread_idx()
            if tidx == 128:
                stamps = cute.make_tensor(mWorkTiles[tile, None].iterator + 6, cute.make_layout(1))
                stamps[0] = cute.arch.globaltimer_lo()

    def _block_pages(self, page_row, k_len, num_blocks, key_offset, n_block):
        """With `page_prefetch`, this lane's share of block n_block's page-table entries
        (read_block_pages), read a block before its loads; otherwise None: the loads read
        them after the stage acquire. The four before n_block: the producer's `ctx`."""
        if not self.pages_ahead:
            return None
        return read_block_pages(
            page_row, k_len, num_blocks, n_block, *self.paged_tile_geometry, key_offset
        )

    def _load_tile(
        self,
        src: KvSource,
        state,
        page_row,
        k_len,
        num_blocks,
        key_offset,
        n_block,
        pages,
        q_boxes=None,
    ):
        """Acquire the stage and issue a K or V tile; `q_boxes(mbar)` (`q_tma`, the tile's
        first K) puts the tile's Q on the same mbarrier first."""
        pipe, atom, tXs, tXg = src.pipe, src.atom, src.smem, src.gmem
        pipe.producer_acquire(state)
        mbar = pipe.producer_get_barrier(state)
        if cutlass.const_expr(q_boxes is not None):
            q_boxes(mbar)
        mcast_rank = None  # `kv_multicast`: this CTA issues its chunks for both
        if cutlass.const_expr(self.kv_multicast):
            mcast_rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        if pages is None:
            load_paged_tile(
                atom,
                tXs,
                tXg,
                page_row,
                k_len,
                num_blocks,
                n_block,
                state.index,
                mbar,
                *self.paged_tile_geometry,
                src.boxes_per_block,
                key_offset,
                mcast_rank,
            )
        else:
            issue_paged_tile(
                atom,
                tXs,
                tXg,
                pages,
                n_block,
                state.index,
                mbar,
                *self.paged_tile_geometry,
                src.boxes_per_block,
                key_offset,
                mcast_rank,
            )

    def _kv_source(self, pipe, atom, mX_tma, sX, kv_head, boxes_per_block) -> KvSource:
        """A tile's K or V source: its TMA views partitioned for the kv_head."""
        if self.wide_box:
            tile_shape = (self.tile_n, self.head_dim, self.load_stages)
            tXs, tXg = partition_slot_boxes(atom, mX_tma, sX, kv_head, self.box_n, tile_shape)
        else:
            tXs, tXg = partition_pool_tiles(atom, mX_tma, sX, kv_head, self.box_n)
        return KvSource(pipe, atom, tXs, tXg, boxes_per_block)

    @cute.jit
    def produce(self, work, args: ProducerArgs, state, q_state=None, q_load=None):
        """Issue one tile's K/V loads (with `v_warp` only K; produce_v issues V), last block
        first, with `q_tma` its Q on the first K's mbarrier; returns the advanced state (and
        Q's)."""
        mPageTable, mK_tma, mV_tma, tma_atom_K, tma_atom_V, sK, sV, pool, pipe_k, pipe_v = args
        q_boxes = None
        if cutlass.const_expr(self.q_tma):
            # The consumers freed this Q stage after their last Q K^T two tiles ago.
            cute.arch.mbarrier_wait(q_load.empty + q_state.index, q_state.phase)
            q_boxes = partial(self.issue_q_boxes, work, q_load, q_state.index)
        ctx = (mPageTable[work.batch, None], work.k_len, pool.num_blocks, work.key_offset)
        head, boxes = self.cache_head(work.kv_head), pool.boxes_per_block
        k_src = self._kv_source(pipe_k, tma_atom_K, mK_tma, sK, head, boxes)
        v_src = self._kv_source(pipe_v, tma_atom_V, mV_tma, sV, head, boxes)
        n_max, n_min = work.n_block_max, work.n_block_min
        if cutlass.const_expr(self.cfg.v_warp or not self.overlap):
            # Block by block: K, then V unless the second warp loads it (`v_warp`, produce_v)
            srcs = (k_src,) if cutlass.const_expr(self.cfg.v_warp) else (k_src, v_src)
            state = self.issue_blocks(srcs, state, ctx, n_max, n_min, q_boxes)
        else:
            n_count = n_max - n_min  # blocks visited
            # `page_prefetch`: each step reads the next block's pages (None otherwise); reads
            # past the tile's last block (and an empty tile's) re-read n_min's.
            pages_next = self._block_pages(*ctx, cutlass.max(n_max - 1, n_min))
            # Consumer order: K_j is needed one block before V_j, so issue K_{j-1} before V_j.
            if n_count > 0:
                pages = pages_next
                pages_next = self._block_pages(*ctx, cutlass.max(n_max - 2, n_min))
                self._load_tile(k_src, state, *ctx, n_max - 1, pages, q_boxes)
                state_v = state.clone()
                state.advance()
                for i in cutlass.range(1, n_count, unroll=1):
                    n_block = n_max - 1 - i
                    pages_v = pages  # block n_block + 1's, read for its K
                    pages = pages_next
                    pages_next = self._block_pages(*ctx, cutlass.max(n_block - 1, n_min))
                    self._load_tile(k_src, state, *ctx, n_block, pages)
                    self._load_tile(v_src, state_v, *ctx, n_block + 1, pages_v)
                    state.advance()
                    state_v.advance()
                self._load_tile(v_src, state_v, *ctx, n_min, pages)
        if cutlass.const_expr(self.q_tma):
            q_state.advance()
            return state, q_state
        return state

    @cute.jit
    def issue_blocks(self, srcs, state, ctx, n_max: Int32, n_min: Int32, q_boxes=None):
        """Issue blocks n_max - 1 down to n_min, each block's tile of every source in `srcs`
        (K, V, or K then V: one pipeline state, one stage per block); `q_boxes`: the tile's
        Q on the first block's first mbarrier. Returns the advanced state."""
        n_count = n_max - n_min  # blocks visited
        # `page_prefetch`: each step reads the next block's pages (None otherwise); reads
        # past the tile's last block (and an empty tile's) re-read n_min's.
        pages_next = self._block_pages(*ctx, cutlass.max(n_max - 1, n_min))
        for i in cutlass.range(n_count, unroll=1):
            n_block = n_max - 1 - i
            pages = pages_next  # every source of the block shares them
            pages_next = self._block_pages(*ctx, cutlass.max(n_block - 1, n_min))
            first_q = None
            if cutlass.const_expr(q_boxes is not None):
                first_q = partial(q_boxes, when=i == 0)
            self._load_tile(srcs[0], state, *ctx, n_block, pages, first_q)
            for src in srcs[1:]:
                self._load_tile(src, state, *ctx, n_block, pages)
            state.advance()
        return state

    @cute.jit
    def produce_v(self, work, args: VLoadArgs, state):
        """`v_warp`: one tile's V loads, last block first; returns the advanced state."""
        mPageTable, mV_tma, tma_atom_V, sV, pool, pipe_v = args
        boxes = pool.boxes_per_block
        v_src = self._kv_source(
            pipe_v, tma_atom_V, mV_tma, sV, self.cache_head(work.kv_head), boxes
        )
        ctx = (mPageTable[work.batch, None], work.k_len, pool.num_blocks, work.key_offset)
        return self.issue_blocks((v_src,), state, ctx, work.n_block_max, work.n_block_min)

    @cute.jit
    def walk_v_loads(self, v_args, tile_args, queue):
        """`v_warp`: the second producer warp takes every tile from the queue, as the
        consumers do, and issues its V loads."""
        num_tiles = tile_args.work_tiles.shape[0]
        users = pipeline.PipelineUserType
        state = pipeline.make_pipeline_state(users.Producer, self.load_stages)
        queue_state = pipeline.make_pipeline_state(users.Consumer, TILE_QUEUE_STAGES)
        wait_tile, take_work = queue.wait_tile, queue.take_work
        tile = wait_tile(queue_state)
        while tile < num_tiles:
            work, queue_state = take_work(queue_state)
            state = self.produce_v(work, v_args, state)
            tile = wait_tile(queue_state)

    @cute.jit
    def issue_q_boxes(self, work, q_load, q_index: Int32, mbar, when=None):
        """`q_tma`: the tile's Q boxes (one per 64 columns) into Q stage `q_index`, completing
        on `mbar` (the first K's, whose transaction count grows by Q's bytes first); only
        `when` it is given. Rows past the request read the next request's tokens or, past
        the last token, TMA's zeros: never stored, and rows never mix."""
        g, t = self.qhead_per_kvhead, self.tokens_per_tile
        if when is None or when:
            if cute.arch.lane_idx() == 0:
                q_bytes = g * t * self.head_dim * (self.dtype.width // 8)
                cute.arch.mbarrier_expect_tx(mbar, q_bytes)
            tok0 = work.q_start + work.first_token
            sQb = cute.composition(q_load.sQ, self.q_boxes_in_tile())  # (G, T, 64, chunk, stage)
            tQs, tQg = self.box_partition(q_load.atom, q_load.mQ_tma, sQb, work, tok0, t)
            for c in cutlass.range_constexpr(self.head_dim // D_CHUNK):
                cute.copy(q_load.atom, tQg[None, c], tQs[None, c, q_index], tma_bar_ptr=mbar)

    # ---------------------------------------------------------------- consumer
    @cute.jit
    def load_q(self, work, mQ: cute.Tensor, sQ: cute.Tensor, tidx: Int32, wg: Int32):
        """Load this warpgroup's 64 packed rows of Q into sQ and wait for them."""
        self.issue_q(work, mQ, sQ, tidx, wg)
        self.wait_q(wg)

    def q_rows_copy(self, atom, tidx: Int32):
        """This thread's slice of a warpgroup's 16-byte copies over its 64 rows of Q (issue_q's
        cp.async loads, convert_q's in-place conversion): a row's lanes side by side."""
        lanes_per_row = self.head_dim // 8  # 16 B each
        thr_layout = cute.make_ordered_layout((128 // lanes_per_row, lanes_per_row), order=(1, 0))
        tiled_copy = cute.make_tiled_copy_tv(atom, thr_layout, cute.make_layout((1, 8)))
        return tiled_copy.get_slice(tidx % 128)

    @cute.jit
    def issue_q(self, work, mQ: cute.Tensor, sQ: cute.Tensor, tidx: Int32, wg: Int32):
        """cp.async this warpgroup's 64 packed rows of Q (one commit group, not waited for);
        rows past the request are skipped (their S/O rows are garbage but never stored, and
        rows never mix)."""
        if cutlass.const_expr(self.cfg.persistent):
            if cutlass.const_expr(self.tma_epilogue):
                # the previous tile's O boxes have left sQ (the issuing thread waits)
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            wg_sync(wg)  # the WG's last reads of sQ (GEMMs, staged or TMA epilogue) are done
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(), self.dtype, num_bits_per_copy=128)
        thr_copy = self.q_rows_copy(atom, tidx)
        sQw = cute.local_tile(sQ, (64, self.head_dim), (wg, 0))
        tQs = thr_copy.partition_D(sQw)
        tQc = thr_copy.partition_S(cute.make_identity_tensor((64, self.head_dim)))
        for m in cutlass.range_constexpr(cute.size(tQs, mode=[1])):
            for k in cutlass.range_constexpr(cute.size(tQs, mode=[2])):
                coord = tQc[0, m, k]
                row = wg * 64 + coord[0]
                tok_local = row // self.qhead_per_kvhead
                if tok_local < self.tokens_per_tile and work.first_token + tok_local < work.q_len:
                    tok = work.q_start + work.first_token + tok_local
                    head = work.kv_head * self.qhead_per_kvhead + row % self.qhead_per_kvhead
                    src = cute.local_tile(mQ[tok, head, None], (8,), (coord[1] // 8,))
                    cute.copy(atom, src, tQs[None, m, k])
        cute.arch.cp_async_commit_group()

    @cute.jit
    def wait_q(self, wg: Int32):
        """Wait for this thread's Q copies, then for the whole warpgroup's."""
        cute.arch.cp_async_wait_group(0)
        cute.arch.fence_view_async_shared()
        wg_sync(wg)

    @cute.jit
    def convert_q(self, sQ: cute.Tensor, sQ_mma: cute.Tensor, tidx: Int32, wg: Int32):
        """`q_converts`: this warpgroup's 64 rows of Q, bf16 -> fp16 in place (exact in
        fp16's normal range; beyond it saturated, never inf), then visible to its wgmma."""
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        thr_copy = self.q_rows_copy(atom, tidx)
        src = thr_copy.partition_S(cute.local_tile(sQ, (64, self.head_dim), (wg, 0)))
        dst = thr_copy.partition_D(cute.local_tile(sQ_mma, (64, self.head_dim), (wg, 0)))
        for m in cutlass.range_constexpr(cute.size(src, mode=[1])):
            for k in cutlass.range_constexpr(cute.size(src, mode=[2])):
                raw = cute.make_rmem_tensor(cute.make_layout(8), self.dtype)
                cute.autovec_copy(src[None, m, k], raw)
                out = cute.make_rmem_tensor(cute.make_layout(8), self.mma_dtype)
                for e in cutlass.range_constexpr(8):
                    x = cute.arch.fmax(cute.arch.fmin(Float32(raw[e]), F16_MAX), -F16_MAX)
                    out[e] = self.mma_dtype(x)
                cute.autovec_copy(out, dst[None, m, k])
        cute.arch.fence_view_async_shared()  # the generic stores before the wgmma's reads
        wg_sync(wg)

    @cute.jit
    def split_q(
        self, sQ, sQ8, sRowScale, tScS, scale_log2: Float32, rows_scale_log2, tidx, wg: Int32
    ):
        """`fp8_qk`: this warpgroup's 64 rows of Q (16-bit, landed) -> their e4m3 halves in sQ8
        and power-of-two row scales p (fp8_kv.split_pair: hi + lo = q / p); fills
        rows_scale_log2 with this thread's accumulator rows' scale_log2 * p (with a soft cap
        the caller passes the cap's prescale as scale_log2: tanh's input needs p); with
        `fp8_qk_rounded` the hi halves alone (Q rounded to e4m3). The previous tile's Q K^T
        have completed (their waits), so sQ8 and the scales are free."""
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)
        thr_copy = self.q_rows_copy(atom, tidx)
        src = thr_copy.partition_S(cute.local_tile(sQ, (64, self.head_dim), (wg, 0)))
        coords = thr_copy.partition_S(cute.make_identity_tensor((64, self.head_dim)))
        atom8 = cute.make_copy_atom(
            cute.nvgpu.CopyUniversalOp(), self.cache_dtype, num_bits_per_copy=64
        )
        thr_copy8 = self.q_rows_copy(atom8, tidx)
        halves_dst = [
            thr_copy8.partition_D(cute.local_tile(sQ8[None, None, h], (64, self.head_dim), (wg, 0)))
            for h in range(self.q_parts)
        ]
        lanes_per_row = self.head_dim // 8
        for m in cutlass.range_constexpr(cute.size(src, mode=[1])):
            row_vals = []
            amax = Float32(0.0)
            for k in cutlass.range_constexpr(cute.size(src, mode=[2])):
                raw = cute.make_rmem_tensor(cute.make_layout(8), self.dtype)
                cute.autovec_copy(src[None, m, k], raw)
                vals = [Float32(raw[e]) for e in range(8)]
                for v in vals:
                    amax = cute.arch.fmax(amax, cute.arch.fmax(v, -v))
                row_vals.append(vals)
            # a row's lanes sit side by side (q_rows_copy)
            for off in cutlass.range_constexpr(lanes_per_row.bit_length() - 1):
                amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=1 << off))
            inv_p = row_scale_pow2(amax, True)
            for k in cutlass.range_constexpr(cute.size(src, mode=[2])):
                vals = row_vals[k]
                pairs = [split_pair(vals[e] * inv_p, vals[e + 1] * inv_p) for e in range(0, 8, 2)]
                for h in cutlass.range_constexpr(self.q_parts):
                    out = cute.make_rmem_tensor(cute.make_layout(8), self.cache_dtype)
                    words = cute.recast_tensor(out, Int32)
                    words[0] = halves(pairs[0], pairs[1], h == 1)
                    words[1] = halves(pairs[2], pairs[3], h == 1)
                    cute.autovec_copy(out, halves_dst[h][None, m, k])
            coord = coords[0, m, 0]
            if coord[1] == 0:
                sRowScale[wg * 64 + coord[0]] = row_scale_pow2(amax, False)
        cute.arch.fence_view_async_shared()  # the generic stores before the wgmma's reads
        wg_sync(wg)
        rows = acc_rows_view(tScS)
        for i in cutlass.range_constexpr(cute.size(rows, mode=[0])):
            rows_scale_log2[i] = scale_log2 * sRowScale[rows[i, 0][0]]

    @cute.jit
    def prefetch_next_q(self, receive, queue_state, tile_args, mQ, sQ, tidx: Int32, wg: Int32):
        """`q_prefetch`: once this tile's last Q K^T has completed, take the next tile from the
        queue and start its Q copies, so they land under this tile's last P V and epilogue.
        Returns (next tile, queue state)."""
        next_tile, queue_state = receive(queue_state)
        if next_tile < tile_args.work_tiles.shape[0]:
            self.issue_q(tile_work(*tile_args, next_tile), mQ, sQ, tidx, wg)
        return next_tile, queue_state

    @cute.jit
    def zero_v_tail(self, sV: cute.Tensor, stage: Int32, first_row: Int32, tidx: Int32, wg):
        """Zero rows [first_row, tile_n) of a V stage: the last page's unused slots may hold
        NaN and P = 0 does not cancel NaN in P V. Both WGs write the same zeros (benign)."""
        vec = 8
        per_row = self.head_dim // vec
        total = (self.tile_n - first_row) * per_row
        sVs = sV[None, None, stage]
        for idx in cutlass.range(tidx % 128, total, 128, unroll=1):
            r = first_row + idx // per_row
            c0 = (idx % per_row) * vec
            for e in cutlass.range_constexpr(vec):
                sVs[r, c0 + e] = self.mma_dtype(0.0)
        cute.arch.fence_view_async_shared()
        wg_sync(wg)

    @cute.jit
    def mask(self, acc_S, tScS, n_block, work, diag, window_left):
        """The causal mask, with the window's left edge when the key has one."""
        apply_causal_mask(
            acc_S,
            tScS,
            block_first_key(n_block, self.tile_n, work.key_offset),
            work.first_token,
            diag,
            self.qhead_per_kvhead,
            window_left,
        )

    @cute.jit
    def rescale_o(self, acc_O: cute.Tensor, row_scale: cute.Tensor):
        """O *= the block's row scales; with `lazy_max` only when some row of the warp moved
        its max (the others' scales are exactly 1)."""
        if cutlass.const_expr(self.cfg.lazy_max):
            if rescale_needed(row_scale):
                scale_rows(acc_O, row_scale)
        else:
            scale_rows(acc_O, row_scale)

    @cute.jit
    def softmax_block(
        self,
        acc_S,
        n_block,
        tScS,
        work,
        diag,
        row_max,
        row_sum,
        row_scale,
        scale_log2,
        feats,
        neg_shift=None,
    ):
        """Online softmax of a block after the first: the mask only on diagonal blocks (and,
        with a sliding window, on blocks under some row's left edge); the soft cap first (in
        each arm of the mask branch with `softmax_per_arm`).

        `softmax_per_arm`: the softmax runs inside both arms of the mask branch. ptxas moves
        the caller's following wgmma wait (for P V, overlap loop) to the top of the basic
        block that holds the softmax, so the softmax no longer overlaps that GEMM (ncu, 8kx2
        p128: 15 % of warp samples on the wait); with the softmax in the arms the wait stays
        after it, at the join.

        `pv_wait_mid` (neg_shift given): the arms end after the first row's exponentials
        (softmax_head); the caller waits for P V and then runs softmax_rest."""
        per_arm = self.overlap
        lazy = self.cfg.lazy_max
        if cutlass.const_expr(neg_shift is not None):
            head = (acc_S, row_max, row_sum, row_scale, neg_shift, scale_log2, lazy)
            arm = partial(softmax_head, *head)
        else:
            arm = partial(softmax_step, acc_S, row_max, row_sum, row_scale, scale_log2, False, lazy)
        window_left, softcap_prescale = feats
        cap = None
        if cutlass.const_expr(softcap_prescale is not None):
            cap = partial(softcap_for(softcap_prescale), acc_S, softcap_prescale)
        # With the softmax in the arms the cap goes there too, beside the mask and the row
        # max, where its tanh stream interleaves with them (2026-11-27, session 11: +1 to
        # +8 % on capped head-dim-256 keys with turns, -1.5 to +3.9 % without, H100).
        if cutlass.const_expr(cap is not None and not per_arm):
            cap()
        needs_mask = n_block >= work.n_block_mask
        if cutlass.const_expr(window_left is not None):
            needs_mask = needs_mask | (n_block < work.n_block_left_mask)
        if needs_mask:
            if cutlass.const_expr(cap is not None and per_arm):
                cap()
            self.mask(acc_S, tScS, n_block, work, diag, window_left)
            if cutlass.const_expr(per_arm):
                arm()
        else:
            if cutlass.const_expr(cap is not None and per_arm):
                cap()
            if cutlass.const_expr(per_arm):
                arm()
        if cutlass.const_expr(not per_arm):
            softmax_step(acc_S, row_max, row_sum, row_scale, scale_log2, False, lazy)

    @cute.jit
    def consume(
        self,
        work,
        args: ConsumerArgs,
        state,
        receive=None,
        queue_state=None,
        tile_args=None,
        q_empty=None,
        q_stage: cutlass.Constexpr[int] = 0,
        o_tma=None,
    ):
        """One tile: Q load, all KV blocks, epilogue; returns the advanced pipeline state.

        With `q_prefetch` this tile's Q was issued by the previous tile (or before the first);
        the next tile is taken from the queue (`receive`) mid-tile and the call returns
        (state, next tile, queue state). With `q_tma` the producer loaded Q into stage
        `q_stage` (a compile-time constant: a runtime stage index costs the block loop its
        uniform-register descriptors) on the first K's mbarrier; the tile frees the stage
        after its last Q K^T (after O, with O staged in it). With `tma_epilogue` (`o_tma`) O's
        boxes are left in flight from sQ; the next tile's Q copies wait for them (with `q_tma`
        the stage is freed once they have read it)."""
        mQ, mO, mLSE, sQ, sK, sV, tiled_mma_qk, tiled_mma_pv, pipe_k, pipe_v = args[:10]
        mSinks, window_left, softcap_prescale, scale_log2, tidx = args[10:15]
        wg = cute.arch.make_warp_uniform(tidx // 128)
        sQ_mma = sQ if cutlass.const_expr(args.sQ_mma is None) else args.sQ_mma
        if cutlass.const_expr(self.fp8_qk):
            sQ_mma = args.q_split[0]
        g = self.block_gemms(sQ_mma, sK, sV, tiled_mma_qk, tiled_mma_pv, tidx)
        tSrQ = g.tSrQ
        if cutlass.const_expr(self.q_tma and not self.fp8_qk):  # fp8_qk: one split buffer
            tSrQ = tSrQ[None, None, None, q_stage]
        acc_O = g.acc_O
        num_rows = cute.size(acc_rows_view(acc_O), mode=[0])

        clock = self.phase_clock() if cutlass.const_expr(self.stamps_times) else None
        # With `q_tma` Q lands with the first K block (its wait below).
        if cutlass.const_expr(self.q_prefetch):
            self.wait_q(wg)
        elif cutlass.const_expr(not self.q_tma):
            self.load_q(work, mQ, sQ, tidx, wg)
        convert_q = None  # `q_converts`: this tile's Q to fp16 once it has landed
        if cutlass.const_expr(self.q_converts and self.q_tma):  # it lands with the first K
            stage_q = (sQ[None, None, q_stage], sQ_mma[None, None, q_stage])
            convert_q = partial(self.convert_q, *stage_q, tidx, wg)  # block: first_block
        elif cutlass.const_expr(self.q_converts):
            self.convert_q(sQ, sQ_mma, tidx, wg)
        if cutlass.const_expr(self.fp8_qk):
            # S comes out of the GEMM divided by each row's Q scale: fold it into the rows'
            # softmax scale (and so into their LSE), or with a soft cap into the cap's prescale
            # (tanh takes S itself; the cap's own factor stays in scale_log2), by the split.
            capped = softcap_prescale is not None
            factor = softcap_prescale if capped else scale_log2
            rows_factor = cute.make_rmem_tensor(num_rows, Float32)
            # A tile without blocks never splits (Q by TMA lands with its first K): its rows
            # keep the scalar scale, so an empty row's -inf max times it stays -inf (sinks).
            rows_factor.fill(factor)
            stage_q = sQ[None, None, q_stage] if cutlass.const_expr(self.q_tma) else sQ
            split = (stage_q, *args.q_split, g.tScS, factor, rows_factor, tidx, wg)
            if cutlass.const_expr(self.q_tma):  # Q lands with the first K: first_block
                convert_q = partial(self.split_q, *split)
            else:
                self.split_q(*split)
            if cutlass.const_expr(capped):
                softcap_prescale = rows_factor
            else:
                scale_log2 = rows_factor
        next_tile = Int32(0)  # q_prefetch only
        if cutlass.const_expr(clock is not None):
            # Q has landed (Q by TMA: with the first K, in the first block)
            self.phase_mark(clock, 1)

        row_max = cute.make_rmem_tensor(num_rows, Float32)
        row_sum = cute.make_rmem_tensor(num_rows, Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        acc_O.fill(0.0)
        row_scale = cute.make_rmem_tensor(num_rows, Float32)
        n_max = work.n_block_max
        n_count = n_max - work.n_block_min  # blocks visited
        diag = work.k_len - work.q_len
        feats = (window_left, softcap_prescale)
        # What every block after the first passes to softmax_block (its loops differ only in
        # how they issue the GEMMs).
        softmax_args = SoftmaxArgs(
            g.tScS, work, diag, row_max, row_sum, row_scale, scale_log2, feats
        )

        if cutlass.const_expr(clock is not None):
            self.phase_mark(clock, 2)  # a tile without blocks: no first block
        if n_count > 0:
            self.first_block(
                g, tSrQ, work, state, softmax_args, sV, pipe_k, pipe_v, tidx, wg, convert_q
            )
            if cutlass.const_expr(clock is not None):
                self.phase_mark(clock, 2)
            if cutlass.const_expr(not self.overlap):
                tOrP, tOrVt, tSrK = g.tOrP, g.tOrVt, g.tSrK
                _wgmma(tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, state.index], False, 0)
                pipe_v.consumer_release(state)
                state.advance()
                for i in cutlass.range(1, n_count, unroll=1):
                    n_block = n_max - 1 - i
                    pipe_k.consumer_wait(state)
                    acc_S = self.new_acc_S(g)
                    _wgmma(tiled_mma_qk, acc_S, tSrQ, tSrK[None, None, None, state.index], True, 0)
                    pipe_k.consumer_release(state)
                    self.softmax_block(acc_S, n_block, *softmax_args)
                    self.rescale_o(acc_O, row_scale)
                    tOrP.store(acc_as_operand_a(acc_S).load().to(self.mma_dtype))
                    pipe_v.consumer_wait(state)
                    _wgmma(
                        tiled_mma_pv, acc_O, tOrP, tOrVt[None, None, None, state.index], False, 0
                    )
                    pipe_v.consumer_release(state)
                    state.advance()
            else:
                # V of block j+1 sits in state_v, one stage behind K's state.
                state_v = state.clone()
                state.advance()
                for i in cutlass.range(1, n_count, unroll=1):
                    state, state_v = self.overlap_step(
                        g, tSrQ, n_max - 1 - i, state, state_v, softmax_args, pipe_k, pipe_v, wg
                    )
            if cutlass.const_expr(self.q_prefetch):  # every Q K^T of the tile is done
                next_tile, queue_state = self.prefetch_next_q(
                    receive, queue_state, tile_args, mQ, sQ, tidx, wg
                )
            # Every Q K^T of the tile is done; a staged or TMA epilogue still writes O into
            # the stage.
            if cutlass.const_expr(self.q_tma and not self.o_in_q_stage):
                self.free_q_stage(q_empty, q_stage)
            if cutlass.const_expr(self.overlap):
                # The last block's P V, left in flight by the overlapped loop.
                self.last_pv(g, state_v, pipe_v, wg, row_scale)
        elif cutlass.const_expr(self.q_prefetch):  # empty tile: nothing read sQ
            next_tile, queue_state = self.prefetch_next_q(
                receive, queue_state, tile_args, mQ, sQ, tidx, wg
            )

        sO = sQ  # the staged epilogue's buffer: the warpgroup's rows of (this tile's) Q
        if cutlass.const_expr(self.q_tma):
            sO = sQ[None, None, q_stage]
        out = (mO, mLSE, mSinks, sO)
        converted = None
        if cutlass.const_expr(clock is not None):
            self.phase_mark(clock, 3)
            converted = partial(self.phase_mark, clock, 4)
        self.epilogue(
            work, out, g, row_max, row_sum, scale_log2, tidx, wg, args.o_scale, converted, o_tma
        )
        if cutlass.const_expr(clock is not None):
            self.phase_mark(clock, 5)
            self.phase_sums_add(clock, args.probe_rows, tidx)
        if cutlass.const_expr(self.q_tma and self.o_in_q_stage):
            if cutlass.const_expr(self.tma_epilogue):
                # O's boxes have read the stage before the producer's TMA refills it (the
                # issuing thread waits; its warp arrives after it). The other stage holds the
                # next tile's Q, so the refill this frees is for the tile after next.
                cute.arch.cp_async_bulk_wait_group(0, read=True)
                cute.arch.sync_warp()
            else:
                # The stage's generic-proxy reads and writes come before the producer's TMA.
                cute.arch.fence_view_async_shared()
            self.free_q_stage(q_empty, q_stage)
        if cutlass.const_expr(self.q_prefetch):
            return state, next_tile, queue_state
        return state

    @cute.jit
    def phase_clock(self) -> cute.Tensor:
        """TileProbe.STAMP_TIMES: six %globaltimer_lo stamps of a tile in registers (a
        tensor, so a stamp taken inside a runtime branch stays visible after it): consume's
        start, Q landed, first block done, loop done, O converted, O stored."""
        clock = cute.make_rmem_tensor(6, Int32)
        clock[0] = cute.arch.globaltimer_lo()
        return clock

    @cute.jit
    def phase_mark(self, clock: cute.Tensor, phase: cutlass.Constexpr[int]):
        clock[phase] = cute.arch.globaltimer_lo()

    @cute.jit
    def phase_sums_add(self, clock: cute.Tensor, rows: cute.Tensor, tidx: Int32):
        """The first consumer thread adds the tile's five phase times (ns) to columns 7-11 of
        row blockIdx.x: per CTA, sums over its tiles (benchmarks/tile_times.py)."""
        if tidx == 0:
            cta, _, _ = cute.arch.block_idx()
            sums = rows[cta, None].iterator + 7
            for phase in cutlass.range_constexpr(5):
                delta = clock[phase + 1] - clock[phase]
                cute.arch.atomic_add(sums + phase, delta, sem="relaxed", scope="gpu")

    @cute.jit
    def free_q_stage(self, q_empty, q_stage: cutlass.Constexpr[int]):
        """`q_tma`: one arrive per warp frees this tile's Q stage for the producer."""
        if cute.arch.lane_idx() == 0:
            cute.arch.mbarrier_arrive(q_empty + q_stage)

    @cute.jit
    def block_gemms(self, sQ, sK, sV, tiled_mma_qk, tiled_mma_pv, tidx: Int32) -> BlockGemms:
        """This warpgroup's BlockGemms (O's accumulator uninitialized); with `fp8_qk` sQ is
        sQ8 and tSrQ its (hi, lo) fragments."""
        wg = cute.arch.make_warp_uniform(tidx // 128)
        thr_qk = tiled_mma_qk.get_slice(tidx)
        thr_pv = tiled_mma_pv.get_slice(tidx)
        wg_qk = tiled_mma_qk.get_slice(wg * 128)
        wg_pv = tiled_mma_pv.get_slice(wg * 128)
        if cutlass.const_expr(self.fp8_qk):
            halves_frag = wg_qk.make_fragment_A(wg_qk.partition_A(sQ))
            tSrQ = tuple(halves_frag[None, None, None, h] for h in range(self.q_parts))
        else:
            tSrQ = wg_qk.make_fragment_A(wg_qk.partition_A(sQ))
        tSrK = wg_qk.make_fragment_B(wg_qk.partition_B(sK))
        # V^T as an (D, tile_n, stage) view of the row-major V tile: MN-major B operand.
        sVt = cute.composition(
            sV, cute.make_ordered_layout((self.head_dim, self.tile_n, self.stages), order=(1, 0, 2))
        )
        tOrVt = wg_pv.make_fragment_B(wg_pv.partition_B(sVt))
        tOrP = wg_pv.make_fragment_A(wg_pv.partition_shape_A((self.tile_m, self.tile_n)))
        acc_O = cute.make_rmem_tensor(
            wg_pv.partition_shape_C((self.tile_m, self.head_dim)), Float32
        )
        tScS = thr_qk.partition_C(cute.make_identity_tensor((self.tile_m, self.tile_n)))
        mmas = (tiled_mma_qk, tiled_mma_pv, thr_pv)
        return BlockGemms(*mmas, tSrQ, tSrK, tOrVt, tOrP, acc_O, tScS)

    def new_acc_S(self, g: BlockGemms) -> cute.Tensor:
        """A fresh S accumulator. (Its shape is not a BlockGemms field: the DSL's `if`
        turns a dataclass's Python ints into runtime values.)"""
        shape = g.mma_qk.partition_shape_C((self.tile_m, self.tile_n))
        return cute.make_rmem_tensor(shape, Float32)

    @cute.jit
    def epilogue(
        self,
        work,
        out,
        g,
        row_max,
        row_sum,
        scale_log2,
        tidx: Int32,
        wg: Int32,
        o_scale=None,
        on_converted=None,
        o_tma=None,
    ):
        """Normalize O (times `o_scale`, an fp8 cache's v_scale) and write it (and the LSE);
        `out` = (mO, mLSE, mSinks, sQ); `on_converted`: the tile probe's mark between the
        two; `o_tma`: O's TMA store (`tma_epilogue`)."""
        mO, mLSE, mSinks, sQ = out
        store_boxes = None
        if cutlass.const_expr(o_tma is not None):
            store_boxes = partial(self.issue_o_boxes, work, o_tma, sQ, wg)
        write_output(
            work,
            mO,
            mLSE,
            sQ,
            g.acc_O,
            row_max,
            row_sum,
            scale_log2,
            g.thr_pv,
            tidx,
            wg,
            self.dtype,
            self.qhead_per_kvhead,
            self.tokens_per_tile,
            self.has_lse,
            self.staged_epilogue,
            mSinks,
            o_scale,
            on_converted,
            store_boxes,
        )

    @cute.jit
    def issue_o_boxes(self, work, o_tma: OTmaStore, sQ: cute.Tensor, wg: Int32):
        """`tma_epilogue`: TMA stores of warpgroup `wg`'s staged rows of O (one box a 64-column
        chunk; call from one warp), committed as one bulk group that is not waited for."""
        t = 64 // self.qhead_per_kvhead
        tok0 = work.q_start + work.first_token + wg * t
        sOb = cute.composition(sQ, self.o_boxes_in_tile())  # (G, T, 64, chunk, wg)
        tOs, tOg = self.box_partition(o_tma.atom, o_tma.mO_tma, sOb, work, tok0, t)
        for c in cutlass.range_constexpr(self.head_dim // D_CHUNK):
            cute.copy(o_tma.atom, tOs[None, c, wg], tOg[None, c])
        cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def first_softmax(self, acc_S, n_block, softmax_args):
        """Soft cap, mask and softmax of a tile's first (right-most) block, which may hold
        the partial last page and is always masked; starts the tile's row stats."""
        tScS, work, diag, row_max, row_sum, row_scale, scale_log2, feats = softmax_args
        window_left, softcap_prescale = feats
        if cutlass.const_expr(softcap_prescale is not None):
            softcap_for(softcap_prescale)(acc_S, softcap_prescale)
        self.mask(acc_S, tScS, n_block, work, diag, window_left)
        softmax_step(acc_S, row_max, row_sum, row_scale, scale_log2, True, self.cfg.lazy_max)

    @cute.jit
    def wait_first_v(self, sV, work, n_block, state, pipe_v, tidx: Int32, wg: Int32):
        """Wait for a tile's first V block; zero its rows past the last key."""
        pipe_v.consumer_wait(state)
        valid_rows = work.k_len - block_first_key(n_block, self.tile_n, work.key_offset)
        if valid_rows < self.tile_n:
            self.zero_v_tail(sV, state.index, valid_rows, tidx, wg)

    @cute.jit
    def first_block(
        self, g, tSrQ, work, state, softmax_args, sV, pipe_k, pipe_v, tidx, wg, convert_q=None
    ):
        """A tile's first block on its own: S = Q K^T in a turn of its own, then its softmax
        with nothing in flight; leaves P in g.tOrP and waits for the block's V. `convert_q`:
        Q's conversion, run once Q (with `q_tma`, on this K's barrier) has landed."""
        n_block = work.n_block_max - 1
        pipe_k.consumer_wait(state)
        if cutlass.const_expr(convert_q is not None):
            convert_q()
        acc_S = self.new_acc_S(g)
        turn_wait(self.turns, wg)
        self.lone_qk(g, tSrQ, acc_S, state.index, wg)
        pipe_k.consumer_release(state)
        self.first_softmax(acc_S, n_block, softmax_args)
        g.tOrP.store(acc_as_operand_a(acc_S).load().to(self.mma_dtype))
        self.wait_first_v(sV, work, n_block, state, pipe_v, tidx, wg)

    @cute.jit
    def lone_qk(self, g, tSrQ, acc_S, stage: Int32, wg: Int32):
        """S = Q K^T over the whole block, alone in the turn (taken by the caller): issue,
        pass the turn, wait."""
        _wgmma(g.mma_qk, acc_S, tSrQ, g.tSrK[None, None, None, stage], True, -1)
        turn_pass(self.turns, wg)
        warpgroup.wait_group(0)

    @cute.jit
    def overlap_step(self, g, tSrQ, n_block, state, state_v, softmax_args, pipe_k, pipe_v, wg):
        """One block of the overlapped loop: S_j = Q K_j^T and O += P_{j+1} V_{j+1} in one
        turn, the softmax of S_j under the P V. Returns the advanced (state, state_v)."""
        row_scale = softmax_args.row_scale
        pipe_k.consumer_wait(state)
        acc_S = self.new_acc_S(g)
        turn_wait(self.turns, wg)
        _wgmma(g.mma_qk, acc_S, tSrQ, g.tSrK[None, None, None, state.index], True, -1)
        if cutlass.const_expr(self.pv_wait_mid):
            self.rescale_o(g.acc_O, row_scale)  # the previous block's, under this Q K^T
        _wgmma(g.mma_pv, g.acc_O, g.tOrP, g.tOrVt[None, None, None, state_v.index], False, -1)
        turn_pass(self.turns, wg)
        warpgroup.wait_group(1)  # S_j done; P_{j+1} V_{j+1} may still run
        pipe_k.consumer_release(state)
        neg_shift = None
        if cutlass.const_expr(self.pv_wait_mid):
            neg_shift = cute.make_rmem_tensor(cute.size(row_scale), Float32)
        self.softmax_block(acc_S, n_block, *softmax_args, neg_shift=neg_shift)
        warpgroup.wait_group(0)
        pipe_v.consumer_release(state_v)
        if cutlass.const_expr(self.pv_wait_mid):
            # O's rescale waits for the next block's turn (above, or last_pv): its branch
            # here would split the other rows' exponentials from P's packing, which ptxas
            # then cannot interleave.
            softmax_rest(acc_S, softmax_args.row_sum, row_scale, neg_shift, softmax_args.scale_log2)
        else:
            self.rescale_o(g.acc_O, row_scale)
        g.tOrP.store(acc_as_operand_a(acc_S).load().to(self.mma_dtype))
        if cutlass.const_expr(self.pv_wait_mid):
            computed_here(g.tOrP)
        state.advance()
        state_v.advance()
        pipe_v.consumer_wait(state_v)
        return state, state_v

    @cute.jit
    def last_pv(self, g, state_v, pipe_v, wg: Int32, row_scale):
        """A tile's last P V in a turn of its own (the overlapped loops leave it in flight);
        with `pv_wait_mid` after the last block's rescale of O."""
        turn_wait(self.turns, wg)
        if cutlass.const_expr(self.pv_wait_mid):
            self.rescale_o(g.acc_O, row_scale)
        _wgmma(g.mma_pv, g.acc_O, g.tOrP, g.tOrVt[None, None, None, state_v.index], False, -1)
        turn_pass(self.turns, wg)
        warpgroup.wait_group(0)
        pipe_v.consumer_release(state_v)
