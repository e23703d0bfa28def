"""vLLM's per-layer objects for the GPU backend tests (tests/gpu): the layer in the forward
context and the batch's common metadata, as vLLM builds them."""

import torch


def register_layer(vllm_config, name, impl):
    """The layer in vLLM's forward context, where the builders find its impl's settings
    (window, soft cap, sinks, KV cache dtype): an ``Attention`` (FA3's builder reads the
    sliding window of ``Attention`` layers only, for its ahead-of-time schedule) built without
    its constructor."""
    from vllm.model_executor.layers.attention import Attention

    class _ContextLayer(Attention):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.impl = impl

    vllm_config.compilation_config.static_forward_context[name] = _ContextLayer()


def common_metadata(case):
    """vLLM's ``CommonAttentionMetadata`` for a ``testing.cases`` case (every row of it)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qsl = case.query_start_loc_cpu
    q_lens = (qsl[1:] - qsl[:-1]).tolist()
    return CommonAttentionMetadata(
        query_start_loc=case.cu_seqlens_q,
        query_start_loc_cpu=qsl,
        seq_lens=case.seqused_k,
        num_reqs=len(q_lens),
        num_actual_tokens=int(qsl[-1]),
        max_query_len=max(q_lens),
        max_seq_len=int(case.seq_lens_cpu.max()),
        block_table_tensor=case.block_table,
        slot_mapping=case.slot_mapping,
        seq_lens_cpu_upper_bound=case.seq_lens_cpu,
    )
