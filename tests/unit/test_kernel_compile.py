"""Compile-only tests for the SM90 prefill kernel (CPU, no GPU needed)."""

import dataclasses
import os
from functools import partial

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

import pytest  # noqa: E402

from vllm_fa4.kernels.config import (  # noqa: E402
    DEFAULT_CONFIG,
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_DIMS,
    SUPPORTED_PAGE_SIZES,
    KernelConfig,
    KernelKey,
)
from vllm_fa4.testing.variants import ALL_CONFIGS, parse_configs  # noqa: E402

# Every compile-time key a Llama-family model can need (dtype x head dim x page size) at GQA 4,
# plus odd and extreme GQA groups (the group size only changes row-to-head arithmetic).
KEYS = sorted(
    {
        KernelKey(dt, hd, ps, 4)
        for dt in SUPPORTED_DTYPES
        for hd in SUPPORTED_HEAD_DIMS
        for ps in SUPPORTED_PAGE_SIZES
    }
    | {KernelKey("bfloat16", 128, 16, qpk) for qpk in (1, 3, 8, 32)}
    | {KernelKey("float16", 64, 32, 3)},
    key=repr,
)


@pytest.mark.parametrize("key", KEYS, ids=repr)
def test_compile_key(key):
    from vllm_fa4.kernels.compile import compile_kernel

    assert compile_kernel(key, DEFAULT_CONFIG, has_lse=True) is not None


# Issue 11's keys (sliding window, soft cap, sinks; alone and together) with every config
# serving may pick for them, plus base (the non-overlapped loops), at both page regimes.
FEATURE_KEYS = [
    KernelKey("bfloat16", 128, 16, 4, sliding_window=True),
    KernelKey("float16", 128, 128, 4, softcap=True),
    KernelKey("bfloat16", 64, 16, 3, sinks=True),
    KernelKey("bfloat16", 256, 128, 2, sliding_window=True, softcap=True, sinks=True),
    KernelKey("bfloat16", 128, 128, 8, sliding_window=True, softcap=True, sinks=True),
]


@pytest.mark.parametrize("key", FEATURE_KEYS, ids=repr)
def test_compile_model_feature_keys(key):
    from vllm_fa4.kernels.compile import compile_kernel
    from vllm_fa4.kernels.config import serving_configs

    for config in (*serving_configs(key).all, DEFAULT_CONFIG):
        for has_lse in (False, True):
            assert compile_kernel(key, config, has_lse=has_lse) is not None


