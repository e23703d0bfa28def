"""Correctness gate for benchmarks/kernels.py: every peer's output against the fp32 reference.

Long requests are checked on a subset of query rows, so the reference stays cheap: the first
and the last `rows` queries of up to `requests` requests. Under bottom-right causal masking
the first r rows of a (q_len, k_len) request are exactly a request (r, k_len - q_len + r),
and its last r rows are a request (r, k_len), both over the same page-table row, so the
subset is itself a valid input for `paged_attention_reference`.
"""

from __future__ import annotations

from dataclasses import dataclass


def subset_plan(specs, rows: int, requests: int):
    """[(request, first_row, num_rows, k_len_of_subrequest)] covering the checked rows."""
    n = len(specs)
    if n <= requests:
        chosen = list(range(n))
    else:  # evenly spread, always including the first and the last request
        chosen = sorted({round(i * (n - 1) / (requests - 1)) for i in range(requests)})
    plan = []
    for b in chosen:
        q_len, k_len = specs[b]
        if q_len <= 2 * rows:
            plan.append((b, 0, q_len, k_len))
        else:
            plan.append((b, 0, rows, k_len - q_len + rows))
            plan.append((b, q_len - rows, rows, k_len))
    return plan


@dataclass
class Reference:
    rows: object  # [n] int64 global row indices into the peer output
    ref_out: object  # fp32 reference for those rows
    lowp_out: object  # same-precision reference (the error baseline of assert_attention_close)
    cu_seqlens_q: object


def build_reference(problem, rows: int, requests: int) -> Reference:
    import torch

    from vllm_fa4.paged_prefill.reference import paged_attention_reference

    device = problem.q.device
    cu_host = [0]
    for q_len, _ in problem.specs:
        cu_host.append(cu_host[-1] + q_len)
    plan = subset_plan(problem.specs, rows, requests)
    row_idx, cu, k_lens, tables = [], [0], [], []
    for b, first, count, k_len in plan:
        row_idx.append(torch.arange(cu_host[b] + first, cu_host[b] + first + count))
        cu.append(cu[-1] + count)
        k_lens.append(k_len)
        tables.append(b)
    row_idx = torch.cat(row_idx).to(device)
    q_sub = problem.q.index_select(0, row_idx)
    cu_t = torch.tensor(cu, dtype=torch.int32, device=device)
    k_t = torch.tensor(k_lens, dtype=torch.int32, device=device)
    table = problem.page_table.index_select(0, torch.tensor(tables, device=device)).contiguous()
    args = (q_sub, problem.k_cache, problem.v_cache, cu_t, k_t, table, problem.softmax_scale)
    ref_out, _ = paged_attention_reference(*args, compute_dtype=torch.float32)
    lowp_out, _ = paged_attention_reference(*args, compute_dtype=problem.q.dtype)
    return Reference(row_idx, ref_out, lowp_out, cu_t)


@dataclass
class CheckResult:
    status: str  # "ok" | "FAIL" | "NaN" | "error"
    max_abs_err: float | None
    detail: str = ""

    def cell(self) -> str:
        err = "—" if self.max_abs_err is None else f"{self.max_abs_err:.2e}"
        return self.status if self.status == "error" else f"{self.status} {err}"


def check_output(out, ref: Reference) -> CheckResult:
    import torch

    from vllm_fa4.testing.checks import assert_attention_close

    got = out.index_select(0, ref.rows)
    bad = int((~torch.isfinite(got.float())).sum())
    if bad:
        return CheckResult("NaN", float("nan"), f"{bad} non-finite values in checked rows")
    max_err = float((got.float() - ref.ref_out.float()).abs().max())
    try:
        summary = assert_attention_close(
            got, ref.ref_out, ref.lowp_out, cu_seqlens_q=ref.cu_seqlens_q
        )
    except AssertionError as exc:
        return CheckResult("FAIL", max_err, " ".join(str(exc).split())[:500])
    return CheckResult("ok", max_err, " ".join(str(summary).split())[:500])
