"""The kernel side of an FP8 (e4m3) KV cache (issue 30), on the CPU: which configs build an
fp8 key, its staging ring and registers, the policy rows, and one compile (sm_90a) of the
converter path with its conversion instructions in the PTX."""

from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import pytest  # noqa: E402

from vllm_fa4.kernels import fp8_kv  # noqa: E402
from vllm_fa4.kernels.config import (  # noqa: E402
    FP8_E4M3,
    SMEM_BYTES,
    SUPPORTED_HEAD_DIMS,
    KernelConfig,
    KernelKey,
)
from vllm_fa4.paged_prefill.policy import FP8_TABLE, serving_configs  # noqa: E402
from vllm_fa4.paged_prefill.route import kernel_reads_fp8  # noqa: E402


def fp8_key(hd=128, page=16, **features) -> KernelKey:
    return KernelKey("bfloat16", hd, page, 4, kv_dtype=FP8_E4M3, **features)


@pytest.mark.parametrize(
    "hd,spec,stages",
    [
        (128, "queue+pv_wait_mid+lazy_max", 2),  # one Q stage: two fp8 slots fit
        (128, "queue_with_work+pv_wait_mid+q_tma+lazy_max", 1),  # Q's ring takes the second
        (64, "queue_with_work+overlap+q_tma+lazy_max+mma_wgs=3", 2),
        (256, "queue+overlap", 1),  # 128 KB of 16-bit K/V stages
        # fp8_qk: K stays e4m3 (no 16-bit K stages), so Q's ring and two V slots fit
        (128, "queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk", 2),
        (128, "queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded", 2),
        # fp8_qk_rounded at 256: Q's one e4m3 part fits where the split's two do not
        (256, "queue+overlap+lazy_max+fp8_qk_rounded", 2),
        (256, "one_per_cta+overlap+fp8_qk_rounded", 2),
    ],
)
def test_staging_stages_fill_shared_memory(hd, spec, stages):
    config, key = KernelConfig.parse(spec), fp8_key(hd)
    assert config.unsupported_reason(key) is None
    assert config.staging_stages(key) == stages
    assert config._smem_bytes(key, stages) <= SMEM_BYTES - 1024
    assert config.staging_stages(KernelKey("bfloat16", hd, 16, 4)) == 0


@pytest.mark.parametrize(
    "spec,words",
    [
        ("queue+overlap+wide_box", "'wide_box' with an fp8 KV cache"),
        ("queue+overlap+q_prefetch", "'q_prefetch' with an fp8 KV cache"),
    ],
)
def test_configs_the_fp8_kernel_does_not_build(spec, words):
    config = KernelConfig.parse(spec)
    assert words in config.unsupported_reason(fp8_key())
    assert config.unsupported_reason(KernelKey("bfloat16", 128, 16, 4)) is None


@pytest.mark.parametrize("qk", ["fp8_qk", "fp8_qk_rounded"])
@pytest.mark.parametrize(
    "key,words",
    [
        (KernelKey("bfloat16", 128, 16, 4), "'{qk}' without an fp8 KV cache"),
        (KernelKey("float16", 128, 16, 4, kv_dtype=FP8_E4M3), "float16 model (bfloat16 only)"),
        (fp8_key(64), "'{qk}' at head dim 64"),
    ],
)
def test_fp8_qk_builds_where_it_was_measured_only(qk, key, words):
    """Q's split into two e4m3 parts holds a bf16 value, not an fp16 one; head dim 64 was
    never measured (Q rounded once: the same kernel). The soft cap builds: the rows' Q scales
    ride in the cap's prescale (tanh's input) instead of the softmax scale."""
    config = KernelConfig.parse(f"queue+pv_wait_mid+lazy_max+{qk}")
    assert words.format(qk=qk) in config.unsupported_reason(key)
    assert config.unsupported_reason(fp8_key(128, page=128, sliding_window=True)) is None
    assert config.unsupported_reason(fp8_key(128, softcap=True)) is None
    # head dim 256: the split's two Q parts (64 KB) do not fit beside the K/V rings, one does
    at_256 = config.unsupported_reason(fp8_key(256))
    assert (at_256 is None) == (qk == "fp8_qk_rounded"), at_256
    prefetch = KernelConfig.parse(f"queue+overlap+q_prefetch+{qk}")
    assert "q_prefetch" in prefetch.unsupported_reason(fp8_key())


