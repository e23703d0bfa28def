"""Compile-only tests for the SM90 prefill kernel (CPU, no GPU needed).

The default run (scripts/test.sh) compiles one kernel per config family serving can launch
(``test_compile_served_config_family``: 42 with the FP8 families and the odd GQA groups'
fallbacks). The full matrix, marker ``compile_matrix`` (deselected by default; .ci/run runs
it), compiles every key with every config serving can launch for it and the model-feature
keys: ``pytest -m compile_matrix``, 79 tests (about 1.5 minutes on 2 idle cores of the
2026-11-29 machine; CI machines have been 2.6 times slower). The configs serving never
launches, marker ``compile_variants`` (38 kernels, deselected by default and by .ci/run: GPU
tests sweep them), compile with ``pytest -m compile_variants`` after a change to the kernel's
shared code. Each dtype is compiled on half of the head-dim x page-size cells
(``chessboard_dtype``), each feature config with or without the LSE. Kernels go through the
disk cache (``VLLM_FA4_CACHE_DIR``, one per test run: tests/conftest.py), so a kernel one test
process compiled is loaded, not compiled again, by another of the same run.
"""

import dataclasses
import os
from itertools import product

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402

import pytest  # noqa: E402

from vllm_fa4.kernels.config import (  # noqa: E402
    DEFAULT_CONFIG,
    FP8_E4M3,
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_DIMS,
    SUPPORTED_PAGE_SIZES,
    BlockStep,
    KernelConfig,
    KernelKey,
    QLoad,
    TileProbe,
    Tiles,
)
from vllm_fa4.paged_prefill.policy import launchable_configs, serving_configs  # noqa: E402
from vllm_fa4.testing.variants import ALL_CONFIGS, parse_configs  # noqa: E402

DEBUG_BASELINE = KernelConfig.parse("one_per_cta+serial")  # the one serial loop kept


def assert_compiles(key: KernelKey, config: KernelConfig, has_lse: bool) -> None:
    from vllm_fa4.kernels.compile import build_kernel

    assert build_kernel(key, config, has_lse) is not None


def case_id(key: KernelKey, config: KernelConfig, *has_lse: bool) -> str:
    lse = [f"lse={has_lse[0]}"] if has_lse else []
    return "-".join([repr(key), config.spec, *lse])


def chessboard_dtype(head_dim: int, page_size: int) -> str:
    """The 16-bit dtype only changes the MMA's element type and one conversion, so each
    (head dim, page size) cell is compiled with one dtype, alternating like a chessboard:
    every dtype meets every head dim and every page size (half the compiles of the full
    cross product, which CI's time could not afford: docs/reliability.md, part 5). The
    README suite's config families use the same cells, so the matrix loads them from disk."""
    cell = SUPPORTED_HEAD_DIMS.index(head_dim) + SUPPORTED_PAGE_SIZES.index(page_size)
    return SUPPORTED_DTYPES[cell % len(SUPPORTED_DTYPES)]


# Every compile-time (head dim x page size) a Llama-family model can need at GQA 4, each dtype
# on half of them, plus odd and extreme GQA groups (the group size only changes row-to-head
# arithmetic).
KEYS = sorted(
    {
        KernelKey(chessboard_dtype(hd, ps), hd, ps, 4)
        for hd in SUPPORTED_HEAD_DIMS
        for ps in SUPPORTED_PAGE_SIZES
    }
    | {KernelKey("bfloat16", 128, 16, qpk) for qpk in (1, 3, 8, 32)}
    | {KernelKey("float16", 64, 32, 3)},
    key=repr,
)


