"""The project's accuracy bar for attention outputs (FlashAttention's test convention).

``out`` (kernel, bf16/fp16) is compared with ``ref_out`` (fp32 reference) and must be within
``rtol_factor`` x the max error of ``lowp_out`` (the same math done by PyTorch in low
precision) plus an fp32 rounding floor ``2 * max|(ref + 0.3 - 0.3) - ref|``; its mean error
must be within ``mean_factor`` x the low-precision mean error plus the same floor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionError:
    max_err: float  # max |out - ref|
    mean_err: float  # mean |out - ref|
    lowp_max_err: float  # max |lowp - ref|
    lowp_mean_err: float  # mean |lowp - ref|
    floor: float  # fp32 rounding floor
    max_bound: float
    mean_bound: float
    worst_index: tuple[int, ...]  # index of max |out - ref| (token, head, dim)

    def __str__(self) -> str:
        return (
            f"max err {self.max_err:.3e} (bound {self.max_bound:.3e}, lowp {self.lowp_max_err:.3e})"
            f", mean err {self.mean_err:.3e} (bound {self.mean_bound:.3e}, "
            f"lowp {self.lowp_mean_err:.3e}), worst at {self.worst_index}"
        )


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for s in reversed(shape):
        idx.append(flat % s)
        flat //= s
    return tuple(reversed(idx))


def _request_of(token: int, cu: list[int]) -> int:
    for b in range(len(cu) - 1):
        if cu[b] <= token < cu[b + 1]:
            return b
    return -1


def assert_attention_close(
    out: torch.Tensor,
    ref_out: torch.Tensor,
    lowp_out: torch.Tensor,
    *,
    rtol_factor: float = 2.0,
    mean_factor: float = 1.5,
    cu_seqlens_q: torch.Tensor | None = None,
) -> AttentionError:
    """Check a kernel output against the fp32 reference; raise AssertionError if it fails.

    Args:
        out: kernel output [total_q, Hq, D] (poisoned with NaN before the kernel ran, so any
            unwritten element fails the finiteness check).
        ref_out: fp32 reference output, same shape.
        lowp_out: reference computed in the kernel's dtype (``compute_dtype=q.dtype``).
        cu_seqlens_q: optional [B+1] query offsets; enables per-request reporting and the
            per-request "not all zero" check.
    """
    if out.shape != ref_out.shape or lowp_out.shape != ref_out.shape:
        raise AssertionError(
            f"shape mismatch: out {tuple(out.shape)}, ref {tuple(ref_out.shape)}, "
            f"lowp {tuple(lowp_out.shape)}"
        )
    cu = [int(x) for x in cu_seqlens_q.tolist()] if cu_seqlens_q is not None else None

    def where(flat: int) -> str:
        idx = _unravel(flat, out.shape)
        s = f"index {idx}"
        if cu is not None:
            s += f" (request {_request_of(idx[0], cu)})"
        return s

    o = out.detach().float()
    r = ref_out.detach().to(o.device).float()
    lp = lowp_out.detach().to(o.device).float()

    bad = ~torch.isfinite(o)
    n_bad = int(bad.sum())
    if n_bad:
        first = int(bad.flatten().nonzero()[0])
        raise AssertionError(
            f"{n_bad} of {o.numel()} output elements are NaN/Inf (unwritten or overflow); "
            f"first at {where(first)}"
        )
    if not torch.isfinite(r).all():
        raise AssertionError("reference output contains NaN/Inf: the test case is broken")
    if o.numel() == 0:
        return AttentionError(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, ())

    err = (o - r).abs()
    lp_err = (lp - r).abs()
    floor = 2.0 * float(((r + 0.3 - 0.3) - r).abs().max())
    max_err = float(err.max())
    worst = int(err.flatten().argmax())
    mean_err = float(err.mean())
    lp_max = float(lp_err.max())
    lp_mean = float(lp_err.mean())
    res = AttentionError(
        max_err=max_err,
        mean_err=mean_err,
        lowp_max_err=lp_max,
        lowp_mean_err=lp_mean,
        floor=floor,
        max_bound=rtol_factor * lp_max + floor,
        mean_bound=mean_factor * lp_mean + floor,
        worst_index=_unravel(worst, out.shape),
    )

    # Causal output must not be all zero where the reference is not (a masked-out kernel
    # would otherwise pass a loose tolerance).
    spans = [(0, o.shape[0])] if cu is None else list(zip(cu[:-1], cu[1:]))
    for b, (s, e) in enumerate(spans):
        if e > s and bool(r[s:e].abs().amax() > 0) and not bool(o[s:e].abs().amax() > 0):
            who = "output" if cu is None else f"request {b} (rows {s}..{e - 1})"
            raise AssertionError(f"{who} is all zero but the reference is not")

    if max_err > res.max_bound:
        raise AssertionError(
            f"max error {max_err:.3e} at {where(worst)} exceeds {rtol_factor} x low-precision "
            f"max error {lp_max:.3e} + floor {floor:.1e} = {res.max_bound:.3e} "
            f"(out {float(o.flatten()[worst]):.5f}, ref {float(r.flatten()[worst]):.5f}); {res}"
        )
    if mean_err > res.mean_bound:
        raise AssertionError(
            f"mean error {mean_err:.3e} exceeds {mean_factor} x low-precision mean error "
            f"{lp_mean:.3e} + floor {floor:.1e} = {res.mean_bound:.3e}; {res}"
        )
    return res


def assert_lse_close(
    lse: torch.Tensor, ref_lse: torch.Tensor, *, atol: float = 1e-2, rtol: float = 1e-3
) -> float:
    """lse [Hq, total_q] against the reference: same -inf pattern, finite values close.

    Returns the max abs error over finite entries.
    """
    if lse.shape != ref_lse.shape:
        raise AssertionError(f"lse shape {tuple(lse.shape)} != reference {tuple(ref_lse.shape)}")
    a = lse.detach().float()
    r = ref_lse.detach().to(a.device).float()
    if torch.isnan(a).any():
        raise AssertionError(f"lse has {int(torch.isnan(a).sum())} NaN entries")
    fin = torch.isfinite(r)
    if not torch.equal(torch.isfinite(a), fin) or not torch.equal(a[~fin], r[~fin]):
        raise AssertionError("lse -inf pattern differs from the reference (rows with no key)")
    if not fin.any():
        return 0.0
    err = (a[fin] - r[fin]).abs()
    tol = atol + rtol * r[fin].abs()
    if (err > tol).any():
        i = int((err - tol).argmax())
        raise AssertionError(
            f"lse error {float(err[i]):.3e} > tol {float(tol[i]):.3e} "
            f"(max lse error {float(err.max()):.3e})"
        )
    return float(err.max())
