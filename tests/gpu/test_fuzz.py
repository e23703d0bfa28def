"""Fuzz suite: random vLLM-shaped batches through FA4, against the fp32 reference and FA3.

Batches come from ``vllm_fa4.testing.fuzz`` (decodes first, then prefills; q_len 0 to 8k,
skewed; cached prefixes up to 64k and a few contexts to 128k; 1 to 64 requests;
speculative-decode thresholds; CUDA-graph padding; random dtype, head dim, GQA group up to 128,
1 to 16 KV heads, page size; sliding window, soft cap and sinks) on vLLM's packed cache with
permuted pages, the null block 0 and NaN in every unused slot, in a contiguous, padded
(``page_size_padded``) or cross-layer layout whose pads and other layers are NaN too; block
tables exactly as wide as needed or wider, unused entries the null block or junk ids; q is a
strided view of a qkv buffer. Two levels: ``plan_prefill`` + ``run_prefill`` (prefill rows
only), and the whole backend (vLLM's cache write, ``FA4MetadataBuilder.build`` from the
layer's cache spec, ``FA4AttentionImpl.forward``).

Pass rule per batch: no NaN/Inf in any row of the call (each was NaN before it); where FA3
(vLLM's ``flash_attn_varlen_func`` with the block table and the same window, cap and sinks)
runs, max and mean error against the fp32 reference <= 2x FA3's on the same inputs (plus an
fp32-rounding floor); always, every row we compute within the absolute bound
(``testing.checks.ABS_ERROR_C`` x eps x the row's max |ref|: it holds where FA3 is itself off
or cannot run, which the summary counts); rows outside the call and every input (the whole
cache buffer: pads, other layers) bit-for-bit unchanged; a rerun bit-identical; lse (when
asked) as the reference's. A failing batch is shrunk (requests dropped, lengths halved while
it still fails) and printed with its seed and a one-batch replay command.

    VLLM_FA4_FUZZ_COUNT   batches per kernel config (default 300: 200 prefill-level, 100 backend)
    VLLM_FA4_FUZZ_SEED    base seed (default 0)
    VLLM_FA4_FUZZ_REPLAY  one batch's JSON (from a failure report): run only that batch
    VLLM_FA4_TEST_VARIANTS  kernel configs to run (testing.variants), as the other GPU tests

    pytest tests/gpu/test_fuzz.py -q                          # ~2-3 min on one H100
    VLLM_FA4_FUZZ_COUNT=10000 VLLM_FA4_FUZZ_SEED=7 pytest tests/gpu/test_fuzz.py -q -x
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time

import pytest
import torch
from helpers.vllm_layers import register_layer

from vllm_fa4 import envs
from vllm_fa4.kernels.config import KernelKey
from vllm_fa4.paged_prefill.policy import serving_configs
from vllm_fa4.paged_prefill.route import kernel_reads_fp8
from vllm_fa4.testing import fuzz
from vllm_fa4.testing.variants import config_id, sweep_configs

pytestmark = pytest.mark.gpu

CONFIGS = sweep_configs()
MAX_SHRUNK_FAILURES = 3  # failures per session that get shrunk (each costs up to ~1 min)
SHRINK_TRIES = 80
SHRINK_DEADLINE_S = 90.0
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICE = "cuda"  # "cpu" with ROUTE "reference" checks the harness itself (FA3 stubbed out;
ROUTE = "kernel"  # tests/unit/test_fuzz_harness.py); a missing kernel is an error, never the
_NAN = float("nan")  # fp32 reference


def _accepts(config):
    """Shapes every config of the variant can build (None: each key's serving defaults)."""

    def accept(shape: fuzz.Shape) -> bool:
        key = _key(shape)
        if key.fp8_kv and not kernel_reads_fp8(key):  # FP8 caches where the kernel reads them
            return False
        configs = serving_configs(key, config).all
        return key.unsupported_reason() is None and all(
            c.unsupported_reason(key) is None for c in configs
        )

    return accept


def _key(shape: fuzz.Shape) -> KernelKey:
    return KernelKey.for_layer(
        shape.dtype,
        shape.head_dim,
        shape.page_size,
        shape.num_q_heads,
        shape.num_kv_heads,
        sliding_window=shape.window,
        softcap=shape.softcap,
        sinks=shape.sinks,
        kv_dtype=shape.kv_dtype,
    )


def _make_case(b: fuzz.Batch, specs):
    """The batch's paged case: its shape, features, cache layout and block table (junk ids
    past the cache at the prefill level only: at the backend level FA3 reads the table for
    FA4's decode rows, and vLLM's stale entries are in range)."""
    from vllm_fa4.testing.cases import make_paged_case

    s = b.shape
    return make_paged_case(
        specs,
        s.num_q_heads,
        s.num_kv_heads,
        s.head_dim,
        s.page_size,
        _DTYPES[s.dtype],
        DEVICE,
        seed=b.seed,
        window_left=b.window_left,
        softcap=b.softcap,
        sinks=s.sinks,
        block_pad=s.block_pad,
        layers=s.layers,
        layer=b.layer,
        table_slack=b.table_slack,
        junk_table=b.junk_table,
        junk_past_cache=b.level == "prefill",
        fp8_kv=s.kv_dtype is not None,
    )


def _params():
    replay = envs.fuzz_replay()
    params = []
    for config in CONFIGS:
        if replay:
            batches = [fuzz.Batch.from_json(replay)]
        else:
            batches = fuzz.batches(envs.fuzz_seed(), envs.fuzz_count(), _accepts(config))
        for b in batches:
            name = "replay" if replay else str(b.index)
            params.append(pytest.param(config, b, id=f"{config_id(config)}-{b.level}-{name}"))
    return params


class FuzzFailure(AssertionError):
    def __init__(self, tag: str, message: str):
        super().__init__(f"[{tag}] {message}")
        self.tag = tag


# ---------------------------------------------------------------------------------------------
# checks shared by both levels


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A view that compares NaN payloads bit for bit."""
    return t.view(
        {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    )


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype.is_floating_point:
        return torch.equal(_bits(a.contiguous()), _bits(b.contiguous()))
    return torch.equal(a, b)


def _check_unchanged(snapshots: dict, live: dict, what: str) -> None:
    changed = [name for name, t in live.items() if not _same_bits(snapshots[name], t)]
    if changed:
        raise FuzzFailure("inputs", f"{what} changed: {', '.join(changed)}")


def _check_rows_untouched(out_all, guard, start, stop) -> None:
    for lo, hi in ((0, start), (stop, out_all.shape[0])):
        if hi > lo and not _same_bits(out_all[lo:hi], guard[lo:hi]):
            diff = (_bits(out_all[lo:hi]) != _bits(guard[lo:hi])).flatten(1).any(1)
            row = lo + int(diff.nonzero()[0])
            raise FuzzFailure(
                "untouched", f"row {row} outside the call's rows [{start}, {stop}) was written"
            )


def _request_of(row: int, cu: list[int]) -> int:
    for i in range(len(cu) - 1):
        if cu[i] <= row < cu[i + 1]:
            return i
    return -1


def _compare(ours, fa3, ref, dtype, cu: list[int], rows=None, ours_rows=None, softcap=False):
    """The error rule; returns the batch's stats.

    Where FA3 ran (``fa3`` not None): max and mean error of ``ours`` within 2x FA3's (fp32
    reference) plus a rounding floor, over the rows FA3 left finite (and ``rows``). Always:
    every row of ``ours_rows`` (default ``rows``; a bool mask over tokens, default all) within
    the absolute bound (``checks.ABS_ERROR_C``). FA3's own absolute score is recorded, never
    asserted.
    """
    from vllm_fa4.testing.checks import ABS_ERROR_C, assert_rows_within_absolute_bound

    ours_rows = rows if ours_rows is None else ours_rows
    stats = {}
    if fa3 is not None:
        keep = torch.isfinite(fa3.float()).flatten(1).all(1)  # FA3 ran on a NaN-free cache
        if rows is not None:
            keep &= rows
        stats["fa3_abs"] = assert_rows_within_absolute_bound(
            fa3, ref, dtype, softcap=softcap, rows=keep, raise_on_failure=False
        ).worst_score
    own = assert_rows_within_absolute_bound(
        ours, ref, dtype, softcap=softcap, rows=ours_rows, raise_on_failure=False
    )
    stats["abs"] = own.worst_score
    if not own.worst_score <= ABS_ERROR_C:
        token, head = own.worst_row
        yardstick = "FA3 cannot run" if fa3 is None else f"FA3's worst score {stats['fa3_abs']:.2f}"
        raise FuzzFailure(
            "abs",
            f"row {token} (request {_request_of(token, cu)}), head {head}: max error "
            f"{own.max_err:.3e} > {ABS_ERROR_C} x eps x the row's max |ref| "
            f"{own.row_max_ref:.3e} (score {own.worst_score:.2f}; {yardstick})",
        )
    if fa3 is None:
        stats["fa3_refused"] = True
        return stats
    idx = keep.nonzero().flatten()
    o, f, r = ours[idx].float(), fa3[idx].float(), ref[idx].float()
    if o.numel() == 0:
        return {**stats, "ratio": 0.0}
    if not torch.isfinite(r).all():
        raise FuzzFailure("harness", "the fp32 reference is not finite: the test case is broken")
    e_o, e_f = (o - r).abs(), (f - r).abs()
    rounding = ((r + 0.3) - 0.3 - r).abs()
    # fp32 rounding of the reference, plus a quarter of a 16-bit rounding step: where FA3 is
    # exact (every row sees one key) ours may not be off by more than that.
    slack = torch.finfo(dtype).eps / 8
    floor_max = 2 * float(rounding.max()) + slack * float(r.abs().max())
    floor_mean = 2 * float(rounding.mean()) + slack * float(r.abs().mean())
    max_o, max_f = float(e_o.max()), float(e_f.max())
    mean_o, mean_f = float(e_o.mean()), float(e_f.mean())
    stats.update(ratio=max_o / max(max_f, 1e-30), max=max_o, fa3_max=max_f)
    if max_o > 2 * max_f + floor_max:
        row = int(idx[int(e_o.argmax()) // (o.shape[1] * o.shape[2])])
        raise FuzzFailure(
            "error",
            f"max error {max_o:.3e} > 2 x FA3's {max_f:.3e} + floor {floor_max:.1e} "
            f"(worst at row {row}, request {_request_of(row, cu)}; mean {mean_o:.3e} vs FA3 "
            f"{mean_f:.3e})",
        )
    if mean_o > 2 * mean_f + floor_mean:
        raise FuzzFailure(
            "error",
            f"mean error {mean_o:.3e} > 2 x FA3's {mean_f:.3e} + floor {floor_mean:.1e} "
            f"(max {max_o:.3e} vs FA3 {max_f:.3e})",
        )
    return stats


def _check_finite(out, start: int, cu: list[int], what: str, allowed=None) -> torch.Tensor:
    """Rows of ``out`` holding NaN/Inf; raises unless ``allowed`` (a row mask) covers them."""
    bad = ~torch.isfinite(out.float()).flatten(1).all(1)
    bad_unallowed = bad if allowed is None else bad & ~allowed
    if bool(bad_unallowed.any()):
        row = int(bad_unallowed.nonzero()[0])
        raise FuzzFailure(
            "nan",
            f"{int(bad_unallowed.sum())} {what} rows hold NaN/Inf (unwritten or overflow); first: "
            f"row {start + row}, request {_request_of(row, cu)}",
        )
    return bad


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _fa3_refused(e: Exception) -> bool:
    """FA3 turned the inputs down (an argument check), as opposed to crashing."""
    text = str(e)
    return isinstance(e, (RuntimeError, ValueError, AssertionError, NotImplementedError)) and not (
        "CUDA error" in text or "illegal" in text
    )


def _fa3(q, k_cache, v_cache, case):
    """FA3 on the case, or None where it refuses the inputs (the absolute bound alone then)."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    try:
        return case.fa3(out, q, k_cache, v_cache, page_table=case.table_within_cache())
    except Exception as e:  # noqa: BLE001 - FA3's own refusal is not ours
        if _fa3_refused(e):
            return None
        raise


