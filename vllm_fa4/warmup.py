"""Ahead-of-time compilation of every prefill kernel a model needs, during vLLM's startup.

Builders call ``request(key, vllm_config)`` when they are created, before vLLM's memory
profiling run and CUDA-graph capture. The key is compiled (or loaded from the disk cache) right
there: the profiling run already executes a prefill, before vLLM's own CuTe-DSL warmup stage.
The key is also registered with that warmup stage (vLLM lists it among its CuTe-DSL units), so
whatever path vLLM takes, nothing compiles while serving.
"""

from __future__ import annotations

import functools
import logging
import time

from vllm_fa4.kernels.config import KernelKey

logger = logging.getLogger("vllm_fa4")


def _kernel_available() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


class _PrefillWarmupProvider:
    """Registered with vLLM's CuTe-DSL warmup (held strongly here: vLLM keeps a WeakSet)."""

    def __init__(self) -> None:
        self.keys: list[KernelKey] = []

    def get_cutedsl_warmup_compile_units(self):
        from vllm.model_executor.warmup.cutedsl_warmup import CuTeDSLCompileUnit

        from vllm_fa4.kernels.compile import compile_keys

        return [
            CuTeDSLCompileUnit(
                "vllm_fa4.prefill",
                ("vllm_fa4", key),
                functools.partial(compile_keys, [key], progress=False),
            )
            for key in self.keys
        ]


PROVIDER = _PrefillWarmupProvider()


def request(key: KernelKey, vllm_config=None) -> None:
    """Compile ``key`` now (startup) and list it in vLLM's CuTe-DSL warmup."""
    if key in PROVIDER.keys or not _kernel_available():
        return
    reason = key.unsupported_reason()
    if reason is not None:
        logger.warning(
            "FA4: no prefill kernel for %s (%s); prefill uses the reference", key, reason
        )
        return
    from vllm_fa4.kernels.compile import compile_keys

    started = time.perf_counter()
    compile_keys([key], progress=False)
    logger.info(
        "FA4: prefill kernel %s ready in %.1f s (compiled or loaded from disk)",
        key,
        time.perf_counter() - started,
    )
    if not PROVIDER.keys:
        from vllm.model_executor.warmup.cutedsl_warmup import register_cutedsl_warmup_provider

        register_cutedsl_warmup_provider(PROVIDER)
    PROVIDER.keys.append(key)
