"""Ahead-of-time compilation of every prefill kernel a model needs, during vLLM's startup.

Builders whose prefill route is the kernel (``paged_prefill.route``; a key without a kernel is
refused there) call ``request(key, config)`` when they are created, before vLLM's memory profiling
run and CUDA-graph capture. The kernel is compiled (or loaded from the disk cache) right there:
the profiling run already executes a prefill, before vLLM's own CuTe-DSL warmup stage. The
(key, config) is also registered with that warmup stage (vLLM lists it among its CuTe-DSL
units), so whatever path vLLM takes, nothing compiles while serving.
"""

from __future__ import annotations

import functools
import logging
import time

from vllm_fa4.kernels.config import KernelConfig, KernelKey
from vllm_fa4.paged_prefill.route import device_unsupported_reason

logger = logging.getLogger("vllm_fa4")


class _PrefillWarmupProvider:
    """Registered with vLLM's CuTe-DSL warmup (held strongly here: vLLM keeps a WeakSet)."""

    def __init__(self) -> None:
        self.kernels: list[tuple[KernelKey, KernelConfig]] = []

    def get_cutedsl_warmup_compile_units(self):
        from vllm.model_executor.warmup.cutedsl_warmup import CuTeDSLCompileUnit

        from vllm_fa4.kernels.compile import compile_keys

        return [
            CuTeDSLCompileUnit(
                "vllm_fa4.prefill",
                ("vllm_fa4", key, config),
                functools.partial(compile_keys, [key], config, progress=False),
            )
            for key, config in self.kernels
        ]


PROVIDER = _PrefillWarmupProvider()


def request(key: KernelKey, config: KernelConfig) -> None:
    """Compile ``key`` with ``config`` now (startup) and list it in vLLM's CuTe-DSL warmup."""
    if (key, config) in PROVIDER.kernels or device_unsupported_reason() is not None:
        return
    reason = key.unsupported_reason() or config.unsupported_reason(key)
    if reason is not None:  # the builder's route check refuses such a key first
        raise RuntimeError(
            f"FA4: no prefill kernel for {key} with kernel config {config.spec!r}: {reason} "
            "(use --attention-backend FLASH_ATTN for this model)"
        )
    from vllm_fa4.kernels.compile import compile_keys

    started = time.perf_counter()
    compile_keys([key], config, progress=False)
    logger.info(
        "FA4: prefill kernel %s (%s) ready in %.1f s (compiled or loaded from disk)",
        key,
        config.spec,
        time.perf_counter() - started,
    )
    if not PROVIDER.kernels:
        from vllm.model_executor.warmup.cutedsl_warmup import register_cutedsl_warmup_provider

        register_cutedsl_warmup_provider(PROVIDER)
    PROVIDER.kernels.append((key, config))