# ---------------------------------------------------------------------------------------------
# level 1: plan_prefill + run_prefill


def _run_prefill_level(b: fuzz.Batch, config, ctx) -> dict:
    from vllm_fa4.paged_prefill import run_prefill
    from vllm_fa4.testing.cases import q_as_read_by
    from vllm_fa4.testing.checks import assert_lse_close

    if not b.prefills:
        return {}
    s, dtype = b.shape, _DTYPES[b.shape.dtype]
    hq, hkv, d = s.num_q_heads, s.num_kv_heads, s.head_dim
    case = _make_case(b, b.prefills)
    n, start = case.num_tokens, b.num_decode_tokens
    stop, rows = start + n, start + n + b.pad_rows
    gen = torch.Generator(device=DEVICE).manual_seed(b.seed + 7)
    # q: the call's rows of a wider qkv buffer whose other rows belong to the decodes/padding.
    qkv = torch.randn(rows, (hq + 2 * hkv) * d, generator=gen, device=DEVICE).to(dtype)
    qkv[start:stop, : hq * d] = case.q.reshape(n, hq * d)
    q = qkv[:, : hq * d].view(rows, hq, d)[start:stop]
    out_all = torch.randn(rows, hq, d, generator=gen, device=DEVICE).to(dtype)
    out_all[start:stop] = _NAN
    guard = out_all.clone()
    lse = torch.full((hq, n), _NAN, device=DEVICE) if b.with_lse else None
    plan = case.plan(config)
    live = {
        "qkv": qkv,
        "kv_cache": case.kv_buffer,  # the whole buffer: pads and other layers too
        "cu_seqlens_q": plan.args.cu_seqlens_q,
        "seqused_k": plan.args.seqused_k,
        "page_table": plan.args.page_table,
        "work_tiles": plan.args.work_tiles,
    }
    snap = {name: t.clone() for name, t in live.items()}

    def call(out, lse_out):
        run_prefill(
            plan,
            q,
            case.k_cache,
            case.v_cache,
            out,
            softmax_scale=case.softmax_scale,
            lse=lse_out,
            softcap=case.softcap,
            sinks=case.sinks,
            **case.kv_scales,
        )
        _sync()

    call(out_all[start:stop], lse)
    out = out_all[start:stop]
    cu = [int(x) for x in case.query_start_loc_cpu.tolist()]
    _check_rows_untouched(out_all, guard, start, stop)
    _check_unchanged(snap, live, "inputs of run_prefill")
    _check_finite(out, start, cu, "output")
    if lse is not None and bool(torch.isnan(lse).any()):
        raise FuzzFailure("nan", f"lse has {int(torch.isnan(lse).sum())} unwritten (NaN) entries")

    out2 = torch.full_like(out, _NAN)
    lse2 = torch.full_like(lse, _NAN) if lse is not None else None
    call(out2, lse2)
    if not _same_bits(out, out2) or (lse is not None and not _same_bits(lse, lse2)):
        raise FuzzFailure("rerun", "a second run_prefill on the same inputs differs bitwise")
    if n == 0:
        return {}

    # FA3 on the same valid data: it reads unused slots (flash-attention #2374), so they are 0;
    # the same layout (a view of a copy of the whole buffer). An FP8 cache: FA3 (16-bit) on its
    # dequantized values in the model's dtype (exact: e4m3 times a 4-bit scale), i.e. 16-bit
    # attention on the FP8 cache, what our kernel computes.
    if case.fp8_kv:
        kv_clean = case.kv_view(torch.zeros(snap["kv_cache"].shape, dtype=dtype, device=DEVICE))
        kv_clean.copy_(case.dequantized_kv_cache().nan_to_num_(0.0))
    else:
        kv_clean = case.kv_view(snap["kv_cache"].nan_to_num_(0.0))
    # `fp8_qk_rounded` (opt-in) rounds Q to e4m3 by design: FA3 and the reference read that Q
    q_ref = q_as_read_by(config, case, q)
    fa3 = _fa3(q_ref, kv_clean[..., :d], kv_clean[..., d:], case)
    ref, ref_lse = case.reference(q_ref)
    stats = _compare(out, fa3, ref, dtype, cu, softcap=b.softcap is not None)
    if lse is not None:
        try:
            assert_lse_close(lse, ref_lse)
        except AssertionError as e:
            raise FuzzFailure("lse", str(e)) from None
    return stats