# Every non-base config at the benchmark key; the combined variant also at the head-dim /
# page / GQA extremes (smem epilogue lane layout per head dim, box splitting at page 128).
VARIANT_CASES = [
    (c.spec, KernelKey("bfloat16", 64 if c.mma_wgs == 3 else 128, 16, 4)) for c in ALL_CONFIGS[1:]
] + [
    # three consumer warpgroups: gpt-oss's group of 8 at page 128, the staged epilogue, and
    # the producer's 40 registers with page_prefetch (consumers then get 152)
    ("overlap+pingpong+softmax_per_arm+persistent+mma_wgs=3", KernelKey("bfloat16", 64, 128, 8)),
    ("overlap+pingpong+softmax_per_arm+smem_epilogue+mma_wgs=3", KernelKey("float16", 64, 16, 1)),
    ("overlap+pingpong+softmax_per_arm+page_prefetch+mma_wgs=3", KernelKey("bfloat16", 64, 16, 3)),
    ("overlap+pingpong+softmax_per_arm", KernelKey("bfloat16", 128, 128, 4)),
    ("overlap+pingpong+softmax_per_arm+smem_epilogue", KernelKey("bfloat16", 128, 64, 4)),
    ("overlap+pingpong+softmax_per_arm+smem_epilogue", KernelKey("float16", 64, 128, 1)),
    ("overlap+pingpong+softmax_per_arm+smem_epilogue", KernelKey("bfloat16", 256, 16, 3)),
    ("overlap+pingpong+softmax_per_arm+smem_epilogue", KernelKey("bfloat16", 256, 128, 8)),
    ("base", KernelKey("float16", 64, 16, 3)),
    ("overlap+pingpong+softmax_per_arm+page_prefetch", KernelKey("bfloat16", 128, 128, 4)),
    ("overlap+pingpong+softmax_per_arm+page_prefetch", KernelKey("bfloat16", 128, 64, 4)),
    ("overlap+pingpong+softmax_per_arm+page_prefetch", KernelKey("float16", 256, 16, 3)),
    ("smem_epilogue+persistent", KernelKey("bfloat16", 256, 128, 8)),
    ("persistent", KernelKey("float16", 64, 32, 1)),
    # q_tma's box (G heads x T tokens x 64): a group that does not divide the tile (3: 126
    # of 128 rows), one head per KV head, 32 heads (4 tokens), three warpgroups
    (
        "overlap+pingpong+softmax_per_arm+persistent+lazy_max+q_tma",
        KernelKey("bfloat16", 128, 128, 3),
    ),
    ("persistent+q_tma", KernelKey("float16", 128, 16, 1)),
    # queue_work's slot with the window's two words
    (
        "overlap+pingpong+softmax_per_arm+persistent+q_tma+queue_work",
        KernelKey("bfloat16", 128, 16, 4, sliding_window=True),
    ),
    ("q_tma", KernelKey("bfloat16", 128, 32, 32)),
    (
        "overlap+pingpong+softmax_per_arm+persistent+q_tma+mma_wgs=3",
        KernelKey("bfloat16", 64, 128, 8),
    ),
    # wide_box's 5-D box (64, 8 rows, chunks, row groups): one chunk (head dim 64), four
    # (256, 64-key tiles), a 128-row box, a page split into 32-row boxes, the base loop
    ("wide_box", KernelKey("float16", 64, 32, 3)),
    ("overlap+pingpong+softmax_per_arm+wide_box", KernelKey("bfloat16", 256, 128, 2)),
    ("overlap+pingpong+softmax_per_arm+persistent+wide_box", KernelKey("bfloat16", 256, 16, 4)),
    (
        "overlap+pingpong+softmax_per_arm+persistent+lazy_max+q_tma+queue_work+v_warp+wide_box",
        KernelKey("bfloat16", 128, 128, 8),
    ),
    ("overlap+pingpong+softmax_per_arm+page_prefetch+wide_box", KernelKey("bfloat16", 128, 64, 4)),
    # pv_wait_mid's split softmax after the soft cap and the window's mask, at head dim 256
    (
        "overlap+pingpong+softmax_per_arm+persistent+pv_wait_mid",
        KernelKey("bfloat16", 256, 128, 2, sliding_window=True, softcap=True, sinks=True),
    ),
]


def test_wide_box_needs_whole_boxes_per_block():
    """wide_box addresses the cache as token slots: a block stride that is not a whole
    number of boxes is refused with the layout named, vLLM's layouts pass."""
    import torch

    from vllm_fa4.kernels.compile import check_slot_boxes
    from vllm_fa4.paged_prefill.layout import split_kv_cache

    cache = torch.empty(4, 8, 16, 2 * 128, dtype=torch.bfloat16)  # logical (blocks, H, page, 2D)
    nhd = cache.view(4, 16, 8, 256).transpose(1, 2)  # NHD memory
    k, _ = split_kv_cache(nhd, 128)
    check_slot_boxes(k, 16)
    check_slot_boxes(k[::2], 16)  # every other block: block stride 2 pages
    padded = torch.empty(4, 16 * 8 * 256 + 64, dtype=torch.bfloat16)[:, : 16 * 8 * 256]
    k_padded, _ = split_kv_cache(padded.view(4, 16, 8, 256).transpose(1, 2), 128)
    with pytest.raises(ValueError, match="wide_box needs the cache's block stride"):
        check_slot_boxes(k_padded, 16)


@pytest.mark.parametrize("spec,key", VARIANT_CASES, ids=[f"{s}-{k!r}" for s, k in VARIANT_CASES])
def test_compile_variants(spec, key):
    from vllm_fa4.kernels.compile import compile_kernel

    assert compile_kernel(key, KernelConfig.parse(spec), has_lse=True) is not None


def test_three_warpgroups_at_head_dim_64_only():
    from vllm_fa4.kernels.compile import compile_kernel

    three = KernelConfig.parse("overlap+pingpong+softmax_per_arm+mma_wgs=3")
    assert three.unsupported_reason(KernelKey("bfloat16", 64, 16, 4)) is None
    for hd in (128, 256):
        assert "head dim 64 only" in three.unsupported_reason(KernelKey("bfloat16", hd, 16, 4))
    assert "mma_wgs=4" in KernelConfig.parse("mma_wgs=4").unsupported_reason(
        KernelKey("bfloat16", 64, 16, 4)
    )
    with pytest.raises(ValueError, match="head dim 64 only"):
        compile_kernel(KernelKey("bfloat16", 128, 16, 4), three)
    # 128 producer + 384 consumer threads fit the register file
    for cfg in (three, KernelConfig.parse("page_prefetch+mma_wgs=3")):
        assert cfg.num_threads == 512
        assert 128 * cfg.producer_regs + 384 * cfg.mma_regs <= 65536


