"""Host side of prefill: plain tensors in, tensors out (no vLLM imports).

vLLM names -> kernel names: query_start_loc -> cu_seqlens_q, seq_lens -> seqused_k,
block_table -> page_table (a view of its rows), kv_cache -> (k_cache, v_cache) views.
"""

from vllm_fa4.paged_prefill.layout import split_kv_cache
from vllm_fa4.paged_prefill.plan import PrefillPlan, plan_prefill
from vllm_fa4.paged_prefill.run import run_prefill, select_route

__all__ = ["PrefillPlan", "plan_prefill", "run_prefill", "select_route", "split_kv_cache"]
