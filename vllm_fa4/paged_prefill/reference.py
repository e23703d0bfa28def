"""Reference paged prefill attention in plain PyTorch (CPU or CUDA).

Semantics (docs/contracts.md): request b has q_len = cu[b+1] - cu[b] query tokens and
k_len = seqused_k[b] keys; its query token j sits at key position i = k_len - q_len + j and
sees keys [0, i] (bottom-right causal), or [max(0, i - window_left), i] with a sliding
window. Key token t lives at ``k_cache[page_table[b, t // page_size], t % page_size, kv_head]``
and query head h reads KV head ``h // (Hq // Hkv)``. Scores are s = softmax_scale * q·k,
soft-capped to ``softcap * tanh(s / softcap)`` before the mask when a cap is given. A sink
logit ``sinks[h]`` (same units as s) joins every row's softmax denominator and adds no value:
out = sum_k exp(s_k) v_k / (sum_k exp(s_k) + exp(sink)), lse = log(sum_k exp(s_k) + exp(sink)).
A row that sees no key gets out = 0 and lse = -inf (sinks[h] with sinks). Only the first
k_len cache slots of a request are ever read, so NaN in unused slots cannot leak.
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


# The cache dtypes read as quantized values times a per-tensor scale.
FP8_DTYPES = (torch.float8_e4m3fn,)


def _dequantized(x: torch.Tensor, scale: float, dtype: torch.dtype, device) -> torch.Tensor:
    """Gathered cache rows as ``dtype``: an FP8 cache's values times its scale, multiplied in
    fp32 (fp64 for an fp64 ground truth), then cast to ``dtype``."""
    if x.dtype in FP8_DTYPES:
        wide = torch.float64 if dtype == torch.float64 else torch.float32
        x = x.to(device=device, dtype=wide) * scale
    return x.to(device=device, dtype=dtype)


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
    window_left: int | None = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
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
            P rounded to that dtype before P·V; soft cap and sinks in fp32.
        window_left: keys a row sees left of its diagonal (>= 0; vLLM's sliding window w is
            w - 1); None: no window.
        softcap: the logit soft cap (> 0), applied to the scaled scores before the mask;
            None: off.
        sinks: [Hq] sink logits (any float dtype, read in the stat dtype); None: no sinks.
        k_scale, v_scale: an FP8 cache's per-tensor scales: its keys and values are
            dequantized in fp32 (k8 * k_scale), then cast to ``compute_dtype``. A 16-bit
            cache is read as it is (its scales must be 1).

    Returns:
        out: [total_q, Hq, D] in ``compute_dtype`` (callers cast).
        lse: [Hq, total_q] float32 (float64 when compute_dtype is float64), natural log, sink
            included; for rows that see no key -inf, or sinks[h] with sinks.
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

    if window_left is not None:
        if isinstance(window_left, bool) or int(window_left) != window_left or window_left < 0:
            raise ValueError(f"window_left must be an int >= 0 or None, got {window_left!r}")
        window_left = int(window_left)
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be positive or None, got {softcap!r}")
    if sinks is not None and (sinks.dim() != 1 or sinks.shape[0] != num_q_heads):
        raise ValueError(f"sinks must be [Hq={num_q_heads}], got {tuple(sinks.shape)}")
    if k_cache.dtype not in FP8_DTYPES and (k_scale, v_scale) != (1.0, 1.0):
        raise ValueError(
            f"k_scale/v_scale ({k_scale}, {v_scale}) given for a {k_cache.dtype} cache"
        )

    cu = _to_list(cu_seqlens_q)
    k_lens = _to_list(seqused_k)
    if len(cu) != len(k_lens) + 1:
        raise ValueError(f"cu_seqlens_q has {len(cu)} entries for {len(k_lens)} requests")
    if cu[-1] > total_q:
        raise ValueError(f"cu_seqlens_q ends at {cu[-1]} but q has {total_q} rows")

    out = torch.zeros(total_q, num_q_heads, head_dim, dtype=compute_dtype, device=device)
    lse = torch.full((num_q_heads, total_q), float("-inf"), dtype=stat_dtype, device=device)
    sink = None
    if sinks is not None:
        sink = sinks.detach().to(device=device, dtype=stat_dtype)
        # Every row of a request starts at "sees no key"; rows past cu[-1] belong to none.
        lse[:, cu[0] : cu[-1]] = sink[:, None]
        sink = sink.view(num_kv_heads, qpk, 1, 1)

    ctx = _exact_fp32_matmul() if upcast else contextlib.nullcontext()
    with ctx:
        for b, k_len in enumerate(k_lens):
            q_start, q_len = cu[b], cu[b + 1] - cu[b]
            if q_len <= 0 or k_len <= 0:
                continue  # nothing to compute; rows (if any) stay 0 / -inf (the sink)
            prefix = k_len - q_len
            # Gather only the keys any row of this request can see: keys [key_lo, n_keys).
            n_keys = min(k_len, max(prefix + q_len, 0))
            key_lo = 0 if window_left is None else min(max(prefix - window_left, 0), n_keys)
            t = torch.arange(key_lo, n_keys, device=page_table.device)
            blocks = page_table[b].long()[t // page_size].to(k_cache.device)
            offs = (t % page_size).to(k_cache.device)
            k = _dequantized(k_cache[blocks, offs], k_scale, compute_dtype, device)  # [n, Hkv, D]
            v = _dequantized(v_cache[blocks, offs], v_scale, compute_dtype, device)
            if not upcast:
                k = k * softmax_scale  # FlashAttention's reorder_ops: scale K, in low precision
            kh = k.permute(1, 0, 2)  # [Hkv, n_keys - key_lo, D]
            vh = v.permute(1, 0, 2)

            # Keys one chunk of rows [r0, r1) reads: [first key of row r0, last key of r1-1].
            span = n_keys if window_left is None else min(n_keys, window_left + _MAX_ROWS_PER_CHUNK)
            per_row = max(1, num_q_heads * max(span, 1) * 4)
            rows = max(1, min(_MAX_ROWS_PER_CHUNK, _SCORE_BYTES_BUDGET // per_row))
            for r0 in range(0, q_len, rows):
                r1 = min(q_len, r0 + rows)
                nr = r1 - r0
                # Keys visible to the last row of the chunk; the window's left edge of its first.
                nk = min(n_keys, max(prefix + r1, 0))
                k0 = 0 if window_left is None else min(max(prefix + r0 - window_left, 0), nk)
                qc = q[q_start + r0 : q_start + r1].to(compute_dtype)  # [nr, Hq, D]
                # [Hkv, qpk * nr, D], row = g * nr + r
                qh = qc.reshape(nr, num_kv_heads, qpk, head_dim).permute(1, 2, 0, 3)
                qh = qh.reshape(num_kv_heads, qpk * nr, head_dim)
                if nk == k0:
                    continue  # no row sees a key: out 0, lse -inf / the sink (set above)
                kc, vc = kh[:, k0 - key_lo : nk - key_lo], vh[:, k0 - key_lo : nk - key_lo]
                s = torch.matmul(qh, kc.transpose(1, 2))  # [Hkv, qpk*nr, nk-k0]
                s = s.to(stat_dtype)
                if upcast:
                    s = s * softmax_scale
                if softcap is not None:
                    s = torch.tanh(s / softcap) * softcap
                s = s.view(num_kv_heads, qpk, nr, nk - k0)
                row = torch.arange(r0, r1, device=device)
                col = torch.arange(k0, nk, device=device)
                diag = (prefix + row)[:, None]
                visible = col[None, :] <= diag  # [nr, nk-k0]
                if window_left is not None:
                    visible &= col[None, :] >= diag - window_left
                s = s.masked_fill(~visible, float("-inf"))
                m = s.amax(dim=-1, keepdim=True)
                if sink is not None:
                    m = torch.maximum(m, sink)  # finite: the sink is always in the row
                m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
                p = torch.exp(s - m)
                denom = p.sum(dim=-1, keepdim=True)  # [Hkv, qpk, nr, 1]
                if sink is not None:
                    denom = denom + torch.exp(sink - m)
                row_lse = torch.log(denom) + m  # -inf where denom == 0
                safe = torch.where(denom > 0, denom, torch.ones_like(denom))
                p = p / safe
                p = p.to(compute_dtype).view(num_kv_heads, qpk * nr, nk - k0)
                o = torch.matmul(p, vc)  # [Hkv, qpk*nr, D]
                o = o.view(num_kv_heads, qpk, nr, head_dim).permute(2, 0, 1, 3)
                out[q_start + r0 : q_start + r1] = o.reshape(nr, num_q_heads, head_dim)
                lse[:, q_start + r0 : q_start + r1] = row_lse.reshape(num_q_heads, nr)
    return out, lse