def served_config_families() -> list[tuple[KernelKey, KernelConfig]]:
    """One (key, config) per distinct config that serving can launch for some supported key
    (every dtype, head dim, page size, model feature and KV cache dtype), with the plainest
    key that runs it (no feature, the compile matrix's dtype for its cell, smallest page
    first): serving picks configs by head dim, page size, window and cache dtype only, so
    these few kernels cover every code path serving compiles. An fp8 cache's kernel is its
    own family per staging depth (fp8_kv.py: the converter warps, one or two staging slots).
    A GQA group of 3 stands for the groups that do not divide 64, whose TMA-store picks store
    O another way (policy._fit_group)."""
    keys = [
        KernelKey(
            dt, hd, ps, group, sliding_window=window, softcap=softcap, sinks=sinks, kv_dtype=kv
        )
        for group in (4, 3)
        for dt in SUPPORTED_DTYPES
        for hd in SUPPORTED_HEAD_DIMS
        for ps in SUPPORTED_PAGE_SIZES
        for window in (False, True)
        for softcap in (False, True)
        for sinks in (False, True)
        for kv in (None, FP8_E4M3)
    ]
    plainest_first = sorted(
        keys,
        key=lambda k: (
            k.qhead_per_kvhead != 4,
            k.sliding_window,
            k.softcap,
            k.sinks,
            k.dtype != chessboard_dtype(k.head_dim, k.page_size),  # the matrix's cells
            k.page_size,
        ),
    )
    families: dict[tuple, KernelKey] = {}
    for key in plainest_first:
        for config in launchable_configs(key):
            families.setdefault((config, key.kv_dtype, config.staging_stages(key)), key)
    return [(key, config) for (config, _, _), key in families.items()]


SERVED_FAMILIES = served_config_families()


@pytest.mark.parametrize(
    "key,config", SERVED_FAMILIES, ids=[case_id(k, c) for k, c in SERVED_FAMILIES]
)
def test_compile_served_config_family(key, config):
    assert_compiles(key, config, has_lse=False)  # as warmup compiles it for serving


# FP8 caches (issue 30): each head dim at both page regimes (dtypes alternating), and odd
# GQA groups.
FP8_KEYS = sorted(
    {
        KernelKey(chessboard_dtype(hd, ps), hd, ps, 4, kv_dtype=FP8_E4M3)
        for hd in SUPPORTED_HEAD_DIMS
        for ps in (16, 128)
    }
    | {KernelKey("bfloat16", 128, 32, qpk, kv_dtype=FP8_E4M3) for qpk in (1, 3)},
    key=repr,
)

# The matrix: every key above with every config serving can launch for it.
SERVED_CASES = [(key, config) for key in (*KEYS, *FP8_KEYS) for config in launchable_configs(key)]


def test_default_run_compiles_one_kernel_per_served_family():
    """The README suite's compile cost stays one kernel per served config family (it once
    compiled all 122 matrix kernels: 45+ minutes on 2 cores), and those families cover every
    config the matrix's keys are served with."""
    assert {config for _, config in SERVED_CASES} <= {config for _, config in SERVED_FAMILIES}
    listed = subprocess.run(  # pyproject's addopts as the README's command applies them
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            __file__,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(__file__),
    )
    compiling = [
        line
        for line in listed.stdout.splitlines()
        if "::test_compile" in line or "::test_three_warpgroup_serving" in line
    ]
    assert len(compiling) == len(SERVED_FAMILIES), listed.stdout[-3000:] + listed.stderr[-2000:]
    assert all("::test_compile_served_config_family[" in line for line in compiling)


@pytest.mark.compile_matrix
@pytest.mark.parametrize("key,config", SERVED_CASES, ids=[case_id(k, c) for k, c in SERVED_CASES])
def test_compile_key(key, config):
    assert_compiles(key, config, has_lse=False)


@pytest.mark.compile_matrix
def test_compile_default_config_with_lse():
    assert_compiles(KernelKey("bfloat16", 128, 16, 4), DEFAULT_CONFIG, has_lse=True)


