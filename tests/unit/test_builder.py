"""FA4MetadataBuilder.build on named batch specs, fields checked against hand-computed values."""

import dataclasses
import logging
import math

import pytest
import torch

from vllm_fa4.kernels.config import KernelKey, KvBox, tile_geometry
from vllm_fa4.paged_prefill.plan import L2_SECTION_BYTES, build_work_tiles, pair_rows

BLOCK = 16
HQ, HKV, D = 32, 8, 128
QPK = HQ // HKV
_GEOMETRY = tile_geometry(KernelKey("bfloat16", D, 16, QPK))
TILE_M, TILE_N, TPT = _GEOMETRY.tile_m, _GEOMETRY.tile_n, _GEOMETRY.tokens_per_tile


def make_builder(vllm_config, threshold=None):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from vllm_fa4.metadata import FA4MetadataBuilder

    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HKV, head_size=D, dtype=torch.bfloat16)
    builder = FA4MetadataBuilder(spec, ["layer.0"], vllm_config, torch.device("cpu"))
    if threshold is not None:  # what a speculative config with k tokens sets
        builder.reorder_batch_threshold = threshold
    return builder


def make_common(query_lens, seq_lens, pad_tokens=0):
    from vllm.v1.attention.backend import CommonAttentionMetadata

    q = torch.tensor(query_lens, dtype=torch.int32)
    s = torch.tensor(seq_lens, dtype=torch.int32)
    qsl = torch.zeros(len(q) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q, 0)
    num_tokens = int(qsl[-1]) + pad_tokens
    blocks = [math.ceil(n / BLOCK) for n in seq_lens]
    table = torch.zeros(len(q), max(blocks) + 3, dtype=torch.int32)
    next_block = 1  # block 0 is the null block
    for i, n in enumerate(blocks):
        table[i, :n] = torch.arange(next_block, next_block + n)
        next_block += n
    return CommonAttentionMetadata(
        query_start_loc=qsl.clone(),
        query_start_loc_cpu=qsl,
        seq_lens=s.clone(),
        num_reqs=len(q),
        num_actual_tokens=num_tokens,
        max_query_len=int(q.max()),
        max_seq_len=int(s.max()),
        block_table_tensor=table,
        slot_mapping=torch.arange(num_tokens, dtype=torch.int64),
        seq_lens_cpu_upper_bound=s.clone(),
    )


def expected_tiles(query_lens, seq_lens, tpt=TPT, heads=HKV):
    """Brute force: every (request, kv head, m block) with its KV-tile count (``heads``:
    2 * HKV virtual heads where the pick pairs tiles, `kv_multicast`)."""
    tiles = []
    for b, (q, k) in enumerate(zip(query_lens, seq_lens)):
        for m in range(math.ceil(q / tpt)):
            last = min(q, (m + 1) * tpt) - 1
            cost = math.ceil((k - q + last + 1) / TILE_N)
            tiles += [(b, h, m, cost) for h in range(heads)]
    return tiles


def check_prefill(md, query_lens, seq_lens, nd):
    p = md.prefill
    pq, ps = query_lens[nd:], seq_lens[nd:]
    assert p.num_reqs == len(pq) and p.num_tokens == sum(pq)
    assert p.args.cu_seqlens_q.tolist() == [0] + list(torch.tensor(pq).cumsum(0).tolist())
    assert p.args.seqused_k.tolist() == ps
    assert p.max_seqlen_q == max(pq) and p.max_seqlen_k == max(ps)
    assert p.key.head_dim == D and p.key.page_size == BLOCK and p.key.qhead_per_kvhead == QPK
    paired = p.config.paired_heads
    tpt = p.geometry.tokens_per_tile
    assert tpt == (2 * TPT if paired else TPT) and p.geometry.tile_n == TILE_N
    tiles = [tuple(r) for r in p.args.work_tiles.tolist()]
    assert sorted(tiles) == sorted(expected_tiles(pq, ps, tpt, 2 * HKV if paired else HKV))
    # The builder's order is the planner's: LPT inside L2 sections (test_plan checks it).
    order = build_work_tiles(pq, ps, HKV, tpt, TILE_N, 2 * D * 2, L2_SECTION_BYTES)
    order = pair_rows(order) if paired else order
    assert tiles == [tuple(r) for r in order.tolist()]


