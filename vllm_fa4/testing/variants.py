"""The kernel configs that GPU tests and variant benchmarks sweep (not used in serving).

``VLLM_FA4_TEST_VARIANTS``: ``all`` (every config below), or specs separated by spaces or
``;`` (``default``: each key's default config); unset means the process's config
(``VLLM_FA4_VARIANT``), which when unset too is each key's default. A config None stands for
"each key's serving configs, picked per batch" (``kernels.config.serving_configs``).
"""

from __future__ import annotations

import re

from vllm_fa4 import envs
from vllm_fa4.kernels.config import KernelConfig

ALL_CONFIGS = tuple(
    KernelConfig.parse(s)
    for s in (
        "base",
        "smem_epilogue",
        "page_prefetch",
        "persistent",
        "smem_epilogue+persistent",
        "overlap+pingpong+softmax_per_arm",
        "overlap+pingpong+persistent+softmax_per_arm",
        "persistent+q_prefetch",
        "overlap+pingpong+persistent+q_prefetch+softmax_per_arm",
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
