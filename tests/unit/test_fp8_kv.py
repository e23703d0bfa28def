"""FP8 KV cache (issue 30) outside the kernel: the key's ``kv_dtype``, where it is named, and
what it changes (CPU)."""

from __future__ import annotations

import pytest
import torch

from vllm_fa4.kernels.config import FP8_E4M3, KernelKey
from vllm_fa4.testing.fake_kernels import RecordingCompiler, RecordingLoader

BF16_KEY = KernelKey("bfloat16", 128, 16, 4)
FP8_KEY = KernelKey("bfloat16", 128, 16, 4, kv_dtype=FP8_E4M3)


def test_key_kv_dtype_defaults_to_the_model_dtype():
    assert BF16_KEY.kv_dtype is None and not BF16_KEY.fp8_kv
    assert FP8_KEY.fp8_kv and FP8_KEY != BF16_KEY and hash(FP8_KEY) != hash(BF16_KEY)
    assert "kv_dtype='float8_e4m3fn'" in repr(FP8_KEY)


@pytest.mark.parametrize(
    "kv_dtype,expected",
    [
        (None, None),
        (torch.bfloat16, None),  # the model's own dtype is the plain cache
        ("bfloat16", None),
        (torch.float8_e4m3fn, FP8_E4M3),
        ("float8_e4m3fn", FP8_E4M3),
        (torch.float8_e5m2, "float8_e5m2"),  # kept, and refused by unsupported_reason
        (torch.float16, "float16"),
    ],
)
def test_for_layer_names_the_kv_dtype(kv_dtype, expected):
    key = KernelKey.for_layer(torch.bfloat16, 128, 16, 32, 8, kv_dtype=kv_dtype)
    assert key.kv_dtype == expected


def test_unsupported_reason_accepts_e4m3_only():
    assert FP8_KEY.unsupported_reason() is None
    for other in ("float8_e5m2", "float16", "int8", "uint8"):
        why = KernelKey("bfloat16", 128, 16, 4, kv_dtype=other).unsupported_reason()
        assert why is not None and other in why, why


def test_cache_entry_names_differ_for_fp8(tmp_path):
    from vllm_fa4.kernels.cache import KernelCache
    from vllm_fa4.kernels.config import DEFAULT_CONFIG

    cache = KernelCache(RecordingCompiler(tmp_path / "c.txt"), "fn", loader=RecordingLoader())
    cache._fingerprint = "fixed"  # the names' other half: the same for both entries
    names = {cache.entry_name((key, DEFAULT_CONFIG, False)) for key in (BF16_KEY, FP8_KEY)}
    assert len(names) == 2


# ---- the reference route on an FP8 cache ------------------------------------------------------

SPECS = [(5, 40), (0, 7), (17, 17), (1, 130), (33, 100)]  # chunks after prefixes, q_len 0


def _fp8_case(page_size=16, dtype=torch.bfloat16, seed=3, **kw):
    from vllm_fa4.testing.cases import make_paged_case

    return make_paged_case(SPECS, 8, 2, 32, page_size, dtype, "cpu", seed=seed, fp8_kv=True, **kw)


