"""The GPU fuzz harness (tests/gpu/test_fuzz.py) end to end on the CPU: its ``DEVICE = "cpu"``
mode with the fp32 reference as the prefill route and stand-ins for what needs a GPU (FA3,
vLLM's cache-write op). What this checks is the harness, not the kernel: the new layouts reach
``run_prefill``, the builder (vLLM's ``page_size_padded`` spec) and FLASH_ATTN as the same
views, snapshots cover the whole cache buffer, the window / cap / sinks reach every side, and
the checks fail on planted faults (a write into a pad, an ignored window, one row off with FA3
refusing)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from vllm_fa4.paged_prefill import paged_attention_reference
from vllm_fa4.testing import fuzz

HARNESS = Path(__file__).resolve().parents[1] / "gpu" / "test_fuzz.py"
# Small enough for the fp32 reference on two loaded CPU cores.
CPU_LIMITS = fuzz.Limits(
    max_q_tokens=600, max_backend_q_tokens=600, max_kv_tokens=6000, max_work=1 << 26
)


@pytest.fixture(scope="module")
def harness():
    spec = importlib.util.spec_from_file_location("fuzz_harness_on_cpu", HARNESS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fa3_stand_in(self, out, q=None, k_cache=None, v_cache=None, page_table=None):
    """PagedCase.fa3 on the CPU: the same math in the case's dtype, from the views given."""
    ref, _ = paged_attention_reference(
        self.q if q is None else q,
        self.k_cache if k_cache is None else k_cache,
        self.v_cache if v_cache is None else v_cache,
        self.cu_seqlens_q,
        self.seqused_k,
        self.page_table if page_table is None else page_table,
        self.softmax_scale,
        compute_dtype=self.dtype,
        **self.features,
    )
    return out.copy_(ref)


def _flash_attn_forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *a, **k):
    """FlashAttentionImpl.forward on the CPU: its rows from the reference in the query's
    dtype, with the impl's own window, cap and sinks (what FA4's decode rows delegate to)."""
    if attn_metadata is None:
        return output.fill_(0)
    k_cache, v_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
    n = attn_metadata.num_actual_tokens
    ref, _ = paged_attention_reference(
        query[:n],
        k_cache,
        v_cache,
        attn_metadata.query_start_loc,
        attn_metadata.seq_lens,
        attn_metadata.block_table,
        self.scale,
        compute_dtype=query.dtype,
        window_left=None if self.sliding_window[0] < 0 else self.sliding_window[0],
        softcap=self.logits_soft_cap or None,
        sinks=self.sinks,
    )
    output[:n] = ref
    return output