# ---------------------------------------------------------------------------------------------
# level 2: the backend (vLLM's cache write, builder, impl)


class _Layer(torch.nn.Module):
    """The attributes FlashAttentionImpl reads from the attention layer (unit scales)."""

    def __init__(self):
        super().__init__()
        for name in ("_q_scale", "_k_scale", "_v_scale"):
            setattr(self, name, torch.ones((), dtype=torch.float32, device=DEVICE))
        self._q_scale_float = self._k_scale_float = self._v_scale_float = 1.0


class _Ctx:
    """vLLM configs per (shape, speculative tokens), built once per session."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.configs: dict = {}

    def vllm_config(self, shape: fuzz.Shape, spec_tokens: int):
        key = (shape, spec_tokens)
        if key not in self.configs:
            from helpers.vllm_configs import shaped_vllm_config

            self.configs[key] = shaped_vllm_config(
                self.tmp,
                shape.num_q_heads,
                shape.num_kv_heads,
                shape.head_dim,
                shape.page_size,
                device=DEVICE,
                dtype=shape.dtype,
                num_speculative_tokens=spec_tokens or None,
            )
        return self.configs[key]


def _cache_spec(case):
    """The layer's KV cache spec as vLLM makes it: a sliding-window spec for a windowed layer,
    ``page_size_padded`` (bytes) for a padded layout (a cross-layer layout keeps the layer's
    own unpadded spec: the block stride comes from the shared allocation)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    shape = dict(
        block_size=case.page_size,
        num_kv_heads=case.num_kv_heads,
        head_size=case.head_dim,
        dtype=case.dtype,
        page_size_padded=case.page_size_padded,
    )
    if case.window_left is None:
        return FullAttentionSpec(**shape)
    return SlidingWindowSpec(**shape, sliding_window=case.window_left + 1)  # vLLM's spelling


