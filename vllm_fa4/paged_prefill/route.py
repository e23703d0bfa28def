"""Which route runs a plan: the compiled kernel or the fp32 PyTorch reference.

Decided in ONE place, ``select_route``, once per (key, configs, device, env); the choice is
logged on logger ``vllm_fa4``. The metadata builder asks at startup, so a key without a kernel
is refused before serving starts, and carries the answer in every plan (``PrefillPlan.route``):
nothing decides it per step. Env ``VLLM_FA4_PREFILL_ROUTE`` (read through ``vllm_fa4.envs``):

- ``auto`` (default): the kernel where one exists; on a CUDA device without one, an error
  naming the reason (never a silent fallback to the slow reference); on a non-CUDA device
  (CPU tests), the reference.
- ``kernel``: the kernel, or an error (also on CPU).
- ``reference``: the slow fp32 PyTorch reference, only when asked for (a WARNING when a
  kernel exists for the key).
"""

from __future__ import annotations

import logging

import torch

from vllm_fa4 import envs
from vllm_fa4.kernels.config import KernelKey
from vllm_fa4.paged_prefill.policy import ServingConfigs

logger = logging.getLogger("vllm_fa4")

_route_cache: dict[tuple, str] = {}


def device_unsupported_reason(device: torch.device | str | None = None) -> str | None:
    """None on an SM90 (Hopper) CUDA device (default: the current one), else why the kernel
    cannot run there."""
    if device is None:
        if not torch.cuda.is_available():
            return "no CUDA GPU"
        device = "cuda"
    device = torch.device(device)
    if device.type != "cuda":
        return f"device {device} is not a CUDA GPU"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        try:  # the name helps the reader; the reason must not depend on it
            name = torch.cuda.get_device_name(device)
        except Exception:
            name = str(device)
        return f"{name}: compute capability {major}.{minor} is not SM90 (Hopper)"
    return None


def kernel_reads_fp8(key: KernelKey) -> bool:
    """Whether the compiled kernel reads ``key``'s FP8 cache (issue 30): THE switch that lets
    startup accept ``--kv-cache-dtype fp8`` (backend selection, builder, warmup, fuzz and the GPU
    tests all ask here). The kernel reads e4m3 caches at every head dim, page size and model
    feature (kernels/fp8_kv.py); a config it does not build for them (``wide_box``,
    ``q_prefetch``: KernelConfig.unsupported_reason) is refused at startup as any other."""
    return key.fp8_kv


def kernel_unavailable_reason(
    key: KernelKey, configs: ServingConfigs, device: torch.device | str
) -> str | None:
    """None when compiled kernels can serve ``key`` with every one of ``configs`` on
    ``device``, else why not."""
    why = device_unsupported_reason(device)
    if why is not None:
        return why
    why = key.unsupported_reason()
    if why is None and key.fp8_kv and not kernel_reads_fp8(key):
        why = f"an FP8 KV cache ({key.kv_dtype}): the prefill kernel does not read one yet"
    for config in configs.all:
        why = why or config.unsupported_reason(key)
    return None if why is None else f"no kernel for {why}"


def select_route(key: KernelKey, configs: ServingConfigs, device: torch.device | str) -> str:
    """``"kernel"`` or ``"reference"`` for ``key`` with ``configs`` on ``device``; logs once
    per choice.

    Raises:
        ValueError: unknown ``VLLM_FA4_PREFILL_ROUTE`` value.
        RuntimeError: no kernel is available for ``key`` and ``configs`` on ``device``, with
            ``VLLM_FA4_PREFILL_ROUTE=kernel``, or with ``auto`` on a CUDA device.
    """
    device = torch.device(device)
    env = envs.prefill_route()
    cache_key = (key, configs, device, env)
    route = _route_cache.get(cache_key)
    if route is not None:
        return route
    why = kernel_unavailable_reason(key, configs, device)
    name = envs.PREFILL_ROUTE
    if env == "kernel":
        if why is not None:
            raise RuntimeError(
                f"{name}=kernel but no FA4 prefill kernel is available for {key} on {device}: {why}"
            )
        route = "kernel"
        logger.info("FA4 prefill: %s on %s -> kernel (forced by %s=kernel)", key, device, name)
    elif env == "reference":
        route = "reference"
        if why is None:
            logger.warning(
                "FA4 prefill: %s on %s -> PyTorch reference although a compiled kernel "
                "exists, because %s=reference (slow; for debugging only)",
                key,
                device,
                name,
            )
        else:  # serving on the reference is slow: say so on a GPU
            log = logger.warning if device.type == "cuda" else logger.info
            log(
                "FA4 prefill: %s on %s -> reference (forced by %s; kernel unavailable: %s)",
                key,
                device,
                name,
                why,
            )
    elif why is None:
        route = "kernel"
        logger.info("FA4 prefill: %s on %s -> kernel", key, device)
    elif device.type == "cuda":
        raise RuntimeError(
            f"FA4: no prefill kernel for {key} with kernel configs "
            f"{' and '.join(repr(c.spec) for c in configs.all)} on {device}: "
            f"{why}. Use --attention-backend FLASH_ATTN for this model (or set {name}="
            "reference to run prefill on the slow fp32 PyTorch reference, for debugging only)"
        )
    else:  # CPU tests: the reference is the only route there
        route = "reference"
        logger.info("FA4 prefill: %s on %s -> PyTorch reference: %s", key, device, why)
    _route_cache[cache_key] = route
    return route


def clear_route_cache() -> None:
    """For tests: forget logged route decisions."""
    _route_cache.clear()
