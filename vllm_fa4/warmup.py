"""Ahead-of-time compilation of every prefill kernel a model needs, during vLLM's startup.

Builders call ``request(key, vllm_config)`` when they are created (after the KV cache is sized,
before vLLM's kernel warmup and CUDA-graph capture). vLLM's CuTe-DSL warmup then asks the
module-level provider for compile units and runs them, so nothing compiles while serving.
If that warmup is disabled, the key is compiled right away instead.
"""

from __future__ import annotations

import functools
import logging

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
            CuTeDSLCompileUnit("vllm_fa4.prefill", ("vllm_fa4", key),
                               functools.partial(compile_keys, [key]))
            for key in self.keys
        ]


PROVIDER = _PrefillWarmupProvider()
_registered = False


def request(key: KernelKey, vllm_config=None) -> None:
    """Make sure ``key`` is compiled before serving starts."""
    global _registered
    if key in PROVIDER.keys or not _kernel_available():
        return
    reason = key.unsupported_reason()
    if reason is not None:
        logger.warning("FA4: no prefill kernel for %s (%s); prefill uses the reference", key,
                       reason)
        return
    PROVIDER.keys.append(key)
    kernel_config = getattr(vllm_config, "kernel_config", None)
    if kernel_config is not None and not getattr(kernel_config, "enable_cutedsl_warmup", True):
        from vllm_fa4.kernels.compile import compile_keys

        compile_keys([key])
        return
    if not _registered:
        from vllm.model_executor.warmup.cutedsl_warmup import register_cutedsl_warmup_provider

        register_cutedsl_warmup_provider(PROVIDER)
        _registered = True