def _run_backend(backend_cls, vllm_config, case, cm, q, k, v, kv_cache, slot_mapping, out):
    """builder.build + do_kv_cache_update + forward on ``kv_cache`` (physical NHD view, updated
    in place), the case's window / cap / sinks as the impl's arguments. Returns (builder,
    impl, layer, metadata)."""
    window = None if case.window_left is None else case.window_left + 1
    # vLLM hands the impl the layer's sinks parameter, in the model dtype (bf16: fuzz.Shape)
    sinks = None if case.sinks is None else case.sinks.to(case.dtype)
    impl = backend_cls.get_impl_cls()(
        case.num_q_heads,
        case.head_dim,
        case.softmax_scale,
        case.num_kv_heads,
        None,
        window,
        "auto",
        logits_soft_cap=case.softcap,
        sinks=sinks,
    )
    register_layer(vllm_config, "layer.0", impl)
    builder = backend_cls.get_builder_cls()(
        _cache_spec(case), ["layer.0"], vllm_config, torch.device(DEVICE)
    )
    layer = _Layer()
    md = builder.build(0, cm)
    kv_vllm = kv_cache.transpose(1, 2)  # vLLM's logical (blocks, Hkv, page, 2D) view
    impl.do_kv_cache_update(layer, k, v, kv_vllm, slot_mapping)
    impl.forward(layer, q, k, v, kv_vllm, md, out)
    _sync()
    return builder, impl, layer, md


