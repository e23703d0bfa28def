"""Energy of a K/V block moved from L2 into shared memory by TMA, with and without a two-CTA
cluster's multicast (issue 32: the one lever sized above the spread, session 28's item 3).

Run: python benchmarks/tma_energy.py [--seconds 3] [--stages 4] [--mib 32]

Our kernel's CTAs each pull every K and V block of their tile from L2 by TMA. A pair of CTAs on
neighbouring tiles of one request and KV head reads nearly the same blocks; in a cluster, each
could load half of a block and multicast it to both, halving the L2 reads. Whether that saves
energy depends on where a byte's energy is spent: in the L2 slice and the crossbar (halved) or
in the SM's side of the path (not). This tool measures it directly: a persistent kernel whose
producer warp streams 128x128 bf16 tiles (one Llama-3.1-8B K block, 32 KB, 128-byte swizzle as
our kernel lays it out) from a buffer the size of --mib into a ring of --stages, and whose
consumer warps only wait for each tile and free its stage (no wgmma: the path alone). Settings:
  tma      one CTA an SM, each loads whole tiles
  tma-mc2  clusters of two, each CTA loads half a tile and multicasts it to both
Each runs back to back for --seconds in power_clocks.py's window. A row: bytes landed in
shared memory a second (all CTAs), L2 bytes a second, board power, SM clock, and the energy a
landed byte over the idle board.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vllm_fa4 import envs  # noqa: E402

envs.default_cute_dsl_env()

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import cutlass.pipeline as pipeline  # noqa: E402
import cutlass.utils as cutlass_utils  # noqa: E402
import cutlass.utils.hopper_helpers as sm90_utils  # noqa: E402
from cutlass import Int32  # noqa: E402
from cutlass.cute.nvgpu import cpasync, warpgroup  # noqa: E402
from cutlass.utils import LayoutEnum  # noqa: E402

ROWS, COLS = 128, 128  # one K block: 128 keys x head dim 128
DT = cutlass.BFloat16
TILE_BYTES = ROWS * COLS * DT.width // 8
CONSUMER_WARPS = 4  # one warpgroup frees the stages, as a consumer warpgroup of ours would


class TmaStream:
    """The stream kernel for one cluster size (1: plain TMA; 2: halves multicast to both)."""

    def __init__(self, cluster: int, stages: int):
        assert cluster in (1, 2)
        self.cluster, self.stages = cluster, stages
        self.threads = 32 * (1 + CONSUMER_WARPS)

    def smem_layout(self):
        atom = warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(LayoutEnum.ROW_MAJOR, DT, COLS), DT
        )
        return cute.tile_to_shape(atom, (ROWS, COLS, self.stages), (0, 1, 2))

    @cute.jit
    def __call__(self, mX: cute.Tensor, mSink: cute.Tensor, tiles_per_cta: Int32, ctas: Int32):
        layout = self.smem_layout()
        op = cpasync.CopyBulkTensorTileG2SOp()
        if cutlass.const_expr(self.cluster > 1):
            op = cpasync.CopyBulkTensorTileG2SMulticastOp()
        atom, mX_tma = cpasync.make_tiled_tma_atom(
            op, mX, cute.slice_(layout, (None, None, 0)), (ROWS, COLS), num_multicast=self.cluster
        )

        @cute.struct
        class Storage:
            mbar: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            sX: cute.struct.Align[cute.struct.MemRange[DT, cute.cosize(layout)], 1024]

        self.storage = Storage
        self.kernel(atom, mX_tma, mSink, tiles_per_cta, layout).launch(
            grid=(ctas, 1, 1),
            block=(self.threads, 1, 1),
            cluster=(self.cluster, 1, 1),
            smem=Storage.size_in_bytes(),
        )

    @cute.kernel
    def kernel(self, atom, mX_tma, mSink, tiles_per_cta: Int32, layout):
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        if warp == 0:
            cpasync.prefetch_descriptor(atom)
        storage = cutlass_utils.SmemAllocator().allocate(self.storage)
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        # Every consumer warp frees a stage in each CTA of the cluster: the partner's TMA
        # writes into this CTA's ring too, so both producers wait for both CTAs' consumers.
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar.data_ptr(),
            num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            consumer_group=pipeline.CooperativeGroup(
                pipeline.Agent.Thread, CONSUMER_WARPS * self.cluster
            ),
            tx_count=TILE_BYTES,
            cta_layout_vmnk=cute.make_layout((1, self.cluster, 1, 1)),
        )
        sX = storage.sX.get_tensor(layout.outer, swizzle=layout.inner)
        gX = cute.local_tile(mX_tma, (ROWS, COLS), (None, 0))  # (ROWS, COLS, tiles)
        tXs, tXg = cpasync.tma_partition(
            atom,
            rank,
            cute.make_layout(self.cluster),
            cute.group_modes(sX, 0, 2),
            cute.group_modes(gX, 0, 2),
        )
        n_tiles = cute.size(gX, mode=[2])
        # Clusters walk the buffer from spread starting points, both CTAs of one on the same
        # tiles (as paired tiles of one KV head would read the same blocks).
        cluster_id = bidx // self.cluster
        first = cluster_id * 37
        if warp == 0:
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            for i in cutlass.range(tiles_per_cta, unroll=1):
                pipe.producer_acquire(state)
                tile = (first + i) % n_tiles
                if cutlass.const_expr(self.cluster > 1):
                    cute.copy(
                        atom,
                        tXg[None, tile],
                        tXs[None, state.index],
                        tma_bar_ptr=pipe.producer_get_barrier(state),
                        mcast_mask=cutlass.Int16((1 << self.cluster) - 1),
                    )
                else:
                    cute.copy(
                        atom,
                        tXg[None, tile],
                        tXs[None, state.index],
                        tma_bar_ptr=pipe.producer_get_barrier(state),
                    )
                state.advance()
            pipe.producer_tail(state)
        else:
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            seen = Int32(0)
            for _ in cutlass.range(tiles_per_cta, unroll=1):
                pipe.consumer_wait(state)
                seen += 1
                pipe.consumer_release(state)
                state.advance()
            if tidx == 32:
                mSink[bidx] = seen
        # No CTA leaves while its partner may still arrive on its barriers.
        if cutlass.const_expr(self.cluster > 1):
            cute.arch.cluster_arrive()
            cute.arch.cluster_wait()


def compile_stream(cluster: int, stages: int):
    """Compile against fake tensors (no GPU needed); called with torch tensors afterwards."""
    sym = cute.sym_int
    mX = cute.runtime.make_fake_tensor(
        DT, (sym(), COLS), stride=(cute.sym_int64(divisibility=COLS), 1), assumed_align=16
    )
    mSink = cute.runtime.make_fake_tensor(Int32, (sym(),), stride=(1,), assumed_align=4)
    return cute.compile(
        TmaStream(cluster, stages), mX, mSink, Int32(1), Int32(1), options="--enable-tvm-ffi"
    )


def stream_call(kernel, cluster: int, mib: int, tiles_per_cta: int):
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ctas = sms // cluster * cluster
    rows = (mib << 20) // (COLS * 2) // ROWS * ROWS
    x = torch.randn(rows, COLS, dtype=torch.bfloat16, device="cuda")
    sink = torch.zeros(ctas, dtype=torch.int32, device="cuda")

    def fn():
        kernel(x, sink, tiles_per_cta, ctas)

    fn()
    torch.cuda.synchronize()
    if not bool((sink == tiles_per_cta).all()):  # every consumer saw every tile
        raise RuntimeError(f"stream kernel (cluster {cluster}) lost tiles: {sink.tolist()}")
    landed = ctas * tiles_per_cta * TILE_BYTES
    return fn, landed, landed // cluster


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--mib", type=int, default=32, help="buffer size (L2-resident at 32)")
    ap.add_argument("--tiles", type=int, default=2000, help="tiles a CTA a launch")
    args = ap.parse_args(argv)
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from power_clocks import Nvml, Sampler, chunk_for, run_window

    nvml = Nvml()
    settings = {}
    for name, cluster in (("tma", 1), ("tma-mc2", 2)):
        t0 = time.perf_counter()
        kernel = compile_stream(cluster, args.stages)
        print(f"compiled {name} in {time.perf_counter() - t0:.1f} s", flush=True)
        settings[name] = stream_call(kernel, cluster, args.mib, args.tiles)
    with Sampler(nvml) as sampler:
        idle = sampler.idle_watts()
        print(
            f"device={torch.cuda.get_device_name()} idle={idle:.0f} W "
            f"limit={nvml.power_limit_w:.0f} W stages={args.stages} buffer={args.mib} MiB "
            f"tiles/CTA={args.tiles}",
            flush=True,
        )
        rows = {
            name: (landed, l2, run_window(fn, sampler, args.seconds, chunk_for(fn)))
            for name, (fn, landed, l2) in settings.items()
        }
    for name, (landed, l2, w) in rows.items():
        seconds = w.ms * 1e-3
        rate = landed / seconds
        print(
            f"{name:8} landed {rate / 1e12:6.2f} TB/s  L2 {l2 / seconds / 1e12:6.2f} TB/s  "
            f"{w.watts:5.0f} W ({w.watts / nvml.power_limit_w:4.0%}) {w.mhz:5.0f} MHz  "
            f"{w.watts / rate * 1e12:6.1f} pJ/landed B total, "
            f"{(w.watts - idle) / rate * 1e12:6.1f} over idle",
            flush=True,
        )


if __name__ == "__main__":
    main()