def _reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, *args):
    """vLLM's cache write (a CUDA op) in torch: slot s -> block s // page, row s % page."""
    n, page = slot_mapping.shape[0], key_cache.shape[1]
    ok = slot_mapping >= 0
    slots = slot_mapping[ok]
    key_cache[slots // page, slots % page] = key[:n][ok]
    value_cache[slots // page, slots % page] = value[:n][ok]


@pytest.fixture
def cpu_harness(harness, monkeypatch, tmp_path):
    from vllm.v1.attention.backends import flash_attn

    import vllm_fa4
    from vllm_fa4.testing.cases import PagedCase

    vllm_fa4.register()
    monkeypatch.setattr(harness, "DEVICE", "cpu")
    monkeypatch.setattr(harness, "ROUTE", "reference")
    monkeypatch.setattr(PagedCase, "fa3", _fa3_stand_in)
    monkeypatch.setattr(flash_attn.FlashAttentionImpl, "forward", _flash_attn_forward)
    monkeypatch.setattr(flash_attn, "reshape_and_cache_flash", _reshape_and_cache_flash, False)
    monkeypatch.setattr(flash_attn, "flash_attn_supports_sinks", lambda: True, raising=False)
    return harness, harness._Ctx(tmp_path)


def _pick(level: str, pred, seed: int = 11, count: int = 900) -> fuzz.Batch:
    """The first batch of a CPU-sized run that is at ``level`` and satisfies ``pred``."""
    for b in fuzz.batches(seed, count, limits=CPU_LIMITS):
        if b.level == level and b.prefills and pred(b):
            return b
    raise AssertionError(f"no {level} batch with that property in {count}")


COVER = {
    "padded+junk": lambda b: b.shape.layout == "padded" and b.junk_table,
    "cross-layer": lambda b: b.shape.layout == "cross-layer" and b.layer > 0,
    "window": lambda b: b.window_left is not None and b.decodes,
    "softcap+sinks": lambda b: b.shape.sinks or b.softcap is not None,
    "exact-width": lambda b: b.table_slack == 0 and b.shape.qhead_per_kvhead >= 16,
}


@pytest.mark.parametrize("level", fuzz.LEVELS)
@pytest.mark.parametrize("what", list(COVER))
def test_harness_passes_correct_batches(cpu_harness, level, what):
    harness, ctx = cpu_harness
    batch = _pick(level, COVER[what])
    failure, stats = harness._attempt(batch, None, ctx)
    assert failure is None, f"{batch.describe()}: {failure}"
    assert stats["abs"] <= 0.5  # the reference route: the reference, rounded once
    assert "ratio" in stats and "fa3_abs" in stats  # the FA3 stand-in ran


def test_backend_builder_sees_the_padded_spec(cpu_harness, monkeypatch):
    from vllm_fa4.metadata import FA4MetadataBuilder

    harness, ctx = cpu_harness
    specs = []
    init = FA4MetadataBuilder.__init__

    def recording_init(self, kv_cache_spec, *args, **kwargs):
        specs.append(kv_cache_spec)
        init(self, kv_cache_spec, *args, **kwargs)

    monkeypatch.setattr(FA4MetadataBuilder, "__init__", recording_init)
    batch = _pick("backend", lambda b: b.shape.layout == "padded" and b.window_left is not None)
    failure, _ = harness._attempt(batch, None, ctx)
    assert failure is None, failure
    s = batch.shape
    page_bytes = (s.page_elems + s.block_pad) * 2
    assert specs and all(spec.page_size_padded == page_bytes for spec in specs)
    assert all(spec.sliding_window == batch.window_left + 1 for spec in specs)


def test_harness_catches_a_write_into_the_pad(cpu_harness, monkeypatch):
    """Ours writing one element past a page (the pad, or the next layer's page) is caught."""
    from vllm_fa4.paged_prefill import run as run_module

    harness, ctx = cpu_harness
    real = run_module.paged_attention_reference

    def scribbling(q, k_cache, *args, **kwargs):
        page_end = k_cache.storage_offset() + k_cache.shape[1] * k_cache.stride(1)
        k_cache.as_strided((1,), (1,), page_end).fill_(0.0)  # block 0's pad / next layer
        return real(q, k_cache, *args, **kwargs)

    monkeypatch.setattr(run_module, "paged_attention_reference", scribbling)
    for layout in ("padded", "cross-layer"):
        batch = _pick("prefill", lambda b, layout=layout: b.shape.layout == layout)
        failure, _ = harness._attempt(batch, None, ctx)
        assert failure is not None and failure.tag == "inputs", (layout, failure)


def test_harness_catches_an_ignored_window(cpu_harness, monkeypatch):
    from vllm_fa4.paged_prefill import run as run_module

    harness, ctx = cpu_harness
    real = run_module.paged_attention_reference

    def windowless(*args, **kwargs):
        return real(*args, **{**kwargs, "window_left": None})

    monkeypatch.setattr(run_module, "paged_attention_reference", windowless)
    batch = _pick("prefill", lambda b: b.window_left == 0 and max(k for _, k in b.prefills) > 1)
    failure, _ = harness._attempt(batch, None, ctx)
    assert failure is not None and failure.tag == "abs", failure


def test_absolute_bound_alone_where_fa3_refuses(cpu_harness, monkeypatch):
    """FA3 refusing the inputs leaves the absolute bound, which still catches a row 5 % off."""
    from vllm_fa4.paged_prefill import run as run_module
    from vllm_fa4.testing.cases import PagedCase

    harness, ctx = cpu_harness

    def refusing(self, *args, **kwargs):
        raise RuntimeError("We only support query heads <= 64 with S aux")

    monkeypatch.setattr(PagedCase, "fa3", refusing)
    batch = _pick("prefill", lambda b: b.shape.layout == "contiguous")
    failure, stats = harness._attempt(batch, None, ctx)
    assert failure is None and stats["fa3_refused"] and "ratio" not in stats

    real = run_module.paged_attention_reference

    def one_row_off(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        out[0] *= 1.05
        return out, lse

    monkeypatch.setattr(run_module, "paged_attention_reference", one_row_off)
    failure, _ = harness._attempt(batch, None, ctx)
    assert failure is not None and failure.tag == "abs" and "FA3 cannot run" in str(failure)


def _fp8_batch(harness, monkeypatch, level: str) -> fuzz.Batch:
    """A CPU-sized batch on an FP8 cache: the pool offers FP8 where the kernel's switch
    (route.kernel_reads_fp8, as the harness imported it) is on."""
    monkeypatch.setattr(harness, "kernel_reads_fp8", lambda key: True)
    for b in fuzz.batches(11, 900, harness._accepts(None), limits=CPU_LIMITS):
        if b.level == level and b.prefills and b.shape.kv_dtype == fuzz.FP8_KV:
            return b
    raise AssertionError(f"no {level} batch on an FP8 cache")


def test_harness_runs_fp8_cache_batches(cpu_harness, monkeypatch):
    """Prefill level: the case's e4m3 cache and scales reach run_prefill, the reference and
    the FA3 stand-in (on the dequantized cache, in the model's dtype)."""
    harness, ctx = cpu_harness
    batch = _fp8_batch(harness, monkeypatch, "prefill")
    failure, stats = harness._attempt(batch, None, ctx)
    assert failure is None, f"{batch.describe()}: {failure}"
    assert stats["abs"] <= 0.5 and "ratio" in stats


def test_harness_catches_a_dropped_fp8_scale(cpu_harness, monkeypatch):
    from vllm_fa4.paged_prefill import run as run_module

    harness, ctx = cpu_harness
    real = run_module.paged_attention_reference

    def unscaled_v(*args, **kwargs):
        return real(*args, **{**kwargs, "v_scale": 1.0})

    monkeypatch.setattr(run_module, "paged_attention_reference", unscaled_v)
    failure, _ = harness._attempt(_fp8_batch(harness, monkeypatch, "prefill"), None, ctx)
    assert failure is not None and failure.tag == "abs", failure


def test_fp8_pool_without_the_kernel_is_the_16_bit_pool(harness, monkeypatch):
    """Switch off (the harness's filter declines FP8): the run is the one FP8 is never drawn
    in, the run before FP8 existed."""
    monkeypatch.setattr(harness, "kernel_reads_fp8", lambda key: False)
    accept = harness._accepts(None)
    shapes = fuzz.run_shapes(11, 900, accept)
    assert all(s.kv_dtype is None for s in shapes)
    monkeypatch.setattr(fuzz, "FP8_KV_ONE_IN", 10**9)
    assert shapes == fuzz.run_shapes(11, 900, accept)


def test_each_worker_keeps_a_share_of_the_gpu_cached(harness):
    """Eight workers each keeping 24 GB cached overfill a 141 GB H200 (seed 91 ran two batches
    out of memory that way); the share shrinks with the worker count, capped at 24 GB."""
    h200 = 141 << 30
    assert harness._kept_cache_bytes(h200, 1) == 24 << 30
    assert harness._kept_cache_bytes(h200, 8) * 8 <= h200 // 2
    assert harness._kept_cache_bytes(h200, 0) == 24 << 30


def test_only_an_out_of_memory_exception_is_retried(harness):
    oom = harness.FuzzFailure("exception", "OutOfMemoryError: CUDA out of memory. Tried ...")
    assert harness._out_of_memory(oom)
    assert not harness._out_of_memory(None)
    assert not harness._out_of_memory(harness.FuzzFailure("exception", "RuntimeError: boom"))
    # a wrong output mentioning memory is a finding, never retried
    assert not harness._out_of_memory(harness.FuzzFailure("max_error", "OutOfMemoryError"))