def _flash_attn(vllm_config, case, cm, q, k, v, buffer, slot_mapping, out):
    """FLASH_ATTN's backend on the batch (cache: a view of ``buffer``); False where it refuses
    the inputs."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

    try:
        kv = case.kv_view(buffer)
        _run_backend(FlashAttentionBackend, vllm_config, case, cm, q, k, v, kv, slot_mapping, out)
    except Exception as e:  # noqa: BLE001 - FA3's own refusal is not ours
        if _fa3_refused(e):
            return False
        raise
    return True


def _cpu_copies_this_vllm_has(**copies) -> dict:
    """The CPU copies vLLM 0.26's runner sets on CommonAttentionMetadata (gone in 0.33)."""
    import dataclasses

    from vllm.v1.attention.backend import CommonAttentionMetadata

    names = {f.name for f in dataclasses.fields(CommonAttentionMetadata)}
    return {name: value for name, value in copies.items() if name in names}


def _run_backend_level(b: fuzz.Batch, config, ctx) -> dict:
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backend import CommonAttentionMetadata

    from vllm_fa4.backend import FA4AttentionBackend

    s, dtype = b.shape, _DTYPES[b.shape.dtype]
    if s.kv_dtype is not None:
        pytest.skip("the backend level on an FP8 cache: tests/gpu/test_fp8.py (not fuzzed yet)")
    hq, hkv, d = s.num_q_heads, s.num_kv_heads, s.head_dim
    reqs = b.requests
    case = _make_case(b, reqs)
    n, rows = case.num_tokens, case.num_tokens + b.pad_rows
    # The new tokens' K/V come in with q, as views of one qkv buffer (vLLM's split of the QKV
    # projection); their cache slots start as NaN so a missing cache write shows.
    new_slots = case.slot_index(case.slot_mapping)
    new_kv = case.kv_cache[new_slots].clone()
    case.kv_cache[new_slots] = _NAN
    gen = torch.Generator(device=DEVICE).manual_seed(b.seed + 7)
    qkv = torch.randn(rows, (hq + 2 * hkv) * d, generator=gen, device=DEVICE).to(dtype)
    qkv[:n, : hq * d] = case.q.reshape(n, hq * d)
    qkv[:n, hq * d : (hq + hkv) * d] = new_kv[..., :d].reshape(n, hkv * d)
    qkv[:n, (hq + hkv) * d :] = new_kv[..., d:].reshape(n, hkv * d)
    q = qkv[:, : hq * d].view(rows, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].view(rows, hkv, d)
    v = qkv[:, (hq + hkv) * d :].view(rows, hkv, d)
    pad_slots = torch.full((b.pad_rows,), -1, dtype=torch.int64, device=DEVICE)
    slot_mapping = torch.cat([case.slot_mapping, pad_slots])  # padded tokens: slot -1
    qsl = case.query_start_loc_cpu
    q_lens = [q_len for q_len, _ in reqs]
    cm = CommonAttentionMetadata(
        query_start_loc=case.cu_seqlens_q,
        query_start_loc_cpu=qsl,
        seq_lens=case.seqused_k,
        num_reqs=len(reqs),
        # piecewise graphs: the actual tokens; full-graph padding (pad_reqs): padded count
        num_actual_tokens=rows if b.pad_reqs else n,
        max_query_len=max(q_lens),
        max_seq_len=int(case.seq_lens_cpu.max()),
        block_table_tensor=case.block_table,
        slot_mapping=slot_mapping,
        causal=True,
        seq_lens_cpu_upper_bound=case.seq_lens_cpu,
        **_cpu_copies_this_vllm_has(
            _seq_lens_cpu=case.seq_lens_cpu,
            _num_computed_tokens_cpu=case.seq_lens_cpu - torch.tensor(q_lens, dtype=torch.int32),
        ),
    )
    vllm_config = ctx.vllm_config(s, b.spec_tokens)
    cu = [int(x) for x in qsl.tolist()]
    nd = b.num_decode_tokens

    def new_out():
        out = torch.randn(rows, hq, d, generator=gen, device=DEVICE).to(dtype)
        out[:n] = _NAN
        return out

    with set_current_vllm_config(vllm_config):
        live = {
            "qkv": qkv,
            "query_start_loc": cm.query_start_loc,
            "query_start_loc_cpu": qsl,
            "seq_lens": cm.seq_lens,
            "seq_lens_cpu": case.seq_lens_cpu,
            "block_table": cm.block_table_tensor,
            "slot_mapping": slot_mapping,
        }
        snap = {name: t.clone() for name, t in live.items()}
        kv_buffer = case.kv_buffer.clone()  # the cache forward runs on: same layout
        kv = case.kv_view(kv_buffer)
        out = new_out()
        guard = out.clone()
        builder, impl, layer, md = _run_backend(
            FA4AttentionBackend, vllm_config, case, cm, q, k, v, kv, slot_mapping, out
        )
        # Zero-length padding requests count as decodes when no prefill precedes them.
        decodes = len(b.decodes) + (0 if b.prefills else b.pad_reqs)
        if md.num_decodes != decodes or (md.prefill is not None) != bool(b.prefills):
            raise FuzzFailure(
                "split",
                f"builder split {md.num_decodes} decodes / prefill plan "
                f"{md.prefill is not None}; expected {decodes} decodes and "
                f"{len(b.prefills)} prefills (threshold {b.decode_threshold})",
            )
        if b.prefills or not b.pad_reqs:  # else FA3 takes it whole, padded rows as actual
            _check_rows_untouched(out, guard, 0, n)
        _check_unchanged(snap, live, "inputs of build/forward")
        # The cache must hold exactly what vLLM's write put there: the poisoned slots filled,
        # the rest of the buffer (pads, other layers) untouched.
        expected_buffer = case.kv_buffer.clone()
        case.kv_view(expected_buffer)[new_slots] = new_kv
        if not _same_bits(kv_buffer, expected_buffer):
            raise FuzzFailure("inputs", "KV cache differs from the state vLLM's cache write left")

        # Rerun: a fresh build on the same batch and forward on the same cache.
        out2 = new_out()
        md2 = builder.build(0, cm)
        impl.forward(layer, q, k, v, kv.transpose(1, 2), md2, out2)
        _sync()
        if not _same_bits(out[:n], out2[:n]):
            raise FuzzFailure("rerun", "a second build + forward on the same batch differs bitwise")
        del out2, md2

        # FLASH_ATTN on the same batch: on the NaN-poisoned cache (its decode rows are what FA4
        # delegates) and on a NaN-free copy (the error baseline, flash-attention #2374).
        args = (vllm_config, case, cm, q, k, v)
        fa3_nan = new_out()
        fa3_ran = _flash_attn(*args, case.kv_buffer.clone(), slot_mapping, fa3_nan)
        fa3 = new_out()
        fa3_ran = fa3_ran and _flash_attn(
            *args, case.kv_buffer.clone().nan_to_num_(0.0), slot_mapping, fa3
        )

    # Decode rows are FA3's: NaN there is tolerated only where FLASH_ATTN itself gives NaN on
    # the same poisoned cache. Prefill rows are ours and must all be finite.
    decode_rows = torch.zeros(n, dtype=torch.bool, device=DEVICE)
    decode_rows[:nd] = True
    fa3_nan_rows = (
        ~torch.isfinite(fa3_nan[:n].float()).flatten(1).all(1) if fa3_ran else ~decode_rows
    )
    bad = _check_finite(out[:n], 0, cu, "output", allowed=fa3_nan_rows & decode_rows)
    case.kv_cache[new_slots] = new_kv  # the reference reads the written cache
    ref, _ = case.reference()
    stats = _compare(
        out[:n],
        fa3[:n] if fa3_ran else None,
        ref,
        dtype,
        cu,
        rows=~bad,
        ours_rows=~bad & ~decode_rows,  # the decode rows are FA3's (FA4 delegates them)
        softcap=b.softcap is not None,
    )
    stats["fa3_nan_decode_rows"] = int(bad.sum())
    return stats


