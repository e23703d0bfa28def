"""Launch one step's prefill: validate (cheaply, no sync) and dispatch to the compiled kernel.

Route selection lives in ONE place, ``select_route``; it logs its choice once per
(key, device, env) on logger ``vllm_fa4``. Env ``VLLM_FA4_PREFILL_ROUTE``:
``auto`` (default) / ``kernel`` (raise if no kernel) / ``reference`` (slow PyTorch reference;
a WARNING when a kernel exists for the key).
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

import torch

from vllm_fa4.kernels.config import KernelKey
from vllm_fa4.paged_prefill.plan import PrefillPlan

logger = logging.getLogger("vllm_fa4")

ROUTE_ENV = "VLLM_FA4_PREFILL_ROUTE"
_ROUTES = ("auto", "kernel", "reference")
_route_cache: dict[tuple, str] = {}
_compile_module: ModuleType | None = None


def _load_compile() -> tuple[ModuleType | None, str | None]:
    """Import ``vllm_fa4.kernels.compile`` lazily; (module, None) or (None, why not)."""
    global _compile_module
    if _compile_module is not None:
        return _compile_module, None
    try:
        mod = importlib.import_module("vllm_fa4.kernels.compile")
    except ImportError as e:
        return None, f"vllm_fa4.kernels.compile is not importable ({type(e).__name__}: {e})"
    if not callable(getattr(mod, "prefill_forward", None)):
        return None, "vllm_fa4.kernels.compile has no prefill_forward"
    _compile_module = mod
    return mod, None


def _kernel_unavailable_reason(key: KernelKey, device: torch.device) -> str | None:
    """None when a compiled kernel can serve ``key`` on ``device``, else why not."""
    if device.type != "cuda":
        return f"device {device} is not a CUDA GPU"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return f"compute capability {major}.{minor} is not SM90 (Hopper)"
    why = key.unsupported_reason()
    if why is not None:
        return f"no kernel for {why}"
    mod, why = _load_compile()
    if mod is None:
        return why
    # Optional hook: the compile module may narrow support further.
    hook = getattr(mod, "unsupported_reason", None)
    if callable(hook):
        why = hook(key)
        if why:
            return f"kernels.compile: {why}"
    return None


def select_route(key: KernelKey, device: torch.device | str) -> str:
    """``"kernel"`` or ``"reference"`` for ``key`` on ``device``; logs once per choice.

    Raises:
        ValueError: unknown ``VLLM_FA4_PREFILL_ROUTE`` value.
        RuntimeError: ``VLLM_FA4_PREFILL_ROUTE=kernel`` but no kernel is available.
    """
    device = torch.device(device)
    env = os.environ.get(ROUTE_ENV, "auto").strip().lower() or "auto"
    cache_key = (key, device, env)
    route = _route_cache.get(cache_key)
    if route is not None:
        return route
    if env not in _ROUTES:
        raise ValueError(f"{ROUTE_ENV}={env!r}: expected one of {', '.join(_ROUTES)}")
    why = _kernel_unavailable_reason(key, device)
    if env == "kernel":
        if why is not None:
            raise RuntimeError(
                f"{ROUTE_ENV}=kernel but no FA4 prefill kernel is available for {key} on "
                f"{device}: {why}"
            )
        route = "kernel"
        logger.info("FA4 prefill: %s on %s -> kernel (forced by %s=kernel)", key, device, ROUTE_ENV)
    elif env == "reference":
        route = "reference"
        if why is None:
            logger.warning(
                "FA4 prefill: %s on %s -> PyTorch reference although a compiled kernel "
                "exists, because %s=reference (slow; for debugging only)",
                key,
                device,
                ROUTE_ENV,
            )
        else:
            logger.info(
                "FA4 prefill: %s on %s -> reference (forced by %s; kernel unavailable: %s)",
                key,
                device,
                ROUTE_ENV,
                why,
            )
    elif why is None:
        route = "kernel"
        logger.info("FA4 prefill: %s on %s -> kernel", key, device)
    else:
        route = "reference"
        log = logger.warning if device.type == "cuda" else logger.info
        log("FA4 prefill: %s on %s -> PyTorch reference (slow): %s", key, device, why)
    _route_cache[cache_key] = route
    return route


def _clear_route_cache() -> None:
    """For tests: forget logged route decisions and the imported compile module."""
    global _compile_module
    _route_cache.clear()
    _compile_module = None


def _check_tensor(name: str, t: torch.Tensor, shape: tuple, plan: PrefillPlan) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
    if t.dtype != plan.dtype:
        raise ValueError(f"{name} has dtype {t.dtype}, the plan was built for {plan.dtype}")
    if t.device != plan.device:
        raise ValueError(f"{name} is on {t.device}, the plan's tensors are on {plan.device}")
    if t.dim() and t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name} must have a contiguous last dim, got strides {t.stride()}")


def run_prefill(
    plan: PrefillPlan,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    *,
    softmax_scale: float,
    lse: torch.Tensor | None = None,
) -> None:
    """Prefill attention for the plan's rows, written into ``out`` (and ``lse`` if given).

    Args:
        q: [plan.num_tokens, Hq, D] (token stride may exceed Hq*D).
        k_cache, v_cache: [num_blocks, page_size, Hkv, D] views (``split_kv_cache``).
        out: [plan.num_tokens, Hq, D], q's dtype; every row is written.
        lse: optional [Hq, plan.num_tokens] float32 (natural log).

    Raises:
        ValueError: inputs that do not match the plan.
    """
    hq, hkv, d = plan.num_q_heads, plan.num_kv_heads, plan.head_dim
    _check_tensor("q", q, (plan.num_tokens, hq, d), plan)
    _check_tensor("out", out, (plan.num_tokens, hq, d), plan)
    if k_cache.dim() != 4:
        raise ValueError(
            f"k_cache must be [num_blocks, page_size, Hkv, D], got {tuple(k_cache.shape)}"
        )
    nb = k_cache.shape[0]
    _check_tensor("k_cache", k_cache, (nb, plan.page_size, hkv, d), plan)
    _check_tensor("v_cache", v_cache, (nb, plan.page_size, hkv, d), plan)
    if lse is not None:
        if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (hq, plan.num_tokens):
            shape = tuple(lse.shape) if isinstance(lse, torch.Tensor) else type(lse).__name__
            raise ValueError(f"lse must be [Hq={hq}, num_tokens={plan.num_tokens}], got {shape}")
        if lse.dtype != torch.float32:
            raise ValueError(f"lse must be float32, got {lse.dtype}")
        if lse.device != plan.device:
            raise ValueError(f"lse is on {lse.device}, the plan's tensors are on {plan.device}")
    if not softmax_scale > 0:
        raise ValueError(f"softmax_scale must be positive, got {softmax_scale}")
    if plan.num_tiles == 0:
        return  # no query rows

    if select_route(plan.key, plan.device) == "kernel":
        assert _compile_module is not None
        _compile_module.prefill_forward(
            plan.key,
            q,
            k_cache,
            v_cache,
            out,
            lse,
            plan.cu_seqlens_q,
            plan.seqused_k,
            plan.page_table,
            plan.work_tiles,
            softmax_scale,
        )
        return

    from vllm_fa4.testing.reference import paged_attention_reference

    ref_out, ref_lse = paged_attention_reference(
        q,
        k_cache,
        v_cache,
        plan.query_start_loc_cpu,
        plan.seq_lens_cpu,
        plan.page_table,
        softmax_scale,
        compute_dtype=torch.float32,
    )
    out.copy_(ref_out)
    if lse is not None:
        lse.copy_(ref_lse)
