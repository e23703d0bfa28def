"""The kernel side of an FP8 (e4m3) KV cache (issue 30), on the CPU: which configs build an
fp8 key, its staging ring and registers, the policy rows, and one compile (sm_90a) of the
converter path with its conversion instructions in the PTX."""

from __future__ import annotations

import os

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import pytest  # noqa: E402

from vllm_fa4.kernels.config import (  # noqa: E402
    FP8_E4M3,
    SMEM_BYTES,
    SUPPORTED_HEAD_DIMS,
    KernelConfig,
    KernelKey,
)
from vllm_fa4.paged_prefill.policy import FP8_TABLE, serving_configs  # noqa: E402
from vllm_fa4.paged_prefill.route import kernel_reads_fp8  # noqa: E402


def fp8_key(hd=128, page=16, **features) -> KernelKey:
    return KernelKey("bfloat16", hd, page, 4, kv_dtype=FP8_E4M3, **features)


@pytest.mark.parametrize(
    "hd,spec,stages",
    [
        (128, "queue+pv_wait_mid+lazy_max", 2),  # one Q stage: two fp8 slots fit
        (128, "queue_with_work+pv_wait_mid+q_tma+lazy_max", 1),  # Q's ring takes the second
        (64, "queue_with_work+overlap+q_tma+lazy_max+mma_wgs=3", 2),
        (256, "queue+overlap", 1),  # 128 KB of 16-bit K/V stages
    ],
)
def test_staging_stages_fill_shared_memory(hd, spec, stages):
    config, key = KernelConfig.parse(spec), fp8_key(hd)
    assert config.unsupported_reason(key) is None
    assert config.staging_stages(key) == stages
    assert config._smem_bytes(key, stages) <= SMEM_BYTES - 1024
    assert config.staging_stages(KernelKey("bfloat16", hd, 16, 4)) == 0


@pytest.mark.parametrize(
    "spec,words",
    [
        ("queue+overlap+wide_box", "'wide_box' with an fp8 KV cache"),
        ("queue+overlap+q_prefetch", "'q_prefetch' with an fp8 KV cache"),
    ],
)
def test_configs_the_fp8_kernel_does_not_build(spec, words):
    config = KernelConfig.parse(spec)
    assert words in config.unsupported_reason(fp8_key())
    assert config.unsupported_reason(KernelKey("bfloat16", 128, 16, 4)) is None


def test_fp8_registers_fit_and_16bit_splits_are_unchanged():
    for spec in ("queue+overlap", "queue+overlap+mma_wgs=3", "pages_ahead"):
        config = KernelConfig.parse(spec)
        hd = 64 if config.mma_wgs == 3 else 128
        producer, consumer = config.register_split(fp8_key(hd))
        assert producer == 40  # the converter warps' share
        assert 128 * producer + 128 * config.mma_wgs * consumer <= 65536
        sixteen = KernelKey("bfloat16", hd, 16, 4)
        assert config.register_split(sixteen) == (config.producer_regs, config.mma_regs)


@pytest.mark.parametrize("hd", SUPPORTED_HEAD_DIMS)
@pytest.mark.parametrize("page", [16, 128])
@pytest.mark.parametrize("window", [False, True])
def test_every_fp8_serving_pick_builds(hd, page, window):
    key = fp8_key(hd, page, sliding_window=window, softcap=window, sinks=window)
    assert kernel_reads_fp8(key)
    for config in serving_configs(key).all:
        assert config.unsupported_reason(key) is None, config.spec
        assert config.staging_stages(key) >= 1
    assert (hd, window, page >= 128) in FP8_TABLE


def test_16bit_keys_keep_their_picks_and_no_fp8_route():
    from vllm_fa4.paged_prefill.policy import TABLE

    for (hd, window, big), specs in TABLE.items():
        key = KernelKey("bfloat16", hd, 128 if big else 16, 4, sliding_window=window)
        assert tuple(c.spec for c in (serving_configs(key).long, serving_configs(key).short)) == (
            tuple(KernelConfig.parse(s).spec for s in specs)
        )
        assert not kernel_reads_fp8(key)


def test_fp8_kernel_ptx_converts_in_the_producer(tmp_path, monkeypatch):
    """One compile in a fresh process (the DSL reads its dump folder at import): the fp8
    build's PTX has the e4m3 unpack, the bf16 repack and no extra HGMMA, and its TMA loads
    count fp8 bytes."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        from vllm_fa4.kernels.compile import compile_kernel
        from vllm_fa4.kernels.config import FP8_E4M3, KernelConfig, KernelKey
        key = KernelKey("bfloat16", 128, 16, 4, kv_dtype=FP8_E4M3)
        compile_kernel(key, KernelConfig.parse("queue+pv_wait_mid+lazy_max"), True)
        """
    )
    env = {
        **os.environ,
        "CUTE_DSL_KEEP": "ptx",
        "CUTE_DSL_DUMP_DIR": str(tmp_path),
        "CUTE_DSL_DISABLE_FILE_CACHING": "1",
    }
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=600)
    (ptx,) = tmp_path.rglob("*.ptx")
    text = ptx.read_text()
    assert text.count("cvt.rn.f16x2.e4m3x2") >= 4
    assert "cvt.rn.bf16x2.f32" in text
    assert "fence.proxy.async.shared::cta" in text
