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