SPECS = {
    # name: (query_lens, seq_lens, expected num_decodes)
    "pure_decode": ([1] * 8, [100 + i for i in range(8)], 8),
    "pure_prefill": ([300, 17, 1024], [300, 17, 1024], 0),
    "mixed": ([1, 1, 1, 700, 33], [50, 4000, 9, 700, 33], 3),
    "chunked_after_prefix": ([1, 2048], [77, 18432], 1),
    "one_token_prefill_is_decode_row": ([1, 1], [1, 30], 2),
    "many_tiny_prefills": ([3] * 500, [5] * 500, 0),
    "one_128k_prefill": ([131072], [131072], 0),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_build_named_batches(vllm_config, name):
    query_lens, seq_lens, nd = SPECS[name]
    builder = make_builder(vllm_config)
    md = builder.build(0, make_common(query_lens, seq_lens))
    ndt = sum(query_lens[:nd])
    assert (md.num_decodes, md.num_decode_tokens) == (nd, ndt)
    assert md.num_prefills == len(query_lens) - nd
    assert md.num_prefill_tokens == sum(query_lens) - ndt
    if nd:
        assert md.decode.num_actual_tokens == ndt
        assert md.decode.seq_lens.tolist() == seq_lens[:nd]
        assert md.decode.block_table.shape[0] == nd
    else:
        assert md.decode is None
    if nd == len(query_lens):
        assert md.prefill is None
    else:
        check_prefill(md, query_lens, seq_lens, nd)


def test_pure_decode_passes_padded_metadata_through(vllm_config):
    # Full CUDA graphs pad the token count; FA3 must see the same, untouched metadata.
    cm = make_common([1] * 4, [10, 20, 30, 40], pad_tokens=4)
    md = make_builder(vllm_config).build(0, cm)
    assert md.prefill is None and md.decode.num_actual_tokens == 8
    assert md.decode.block_table.data_ptr() == cm.block_table_tensor.data_ptr()
    assert md.slot_mapping is cm.slot_mapping  # vLLM's micro-batching reads it


def test_metadata_carries_the_slot_mapping(vllm_config):
    cm = make_common([1, 1, 500], [9, 9, 500])
    md = make_builder(vllm_config).build(0, cm)
    assert md.slot_mapping is cm.slot_mapping and md.prefill is not None


def test_page_table_is_a_view_of_the_block_table(vllm_config):
    cm = make_common([1, 1, 500], [9, 9, 500])
    md = make_builder(vllm_config).build(0, cm)
    table = md.prefill.args.page_table
    assert table.data_ptr() == cm.block_table_tensor[2:].data_ptr()
    assert table.stride() == cm.block_table_tensor.stride()


def test_spec_decode_rows_stay_on_the_decode_path(vllm_config):
    # With 3 speculative tokens the threshold is 4: q_len 2-4 rows are decodes.
    query_lens, seq_lens = [2, 4, 3, 900], [40, 41, 42, 900]
    md = make_builder(vllm_config, threshold=4).build(0, make_common(query_lens, seq_lens))
    assert (md.num_decodes, md.num_decode_tokens) == (3, 9)
    check_prefill(md, query_lens, seq_lens, 3)


def test_chunk_after_long_prefix_is_scheduled_first(vllm_config):
    query_lens, seq_lens = [2048, 2048], [2048, 18432]
    md = make_builder(vllm_config).build(0, make_common(query_lens, seq_lens))
    first = md.prefill.args.work_tiles[0].tolist()
    assert first[0] == 1 and first[3] == math.ceil(18432 / TILE_N)


def test_speculative_config_raises_threshold(tiny_llama_dir):
    from helpers.vllm_configs import make_vllm_config
    from vllm.config import set_current_vllm_config

    config = make_vllm_config(tiny_llama_dir, num_speculative_tokens=3)
    with set_current_vllm_config(config):
        assert make_builder(config).reorder_batch_threshold == 4


def test_builder_declares_uniform_batch_graphs(vllm_config):
    from vllm.v1.attention.backend import AttentionCGSupport

    from vllm_fa4.metadata import FA4MetadataBuilder

    support = FA4MetadataBuilder.get_cudagraph_support(vllm_config, None)
    assert support.value <= AttentionCGSupport.UNIFORM_BATCH.value
    assert support != AttentionCGSupport.NEVER


def test_builder_never_takes_block_table_updates():
    """vLLM reuses a builder's metadata for another KV-cache group through
    ``update_block_table`` when ``supports_update_block_table`` is true (FLASH_ATTN's builder
    sets it). Ours has nothing to update: each step's prefill plan (work tiles, page table,
    config) is built from the group's own block table in ``build``, so reused metadata would
    read another group's pages. The flag must stay false, whatever the base class says."""
    from vllm_fa4.metadata import FA4MetadataBuilder

    assert getattr(FA4MetadataBuilder, "supports_update_block_table", False) is False


def _register_layers(vllm_config, features_by_name):
    """Attention layers in vLLM's forward context whose impls carry ``model_features``."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    class _Layer(AttentionLayerBase):
        def __init__(self, features):
            # (vLLM 0.33's FA3 builder reads the head count off the layers' impls)
            self.impl = SimpleNamespace(model_features=features, num_heads=HQ)

        def get_attn_backend(self):
            raise NotImplementedError

        def get_kv_cache_spec(self, vllm_config):
            raise NotImplementedError

    context = vllm_config.compilation_config.static_forward_context
    for name, features in features_by_name.items():
        context[name] = _Layer(features)


def test_group_features_set_the_key_and_the_plan_window(vllm_config):
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    from vllm_fa4.kernels.config import ModelFeatures
    from vllm_fa4.metadata import FA4MetadataBuilder

    features = ModelFeatures(window_left=255, softcap=50.0, sinks=True)
    _register_layers(vllm_config, {"w.0": features, "w.1": features})
    spec = SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=HKV, head_size=D, dtype=torch.bfloat16, sliding_window=256
    )
    builder = FA4MetadataBuilder(spec, ["w.0", "w.1"], vllm_config, torch.device("cpu"))
    key = builder.kernel_key
    assert (key.sliding_window, key.softcap, key.sinks) == (True, True, True)
    md = builder.build(0, make_common([2048], [2048 + 16384]))
    assert md.prefill.window_left == 255 and md.prefill.key == key
    # the window caps the work: each tile visits at most 4 K/V tiles of 128 keys
    assert int(md.prefill.work_tiles_cpu[:, 3].max()) <= 4


def test_group_features_must_agree(vllm_config):
    from vllm_fa4.kernels.config import ModelFeatures

    _register_layers(vllm_config, {"a.0": ModelFeatures(window_left=127), "a.1": ModelFeatures()})
    with pytest.raises(NotImplementedError, match="differ in sliding window"):
        make_builder_for(vllm_config, ["a.0", "a.1"])


def test_sliding_window_spec_without_layers_sets_the_window(vllm_config):
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    from vllm_fa4.metadata import FA4MetadataBuilder

    spec = SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=HKV, head_size=D, dtype=torch.bfloat16, sliding_window=4096
    )
    builder = FA4MetadataBuilder(spec, ["nolayer.0"], vllm_config, torch.device("cpu"))
    assert builder.kernel_key.sliding_window and builder.features.window_left == 4095


def make_builder_for(vllm_config, layer_names):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from vllm_fa4.metadata import FA4MetadataBuilder

    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HKV, head_size=D, dtype=torch.bfloat16)
    return FA4MetadataBuilder(spec, layer_names, vllm_config, torch.device("cpu"))


def _builder_with_spec(vllm_config, **spec_fields):
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from vllm_fa4.metadata import FA4MetadataBuilder

    fields = dict(block_size=BLOCK, num_kv_heads=HKV, head_size=D, dtype=torch.bfloat16)
    spec = FullAttentionSpec(**(fields | spec_fields))
    return FA4MetadataBuilder(spec, ["layer.0"], vllm_config, torch.device("cpu"))


def test_padded_pages_are_decided_at_startup(vllm_config, caplog):
    """vLLM pads attention pages (``page_size_padded``) to a hybrid model's largest page: the
    builder fits its configs to that block stride when it is created, not mid-request."""
    import logging

    page = 2 * BLOCK * HKV * D * 2
    plain = _builder_with_spec(vllm_config).kernel_configs
    assert plain.long.kv_box is KvBox.WIDE  # page 16, head dim 128: whole-row boxes
    with caplog.at_level(logging.INFO, logger="vllm_fa4"):
        padded = _builder_with_spec(vllm_config, page_size_padded=page + 16).kernel_configs
    assert padded.long.kv_box is KvBox.PER_CHUNK and padded.short == plain.short
    assert dataclasses.replace(padded.long, kv_box=KvBox.WIDE) == plain.long
    assert any("padded KV pages" in r.getMessage() for r in caplog.records)
    # a pad of whole boxes (16 token slots) keeps them
    whole = _builder_with_spec(vllm_config, page_size_padded=page + 16 * HKV * 2 * D * 2)
    assert whole.kernel_configs == plain


def test_unreadable_padded_pages_are_refused_at_startup(vllm_config):
    page = 2 * BLOCK * HKV * D * 2
    with pytest.raises(NotImplementedError, match="block stride .* 16 bytes.*FLASH_ATTN"):
        _builder_with_spec(vllm_config, page_size_padded=page + 6)


def test_kv_cache_dtype_unlike_the_models_is_refused_at_startup(vllm_config):
    """vllm_config's model is bf16: an fp16 cache would fail at the first prefill."""
    with pytest.raises(NotImplementedError, match="KV cache dtype float16 with model dtype"):
        _builder_with_spec(vllm_config, dtype=torch.float16)


def test_check_mode_logs_lengths_that_differ_once_and_never_raises(
    vllm_config, monkeypatch, caplog
):
    """VLLM_FA4_CHECK=1: a step whose device lengths differ from the host copies (a drift
    the kernel would tile by one and bound by the other) is logged once as an error, and
    still served; unset, nothing is compared."""
    from vllm_fa4 import envs

    query_lens, seq_lens = [1, 40, 300], [9, 40, 700]
    drifted = make_common(query_lens, seq_lens)
    drifted.seq_lens[2] += 16  # the GPU copy only
    for value, said in (("", 0), ("1", 1)):
        monkeypatch.setenv(envs.CHECK, value)
        builder = make_builder(vllm_config)
        caplog.clear()
        for _ in range(2):
            md = builder.build(0, drifted)
            assert md.prefill is not None and md.prefill.num_tokens == 340
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == said, errors
    assert "seqused_k[1] is 716 on the GPU, 700 on the host" in errors[0]
    builder.build(0, make_common(query_lens, seq_lens))  # equal copies: nothing more said
    monkeypatch.setenv(envs.CHECK, "yes")
    with pytest.raises(ValueError, match=envs.CHECK):
        make_builder(vllm_config)
