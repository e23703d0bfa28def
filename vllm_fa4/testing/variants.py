"""The kernel configs that GPU tests and variant benchmarks sweep (not used in serving).

``VLLM_FA4_TEST_VARIANTS``: ``all`` (every config below), or specs separated by spaces or
``;`` (``default``: each key's default config); unset means the process's config
(``VLLM_FA4_VARIANT``), which when unset too is each key's default. A config None stands for
"each key's serving configs, picked per batch" (``paged_prefill.policy.serving_configs``).
"""

from __future__ import annotations

import re

from vllm_fa4 import envs
from vllm_fa4.kernels.config import FP8_E4M3, SUPPORTED_HEAD_DIMS, KernelConfig, KernelKey
from vllm_fa4.paged_prefill.policy import (
    FP8_BF16_LONG,
    LONG_BATCH_MIN_PAGE,
    LONG_BY_PAGE,
    configured_config,
    launchable_configs,
)

ALL_CONFIGS = tuple(
    KernelConfig.parse(s)
    for s in (
        # the serial step (the debug baseline) with each value of the other axes
        "one_per_cta+serial",
        "one_per_cta+serial+q_tma",
        "one_per_cta+serial+staged_epilogue",
        "one_per_cta+serial+tma_epilogue",
        "one_per_cta+serial+pages_ahead",
        "one_per_cta+serial+wide_box",
        "one_per_cta+serial+lazy_max",
        "queue+serial",
        "queue+serial+q_prefetch",
        "queue+serial+q_tma",
        "queue_with_work+serial+q_tma",
        "queue_with_work+serial+q_tma+v_warp",
        # the overlapped steps: every config serving picks (paged_prefill.policy)...
        "one_per_cta+overlap",
        "queue+overlap",
        "queue+overlap+lazy_max",
        "queue+overlap+tma_epilogue",
        "queue+overlap+q_prefetch",
        "queue+overlap+q_prefetch+mma_wgs=3",
        "queue_with_work+pv_wait_mid+q_tma+mma_wgs=3+block_n=64",
        "queue_with_work+pv_wait_mid+q_tma+mma_wgs=3+block_n=64+pages_ahead+v_warp",
        "queue_with_work+overlap+q_tma+lazy_max+mma_wgs=3",
        "queue_with_work+pv_wait_mid+q_tma+lazy_max+mma_wgs=3",
        "queue_with_work+overlap+q_tma+lazy_max+mma_wgs=3+pages_ahead+v_warp",
        "queue_with_work+pv_wait_mid+q_tma+lazy_max+mma_wgs=3+pages_ahead+v_warp",
        "queue_with_work+pv_wait_mid+q_tma+v_warp+lazy_max",
        "queue_with_work+pv_wait_mid+q_tma+v_warp+tma_epilogue",
        "queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead+lazy_max",
        "queue_with_work+pv_wait_mid+q_tma+v_warp+wide_box+pages_ahead+lazy_max+kv_multicast",
        "queue_with_work+pv_wait_mid+q_tma+v_warp+lazy_max+kv_multicast",
        "queue_with_work+pv_wait_mid+q_tma+tma_epilogue+lazy_max",
        # (its epilogue where a GQA group does not divide 64: policy._fit_group)
        "queue_with_work+pv_wait_mid+q_tma+staged_epilogue+lazy_max",
    )
)


def parse_configs(spec: str | None) -> tuple[KernelConfig | None, ...]:
    """``all`` | specs separated by spaces or ';' | None: the process's config."""
    if not spec:
        return (configured_config(),)
    if spec.strip() == "all":
        return ALL_CONFIGS
    return tuple(
        None if s == "default" else KernelConfig.parse(s)
        for s in re.split(r"[;\s]+", spec.strip())
        if s
    )


def config_id(config: KernelConfig | None) -> str:
    return "default" if config is None else config.spec


def sweep_configs() -> tuple[KernelConfig | None, ...]:
    """The configs named by ``VLLM_FA4_TEST_VARIANTS``."""
    return parse_configs(envs.sweep_variants_spec())


def representative_keys() -> tuple[KernelKey, ...]:
    """Keys whose serving configs are every config serving can pick (a unit test walks every
    supported key): each head dim at page 16 and at LONG_BATCH_MIN_PAGE, with and without a
    window, with a 16-bit and an FP8 cache, one key per row of LONG_BY_PAGE (a page size
    and soft cap of its own; the picks depend on nothing else) and, where such a row replaces
    an uncapped key's page-16 pick, that key at page 32; an fp16 model's FP8 key per
    row of FP8_BF16_LONG (fp16 keeps the converted pick), and head dims 128 (Qwen2.5-7B's
    group of 7) and 256 at a GQA group that does not divide 64 at both page regimes (their
    TMA-store picks then store O another way, policy._fit_group)."""
    table_rows = tuple(
        KernelKey("bfloat16", head_dim, page, 4, sliding_window=window, kv_dtype=kv)
        for kv in (None, FP8_E4M3)
        for head_dim in SUPPORTED_HEAD_DIMS
        for page in (16, LONG_BATCH_MIN_PAGE)
        for window in (False, True)
    )
    by_page = tuple(
        KernelKey("bfloat16", head_dim, page, 4, sliding_window=window, softcap=softcap)
        for head_dim, window, page, softcap in LONG_BY_PAGE
    )
    # Where LONG_BY_PAGE replaces a table row's long pick at page 16, pages 32 and 64 still
    # take the row's own.
    row_elsewhere = tuple(
        KernelKey("bfloat16", head_dim, 32, 4, sliding_window=window, softcap=softcap)
        for head_dim, window, page, softcap in LONG_BY_PAGE
        if page == 16 and not softcap
    )
    fp16_fp8 = tuple(
        KernelKey(
            "float16",
            head_dim,
            LONG_BATCH_MIN_PAGE if long_page else 16,
            4,
            sliding_window=window,
            kv_dtype=FP8_E4M3,
        )
        for head_dim, window, long_page in FP8_BF16_LONG
    )
    odd_group = tuple(
        KernelKey("bfloat16", head_dim, page, group, kv_dtype=kv)
        for head_dim, group in ((128, 7), (256, 3))
        for kv in (None, FP8_E4M3)
        for page in (16, LONG_BATCH_MIN_PAGE)
    )
    return table_rows + by_page + row_elsewhere + fp16_fp8 + odd_group


def served_configs() -> tuple[tuple[KernelKey, KernelConfig], ...]:
    """(key, config) for every config serving may launch for the representative keys
    (``launchable_configs``: VLLM_FA4_FP8_QUERY=e4m3's picks too), once per head
    dim and cache dtype (the tile shapes, and an FP8 cache's converter warps, differ), with the
    first key that picks it."""
    seen: dict[tuple[KernelConfig, int, str | None], KernelKey] = {}
    for key in representative_keys():
        for config in launchable_configs(key):
            seen.setdefault((config, key.head_dim, key.kv_dtype), key)
    return tuple((key, config) for (config, _, _), key in seen.items())
