"""Reference paged prefill attention in plain PyTorch (CPU or CUDA).

Semantics (docs/contracts.md): request b has q_len = cu[b+1] - cu[b] query tokens and
k_len = seqused_k[b] keys; its query token j sees keys [0, k_len - q_len + j] (bottom-right
causal). Key token t lives at ``k_cache[page_table[b, t // page_size], t % page_size, kv_head]``
and query head h reads KV head ``h // (Hq // Hkv)``. A row that sees no key gets out = 0 and
lse = -inf. Only the first k_len cache slots of a request are ever read, so NaN in unused
slots cannot leak.
"""

from __future__ import annotations

import contextlib

import torch

# Upper bound on the fp32 score matrix of one chunk (bytes); keeps a 64k-token context at
# 32 query heads on a GPU to a few hundred MB.
_SCORE_BYTES_BUDGET = 256 << 20
_MAX_ROWS_PER_CHUNK = 1024


@contextlib.contextmanager
def _exact_fp32_matmul():
    """Disable TF32 for the fp32 ground truth (vLLM or a test may have enabled it)."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def _to_list(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.tolist()]


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seqused_k: torch.Tensor,
    page_table: torch.Tensor,
    softmax_scale: float,
    *,
    compute_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged varlen causal GQA attention; returns ``(out, lse)``.

    Args:
        q: [total_q, Hq, D] (any strides).
        k_cache, v_cache: [num_blocks, page_size, Hkv, D] (any strides).
        cu_seqlens_q: [B + 1] cumulative query lengths (CPU or device; read with ``tolist``).
        seqused_k: [B] key lengths (cached prefix + q_len).
        page_table: [B, max_pages] block ids.
        softmax_scale: multiplier of q·k.
        compute_dtype: float32 (default) or float64: everything upcast, the ground truth.
            A 16-bit dtype (normally ``q.dtype``): the "same math in low precision" baseline
            (FlashAttention's ``upcast=False``): q·k and P·V in that dtype, softmax in fp32,
            P rounded to that dtype before P·V.

    Returns:
        out: [total_q, Hq, D] in ``compute_dtype`` (callers cast).
        lse: [Hq, total_q] float32 (float64 when compute_dtype is float64), natural log,
            -inf for rows that see no key.
    """
    if q.dim() != 3 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError(
            f"expected q [total_q, Hq, D] and k/v cache [blocks, page, Hkv, D], got "
            f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    total_q, num_q_heads, head_dim = q.shape
    _, page_size, num_kv_heads, _ = k_cache.shape
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(f"Hq={num_q_heads} is not a multiple of Hkv={num_kv_heads}")
    qpk = num_q_heads // num_kv_heads
    upcast = compute_dtype.itemsize >= 4
    stat_dtype = torch.float64 if compute_dtype == torch.float64 else torch.float32
    device = q.device

    cu = _to_list(cu_seqlens_q)
    k_lens = _to_list(seqused_k)
    if len(cu) != len(k_lens) + 1:
        raise ValueError(f"cu_seqlens_q has {len(cu)} entries for {len(k_lens)} requests")
    if cu[-1] > total_q:
        raise ValueError(f"cu_seqlens_q ends at {cu[-1]} but q has {total_q} rows")

    out = torch.zeros(total_q, num_q_heads, head_dim, dtype=compute_dtype, device=device)
    lse = torch.full((num_q_heads, total_q), float("-inf"), dtype=stat_dtype, device=device)

    ctx = _exact_fp32_matmul() if upcast else contextlib.nullcontext()
    with ctx:
        for b, k_len in enumerate(k_lens):
            q_start, q_len = cu[b], cu[b + 1] - cu[b]
            if q_len <= 0 or k_len <= 0:
                continue  # nothing to compute; rows (if any) stay 0 / -inf
            prefix = k_len - q_len
            # Gather only the keys any row of this request can see.
            n_keys = min(k_len, max(prefix + q_len, 0))
            t = torch.arange(n_keys, device=page_table.device)
            blocks = page_table[b].long()[t // page_size].to(k_cache.device)
            offs = (t % page_size).to(k_cache.device)
            k = k_cache[blocks, offs].to(device=device, dtype=compute_dtype)  # [n, Hkv, D]
            v = v_cache[blocks, offs].to(device=device, dtype=compute_dtype)
            if not upcast:
                k = k * softmax_scale  # FlashAttention's reorder_ops: scale K, in low precision
            kh = k.permute(1, 0, 2)  # [Hkv, n, D]
            vh = v.permute(1, 0, 2)

            per_row = max(1, num_q_heads * max(n_keys, 1) * 4)
            rows = max(1, min(_MAX_ROWS_PER_CHUNK, _SCORE_BYTES_BUDGET // per_row))
            for r0 in range(0, q_len, rows):
                r1 = min(q_len, r0 + rows)
                nr = r1 - r0
                # Keys visible to the last row of the chunk.
                nk = min(n_keys, max(prefix + r1, 0))
                qc = q[q_start + r0 : q_start + r1].to(compute_dtype)  # [nr, Hq, D]
                # [Hkv, qpk * nr, D], row = g * nr + r
                qh = qc.reshape(nr, num_kv_heads, qpk, head_dim).permute(1, 2, 0, 3)
                qh = qh.reshape(num_kv_heads, qpk * nr, head_dim)
                if nk == 0:
                    continue
                s = torch.matmul(qh, kh[:, :nk].transpose(1, 2))  # [Hkv, qpk*nr, nk]
                s = s.to(stat_dtype)
                if upcast:
                    s = s * softmax_scale
                s = s.view(num_kv_heads, qpk, nr, nk)
                row = torch.arange(r0, r1, device=device)
                col = torch.arange(nk, device=device)
                visible = col[None, :] <= (prefix + row)[:, None]  # [nr, nk]
                s = s.masked_fill(~visible, float("-inf"))
                m = s.amax(dim=-1, keepdim=True)
                m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
                p = torch.exp(s - m)
                denom = p.sum(dim=-1, keepdim=True)  # [Hkv, qpk, nr, 1]
                row_lse = torch.log(denom) + m  # -inf where denom == 0
                safe = torch.where(denom > 0, denom, torch.ones_like(denom))
                p = p / safe
                p = p.to(compute_dtype).view(num_kv_heads, qpk * nr, nk)
                o = torch.matmul(p, vh[:, :nk])  # [Hkv, qpk*nr, D]
                o = o.view(num_kv_heads, qpk, nr, head_dim).permute(2, 0, 1, 3)
                out[q_start + r0 : q_start + r1] = o.reshape(nr, num_q_heads, head_dim)
                lse[:, q_start + r0 : q_start + r1] = row_lse.reshape(num_q_heads, nr)
    return out, lse
