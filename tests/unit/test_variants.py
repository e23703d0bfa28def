"""The exactly-once scheduler test (tests/gpu/test_tile_scheduler.py) runs every config serving
can pick: testing.variants.served_configs, from a few representative keys, must cover the
serving picks of every supported key, and the GPU test must list each of them."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
from pathlib import Path

from vllm_fa4.kernels.config import (
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_DIMS,
    SUPPORTED_KV_DTYPES,
    SUPPORTED_PAGE_SIZES,
    BlockStep,
    Epilogue,
    KernelConfig,
    KernelKey,
    KvBox,
    PageRead,
)
from vllm_fa4.paged_prefill.policy import serving_configs
from vllm_fa4.testing.variants import representative_keys, served_configs

SCHEDULER_TEST = Path(__file__).resolve().parents[1] / "gpu" / "test_tile_scheduler.py"


def _every_key():
    for dtype, head_dim, page, group, window, softcap, sinks, kv in itertools.product(
        SUPPORTED_DTYPES,
        SUPPORTED_HEAD_DIMS,
        SUPPORTED_PAGE_SIZES,
        (1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128),  # 3, 6, 12: tma_epilogue's boxes cannot
        (False, True),
        (False, True),
        (False, True),
        SUPPORTED_KV_DTYPES,
    ):
        key = KernelKey(dtype, head_dim, page, group, True, window, softcap, sinks, kv)
        if key.unsupported_reason() is None:
            yield key


def test_served_configs_cover_every_supported_key():
    served = {(config, key.head_dim) for key, config in served_configs()}
    missed = {
        (config.spec, key.head_dim)
        for key in _every_key()
        for config in serving_configs(key).all
        if (config, key.head_dim) not in served
    }
    assert not missed, f"serving picks not among testing.variants.served_configs: {missed}"
    assert all(key in representative_keys() for key, _ in served_configs())


def test_every_served_config_builds_its_key():
    """A pick the kernel cannot build for a key would refuse the model at startup (or, chosen
    per batch, fail mid-request): e.g. tma_epilogue at a GQA group that does not divide 64."""
    unbuildable = {
        (str(key), config.spec, config.unsupported_reason(key))
        for key in _every_key()
        for config in serving_configs(key).all
        if config.unsupported_reason(key) is not None
    }
    assert not unbuildable


def test_served_configs_include_the_defaults_the_hand_list_missed():
    served = {config for _, config in served_configs()}
    long_128 = serving_configs(KernelKey("bfloat16", 128, 16, 4)).long
    assert long_128.kv_box is KvBox.WIDE and long_128 in served
    assert long_128.block_step is BlockStep.OVERLAP_PV_WAIT_MID
    hd64 = KernelConfig.parse("queue_with_work+overlap+q_tma+lazy_max+mma_wgs=3")
    mid = dataclasses.replace(hd64, block_step=BlockStep.OVERLAP_PV_WAIT_MID)
    assert hd64 in served and mid in served


def test_scheduler_test_runs_every_served_config():
    spec = importlib.util.spec_from_file_location("tile_scheduler_test", SCHEDULER_TEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runs = {tuple(p.values) for p in module.RUNS}
    for key, config in served_configs():
        window = module.WINDOW_LEFT if key.sliding_window else None
        assert (key.head_dim, key.page_size, window, key.fp8_kv, config) in runs, config.spec


def test_only_the_turned_block_steps_take_turns():
    """overlap_free is the overlapped step without ping-pong turns (barriers.py): 0 turns,
    like serial; overlap and pv_wait_mid take one turn per consumer warpgroup."""
    for spec, mma_wgs in (("queue", 2), ("queue_with_work+q_tma", 3)):
        for step, turned in (
            ("serial", False),
            ("overlap_free", False),
            ("overlap", True),
            ("pv_wait_mid", True),
        ):
            config = KernelConfig.parse(f"{spec}+{step}+mma_wgs={mma_wgs}")
            assert config.block_step is BlockStep(step)
            assert config.turns == (mma_wgs if turned else 0), config.spec
            assert KernelConfig.parse(config.spec) == config


def test_block_n_spelling_geometry_and_limits():
    """block_n=80 (five 16-token pages at head dim 256): spelled and read back, the tile
    geometry and the TMA box follow it, and keys whose pages it would split are refused."""
    config = KernelConfig.parse("queue+overlap_free+lazy_max+block_n=80")
    assert config.block_n == 80 and KernelConfig.parse(config.spec) == config
    gemma = KernelKey.for_layer("bfloat16", 256, 16, 16, 8, softcap=True)
    assert config.unsupported_reason(gemma) is None
    assert config.geometry(gemma).tile_n == 80 and config.box_n(gemma) == 16
    assert KernelConfig.parse("queue+overlap").geometry(gemma).tile_n == 64
    for page in (32, 64, 128):  # 80 keys would split a page
        paged = dataclasses.replace(gemma, page_size=page)
        assert "whole pages" in config.unsupported_reason(paged)
    fp8 = KernelKey.for_layer("bfloat16", 256, 16, 16, 8, kv_dtype="float8_e4m3fn")
    assert "shared memory" in config.unsupported_reason(fp8)  # no room for the staging ring
    assert "multiple of 16" in KernelConfig.parse("queue+block_n=72").unsupported_reason(gemma)


def test_block_n_80_is_the_long_pick_of_gemma_2s_capped_page_16_keys_only():
    """LONG_BY_PAGE: 80-key blocks for long batches of head dim 256 with a soft cap at page 16,
    16-bit caches, the global layers and (since session 20) the local layers on one pick: the
    P V wait mid-softmax with lazy_max, page-table entries read a block ahead (session 14);
    short batches, other pages, the uncapped local layers and FP8 keep the table's row (the
    uncapped global layers: the next test)."""
    bn80 = KernelConfig.parse("queue+pv_wait_mid+lazy_max+block_n=80+pages_ahead")
    gemma = KernelKey.for_layer("bfloat16", 256, 16, 16, 8, softcap=True)
    picks = serving_configs(gemma)
    assert picks.long == bn80 and picks.short.block_n == 0
    assert picks.geometry(gemma).tile_n == 80  # the plan picks with the long config's tiles
    local = dataclasses.replace(gemma, sliding_window=True)
    assert serving_configs(local).long == bn80
    assert serving_configs(local).short.block_n == 0
    for other in (
        dataclasses.replace(local, softcap=False),
        dataclasses.replace(gemma, page_size=32),
        dataclasses.replace(gemma, page_size=128),
        dataclasses.replace(local, page_size=128),
        KernelKey.for_layer("bfloat16", 256, 16, 16, 8, softcap=True, kv_dtype="float8_e4m3fn"),
        KernelKey.for_layer("float16", 128, 16, 32, 8, softcap=True),
    ):
        assert all(c.block_n == 0 for c in serving_configs(other).all), other
    for dtype in ("bfloat16", "float16"):
        key = dataclasses.replace(gemma, dtype=dtype)
        assert serving_configs(key).long == bn80 and bn80.unsupported_reason(key) is None


def test_head_dim_256_uncapped_page_16_long_batches_store_o_by_tma():
    """Session 26: the uncapped global layers' long batches at page 16 run the capped key's
    pick with O stored by TMA; their short batches keep HD256_SHORT; other pages, the window,
    FP8 and GQA groups that do not divide 64 (O stored directly there) do not."""
    key = KernelKey.for_layer("bfloat16", 256, 16, 16, 8)
    picks = serving_configs(key)
    want = KernelConfig.parse("queue+pv_wait_mid+lazy_max+block_n=80+pages_ahead+tma_epilogue")
    assert picks.long == want and want.unsupported_reason(key) is None
    assert picks.short == KernelConfig.parse("queue+overlap+tma_epilogue")
    assert picks.geometry(key).tile_n == 80
    capped = serving_configs(dataclasses.replace(key, softcap=True)).long
    assert capped.epilogue is Epilogue.DIRECT and capped.block_n == 80
    for other in (
        dataclasses.replace(key, page_size=32),
        dataclasses.replace(key, page_size=128),
        dataclasses.replace(key, sliding_window=True),
        dataclasses.replace(key, kv_dtype="float8_e4m3fn"),
    ):
        assert serving_configs(other).long != want, other
    group3 = KernelKey.for_layer("bfloat16", 256, 16, 12, 4)
    assert serving_configs(group3).long == dataclasses.replace(want, epilogue=Epilogue.DIRECT)


def test_head_dim_128_short_batches_store_o_by_tma():
    """Session 27: head dim 128's short batches without a window store O by TMA (16-bit
    caches from the Q stage, FP8 caches from sQ), at every page class, and with a window at
    page 128 (16-bit); long batches, the window below page 128 and head dim 64 keep theirs;
    a GQA group that does not divide 64 (Qwen2.5-7B's 7) falls back to the epilogue the pick
    replaced."""
    for page in (16, 32, 128):
        key = KernelKey.for_layer("bfloat16", 128, page, 32, 8)
        picks = serving_configs(key)
        assert picks.short == KernelConfig.parse(
            "queue_with_work+pv_wait_mid+q_tma+tma_epilogue+lazy_max"
        ), key
        assert picks.long.epilogue is not Epilogue.TMA, key
        fp8 = dataclasses.replace(key, kv_dtype="float8_e4m3fn")
        fp8_short = serving_configs(fp8).short
        assert fp8_short == KernelConfig.parse("queue+pv_wait_mid+tma_epilogue+lazy_max"), fp8
        assert fp8_short.unsupported_reason(fp8) is None
        for other in (dataclasses.replace(key, sliding_window=True), fp8):
            assert serving_configs(other).long.epilogue is not Epilogue.TMA, other
        windowed = serving_configs(dataclasses.replace(key, sliding_window=True)).short
        # the windowed row stores O by TMA at page 128 only (its page-16 row gained nothing)
        assert (windowed.epilogue is Epilogue.TMA) == (page == 128), (page, windowed)
        qwen = KernelKey.for_layer("bfloat16", 128, page, 28, 4)
        for cache in (qwen, dataclasses.replace(qwen, kv_dtype="float8_e4m3fn")):
            short = serving_configs(cache).short
            assert short.epilogue is Epilogue.STAGED, cache
            assert short.unsupported_reason(cache) is None, cache
        # the windowed page-128 row's short pick stored O directly before: it falls back to that
        qwen_window = serving_configs(dataclasses.replace(qwen, sliding_window=True))
        assert qwen_window.short.epilogue is not Epilogue.TMA
        assert qwen_window.short == qwen_window.long, page
    for page in (16, 128):
        hd64 = KernelKey.for_layer("bfloat16", 64, page, 32, 8)
        assert all(c.epilogue is not Epilogue.TMA for c in serving_configs(hd64).all), hd64


def test_head_dim_256_global_layers_read_pages_ahead_on_16_bit_caches_only():
    """Session 14: long batches of head dim 256 without a window read a block's page-table
    entries a block ahead below page 128 (with and without the cap), and since session 20
    the local layers too (on FP8 caches since session 21); page 128, short batches and the
    FP8 global layers do not."""
    for softcap in (False, True):
        local = KernelKey.for_layer(
            "bfloat16", 256, 16, 16, 8, softcap=softcap, sliding_window=True
        )
        assert serving_configs(local).long.page_read is PageRead.BLOCK_AHEAD, local
        # FP8 local layers too since session 21 (the 16-bit uncapped row's pick, no 80 keys)
        fp8_local = serving_configs(dataclasses.replace(local, kv_dtype="float8_e4m3fn"))
        assert fp8_local.long.spec == "queue+pv_wait_mid+pages_ahead+lazy_max", fp8_local
        for page in (16, 32, 64):
            key = KernelKey.for_layer("bfloat16", 256, page, 16, 8, softcap=softcap)
            picks = serving_configs(key)
            assert picks.long.page_read is PageRead.BLOCK_AHEAD, key
            assert picks.short.page_read is PageRead.AFTER_ACQUIRE, key
        for other in (
            KernelKey.for_layer("bfloat16", 256, 128, 16, 8, softcap=softcap),
            KernelKey.for_layer(
                "bfloat16", 256, 16, 16, 8, softcap=softcap, kv_dtype="float8_e4m3fn"
            ),
        ):
            assert all(c.page_read is PageRead.AFTER_ACQUIRE for c in serving_configs(other).all), (
                other
            )


def test_tma_epilogue_needs_q_by_cp_async_or_tma_and_whole_tokens_a_warpgroup():
    """Prefetched Q would land in sQ while O's boxes still read it (Q by TMA waits for the
    stage, which the boxes' reads free); not with Q by TMA on an fp8 cache (its Q stage is
    converted or split); a box holds a warpgroup's 64 rows only when they are whole tokens
    (64 % G == 0)."""
    key = KernelKey("bfloat16", 128, 16, 2)
    assert KernelConfig.parse("queue+overlap+tma_epilogue").unsupported_reason(key) is None
    with_tma = KernelConfig.parse("queue_with_work+pv_wait_mid+q_tma+tma_epilogue+lazy_max")
    assert with_tma.unsupported_reason(key) is None
    fp8 = dataclasses.replace(key, kv_dtype="float8_e4m3fn")
    assert "fp8" in with_tma.unsupported_reason(fp8)
    prefetch = KernelConfig.parse("queue+overlap+q_prefetch+tma_epilogue")
    assert "q_prefetch" in prefetch.unsupported_reason(key)
    odd = KernelKey("bfloat16", 128, 16, 3)
    assert "whole tokens" in KernelConfig.parse("queue+overlap+tma_epilogue").unsupported_reason(
        odd
    )


def test_head_dim_128_long_batches_multicast_k_v_where_measured():
    """Sessions 29-30: head dim 128's long batches on a 16-bit cache without a window, soft
    cap or sinks share K/V in a two-CTA cluster (`kv_multicast`) at every page size when the
    GQA group is even; odd groups (Qwen2.5-7B's 7), FP8 caches, windows, soft caps, sinks,
    short batches and the other head dims keep their picks; `kv_multicast` builds on the
    persistent grid with the TileWork slots only (its claims are handed within the cluster)."""
    for page in SUPPORTED_PAGE_SIZES:
        for hq, hkv in ((32, 8), (64, 8), (8, 1), (16, 8)):  # groups 4, 8 (70B at TP 8), 2
            key = KernelKey.for_layer("bfloat16", 128, page, hq, hkv)
            picks = serving_configs(key)
            assert picks.long.kv_multicast and not picks.short.kv_multicast, key
            assert picks.long.unsupported_reason(key) is None, key
        keep = [
            KernelKey.for_layer("bfloat16", 128, page, 28, 4),
            KernelKey.for_layer("bfloat16", 128, page, 32, 32),
            KernelKey("bfloat16", 128, page, 4, kv_dtype="float8_e4m3fn"),
            KernelKey("bfloat16", 128, page, 4, sliding_window=True),
            KernelKey("bfloat16", 128, page, 4, softcap=True),
            KernelKey("bfloat16", 128, page, 4, sinks=True),
            KernelKey("bfloat16", 64, page, 4),
            KernelKey("bfloat16", 256, page, 4),
        ]
        for key in keep:
            assert not any(c.kv_multicast for c in serving_configs(key).all), key
    key = KernelKey("bfloat16", 128, 16, 4)
    for spec, words in (
        ("one_per_cta+pv_wait_mid+lazy_max+kv_multicast", "needs 'queue_with_work'"),
        ("queue+pv_wait_mid+lazy_max+kv_multicast", "needs 'queue_with_work'"),
    ):
        assert words in KernelConfig.parse(spec).unsupported_reason(key)
    odd = KernelConfig.parse("queue_with_work+pv_wait_mid+q_tma+lazy_max+kv_multicast")
    assert "an even group" in odd.unsupported_reason(KernelKey("bfloat16", 128, 16, 7))
