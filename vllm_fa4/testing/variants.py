"""The kernel configs that GPU tests and variant benchmarks sweep (not used in serving).

``VLLM_FA4_TEST_VARIANTS``: ``all`` (every config below), or specs separated by spaces or
``;`` (``default``: each key's default config); unset means the process's config
(``VLLM_FA4_VARIANT``), which when unset too is each key's default. A config None stands for
"each key's serving configs, picked per batch" (``kernels.config.serving_configs``).
"""

from __future__ import annotations

import re

from vllm_fa4 import envs
from vllm_fa4.kernels.config import (
    LONG_BATCH_MIN_PAGE,
    SUPPORTED_HEAD_DIMS,
    KernelConfig,
    KernelKey,
    serving_configs,
)

ALL_CONFIGS = tuple(
    KernelConfig.parse(s)
    for s in (
        "base",
        "pingpong",
        "overlap",
        "overlap+pingpong",
        "smem_epilogue",
        "overlap+pingpong+smem_epilogue",
        "pingpong+smem_epilogue",
        "pingpong+max_box_n=64",
        "page_prefetch",
        "pingpong+page_prefetch",
        "pingpong+kv_stages=3",
        "overlap+pingpong+page_prefetch+kv_stages=3",
        "persistent",
        "smem_epilogue+persistent",
        "overlap+pingpong+persistent",
        "overlap+pingpong+softmax_per_arm",
        "overlap+pingpong+persistent+softmax_per_arm",
        "persistent+q_prefetch",
        "overlap+pingpong+persistent+q_prefetch+softmax_per_arm",
        # FA3's habits, measured neutral (docs/perf-notes.md, session 5): opt-in only
        "overlap+pingpong+persistent+q_prefetch+softmax_per_arm+kv_evict_last+single_poller",
        "pingpong+page_prefetch+kv_evict_last+single_poller",
        # FA4's conditional rescaling (session 7)
        "overlap+pingpong+persistent+q_prefetch+softmax_per_arm+lazy_max",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max",
        "lazy_max",
        "overlap+pingpong+persistent+q_prefetch+softmax_per_arm+lazy_max+mma_wgs=3",
        # three consumer warpgroups, 192-row tiles (head dim 64 only)
        "overlap+pingpong+persistent+q_prefetch+softmax_per_arm+mma_wgs=3",
        "overlap+pingpong+persistent+softmax_per_arm+mma_wgs=3",
        # Q loaded by the producer with TMA into a two-stage ring (session 9)
        "q_tma",
        "persistent+q_tma",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+mma_wgs=3",
        # the first block's Q K^T over only the columns the tile sees (session 10)
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+narrow_diag",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+narrow_diag+mma_wgs=3",
        # the producer hands each tile over with its TileWork (session 10)
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+mma_wgs=3",
        "persistent+q_tma+queue_work",
        # V loads on the producer warpgroup's second warp (session 12)
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+v_warp",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+v_warp+page_prefetch",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+v_warp+mma_wgs=3",
        # O staged in the tile's own Q stage (short batches, session 10)
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+smem_epilogue",
        # K/V boxes over whole rows of the cache's token slots (session 13)
        "wide_box",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+wide_box",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+v_warp+wide_box",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+v_warp+page_prefetch+wide_box",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+smem_epilogue+wide_box",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+mma_wgs=3+wide_box",
        # the P V wait after the first row's exponentials, O's rescale in the next turn
        # (session 14)
        "overlap+pingpong+softmax_per_arm+pv_wait_mid",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+v_warp+pv_wait_mid",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+v_warp+page_prefetch+wide_box+pv_wait_mid",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+smem_epilogue+pv_wait_mid",
        "overlap+pingpong+persistent+softmax_per_arm+lazy_max+q_tma+queue_work+mma_wgs=3+pv_wait_mid",
    )
)


def parse_configs(spec: str | None) -> tuple[KernelConfig | None, ...]:
    """``all`` | specs separated by spaces or ';' | None: the process's config."""
    if not spec:
        return (envs.kernel_config(),)
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
    window (the picks depend on nothing else)."""
    return tuple(
        KernelKey("bfloat16", head_dim, page, 4, sliding_window=window)
        for head_dim in SUPPORTED_HEAD_DIMS
        for page in (16, LONG_BATCH_MIN_PAGE)
        for window in (False, True)
    )


def served_configs() -> tuple[tuple[KernelKey, KernelConfig], ...]:
    """(key, config) for every config ``serving_configs`` picks for the representative keys,
    once per head dim (the tile shapes differ), with the first key that picks it."""
    seen: dict[tuple[KernelConfig, int], KernelKey] = {}
    for key in representative_keys():
        for config in serving_configs(key).all:
            seen.setdefault((config, key.head_dim), key)
    return tuple((key, config) for (config, _), key in seen.items())