@pytest.mark.parametrize("page", [16, 128])
def test_fp8_qk_serves_long_bf16_batches_at_head_dim_128(page):
    """policy.FP8_BF16_LONG: bf16 models' long batches split Q, with and without the window;
    fp16 models, soft-capped keys and short batches keep the converted picks of FP8_TABLE."""
    from vllm_fa4.kernels.config import Fp8Qk

    for window in (False, True):
        bf16 = serving_configs(fp8_key(128, page, sliding_window=window))
        assert bf16.long.fp8_qk is Fp8Qk.SPLIT_Q and bf16.short.fp8_qk is Fp8Qk.CONVERTED_K
    for key in (
        KernelKey("float16", 128, page, 4, kv_dtype=FP8_E4M3),
        fp8_key(128, page, softcap=True),
        fp8_key(128, page, sliding_window=True, softcap=True),
        fp8_key(64, page),
    ):
        configs = serving_configs(key)
        assert all(c.fp8_qk is Fp8Qk.CONVERTED_K for c in configs.all), key
        assert all(c.unsupported_reason(key) is None for c in configs.all), key


def test_e4m3_query_rounds_q_on_long_bf16_batches_only():
    """policy.FP8_E4M3_Q_LONG (VLLM_FA4_FP8_QUERY=e4m3): long batches of bf16 models at head
    dims 128 (with and without the window, uncapped) and 256 (with and without the window and
    the cap: Gemma 2 and 3) round Q (every GQA group builds it); short batches, fp16 models,
    head dim 128 with the cap, head dim 64 and 16-bit caches keep the exact picks."""
    from vllm_fa4.kernels.config import Fp8Qk
    from vllm_fa4.paged_prefill.policy import Fp8Query

    def both(key):
        return serving_configs(key), serving_configs(key, fp8_query=Fp8Query.E4M3)

    rows = [(128, False, False), (128, True, False)]
    rows += [(256, window, cap) for window in (False, True) for cap in (False, True)]
    for hd, window, cap in rows:
        for page in (16, 32, 128):
            for group in (1, 2, 3, 4, 7, 8):
                key = KernelKey(
                    "bfloat16",
                    hd,
                    page,
                    group,
                    sliding_window=window,
                    softcap=cap,
                    kv_dtype=FP8_E4M3,
                )
                exact, rounded = both(key)
                assert rounded.long.fp8_qk is Fp8Qk.ROUNDED_Q, key
                assert rounded.long.unsupported_reason(key) is None, key
                assert rounded.short == exact.short and exact.long.fp8_qk is not Fp8Qk.ROUNDED_Q
    for key in (
        KernelKey("float16", 128, 16, 4, kv_dtype=FP8_E4M3),
        KernelKey("float16", 256, 16, 2, softcap=True, kv_dtype=FP8_E4M3),
        fp8_key(128, softcap=True),
        fp8_key(128, sliding_window=True, softcap=True),
        fp8_key(64),
        KernelKey("bfloat16", 128, 16, 4),
        KernelKey("bfloat16", 256, 128, 2, softcap=True),
    ):
        exact, rounded = both(key)
        assert rounded == exact, key


def test_fp8_registers_fit_and_16bit_splits_are_unchanged():
    for spec in ("queue+overlap", "queue+overlap+mma_wgs=3", "pages_ahead"):
        config = KernelConfig.parse(spec)
        hd = 64 if config.mma_wgs == 3 else 128
        producer, consumer = config.register_split(fp8_key(hd))
        assert producer == 40  # the converter warps' share
        assert 128 * producer + 128 * config.mma_wgs * consumer <= 65536
        sixteen = KernelKey("bfloat16", hd, 16, 4)
        assert config.register_split(sixteen) == (config.producer_regs, config.mma_regs)


@pytest.mark.parametrize("hd", SUPPORTED_HEAD_DIMS)
@pytest.mark.parametrize("page", [16, 128])
@pytest.mark.parametrize("window", [False, True])
def test_every_fp8_serving_pick_builds(hd, page, window):
    key = fp8_key(hd, page, sliding_window=window, softcap=window, sinks=window)
    assert kernel_reads_fp8(key)
    for config in serving_configs(key).all:
        assert config.unsupported_reason(key) is None, config.spec
        assert config.staging_stages(key) >= 1
    assert (hd, window, page >= 128) in FP8_TABLE


