"""Kernel peers for benchmarks/kernels.py: each one prepares a zero-argument launch on one input.

`prepare(problem)` does everything that is not the kernel (planning, page lists, workspace,
output buffers) and returns `fn` such that `fn()` launches the kernel once and returns the
output [total_q, Hq, D]. Imports happen inside the adapters, so one missing package only
fails its own peer. `flash_attn_4` is only ever prepared inside the separate peer process.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

IN_PROCESS_PEERS = ("ours", "fa3", "fa4_vllm", "flashinfer_fa3", "flashinfer_fa2")
SUBPROCESS_PEERS = ("flash_attn_4",)
ALL_PEERS = IN_PROCESS_PEERS + SUBPROCESS_PEERS


@dataclass
class Problem:
    """One paged prefill input in kernel names (see docs/contracts.md)."""

    q: object  # [total_q, Hq, D]
    k_cache: object  # [num_blocks, page_size, Hkv, D] strided view
    v_cache: object
    cu_seqlens_q: object  # [B+1] int32, device
    seqused_k: object  # [B] int32, device
    page_table: object  # [B, max_pages] int32, device
    specs: tuple[tuple[int, int], ...]
    page_size: int
    softmax_scale: float

    @property
    def num_q_heads(self) -> int:
        return self.q.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.k_cache.shape[2]

    @property
    def head_dim(self) -> int:
        return self.q.shape[2]

    @property
    def max_q(self) -> int:
        return max(q for q, _ in self.specs)

    @property
    def max_k(self) -> int:
        return max(k for _, k in self.specs)

    def new_out(self):
        import torch

        # NaN-filled: a row a peer never writes fails the check instead of passing by luck
        return torch.full(self.q.shape, float("nan"), dtype=self.q.dtype, device=self.q.device)


def problem_from_case(paged_case, specs, page_size: int) -> Problem:
    return Problem(
        q=paged_case.q,
        k_cache=paged_case.k_cache,
        v_cache=paged_case.v_cache,
        cu_seqlens_q=paged_case.cu_seqlens_q,
        seqused_k=paged_case.seqused_k,
        page_table=paged_case.page_table,
        specs=tuple(tuple(s) for s in specs),
        page_size=page_size,
        softmax_scale=float(paged_case.softmax_scale),
    )


# --------------------------------------------------------------------------------------------
# ours: vllm_fa4.paged_prefill (plan once, outside the timed region; run = validate + launch)

ROUTE_ENV = "VLLM_FA4_PREFILL_ROUTE"


def host_lengths(specs):
    """(query_start_loc_cpu [B+1], seq_lens_cpu [B]) as CPU int32 tensors."""
    import torch

    cu = [0]
    for q_len, _ in specs:
        cu.append(cu[-1] + q_len)
    seq = [k_len for _, k_len in specs]
    return torch.tensor(cu, dtype=torch.int32), torch.tensor(seq, dtype=torch.int32)


def prepare_ours(p: Problem) -> Callable:
    import os

    # Time the compiled kernel or fail: never the slow PyTorch fallback route.
    os.environ[ROUTE_ENV] = "kernel"
    from vllm_fa4.kernels.config import KernelKey
    from vllm_fa4.paged_prefill import plan_prefill, run_prefill
    from vllm_fa4.paged_prefill.policy import configured_config, serving_configs

    qsl_cpu, seq_cpu = host_lengths(p.specs)
    key = KernelKey.for_layer(p.q.dtype, p.head_dim, p.page_size, p.num_q_heads, p.num_kv_heads)
    plan = plan_prefill(
        qsl_cpu,
        seq_cpu,
        key=key,
        configs=serving_configs(key, configured_config()),
        num_kv_heads=p.num_kv_heads,
        cu_seqlens_q=p.cu_seqlens_q,
        seqused_k=p.seqused_k,
        page_table=p.page_table,
    )
    out = p.new_out()

    def fn():
        run_prefill(plan, p.q, p.k_cache, p.v_cache, out, softmax_scale=p.softmax_scale)
        return out

    return fn


# --------------------------------------------------------------------------------------------
# vLLM's FlashAttention build: FA3 (default on Hopper) and the vendored CuTe-DSL FA4


def _prepare_vllm_fa(p: Problem, fa_version: int) -> Callable:
    from vllm.vllm_flash_attn import fa_version_unsupported_reason, flash_attn_varlen_func

    reason = fa_version_unsupported_reason(fa_version)
    if reason:
        raise RuntimeError(f"FA{fa_version} unsupported here: {reason}")
    out = p.new_out()
    max_q, max_k = p.max_q, p.max_k

    def fn():
        flash_attn_varlen_func(
            p.q,
            p.k_cache,
            p.v_cache,
            max_seqlen_q=max_q,
            cu_seqlens_q=p.cu_seqlens_q,
            max_seqlen_k=max_k,
            seqused_k=p.seqused_k,
            block_table=p.page_table,
            softmax_scale=p.softmax_scale,
            causal=True,
            out=out,
            fa_version=fa_version,
        )
        return out

    return fn


def prepare_fa3(p: Problem) -> Callable:
    return _prepare_vllm_fa(p, 3)


def prepare_fa4_vllm(p: Problem) -> Callable:
    return _prepare_vllm_fa(p, 4)


# --------------------------------------------------------------------------------------------
# FlashInfer paged prefill (NHD), pages taken from the same page table, planned once


FLASHINFER_WORKSPACE_BYTES = 256 * 1024 * 1024


def flashinfer_page_lists(specs, page_table_cpu, page_size: int):
    """(kv_indptr, kv_indices, last_page_len) as CPU int32 tensors for FlashInfer's plan()."""
    import torch

    indptr, indices, last = [0], [], []
    for b, (_, k_len) in enumerate(specs):
        pages = math.ceil(k_len / page_size)
        indices += page_table_cpu[b, :pages].tolist()
        indptr.append(indptr[-1] + pages)
        last.append(k_len - (pages - 1) * page_size if pages else 0)
    as_i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    return as_i32(indptr), as_i32(indices), as_i32(last)