# Issue 11's keys (sliding window, soft cap, sinks; alone and together) with every config
# serving may pick for them, plus the serial step's loop, at both page regimes.
FEATURE_KEYS = [
    KernelKey("bfloat16", 128, 16, 4, sliding_window=True),
    KernelKey("bfloat16", 64, 16, 8, sliding_window=True, sinks=True, kv_dtype=FP8_E4M3),
    KernelKey("float16", 256, 128, 2, sliding_window=True, softcap=True, kv_dtype=FP8_E4M3),
    KernelKey("float16", 128, 128, 4, softcap=True),
    KernelKey("bfloat16", 64, 16, 3, sinks=True),
    KernelKey("bfloat16", 256, 128, 2, sliding_window=True, softcap=True, sinks=True),
    KernelKey("bfloat16", 128, 128, 8, sliding_window=True, softcap=True, sinks=True),
]


# Each config once, with and without the LSE output alternating (serving never asks for the
# LSE; the variant cases compile it with every swept config serving does not launch).
FEATURE_CASES = [
    (key, config, bool((i + j) % 2))
    for i, key in enumerate(FEATURE_KEYS)
    for j, config in enumerate((*serving_configs(key).all, DEBUG_BASELINE))
]


@pytest.mark.compile_matrix
@pytest.mark.parametrize(
    "key,config,has_lse", FEATURE_CASES, ids=[case_id(*case) for case in FEATURE_CASES]
)
def test_compile_model_feature_keys(key, config, has_lse):
    assert_compiles(key, config, has_lse)


# Every swept config serving does not launch, at the benchmark key (the served ones compile
# above at every key; GPU tests sweep them all with the LSE); features the served configs use
# at the head-dim / page / GQA extremes (smem epilogue lane layout per head dim, box
# splitting at page 128).
SERVED_CONFIGS = {config for _, config in SERVED_FAMILIES}
VARIANT_CASES = [
    (c.spec, KernelKey("bfloat16", 64 if c.mma_wgs == 3 else 128, 16, 4))
    for c in ALL_CONFIGS
    if c not in SERVED_CONFIGS
] + [
    # three consumer warpgroups: gpt-oss's group of 8 at page 128, the staged epilogue, and
    # the producer's 40 registers reading pages a block ahead (consumers then get 152)
    ("queue+overlap+mma_wgs=3", KernelKey("bfloat16", 64, 128, 8)),
    ("one_per_cta+overlap+staged_epilogue+mma_wgs=3", KernelKey("float16", 64, 16, 1)),
    ("one_per_cta+overlap+pages_ahead+mma_wgs=3", KernelKey("bfloat16", 64, 16, 3)),
    # a 128-token page in 64-row boxes (head dim 256's 64-key tiles) and in one 128-row box
    ("one_per_cta+overlap", KernelKey("bfloat16", 256, 128, 4)),
    ("one_per_cta+overlap+staged_epilogue", KernelKey("float16", 64, 128, 1)),
    ("one_per_cta+overlap+staged_epilogue", KernelKey("bfloat16", 256, 16, 3)),
    ("one_per_cta+serial+staged_epilogue", KernelKey("bfloat16", 256, 128, 8)),
    ("one_per_cta+serial", KernelKey("float16", 64, 16, 3)),
    ("one_per_cta+overlap+pages_ahead", KernelKey("bfloat16", 128, 128, 4)),
    ("one_per_cta+overlap+pages_ahead", KernelKey("bfloat16", 128, 64, 4)),
    ("one_per_cta+overlap+pages_ahead", KernelKey("float16", 256, 16, 3)),
    ("queue+serial+staged_epilogue", KernelKey("bfloat16", 256, 128, 8)),
    ("queue+serial", KernelKey("float16", 64, 32, 1)),
    # q_tma's box (G heads x T tokens x 64): a group that does not divide the tile (3: 126
    # of 128 rows), one head per KV head, 32 heads (4 tokens), three warpgroups
    ("queue+overlap+q_tma+lazy_max", KernelKey("bfloat16", 128, 128, 3)),
    ("queue+serial+q_tma", KernelKey("float16", 128, 16, 1)),
    # queue_with_work's slot with the window's two words
    ("queue_with_work+overlap+q_tma", KernelKey("bfloat16", 128, 16, 4, sliding_window=True)),
    ("one_per_cta+serial+q_tma", KernelKey("bfloat16", 128, 32, 32)),
    ("queue+overlap+q_tma+mma_wgs=3", KernelKey("bfloat16", 64, 128, 8)),
    # O's TMA boxes from the tile's Q stage, three warpgroups' rows
    ("queue_with_work+pv_wait_mid+q_tma+tma_epilogue+mma_wgs=3", KernelKey("bfloat16", 64, 128, 8)),
    # wide_box's 5-D box (64, 8 rows, chunks, row groups): one chunk (head dim 64), four
    # (256, 64-key tiles), a 128-row box, the serial loop
    ("one_per_cta+serial+wide_box", KernelKey("float16", 64, 32, 3)),
    ("one_per_cta+overlap+wide_box", KernelKey("bfloat16", 256, 128, 2)),
    ("queue+overlap+wide_box", KernelKey("bfloat16", 256, 16, 4)),
    (
        "queue_with_work+overlap+q_tma+v_warp+wide_box+lazy_max",
        KernelKey("bfloat16", 128, 128, 8),
    ),
    ("one_per_cta+overlap+wide_box+pages_ahead", KernelKey("bfloat16", 128, 64, 4)),
    # pv_wait_mid's split softmax after the soft cap and the window's mask, at head dim 256
    (
        "queue+pv_wait_mid",
        KernelKey("bfloat16", 256, 128, 2, sliding_window=True, softcap=True, sinks=True),
    ),
]


