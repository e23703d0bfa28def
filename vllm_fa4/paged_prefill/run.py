"""Launch one step's prefill: validate (cheaply, no sync) and run the plan's route (decided
once, by the plan's maker: nothing here reads the environment)."""

from __future__ import annotations

import logging

import torch

from vllm_fa4.kernels.config import KernelConfig, KernelKey, check_features, dtype_name
from vllm_fa4.paged_prefill.layout import KvCacheLayout, fit_config, kv_views_problem
from vllm_fa4.paged_prefill.plan import PrefillPlan
from vllm_fa4.paged_prefill.reference import paged_attention_reference

logger = logging.getLogger("vllm_fa4")
_said: set[str] = set()  # layout messages already logged (each once per process)


def _say_once(log, message: str) -> None:
    if message not in _said:
        _said.add(message)
        log(message)


def _check_tensor(
    name: str, t: torch.Tensor, shape: tuple, plan: PrefillPlan, dtype: str | None = None
) -> None:
    """``t`` is a tensor of ``shape`` in ``dtype`` (default: the key's) on the plan's device,
    its last dim contiguous."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {shape}")
    dtype = dtype or plan.key.dtype
    if dtype_name(t.dtype) != dtype:
        raise ValueError(f"{name} has dtype {t.dtype}, the plan was built for {dtype}")
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
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    lse: torch.Tensor | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> None:
    """Prefill attention for the plan's rows, written into ``out`` (and ``lse`` if given).

    Args:
        q: [plan.num_tokens, Hq, D] (token stride may exceed Hq*D).
        k_cache, v_cache: [num_blocks, page_size, Hkv, D] views (``split_kv_cache``), in the
            model's dtype, or ``torch.float8_e4m3fn`` views for an FP8 key (``key.fp8_kv``).
        out: [plan.num_tokens, Hq, D], q's dtype; every row is written.
        k_scale, v_scale: an FP8 cache's per-tensor scales (K = k8 * k_scale, V = v8 *
            v_scale), positive floats on the host; 1.0 for a 16-bit cache.
        lse: optional [Hq, plan.num_tokens] float32 (natural log).
        softcap: the logit soft cap (> 0), given iff ``plan.key.softcap``.
        sinks: [Hq] float32 sink logits on the plan's device, given iff ``plan.key.sinks``.
        The sliding window is the plan's (``plan.window_left``).

    Raises:
        ValueError: inputs that do not match the plan.
    """
    hq, hkv, d = plan.num_q_heads, plan.num_kv_heads, plan.key.head_dim
    _check_tensor("q", q, (plan.num_tokens, hq, d), plan)
    _check_tensor("out", out, (plan.num_tokens, hq, d), plan)
    if k_cache.dim() != 4:
        raise ValueError(
            f"k_cache must be [num_blocks, page_size, Hkv, D], got {tuple(k_cache.shape)}"
        )
    nb, kv_dtype = k_cache.shape[0], plan.key.kv_dtype
    _check_tensor("k_cache", k_cache, (nb, plan.key.page_size, hkv, d), plan, kv_dtype)
    _check_tensor("v_cache", v_cache, (nb, plan.key.page_size, hkv, d), plan, kv_dtype)
    _check_kv_scales(plan, k_scale, v_scale)
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
    check_features(plan.key, plan.window_left, softcap, sinks)
    if sinks is not None and (
        tuple(sinks.shape) != (hq,) or sinks.dtype != torch.float32 or sinks.device != plan.device
    ):
        raise ValueError(
            f"sinks must be float32 [Hq={hq}] on {plan.device}, got {sinks.dtype} "
            f"{tuple(sinks.shape)} on {sinks.device}"
        )
    features = dict(window_left=plan.window_left, softcap=softcap, sinks=sinks)
    if plan.num_tiles == 0:
        return  # no query rows

    # An FP8 key gets the kernel route where route.kernel_reads_fp8 holds for it (issue 30):
    # S = k_scale * (q . k8) takes k_scale into the softmax scale (the soft cap's prescale
    # too), O = v_scale * (P v8) / l takes v_scale in the kernel's epilogue.
    if plan.route == "kernel":
        config = _config_for_views(plan, q, out, k_cache, v_cache)
        if config is not None:
            # Imported here: the CuTe-DSL import costs ~2 s and CPU-only users never need it.
            from vllm_fa4.kernels.launch import prefill_forward

            prefill_forward(
                plan.key,
                config,
                q,
                k_cache,
                v_cache,
                out,
                lse,
                plan.args,
                softmax_scale * k_scale,
                **features,
                **fp8_scale_args(plan.key, v_scale),
            )
            return

    ref_out, ref_lse = paged_attention_reference(
        q,
        k_cache,
        v_cache,
        plan.query_start_loc_cpu,
        plan.seq_lens_cpu,
        plan.args.page_table,
        softmax_scale,
        compute_dtype=torch.float32,
        k_scale=k_scale,
        v_scale=v_scale,
        **features,
    )
    out.copy_(ref_out)
    if lse is not None:
        lse.copy_(ref_lse)


def fp8_scale_args(key: KernelKey, v_scale: float) -> dict:
    """The launch's ``v_scale`` keyword for an FP8 key (k_scale is in the softmax scale);
    nothing for a 16-bit one, whose kernel has no such operand."""
    return dict(v_scale=v_scale) if key.fp8_kv else {}


def _check_kv_scales(plan: PrefillPlan, k_scale: float, v_scale: float) -> None:
    """Scales are an FP8 cache's host floats; a 16-bit cache has none. Their values are not
    judged: vLLM's ``calculate_kv_scales`` can make one 0 (all-zero keys in the first batch),
    and FLASH_ATTN computes with it; raising here would kill every request in flight."""
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not isinstance(scale, float | int) or isinstance(scale, bool):
            raise ValueError(f"{name} must be a host float, got {type(scale).__name__}")
        if not plan.key.fp8_kv and scale != 1.0:
            raise ValueError(f"{name}={scale} given for a {plan.key.dtype} cache (FP8 only)")


def rows_problem(q: torch.Tensor, out: torch.Tensor) -> str | None:
    """Why the kernel cannot take these Q / O views, or None. Its build assumes 16-byte
    aligned data pointers and token / head strides (compile._fake_args). vLLM's rows are
    slices of whole-token tensors whose token stride is at least Hq x D x 2 bytes, 64-aligned
    for every head dim served, so this guards a future caller, at a few integer operations."""
    for name, t in (("q", q), ("out", out)):
        per_16_bytes = 16 // t.element_size()
        if t.data_ptr() % 16:
            return f"{name}'s data pointer is not 16-byte aligned"
        if any(t.stride(i) % per_16_bytes for i in range(t.dim() - 1) if t.shape[i] > 1):
            # no shape in the message: it varies per step, and _say_once logs each text once
            return f"{name}'s strides {tuple(t.stride())} are not whole 16-byte units"
    return None


def _config_for_views(plan: PrefillPlan, q, out, k_cache, v_cache) -> KernelConfig | None:
    """The plan's config fitted to the cache views' strides, or None where the kernel cannot
    read the views (Q / O or the cache) at all. The builder fits its configs to the layout
    vLLM's cache spec announces (padded pages) at startup; this catches a layout nothing
    announced (logged once, never an error: an exception here would kill every request in
    flight)."""
    problem = rows_problem(q, out) or kv_views_problem(k_cache, v_cache)
    if problem is not None:
        _say_once(
            logger.error,
            f"FA4 prefill: the kernel cannot read these views ({problem}); prefill runs on "
            "the slow fp32 PyTorch reference. Use --attention-backend FLASH_ATTN for this model.",
        )
        return None
    config = fit_config(plan.config, plan.key, KvCacheLayout.of_views(k_cache))
    if config != plan.config:
        _say_once(
            logger.warning,
            f"FA4 prefill: KV cache blocks of {k_cache.stride(0)} elements are not whole "
            f"wide_box boxes; {plan.config.spec} runs as {config.spec} (compiled now if "
            "warmup did not: the cache spec did not announce this layout)",
        )
    return config