def _prepare_flashinfer(p: Problem, backend: str) -> Callable:
    import flashinfer
    import torch

    device = p.q.device
    qo_indptr = p.cu_seqlens_q.to("cpu", torch.int32)
    kv_indptr, kv_indices, last_len = flashinfer_page_lists(
        p.specs, p.page_table.cpu(), p.page_size
    )
    workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        workspace, kv_layout="NHD", backend=backend
    )
    wrapper.plan(
        qo_indptr,
        kv_indptr,
        kv_indices.to(device),
        last_len,
        p.num_q_heads,
        p.num_kv_heads,
        p.head_dim,
        p.page_size,
        causal=True,
        sm_scale=p.softmax_scale,
        q_data_type=p.q.dtype,
        kv_data_type=p.k_cache.dtype,
    )
    out = p.new_out()
    kv = (p.k_cache, p.v_cache)

    def fn():
        wrapper.run(p.q, kv, out=out)
        return out

    fn.keepalive = (workspace, wrapper)  # the plan lives in these
    return fn


def prepare_flashinfer_fa3(p: Problem) -> Callable:
    return _prepare_flashinfer(p, "fa3")


def prepare_flashinfer_fa2(p: Problem) -> Callable:
    return _prepare_flashinfer(p, "fa2")


# --------------------------------------------------------------------------------------------
# flash-attn-4 (upstream package; its own CuTe-DSL, so only inside the peer process)


def prepare_flash_attn_4(p: Problem) -> Callable:
    from flash_attn.cute.interface import flash_attn_varlen_func

    out = p.new_out()
    wanted = dict(
        cu_seqlens_q=p.cu_seqlens_q,
        seqused_k=p.seqused_k,
        page_table=p.page_table,
        max_seqlen_q=p.max_q,
        max_seqlen_k=p.max_k,
        softmax_scale=p.softmax_scale,
        causal=True,
        out=out,
    )
    params = inspect.signature(flash_attn_varlen_func).parameters
    has_var_kw = any(x.kind is inspect.Parameter.VAR_KEYWORD for x in params.values())
    kwargs = {k: v for k, v in wanted.items() if has_var_kw or k in params}
    missing = {"cu_seqlens_q", "seqused_k", "page_table", "causal"} - set(kwargs)
    if missing:
        raise RuntimeError(f"flash_attn_varlen_func lacks {sorted(missing)}")

    def fn():
        result = flash_attn_varlen_func(p.q, p.k_cache, p.v_cache, **kwargs)
        return result[0] if isinstance(result, tuple) else result

    return fn


PREPARE = {
    "ours": prepare_ours,
    "fa3": prepare_fa3,
    "fa4_vllm": prepare_fa4_vllm,
    "flashinfer_fa3": prepare_flashinfer_fa3,
    "flashinfer_fa2": prepare_flashinfer_fa2,
    "flash_attn_4": prepare_flash_attn_4,
}