def test_config_spellings_roundtrip(monkeypatch):
    for config in ALL_CONFIGS:
        assert KernelConfig.parse(config.spec) == config
    assert len({c.spec for c in ALL_CONFIGS}) == len(ALL_CONFIGS)
    assert parse_configs("all") == ALL_CONFIGS
    monkeypatch.delenv("VLLM_FA4_VARIANT", raising=False)
    assert parse_configs(None) == (None,)  # each key's default config
    assert parse_configs("default base") == (None, KernelConfig())
    monkeypatch.setenv("VLLM_FA4_VARIANT", "persistent")
    assert parse_configs(None) == (KernelConfig(persistent=True),)
    key = KernelKey("bfloat16", 128, 16, 4)
    assert "go together" in KernelConfig.parse("softmax_per_arm").unsupported_reason(key)
    pv_mid = KernelConfig.parse("pv_wait_mid")
    assert "needs 'softmax_per_arm'" in pv_mid.unsupported_reason(key)
    assert "needs 'persistent'" in KernelConfig.parse("q_prefetch").unsupported_reason(key)
    both = KernelConfig.parse("smem_epilogue+persistent+q_prefetch")
    assert "exclude each other" in both.unsupported_reason(key)
    both = KernelConfig.parse("q_tma+persistent+q_prefetch")
    assert "exclude each other" in both.unsupported_reason(key)
    # a staged epilogue writes O into the tile's own Q stage, freed after it
    assert KernelConfig.parse("q_tma+smem_epilogue").unsupported_reason(key) is None
    # two Q stages: 2 K/V stages fit head dim 128, not 256; 3 K/V stages fit head dim 64 only
    assert KernelConfig.parse("q_tma").unsupported_reason(key) is None
    assert "2 Q stages" in KernelConfig.parse("q_tma").unsupported_reason(
        KernelKey("bfloat16", 256, 16, 4)
    )
    assert "needs 'persistent' and 'q_tma'" in KernelConfig.parse(
        "persistent+queue_work"
    ).unsupported_reason(key)
    assert KernelConfig.parse("persistent+q_tma+queue_work").unsupported_reason(key) is None