def _naive_dequantized(case):
    """Dense float64 attention per request and head on the cache dequantized here, by hand:
    each key read through the block table slot by slot, times the case's scales."""
    hq, hkv, d = case.num_q_heads, case.num_kv_heads, case.head_dim
    out = torch.zeros(case.num_tokens, hq, d, dtype=torch.float64)
    cu = case.query_start_loc_cpu.tolist()
    for b, (q_len, k_len) in enumerate(case.specs):
        if q_len == 0:
            continue
        rows = [
            case.kv_cache[int(case.block_table[b, t // case.page_size]), t % case.page_size]
            for t in range(k_len)
        ]
        kv = torch.stack(rows).double()  # [k_len, Hkv, 2D]
        k, v = kv[..., :d] * case.k_scale, kv[..., d:] * case.v_scale
        visible = torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + k_len - q_len
        for h in range(hq):
            s = case.q[cu[b] : cu[b + 1], h].double() @ k[:, h // (hq // hkv)].T
            s = (s * case.softmax_scale).masked_fill(~visible, float("-inf"))
            out[cu[b] : cu[b + 1], h] = torch.softmax(s, dim=1) @ v[:, h // (hq // hkv)]
    return out


def test_fp8_case_is_an_e4m3_cache_with_nan_unused_slots():
    case = _fp8_case()
    assert (
        case.fp8_kv and case.k_cache.dtype == torch.float8_e4m3fn and case.q.dtype == torch.bfloat16
    )
    assert case.key.kv_dtype == FP8_E4M3
    assert case.k_scale != case.v_scale and case.k_scale not in (1.0, 0.5, 0.25)
    raw = case.kv_cache.view(torch.uint8)
    assert (raw[0] == 0x7F).all()  # the null block is e4m3 NaN
    assert torch.isnan(case.kv_cache.float()[0]).all()
    assert case.block_table[:, 0].unique().numel() == len(SPECS)  # permuted, distinct blocks


@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_route_on_fp8_cache_matches_direct_fp32(page_size, dtype):
    from vllm_fa4.paged_prefill import run_prefill, split_kv_cache

    case = _fp8_case(page_size, dtype)
    plan = case.plan()
    assert plan.route == "reference" and plan.key.fp8_kv
    k, v = split_kv_cache(case.kv_cache_vllm, case.head_dim)
    out = case.new_out()
    run_prefill(plan, case.q, k, v, out, softmax_scale=case.softmax_scale, **case.kv_scales)
    expect = _naive_dequantized(case)
    assert torch.isfinite(out).all()  # no NaN slot (unused, null block 0) leaked
    # out is the fp32 result rounded once to the model's dtype
    torch.testing.assert_close(out.double(), expect, atol=2e-2 * expect.abs().max(), rtol=1e-2)
    exact = case.reference()[0].double()
    torch.testing.assert_close(exact, expect, atol=1e-5, rtol=1e-5)


def test_reference_without_scales_is_wrong_by_the_scale():
    """The scales are applied: dropping them changes the result (a test that can fail)."""
    from vllm_fa4.paged_prefill.reference import paged_attention_reference

    case = _fp8_case()
    args = (case.q, case.k_cache, case.v_cache, case.cu_seqlens_q, case.seqused_k, case.page_table)
    right, _ = paged_attention_reference(*args, case.softmax_scale, **case.kv_scales)
    unscaled, _ = paged_attention_reference(*args, case.softmax_scale)
    assert not torch.allclose(right, unscaled, atol=1e-2)
    v_only, _ = paged_attention_reference(*args, case.softmax_scale, v_scale=case.v_scale)
    assert not torch.allclose(right, v_only, atol=1e-3)


@pytest.mark.parametrize(
    "fp8_key,cache_fp8,scales,words",
    [
        (True, False, {}, "k_cache has dtype torch.bfloat16, the plan was built for float8"),
        (False, True, {}, "k_cache has dtype torch.float8_e4m3fn, the plan was built for bfloat16"),
        (True, True, dict(k_scale=torch.tensor(0.5)), "k_scale must be a host float"),
        (False, False, dict(k_scale=0.5), "k_scale=0.5 given for a bfloat16 cache"),
    ],
)
def test_run_prefill_refuses_mismatched_cache_dtype_and_scales(fp8_key, cache_fp8, scales, words):
    """A programming error (the impl views the cache as its key says): listed in the raise
    audit, never reachable from what vLLM sends."""
    from vllm_fa4.paged_prefill import run_prefill
    from vllm_fa4.testing.cases import make_paged_case

    fp8 = _fp8_case()
    plain = make_paged_case(SPECS, 8, 2, 32, 16, torch.bfloat16, "cpu", seed=3)
    plan = (fp8 if fp8_key else plain).plan()
    cache = fp8 if cache_fp8 else plain
    kwargs = {**(fp8.kv_scales if fp8_key else {}), **scales}
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        run_prefill(
            plan,
            plain.q,
            cache.k_cache,
            cache.v_cache,
            plain.new_out(),
            softmax_scale=0.1,
            **kwargs,
        )


def test_readme_fp8_row_says_what_the_kernel_switch_serves():
    """Flipping route.kernel_reads_fp8 fails this until the README's one FP8 row is updated."""
    from pathlib import Path

    from vllm_fa4.kernels.config import SUPPORTED_HEAD_DIMS
    from vllm_fa4.paged_prefill.route import kernel_reads_fp8

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith("| FP8 KV cache |")]
    served = [
        d
        for d in SUPPORTED_HEAD_DIMS
        if kernel_reads_fp8(KernelKey("bfloat16", d, 16, 4, kv_dtype=FP8_E4M3))
    ]
    assert ("not served yet" in row) == (not served), (row, served)


def test_l2_sections_count_fp8_bytes():
    """The plan's L2 sections budget cache bytes: an FP8 key's keys take half."""
    from vllm_fa4.paged_prefill.plan import kv_bytes_per_token

    assert kv_bytes_per_token(BF16_KEY) == 2 * 128 * 2
    assert kv_bytes_per_token(FP8_KEY) == 2 * 128


def _row_scale_pow2(amax: float, inverse: bool) -> float:
    """fp8_kv.row_scale_asm's arithmetic on the host: the max's biased exponent e clamped to
    [8, 254], then 1/p = 2^(134 - e), p = 2^(e - 134)."""
    import struct

    e = (struct.unpack("<I", struct.pack("<f", amax))[0] >> 23) & 0xFF
    e = min(max(e, 8), 254)
    field = 261 - e if inverse else e - 7
    return struct.unpack("<f", struct.pack("<I", field << 23))[0]


def test_q_split_is_exact_for_bf16_rows():
    """fp8_qk's claim (fp8_kv.py): with p a power of two that puts a row's largest |q| / p in
    [128, 256), hi = e4m3(q / p) and lo = e4m3(q / p - hi) sum to q / p exactly for every
    bf16 element of at least 2^-9 of its row's largest (|q / p| >= 1/4, where lo's 4 bits
    stay above e4m3's subnormal step 2^-9), the rest within half that step; p * (1/p) is 1."""
    import torch

    gen = torch.Generator().manual_seed(0)
    for log_scale in (-20, -6, 0, 5, 20):
        rows = torch.randn(64, 128, generator=gen) * 2.0**log_scale
        rows[0, :100] *= 1e-4  # a row with a few large and many tiny values
        rows[1] = 0.0  # an empty row: any finite p
        q = rows.to(torch.bfloat16).float()
        for row in q:
            amax = float(row.abs().max())
            inv_p, p = _row_scale_pow2(amax, True), _row_scale_pow2(amax, False)
            assert inv_p * p == 1.0 and torch.isfinite(torch.tensor([inv_p, p])).all()
            x = row * inv_p
            if amax:
                assert 128 <= float(x.abs().max()) < 256
            hi = x.to(torch.float8_e4m3fn).float()
            lo = (x - hi).to(torch.float8_e4m3fn).float()
            big = row.abs() >= amax * 2.0**-9
            assert torch.equal((hi + lo)[big], x[big])
            assert float(((hi + lo) - x).abs().max()) <= 2.0**-10


def test_q_rounded_to_e4m3_is_the_kernels_hi_part():
    """testing.cases.q_rounded_to_e4m3 (the GPU tests' reference Q for `fp8_qk_rounded`) is
    the split's hi part times its row's p, row by row as the kernel scales (row_scale_pow2's
    bit arithmetic), exact in bf16, and within e4m3's half step (2^-4 relative) of Q for
    every element of at least 2^-6 of its row's largest (e4m3 normals under p)."""
    import torch

    from vllm_fa4.testing.cases import q_rounded_to_e4m3

    gen = torch.Generator().manual_seed(1)
    for log_scale in (-20, -6, 0, 5, 20):
        q = (torch.randn(3, 4, 128, generator=gen) * 2.0**log_scale).to(torch.bfloat16)
        q[0, 0, :100] *= 1e-4  # a few large and many tiny values
        q[1, 2] = 0.0  # an empty row
        got = q_rounded_to_e4m3(q)
        assert got.dtype == torch.bfloat16
        for row, out in zip(q.float().reshape(-1, 128), got.float().reshape(-1, 128)):
            amax = float(row.abs().max())
            inv_p, p = _row_scale_pow2(amax, True), _row_scale_pow2(amax, False)
            want = (row * inv_p).to(torch.float8_e4m3fn).float() * p
            assert torch.equal(out, want)
            big = row.abs() >= amax * 2.0**-6
            assert float(((out - row).abs() / row.abs().clamp_min(1e-30))[big].max()) <= 2.0**-4


def test_q_as_read_by_rounds_only_where_fp8_qk_rounded_builds():
    """The tests' references read the rounded Q only for a kernel that rounds it: the served
    picks (None), the split, a 16-bit cache and a head dim it cannot build keep Q; the case's
    key is not read for any other config."""
    from types import SimpleNamespace

    import torch

    from vllm_fa4.kernels.config import FP8_E4M3, KernelConfig, KernelKey
    from vllm_fa4.testing.cases import q_as_read_by, q_rounded_to_e4m3

    def case(head_dim=128, kv_dtype=FP8_E4M3):
        return SimpleNamespace(key=KernelKey("bfloat16", head_dim, 16, 4, kv_dtype=kv_dtype))

    class NoKey:  # a case whose key raises (a fuzz shape no kernel builds)
        @property
        def key(self):
            raise AssertionError("read the key")

    q = torch.randn(5, 4, 128).to(torch.bfloat16)
    rounded = KernelConfig.parse("queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk_rounded")
    split = KernelConfig.parse("queue_with_work+pv_wait_mid+q_tma+lazy_max+fp8_qk")
    assert torch.equal(q_as_read_by(rounded, case(), q), q_rounded_to_e4m3(q))
    assert not torch.equal(q_rounded_to_e4m3(q), q)
    assert q_as_read_by(rounded, case(kv_dtype=None), q) is q
    assert q_as_read_by(rounded, case(head_dim=64), q) is q
    q256 = torch.randn(5, 4, 256).to(torch.bfloat16)  # at 256 Q's ring (q_tma) does not fit
    assert q_as_read_by(rounded, case(head_dim=256), q256) is q256
    rounded_256 = KernelConfig.parse("queue+overlap+lazy_max+fp8_qk_rounded")
    assert torch.equal(q_as_read_by(rounded_256, case(256), q256), q_rounded_to_e4m3(q256))
    assert q_as_read_by(split, case(head_dim=256), q256) is q256
    for config in (None, split):
        assert q_as_read_by(config, NoKey(), q) is q