# ---------------------------------------------------------------------------------------------
# driver


@contextlib.contextmanager
def _env(**values):
    old = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_CONTEXT_LOST = "CUDA context lost"
# Waits (s) before a batch that ran out of GPU memory runs again: beside other pytest-xdist
# workers, whose batches end and free theirs. One that still runs out is a failure.
_OOM_RETRY_WAITS_S = (2.0, 8.0)


def _kept_cache_bytes(total_bytes: int, workers: int) -> int:
    """Memory a worker may keep cached (freed tensors' blocks) between batches: a share of the
    GPU per pytest-xdist worker. A fixed 24 GB let eight workers on one H200 (141 GB) run two
    batches of seed 91 out of memory (2026-11-28, session 25)."""
    return min(24 << 30, total_bytes // (2 * max(workers, 1)))


def _out_of_memory(failure: FuzzFailure | None) -> bool:
    return failure is not None and failure.tag == "exception" and "OutOfMemoryError" in str(failure)


_state = {"shrunk": 0, "dead": None}
_stats: list[dict] = []


def _attempt(b: fuzz.Batch, config, ctx) -> tuple[FuzzFailure | None, dict]:
    """Run one batch; a failure (or any exception, as tag ``exception``) is returned."""
    runner = _run_prefill_level if b.level == "prefill" else _run_backend_level
    with _env(
        **{
            envs.PREFILL_ROUTE: ROUTE,
            envs.VARIANT: None if config is None else config.spec,  # the builder's config
        }
    ):
        try:
            return None, runner(b, config, ctx)
        except FuzzFailure as e:
            return e, {}
        except Exception as e:  # noqa: BLE001 - any crash is a finding, shrunk like the rest
            text = f"{type(e).__name__}: {e}"
            tag = _CONTEXT_LOST if ("CUDA error" in text or "illegal" in text) else "exception"
            return FuzzFailure(tag, text), {}


def _replay_command(b: fuzz.Batch, config) -> str:
    variants = config_id(config)
    return (
        f"VLLM_FA4_TEST_VARIANTS={shlex.quote(variants)} "
        f"VLLM_FA4_FUZZ_REPLAY={shlex.quote(b.to_json())} pytest tests/gpu/test_fuzz.py -q"
    )


@pytest.fixture(scope="module")
def fuzz_ctx(tmp_path_factory, request):
    import vllm_fa4

    vllm_fa4.register()
    ctx = _Ctx(tmp_path_factory.mktemp("fuzz-models"))
    yield ctx
    if not _stats:
        return
    ratios = [st for st in _stats if "ratio" in st]
    worst = max(ratios, key=lambda st: st["ratio"], default=None)
    nan_rows = sum(st.get("fa3_nan_decode_rows", 0) for st in _stats)
    by_level = {lvl: [st for st in _stats if st["level"] == lvl] for lvl in fuzz.LEVELS}
    line = (
        f"fuzz: seed {envs.fuzz_seed()}, {len(_stats)} batches ("
        + ", ".join(
            f"{lvl} {len(v)} in {sum(st['seconds'] for st in v):.0f} s"
            for lvl, v in by_level.items()
        )
        + ")"
    )
    if worst is not None:
        line += f"; worst max-error ratio ours/FA3 {worst['ratio']:.2f} (batch {worst['id']})"
    scored = [st for st in _stats if "abs" in st]
    if scored:
        from vllm_fa4.testing.checks import ABS_ERROR_C

        ours_abs = max(scored, key=lambda st: st["abs"])
        line += (
            f"; worst absolute score ours {ours_abs['abs']:.2f} (batch {ours_abs['id']}, "
            f"bound {ABS_ERROR_C})"
        )
        fa3_scores = [st["fa3_abs"] for st in scored if "fa3_abs" in st]
        if fa3_scores:
            over = sum(score > ABS_ERROR_C for score in fa3_scores)
            line += f", FA3 {max(fa3_scores):.2f} ({over} batches over the bound)"
        refused = sum(1 for st in scored if st.get("fa3_refused"))
        if refused:
            line += f"; {refused} batches FA3 refused (absolute bound alone)"
    if nan_rows:
        line += f"; {nan_rows} decode rows NaN in FA3 itself (tolerated, flash-attention #2374)"
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


@pytest.mark.parametrize("config,batch", _params())
def test_fuzz(config, batch, fuzz_ctx, request):
    if _state["dead"] is not None:
        pytest.skip(f"{_CONTEXT_LOST} at {_state['dead']}; replay that batch in a fresh process")
    if batch.level == "prefill" and not batch.prefills:
        # Nothing reaches the kernel or FA3; such a batch used to count as passed (260 of
        # 8,000 in one run of 2026-11-27 that could not import the kernel at all).
        pytest.skip("a prefill-level batch without prefill requests: nothing to run")
    started = time.perf_counter()
    failure, stats = _attempt(batch, config, fuzz_ctx)
    retries = 0
    for wait in _OOM_RETRY_WAITS_S:
        if not _out_of_memory(failure):
            break
        torch.cuda.empty_cache()
        time.sleep(wait)
        retries += 1
        failure, stats = _attempt(batch, config, fuzz_ctx)
    stats.update(
        level=batch.level,
        seconds=time.perf_counter() - started,
        id=request.node.callspec.id,
        oom_retries=retries,
    )
    _stats.append(stats)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if DEVICE == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        if torch.cuda.memory_reserved() > _kept_cache_bytes(total, workers):
            torch.cuda.empty_cache()
    if failure is None:
        return

    seed, count = envs.fuzz_seed(), envs.fuzz_count()
    lines = [
        f"fuzz batch {request.node.callspec.id} failed: {failure}",
        f"  seed {seed}, count {count}, kernel config {config_id(config)}",
        f"  batch: {batch.describe()}",
    ]
    if _out_of_memory(failure):
        lines.append(
            f"  (out of GPU memory after {retries} retries beside {workers} pytest workers: "
            "replay it alone, or run with fewer -n)"
        )
    shrunk = batch
    if failure.tag == _CONTEXT_LOST:
        _state["dead"] = request.node.callspec.id
        lines.append("  (not shrunk: the CUDA context is gone; replay below in a fresh process)")
    elif _state["shrunk"] < MAX_SHRUNK_FAILURES:
        _state["shrunk"] += 1

        def still_fails(c):
            f, _ = _attempt(c, config, fuzz_ctx)
            return f is not None and f.tag == failure.tag

        result = fuzz.shrink(
            batch, still_fails, max_tries=SHRINK_TRIES, deadline_s=SHRINK_DEADLINE_S
        )
        shrunk = result.batch
        again, _ = _attempt(shrunk, config, fuzz_ctx)
        lines += [
            f"  shrunk ({result.steps} steps, {result.tries} tries, {result.stopped}): "
            f"{shrunk.describe()}",
            f"  shrunk failure: {again}",
        ]
    else:
        lines.append(f"  (not shrunk: the first {MAX_SHRUNK_FAILURES} failures were)")
    lines.append(f"  replay: {_replay_command(shrunk, config)}")
    if shrunk is not batch:
        lines.append(f"  replay the original: {_replay_command(batch, config)}")
    pytest.fail("\n".join(lines), pytrace=False)