def test_serving_configs_by_head_dim_page_size_and_batch():
    from vllm_fa4.kernels.config import (
        OVERLAP_PINGPONG,
        PERSISTENT_OVERLAP,
        PERSISTENT_OVERLAP_QPF,
        PERSISTENT_OVERLAP_QPF_3WG,
        PERSISTENT_OVERLAP_QTMA,
        PERSISTENT_OVERLAP_QWORK,
        PERSISTENT_OVERLAP_QWORK_3WG,
        PERSISTENT_OVERLAP_QWORK_V_WARP,
        PERSISTENT_OVERLAP_QWORK_V_WARP_PAGES_AHEAD,
        PERSISTENT_OVERLAP_QWORK_V_WARP_PAGES_AHEAD_WIDE,
        serving_configs,
    )

    def lazy(config):
        return dataclasses.replace(config, lazy_max=True)

    assert PERSISTENT_OVERLAP.persistent and PERSISTENT_OVERLAP.overlap
    assert KernelConfig.parse(PERSISTENT_OVERLAP.spec + "+q_prefetch") == PERSISTENT_OVERLAP_QPF
    assert KernelConfig.parse(PERSISTENT_OVERLAP.spec + "+q_tma") == PERSISTENT_OVERLAP_QTMA
    assert KernelConfig.parse(PERSISTENT_OVERLAP_QTMA.spec + "+queue_work") == (
        PERSISTENT_OVERLAP_QWORK
    )
    staged = dataclasses.replace(PERSISTENT_OVERLAP_QWORK, smem_epilogue=True)
    for page in (16, 32, 64, 128, 256):  # head dim 128: q_tma + queue_work + lazy_max, short
        configs = serving_configs(KernelKey("bfloat16", 128, page, 4))  # batches staged;
        # long ones load V on a second producer warp, below page 128 with the page table
        # read a block ahead and whole-row K/V boxes
        long = (
            PERSISTENT_OVERLAP_QWORK_V_WARP
            if page >= 128
            else PERSISTENT_OVERLAP_QWORK_V_WARP_PAGES_AHEAD_WIDE
        )
        # ... and every one waits for P V after the first row's exponentials
        mid = partial(dataclasses.replace, pv_wait_mid=True)
        assert configs.all == (mid(lazy(long)), mid(lazy(staged)))
        assert configs.pick(100, 10**6) == mid(lazy(long))
    v_warp = dataclasses.replace(PERSISTENT_OVERLAP_QWORK, v_warp=True)
    assert v_warp == PERSISTENT_OVERLAP_QWORK_V_WARP
    assert dataclasses.replace(v_warp, page_prefetch=True) == (
        PERSISTENT_OVERLAP_QWORK_V_WARP_PAGES_AHEAD
    )
    assert dataclasses.replace(v_warp, page_prefetch=True, wide_box=True) == (
        PERSISTENT_OVERLAP_QWORK_V_WARP_PAGES_AHEAD_WIDE
    )
    assert (
        KernelConfig.parse("persistent+q_tma+v_warp").unsupported_reason(
            KernelKey("bfloat16", 128, 16, 4)
        )
        == "flag 'v_warp' needs 'queue_work'"
    )
    for page in (16, 32, 64):
        # with a sliding window (lazy_max not measured there): the session-4 picks
        windowed = serving_configs(KernelKey("bfloat16", 128, page, 4, sliding_window=True))
        assert windowed.all == (PERSISTENT_OVERLAP, PERSISTENT_OVERLAP_QPF)
        assert windowed.pick(100, 10**6) == PERSISTENT_OVERLAP
        assert windowed.pick(100, 100) == PERSISTENT_OVERLAP_QPF
    p128 = KernelKey("bfloat16", 128, 128, 4)
    p128_windowed = KernelKey("bfloat16", 128, 128, 4, sliding_window=True)
    assert serving_configs(p128_windowed).all == (PERSISTENT_OVERLAP_QPF,)
    assert dataclasses.replace(PERSISTENT_OVERLAP_QPF, mma_wgs=3) == PERSISTENT_OVERLAP_QPF_3WG
    assert dataclasses.replace(PERSISTENT_OVERLAP_QWORK, mma_wgs=3) == PERSISTENT_OVERLAP_QWORK_3WG
    for page in (16, 64, 128):  # head dim 64: three warpgroups, every batch; short ones
        configs = serving_configs(KernelKey("bfloat16", 64, page, 8))  # with pv_wait_mid
        three = lazy(PERSISTENT_OVERLAP_QWORK_3WG)
        assert configs.all == (three, dataclasses.replace(three, pv_wait_mid=True))
        assert configs.pick(100, 10**6) == three
        # gpt-oss's 128-key window: lazy_max has nothing to skip there (0 to -1.8 %)
        windowed = serving_configs(KernelKey("bfloat16", 64, page, 8, sliding_window=True))
        assert windowed.all == (PERSISTENT_OVERLAP_QPF_3WG,)
    for page in (16, 64):  # head dim 256: lazy_max for long batches only
        configs = serving_configs(KernelKey("bfloat16", 256, page, 4))
        assert configs.all == (lazy(PERSISTENT_OVERLAP), PERSISTENT_OVERLAP)
        assert configs.pick(100, 10**6) == lazy(PERSISTENT_OVERLAP)
        assert configs.pick(100, 100) == PERSISTENT_OVERLAP
        windowed = serving_configs(KernelKey("bfloat16", 256, page, 4, sliding_window=True))
        assert windowed.all == (PERSISTENT_OVERLAP,)
    configs = serving_configs(KernelKey("bfloat16", 256, 128, 4))
    assert configs.all == (OVERLAP_PINGPONG, PERSISTENT_OVERLAP)
    limit = configs.short_max_blocks
    assert configs.pick(100, 100 * limit) == PERSISTENT_OVERLAP  # mean cost at the limit
    assert configs.pick(100, 100 * limit + 1) == OVERLAP_PINGPONG
    assert configs.pick(0, 0) == OVERLAP_PINGPONG
    for key in (p128, KernelKey("float16", 64, 16, 1), KernelKey("bfloat16", 256, 16, 2)):
        assert all(c.unsupported_reason(key) is None for c in serving_configs(key).all)
    fixed = serving_configs(p128, KernelConfig(persistent=True))
    assert fixed.all == (KernelConfig(persistent=True),)
    assert fixed.pick(10, 10) == fixed.pick(10, 10**6) == KernelConfig(persistent=True)