def test_wide_box_needs_whole_boxes_per_block():
    """wide_box addresses the cache as token slots: a block stride that is not a whole
    number of boxes is refused with the layout named, vLLM's layouts pass."""
    import torch

    from vllm_fa4.kernels.launch import check_slot_boxes
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


@pytest.mark.compile_variants
@pytest.mark.parametrize("spec,key", VARIANT_CASES, ids=[f"{s}-{k!r}" for s, k in VARIANT_CASES])
def test_compile_variants(spec, key):
    assert_compiles(key, KernelConfig.parse(spec), has_lse=True)


def test_three_warpgroups_at_head_dim_64_only():
    from vllm_fa4.kernels.compile import compile_kernel

    three = KernelConfig.parse("queue+overlap+mma_wgs=3")
    assert three.unsupported_reason(KernelKey("bfloat16", 64, 16, 4)) is None
    for hd in (128, 256):
        assert "head dim 64 only" in three.unsupported_reason(KernelKey("bfloat16", hd, 16, 4))
    assert "mma_wgs=4" in KernelConfig.parse("mma_wgs=4").unsupported_reason(
        KernelKey("bfloat16", 64, 16, 4)
    )
    with pytest.raises(ValueError, match="head dim 64 only"):
        compile_kernel(KernelKey("bfloat16", 128, 16, 4), three)
    # 128 producer + 384 consumer threads fit the register file
    for cfg in (three, KernelConfig.parse("pages_ahead+mma_wgs=3")):
        assert cfg.num_threads == 512
        assert 128 * cfg.producer_regs + 384 * cfg.mma_regs <= 65536
        # the consumers keep 160 with pages ahead too (152 spilled P, session 14)
        assert (cfg.producer_regs, cfg.mma_regs) == (32, 160)