def test_16bit_keys_keep_their_picks_and_no_fp8_route():
    """A 16-bit key runs TABLE's row (LONG_BY_PAGE's long pick where it names the key's page
    size; head dim 128's long pick with the K/V multicast, MULTICAST_LONG), never FP8_TABLE's,
    and no fp8 route."""
    from vllm_fa4.paged_prefill.policy import LONG_BY_PAGE, MULTICAST_LONG, TABLE

    for (hd, window, big), (long, short) in TABLE.items():
        page = 128 if big else 16
        key = KernelKey("bfloat16", hd, page, 4, sliding_window=window)
        long = LONG_BY_PAGE.get((hd, window, page, False), long)
        if hd == 128 and not window:
            long += "+" + MULTICAST_LONG
        assert tuple(c.spec for c in (serving_configs(key).long, serving_configs(key).short)) == (
            tuple(KernelConfig.parse(s).spec for s in (long, short))
        )
        assert not kernel_reads_fp8(key)


def compiled_ptx(tmp_path, page: int, spec: str, head_dim: int = 128) -> str:
    """The PTX of one bf16-model fp8 build (with LSE), compiled for sm_90a (no cache: the
    dump is this compile's)."""
    from vllm_fa4.kernels.compile import compile_kernel

    key = KernelKey("bfloat16", head_dim, page, 4, kv_dtype=FP8_E4M3)
    compile_kernel(key, KernelConfig.parse(spec), True, dump_dir=str(tmp_path))
    (ptx,) = tmp_path.rglob("*.ptx")
    return ptx.read_text()


def test_fp8_kernel_ptx_converts_in_the_producer(tmp_path, monkeypatch):
    """One compile: a bf16 model's fp8 build runs its GEMMs in fp16 (every wgmma f16, no
    bf16 repack of K/V: one cvt per e4m3 pair), converts Q bf16 -> fp16 once per tile and
    writes O in bf16."""
    import re

    text = compiled_ptx(tmp_path, 16, "queue+pv_wait_mid+lazy_max")
    assert text.count("cvt.rn.f16x2.e4m3x2") >= 8
    assert "prmt.b32" not in text  # no bf16 repack (fp8_kv's old route)
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.(\w+)\.(\w+)", text)
    assert wgmma and set(wgmma) == {("f16", "f16")}, set(wgmma)
    assert "cvt.f32.bf16" in text and "cvt.rn.f16x2.f32" in text  # Q, once per tile
    assert "cvt.rn.bf16x2.f32" in text  # O in the model's dtype
    assert "fence.proxy.async.shared::cta" in text
    # The converter loads a batch of pieces before its first store (a load cannot move above
    # a store it may alias; per piece, each LDS's latency was exposed): LOAD_BATCH 16-byte
    # loads come before the first conversion's store.
    lines = text.splitlines()
    first_cvt = next(i for i, line in enumerate(lines) if "cvt.rn.f16x2.e4m3x2" in line)
    first_store = next(i for i in range(first_cvt, len(lines)) if "st.shared" in lines[i])
    fences = ("st.shared", "bar.", "mbarrier")
    start = max((i for i in range(first_cvt) if any(f in lines[i] for f in fences)), default=0)
    loads = sum("ld.shared.v4" in line for line in lines[start:first_store])
    assert loads >= fp8_kv.LOAD_BATCH, loads


def test_fp8_qk_ptx_runs_q_kt_on_e4m3_and_converts_only_v(tmp_path):
    """fp8_qk's compile (sm_90a): Q K^T as e4m3 x e4m3 wgmmas (k32), P V
    in fp16 on the converted V, Q split by cvt.rn.satfinite.e4m3x2.f32."""
    import re

    text = compiled_ptx(tmp_path, 128, "queue+pv_wait_mid+lazy_max+fp8_qk")
    wgmma = set(
        re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+(k\d+)\.f32\.(\w+)\.(\w+)", text)
    )
    assert wgmma == {("k32", "e4m3", "e4m3"), ("k16", "f16", "f16")}, wgmma
    assert "cvt.rn.satfinite.e4m3x2.f32" in text  # Q's split, once a tile
    assert "cvt.rn.f16x2.e4m3x2" in text  # V's conversion (and the split's hi back to f16)