@pytest.mark.parametrize("spec", ["pingpnog", "smemepi", "mma_wgs", "overlap=1", "mma_wgs=x"])
def test_bad_config_spelling_names_the_valid_ones(spec, monkeypatch):
    from vllm_fa4 import envs

    with pytest.raises(ValueError, match="mma_wgs"):
        KernelConfig.parse(spec)
    monkeypatch.setenv("VLLM_FA4_VARIANT", spec)
    with pytest.raises(ValueError, match="VLLM_FA4_VARIANT"):
        envs.kernel_config()


def test_disk_cache_roundtrip(tmp_path):
    """Export through compile_keys, then load the entry in a fresh process (no GPU needed
    to load a module; calling it would need one)."""
    env = dict(os.environ, VLLM_FA4_CACHE_DIR=str(tmp_path), CUTE_DSL_ARCH="sm_90a")
    script = textwrap.dedent(
        """
        import sys
        from vllm_fa4.kernels import compile as c
        from vllm_fa4.kernels.config import KernelKey
        key = KernelKey("bfloat16", 128, 16, 4)
        path = c._CACHE.entry_path((key, c.DEFAULT_CONFIG, False))
        existed = path.exists()
        called = []
        orig = c._CACHE.compile_fn
        c._CACHE.compile_fn = lambda *a, **k: (called.append(1), orig(*a, **k))[1]
        c.compile_keys([key])
        print("EXISTED", existed, "COMPILED", bool(called))
        """
    )
    first = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert "EXISTED False COMPILED True" in first.stdout
    assert list(tmp_path.glob("*.o")), "no cache entry written"
    second = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240
    )
    assert second.returncode == 0, second.stderr[-3000:]
    assert "EXISTED True COMPILED False" in second.stdout, second.stdout + second.stderr[-2000:]


def _local_memory_instructions(key: KernelKey, config: KernelConfig) -> int:
    """Compile (key, config) in a fresh process (the DSL reads its dump folder at import) and
    count the SASS instructions that touch local memory (register spills)."""
    import pathlib
    import shutil
    import tempfile

    import triton

    tool = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    tool = str(tool) if tool.exists() else shutil.which("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump not found (triton's bundled copy or PATH)")
    dump = tempfile.mkdtemp(prefix="vllm-fa4-spills-")
    code = textwrap.dedent(
        f"""
        from vllm_fa4.kernels.compile import compile_kernel
        from vllm_fa4.kernels.config import KernelConfig, KernelKey
        compile_kernel({key!r}, KernelConfig.parse({config.spec!r}), has_lse=False)
        """
    )
    env = dict(os.environ, CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=dump, CUTE_DSL_ARCH="sm_90a")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    cubins = sorted(pathlib.Path(dump).rglob("*.cubin"))
    assert len(cubins) == 1, cubins
    sass = subprocess.run([tool, "-sass", str(cubins[0])], capture_output=True, text=True).stdout
    shutil.rmtree(dump, ignore_errors=True)
    assert "HGMMA" in sass  # the disassembly is real
    return sum(1 for line in sass.splitlines() if "LDL" in line or "STL" in line)


# Head dim 64 runs three consumer warpgroups at 160 registers per thread, where a few more live
# values spill inside the block loop (gpt-oss's windowed layer had 65 local loads/stores until
# the window mask became one sign test per element: 3-5 % of its speed, docs/perf-notes.md).
NO_SPILL_KEYS = [
    KernelKey("bfloat16", 64, 16, 8, sliding_window=True, sinks=True),  # gpt-oss windowed
    KernelKey("bfloat16", 64, 16, 4),  # Llama-3.2-1B
]


@pytest.mark.parametrize("key", NO_SPILL_KEYS, ids=repr)
def test_three_warpgroup_serving_kernels_do_not_spill(key):
    from vllm_fa4.kernels.config import serving_configs

    for config in serving_configs(key).all:
        assert config.mma_wgs == 3
        assert _local_memory_instructions(key, config) == 0, config.spec