def test_config_spellings_roundtrip(monkeypatch):
    for config in ALL_CONFIGS:
        assert KernelConfig.parse(config.spec) == config
    assert len({c.spec for c in ALL_CONFIGS}) == len(ALL_CONFIGS)
    assert parse_configs("all") == ALL_CONFIGS
    assert KernelConfig().spec == "queue+overlap"
    # any order, each field at most once, a field left out keeps its default
    assert KernelConfig.parse("lazy_max+q_tma+queue_with_work") == KernelConfig(
        tiles=Tiles.QUEUE_WITH_WORK, q_load=QLoad.TMA, lazy_max=True
    )
    with pytest.raises(ValueError, match="sets tiles twice"):
        KernelConfig.parse("queue+one_per_cta")
    # an overlay sets its values over a config's own, axis by axis (variants_ab's default+)
    pick = KernelConfig.parse("queue+overlap+tma_epilogue")
    assert pick.overlaid("tma_epilogue") == pick
    assert pick.overlaid("pv_wait_mid+lazy_max") == KernelConfig.parse(
        "queue+pv_wait_mid+tma_epilogue+lazy_max"
    )
    assert pick.overlaid("") == pick
    with pytest.raises(ValueError, match="sets epilogue twice"):
        pick.overlaid("tma_epilogue+direct_epilogue")
    monkeypatch.delenv("VLLM_FA4_VARIANT", raising=False)
    assert parse_configs(None) == (None,)  # each key's default config
    assert parse_configs("default queue+overlap") == (None, KernelConfig())
    monkeypatch.setenv("VLLM_FA4_VARIANT", "one_per_cta+serial")
    serial = KernelConfig(tiles=Tiles.ONE_PER_CTA, block_step=BlockStep.SERIAL)
    assert parse_configs(None) == (serial,)
    assert serial.turns == 0 and KernelConfig.parse("overlap+mma_wgs=3").turns == 3


def test_count_visits_is_not_a_spelling():
    """Test instrumentation: no spec (the environment's included) can select it."""
    assert "count_visits" not in KernelConfig.spellings()
    with pytest.raises(ValueError, match="unknown kernel config value 'count_visits'"):
        KernelConfig.parse("queue+count_visits")
    for probe in ("count_visits", "stamp_times"):
        assert probe not in KernelConfig.spellings()
        probing = dataclasses.replace(KernelConfig(), tile_probe=TileProbe(probe))
        assert probing.spec == KernelConfig().spec and probing != KernelConfig()


@pytest.mark.parametrize(
    "spec, words",
    [
        ("queue_with_work", "'queue_with_work' needs 'q_tma'"),
        ("q_tma+v_warp", "'v_warp' needs 'queue_with_work'"),
        ("one_per_cta+q_prefetch", "'q_prefetch' needs a queue"),
        ("q_prefetch+staged_epilogue", "exclude each other"),
        ("mma_wgs=4", "mma_wgs=4"),
    ],
)
def test_config_rules(spec, words):
    key = KernelKey("bfloat16", 64, 16, 4)
    assert words in KernelConfig.parse(spec).unsupported_reason(key)


def test_q_ring_needs_shared_memory():
    # two Q stages: 2 K/V stages fit head dim 128, not 256; a staged epilogue writes O into
    # the tile's own Q stage, freed after it
    q_tma = KernelConfig.parse("q_tma")
    assert q_tma.unsupported_reason(KernelKey("bfloat16", 128, 16, 4)) is None
    assert "2 Q stages" in q_tma.unsupported_reason(KernelKey("bfloat16", 256, 16, 4))
    staged = KernelConfig.parse("q_tma+staged_epilogue")
    assert staged.unsupported_reason(KernelKey("bfloat16", 128, 16, 4)) is None


