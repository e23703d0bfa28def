"""Host side of prefill: plain tensors in, tensors out (no vLLM imports).

vLLM names -> kernel names: query_start_loc -> cu_seqlens_q, seq_lens -> seqused_k,
block_table -> page_table (a view of its rows), kv_cache -> (k_cache, v_cache) views.

    layout.py     split_kv_cache: K/V views of vLLM's packed cache
    policy.py     serving_configs: the measured serving table (key -> long / short configs)
    plan.py       plan_prefill -> PrefillPlan (LPT work list, config pick, launch arguments,
                  the route), once per step
    route.py      select_route: compiled kernel or fp32 reference, decided and logged once
    run.py        run_prefill: validate, then run the plan's route
    reference.py  the fp32 PyTorch reference (a route only when asked for, the tests' ground truth)
"""

from vllm_fa4.paged_prefill.layout import split_kv_cache
from vllm_fa4.paged_prefill.plan import PrefillPlan, plan_prefill
from vllm_fa4.paged_prefill.reference import paged_attention_reference
from vllm_fa4.paged_prefill.route import select_route
from vllm_fa4.paged_prefill.run import run_prefill

__all__ = [
    "PrefillPlan",
    "paged_attention_reference",
    "plan_prefill",
    "run_prefill",
    "select_route",
    "split_kv_cache",
]
