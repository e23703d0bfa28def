"""vllm_fa4.compat against the installed vLLM (CI runs this file on 0.26.0 and on 0.33.0)."""

import dataclasses

import numpy as np
import pytest
import torch

from vllm_fa4 import compat
from vllm_fa4.paged_prefill import split_kv_cache
from vllm_fa4.paged_prefill.layout import kv_views_problem

FIELD_GROUPS = (
    compat.PER_REQUEST_FIELDS,
    compat.PER_TOKEN_FIELDS,
    compat.QUERY_START_FIELDS,
    compat.RECOMPUTED_FIELDS,
    compat.CLEARED_FIELDS,
    compat.KEPT_FIELDS,
)


def metadata_fields() -> list[str]:
    return [field.name for field in dataclasses.fields(compat.CommonAttentionMetadata)]


def test_every_metadata_field_is_classified_for_the_decode_slice():
    """A field this vLLM added that decode_slice has not reviewed fails here: per request,
    it would reach FA3's decode builder with the prefill rows still in it."""
    classified = {name for group in FIELD_GROUPS for name in group}
    assert set(metadata_fields()) <= classified, set(metadata_fields()) - classified
    named = [name for group in FIELD_GROUPS for name in group]
    assert len(named) == len(classified)  # each name in one group only


def full_metadata(query_lens, seq_lens):
    """CommonAttentionMetadata with every optional per-request and per-token field this vLLM
    has set (row i holds i), so a field left unsliced shows."""
    q = torch.tensor(query_lens, dtype=torch.int32)
    qsl = torch.zeros(len(q) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q, 0)
    num_reqs, num_tokens = len(q), int(qsl[-1])
    cm = compat.CommonAttentionMetadata(
        query_start_loc=qsl.clone(),
        query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_reqs=num_reqs,
        num_actual_tokens=num_tokens,
        max_query_len=int(q.max()),
        max_seq_len=max(seq_lens),
        block_table_tensor=torch.arange(num_reqs * 4, dtype=torch.int32).view(num_reqs, 4),
        slot_mapping=torch.arange(num_tokens, dtype=torch.int64),
    )
    numpy_rows = ("encoder_seq_lens_cpu", "req_idx")  # vLLM keeps these as numpy arrays
    rows = {
        name: np.arange(num_reqs) if name in numpy_rows else torch.arange(num_reqs)
        for name in compat.PER_REQUEST_FIELDS
        if name in metadata_fields() and getattr(cm, name) is None
    }
    tokens = {name: torch.arange(num_tokens) for name in ("positions",)}
    batch = {"logits_indices_padded": torch.arange(num_tokens), "num_logits_indices": num_tokens}
    return cm.replace(**rows, **tokens, **batch)


def test_decode_slice_cuts_every_field_to_the_decode_rows():
    query_lens, seq_lens = [1, 1, 3, 700], [40, 41, 42, 700]
    cm = full_metadata(query_lens, seq_lens)
    sliced = compat.decode_slice(cm, num_decodes=3, num_decode_tokens=5)
    assert (sliced.num_reqs, sliced.num_actual_tokens, sliced.max_query_len) == (3, 5, 3)
    assert sliced.max_seq_len == cm.max_seq_len  # an upper bound stays one
    for name in compat.PER_REQUEST_FIELDS:
        if name in metadata_fields() and getattr(cm, name) is not None:
            assert len(getattr(sliced, name)) == 3, name
    for name in compat.PER_TOKEN_FIELDS:
        assert len(getattr(sliced, name)) == 5, name
    for name in compat.QUERY_START_FIELDS:
        assert getattr(sliced, name).tolist() == [0, 1, 2, 5], name
    for name in compat.CLEARED_FIELDS:
        if name in metadata_fields():
            assert getattr(sliced, name) is None, name
    # views of the batch's tensors, no copies
    assert sliced.block_table_tensor.data_ptr() == cm.block_table_tensor.data_ptr()


def test_prefill_seq_lens_come_from_the_cpu_upper_bound():
    cm = full_metadata([1, 500], [9, 500])
    assert compat.prefill_seq_lens_cpu(cm) is cm.seq_lens_cpu_upper_bound
    assert compat.prefill_seq_lens_cpu(cm.replace(seq_lens_cpu_upper_bound=None)) is getattr(
        cm, "_seq_lens_cpu", None
    )


@pytest.mark.skipif(compat.KVCacheLayout is None, reason="vLLM 0.33's KVCacheLayout")
@pytest.mark.parametrize("hkv", [1, 4])
def test_declared_layouts_give_views_the_kernel_reads(hkv):
    """The per-layer views vLLM 0.33 makes (its own create_kv_cache_views) for each layout FA4
    declares split into the K and V that FLASH_ATTN's forward takes from the same tensor; an
    HND layout, which FA4 does not declare, is refused by split_kv_cache."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheTensor,
        create_kv_cache_views,
    )

    d, block_size, num_blocks, num_layers = 64, 16, 5, 3
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=hkv, head_size=d, dtype=torch.bfloat16
    )
    page, size = spec.page_size_bytes, spec.page_size_bytes * num_blocks * num_layers

    def views(layout):
        layer_outer = layout.is_layer_compact
        tensor = KVCacheTensor(
            size=size,
            layers=[f"layer.{i}" for i in range(num_layers)],
            layer_stride=page * num_blocks if layer_outer else page,
            block_stride=page if layer_outer else page * num_layers,
        )
        raw = torch.randint(-100, 100, (size,), dtype=torch.int8)
        return create_kv_cache_views(raw, spec, num_blocks, layout, tensor)

    for layout in compat.NHD_KV_CACHE_LAYOUTS:
        for kv in views(layout):
            fa_k, fa_v = kv.transpose(1, 2).split(d, dim=-1)  # FlashAttentionImpl.forward
            k, v = split_kv_cache(kv, d)
            # compared as bits: random bytes hold NaNs, which compare unequal
            assert torch.equal(k.view(torch.int16), fa_k.view(torch.int16)), layout
            assert torch.equal(v.view(torch.int16), fa_v.view(torch.int16)), layout
            assert k.data_ptr() == fa_k.data_ptr() and v.data_ptr() == fa_v.data_ptr()
    if hkv > 1:
        (hnd_kv, *_) = views(compat.KVCacheLayout.LBHNC)
        # an HND layer view is not refused mid-request but named (the reference route then
        # serves it); the layouts FA4 declares never produce one
        assert "not NHD" in kv_views_problem(*split_kv_cache(hnd_kv, d))