def test_serving_configs_by_head_dim_page_size_and_batch():
    """Invariants of the serving policy over every key it can be asked about (which config
    each key gets is the policy table's business and not restated here)."""
    features = [{}, {"sliding_window": True}, {"softcap": True, "sinks": True}]
    keys = [
        KernelKey(dtype, head_dim, page, group, **flags)
        for dtype, head_dim, page, group, flags in product(
            SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS, SUPPORTED_PAGE_SIZES, (1, 3, 4, 8, 32), features
        )
    ]
    for key in keys:
        configs = serving_configs(key)
        for config in configs.all:  # every served config builds every key it serves
            assert config.unsupported_reason(key) is None, (key, config.spec)
            assert config.tile_probe is TileProbe.NONE
        # one plan tiles the batch before it picks: long and short tile alike
        assert configs.long.mma_wgs == configs.short.mma_wgs
        if key.sliding_window:  # lazy_max measured a gain only on Gemma 2's 4k-window long
            # batches (head dim 256); gpt-oss's rows visit two or three blocks, and head dim
            # 128's 4k windows lost with it (session 20)
            lazy = {config for config in configs.all if config.lazy_max}
            assert lazy <= ({configs.long} if key.head_dim == 256 else set()), key
    configs = serving_configs(KernelKey("bfloat16", 128, 16, 4))
    assert configs.long != configs.short
    limit = configs.short_max_blocks
    assert configs.pick(100, 100 * limit) == configs.short  # mean cost at the limit
    assert configs.pick(100, 100 * limit + 1) == configs.long
    assert configs.pick(0, 0) == configs.long
    fixed = KernelConfig.parse("one_per_cta+serial")  # VLLM_FA4_VARIANT: every batch
    assert serving_configs(KernelKey("bfloat16", 128, 16, 4), fixed).all == (fixed,)


@pytest.mark.parametrize("spec", ["pingpnog", "smemepi", "mma_wgs", "overlap=1", "mma_wgs=x"])
def test_bad_config_spelling_names_the_valid_ones(spec, monkeypatch):
    from vllm_fa4.paged_prefill.policy import configured_config

    with pytest.raises(ValueError, match="mma_wgs"):
        KernelConfig.parse(spec)
    monkeypatch.setenv("VLLM_FA4_VARIANT", spec)
    with pytest.raises(ValueError, match="VLLM_FA4_VARIANT"):
        configured_config()


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
    """Compile (key, config) with its cubin dumped (no cache) and count the SASS
    instructions that touch local memory (register spills)."""
    import pathlib
    import shutil
    import tempfile

    import triton

    from vllm_fa4.kernels.compile import compile_kernel

    tool = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    tool = str(tool) if tool.exists() else shutil.which("cuobjdump")
    if tool is None:
        pytest.skip("cuobjdump not found (triton's bundled copy or PATH)")
    dump = tempfile.mkdtemp(prefix="vllm-fa4-spills-")
    try:  # a folder not made yet: compile_kernel makes it (the DSL would write nothing)
        compile_kernel(key, config, has_lse=False, dump_dir=f"{dump}/not/made")
        cubins = sorted(pathlib.Path(dump, "not/made").glob("*.cubin"))
        assert len(cubins) == 1, cubins
        sass = subprocess.run([tool, "-sass", str(cubins[0])], capture_output=True, text=True)
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    assert "HGMMA" in sass.stdout  # the disassembly is real
    return sum(1 for line in sass.stdout.splitlines() if "LDL" in line or "STL" in line)


def test_dump_dir_with_whitespace_is_refused_before_compiling():
    from vllm_fa4.kernels.compile import compile_kernel

    with pytest.raises(ValueError, match="holds whitespace"):
        compile_kernel(KernelKey("bfloat16", 128, 16, 4), dump_dir="/tmp/a b")


# Head dim 64 runs three consumer warpgroups at 160 registers per thread, where a few more live
# values spill inside the block loop (gpt-oss's windowed layer had 65 local loads/stores until
# the window mask became one sign test per element: 3-5 % of its speed, docs/perf-notes.md).
NO_SPILL_KEYS = [
    KernelKey("bfloat16", 64, 16, 8, sliding_window=True, sinks=True),  # gpt-oss windowed
    KernelKey("bfloat16", 64, 16, 4),  # Llama-3.2-1B
]


NO_SPILL_CASES = [(key, config) for key in NO_SPILL_KEYS for config in serving_configs(key).all]


@pytest.mark.compile_matrix  # a compile without the cache per kernel: 10-20 s each
@pytest.mark.parametrize(
    "key,config", NO_SPILL_CASES, ids=[case_id(k, c) for k, c in NO_SPILL_CASES]
)
def test_three_warpgroup_serving_kernels_do_not_spill(key, config):
    assert config.mma_wgs == 3
    assert _local_memory_instructions(key, config) == 0, config.spec