def test_fp8_qk_rounded_ptx_runs_half_the_e4m3_wgmmas(tmp_path):
    """fp8_qk_rounded (Q rounded once to e4m3): the split's kernel with its lo part's Q K^T
    gone, so half of fp8_qk's e4m3 wgmmas, the fp16 P V unchanged."""
    import re

    def wgmmas(spec: str, folder: str) -> dict:
        (tmp_path / folder).mkdir()
        text = compiled_ptx(tmp_path / folder, 128, spec)
        found = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k\d+\.f32\.(\w+)\.\w+", text)
        return {kind: found.count(kind) for kind in set(found)}

    split = wgmmas("queue+pv_wait_mid+lazy_max+fp8_qk", "split")
    rounded = wgmmas("queue+pv_wait_mid+lazy_max+fp8_qk_rounded", "rounded")
    assert split["e4m3"] > 0 and rounded["e4m3"] * 2 == split["e4m3"], (split, rounded)
    assert rounded["f16"] == split["f16"] > 0


def test_fp8_qk_rounded_compiles_at_head_dim_256(tmp_path):
    """Head dim 256 (Gemma-2's shape, no cap): Q K^T on e4m3 x e4m3 wgmmas from one Q part,
    P V in fp16, and the shared memory the config counts is what the kernel asks for (a
    build over the limit fails here, not on the GPU)."""
    import re

    text = compiled_ptx(tmp_path, 16, "queue+overlap+lazy_max+fp8_qk_rounded", head_dim=256)
    wgmma = set(
        re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+(k\d+)\.f32\.(\w+)\.(\w+)", text)
    )
    assert wgmma == {("k32", "e4m3", "e4m3"), ("k16", "f16", "f16")}, wgmma


@pytest.mark.parametrize("warps", [2, 3])
@pytest.mark.parametrize("groups,chunks", [(16, 1), (16, 2), (8, 4)])  # head dims 64/128/256
def test_converter_warps_store_every_piece_once_and_share_them_evenly(warps, groups, chunks):
    """convert_tile's split (warp_pieces): every (8-row group, chunk) piece of a tile stored
    by exactly one warp, and no warp more than one piece above another (whole groups gave
    one warp 12 of 32 pieces at head dim 128 where 11 is the most needed)."""
    shared, rest = fp8_kv.warp_pieces(groups, chunks, warps)
    per_warp = [[(rank + m, k) for m, k in shared] + list(rest[rank]) for rank in range(warps)]
    every = sorted(p for mine in per_warp for p in mine)
    assert every == [(m, k) for m in range(groups) for k in range(chunks)]
    counts = [len(mine) for mine in per_warp]
    assert max(counts) - min(counts) <= 1, counts
    assert max(counts) == -(-groups * chunks // warps)


def test_converter_warps_leave_the_loading_warps_alone():
    assert fp8_kv.converter_warps(False) == (1, 2, 3)
    assert fp8_kv.converter_warps(True) == (2, 3)


@pytest.mark.parametrize("element_bytes", [1, 2])
@pytest.mark.parametrize("tile_base", [0, 1024, 3 * 16384])
def test_hoisted_swizzle_offsets_match_the_swizzle_for_every_element(element_bytes, tile_base):
    """convert_tile adds offsets computed once per block (unit_offsets) to unswizzled
    addresses. Walk every lane's every piece of a (128, 128) tile in 64-column chunks, as
    _warp_copy maps them, and compare each element's address with the swizzled one. One
    offset per 32-byte piece (bc94cb9's wrong GPU results) fails here."""
    bits, base, shift = fp8_kv.SWIZZLES[8 * element_bytes]

    def swizzled(addr):
        return addr ^ ((addr >> shift) & (((1 << bits) - 1) << base))

    rows, chunk_cols = 128, fp8_kv.D_CHUNK
    row_bytes = chunk_cols * element_bytes
    piece_bytes = fp8_kv.VEC * element_bytes
    for lane in range(32):
        row0, col0 = lane // fp8_kv.LANES_PER_ROW, (lane % fp8_kv.LANES_PER_ROW) * fp8_kv.VEC
        first = tile_base + row0 * row_bytes + col0 * element_bytes
        offsets = fp8_kv.unit_offsets(first, element_bytes, piece_bytes)
        assert len(offsets) == piece_bytes // fp8_kv.UNIT_BYTES
        for group in range(rows // 8):
            for chunk in range(2):
                piece = first + group * 8 * row_bytes + chunk * rows * row_bytes
                for i in range(fp8_kv.VEC):
                    unit = i * element_bytes // fp8_kv.UNIT_BYTES
                    got = piece + (i + offsets[unit]) * element_bytes
                    assert got == swizzled(piece + i * element_bytes), (lane, group, chunk, i)
