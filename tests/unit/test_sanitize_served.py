"""tools/sanitize_served.py's (key, config, layout) enumeration, on the CPU: the runs need
CUDA (their cases do), the set they cover does not. It must hold FP8 (e4m3) cache keys the
kernel reads, every config FP8_TABLE serves at each head dim, each on the packed and the
padded layout, with the padded layout's byte math at the cache's own element size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers.modules import load_file

from vllm_fa4.kernels.config import FP8_E4M3, KernelConfig, KvBox
from vllm_fa4.paged_prefill.policy import FP8_TABLE, launchable_configs
from vllm_fa4.paged_prefill.route import kernel_reads_fp8

TOOL = Path(__file__).resolve().parents[2] / "tools" / "sanitize_served.py"


tool = load_file("sanitize_served", TOOL)


def test_filters_split_the_set_into_fp8_and_16bit():
    fp8, wide = list(tool.pairs(fp8=True)), list(tool.pairs(fp8=False))
    assert fp8 and wide
    assert all(key.fp8_kv for _, key, _, _ in fp8)
    assert not any(key.fp8_kv for _, key, _, _ in wide)
    assert sorted(map(repr, tool.pairs())) == sorted(map(repr, fp8 + wide))
    assert all(label.endswith(" fp8") for label, *_ in fp8)


def test_every_fp8_key_is_read_by_the_kernel_with_every_config():
    for label, key, config, _ in tool.pairs(fp8=True):
        assert key.kv_dtype == FP8_E4M3, label
        assert kernel_reads_fp8(key), label
        assert key.unsupported_reason() is None, label
        assert config.unsupported_reason(key) is None, (label, config.spec)


def test_fp8_covers_each_served_config_at_each_head_dim_and_the_features():
    served = {(key.head_dim, config) for _, key, config, _ in tool.pairs(fp8=True)}
    table = {
        (head_dim, KernelConfig.parse(spec))
        for (head_dim, _, _), specs in FP8_TABLE.items()
        for spec in specs
    }
    assert sorted((d, c.spec) for d, c in table - served) == []
    keys = {key for _, key, _, _ in tool.pairs(fp8=True)}
    assert {k.dtype for k in keys} == {"bfloat16", "float16"}
    assert {k.page_size >= 128 for k in keys} == {False, True}
    for feature in ("sliding_window", "softcap", "sinks"):
        assert any(getattr(k, feature) for k in keys), feature


def test_each_fp8_key_runs_its_serving_configs_packed_and_padded():
    """Both VLLM_FA4_FP8_QUERY modes' picks (e4m3's rounds Q on long batches)."""
    runs: dict = {}
    for _, key, config, pad in tool.pairs(fp8=True):
        runs.setdefault(key, set()).add((config, pad))
    for key, got in runs.items():
        want = {(c, pad) for c in launchable_configs(key) for pad in (False, True)}
        assert got == want, key  # no wide_box for fp8: the padded cache needs no refit


@pytest.mark.parametrize("fp8", [False, True])
def test_padded_layout_uses_the_cache_element_size(fp8):
    assert tool.PAD_BYTES % 16 == 0  # the kernel's (and startup's) TMA stride rule
    for shape in tool.shapes(fp8):
        esize = 1 if fp8 else 2
        assert shape.element_size == esize
        assert tool.PAD_BYTES % esize == 0
        layout = tool.padded_layout(shape)
        page_bytes = shape.page * shape.hkv * 2 * shape.head_dim * esize
        assert layout.block_stride == page_bytes + tool.PAD_BYTES
        assert layout.token_stride == shape.hkv * 2 * shape.head_dim * esize
        assert layout.head_bytes == shape.head_dim * esize
        assert layout.unsupported_reason() is None, shape


def test_16bit_padded_runs_refit_wide_box():
    wide = [(c, pad) for _, _, c, pad in tool.pairs(fp8=False) if c.kv_box is KvBox.WIDE]
    assert wide and not any(pad for _, pad in wide)


def test_help_runs():
    done = subprocess.run(
        [sys.executable, str(TOOL), "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    for flag in ("--precompile", "--short-only", "--shard", "--fp8-only", "--no-fp8"):
        assert flag in done.stdout


def test_wrap_batch_wraps_every_ring_of_every_unwindowed_config():
    """WRAP (racecheck's stand-in for the long batch) must give each work tile of its longest
    request more K/V tiles than twice the K/V and staging rings hold, or it stops testing
    what the long batch adds."""
    from vllm_fa4.kernels.config import KV_STAGES, tile_geometry

    longest = max(k for _, k in tool.WRAP)
    assert max(q for q, _ in tool.WRAP) <= max(q for q, _ in tool.SHORT)  # cost stays short-like
    for label, key, config, _ in tool.pairs():
        if key.sliding_window:  # its windows hold 2-3 tiles; --ctas wraps its rings across tiles
            continue
        tiles = longest // tile_geometry(key, config.mma_wgs).tile_n
        assert tiles > 2 * (KV_STAGES + config.staging_stages(key)), (label, config.spec, tiles)


def test_ctas_caps_the_persistent_grid(monkeypatch):
    import torch

    from vllm_fa4.kernels import launch

    monkeypatch.setattr(launch, "_SM_COUNT", {})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    tool._cap_persistent_grid(7)
    assert launch._sm_count(torch.device("cuda", 0)) == 7


@pytest.mark.parametrize("fp8", [False, True])
def test_every_policy_row_has_a_shape(fp8):
    """Each row of the serving table (head dim, window, page class) has a shape in the
    sanitizer's set, so every config serving launches is run under the sanitizers."""
    from vllm_fa4.paged_prefill.policy import LONG_BATCH_MIN_PAGE, TABLE

    table = FP8_TABLE if fp8 else TABLE
    rows = {
        (s.head_dim, s.window is not None, s.page >= LONG_BATCH_MIN_PAGE) for s in tool.shapes(fp8)
    }
    assert sorted(set(table) - rows) == []


@pytest.mark.parametrize("fp8", [False, True])
def test_every_served_config_runs_under_the_sanitizers(fp8):
    """Every config serving picks (testing.variants.served_configs, LONG_BY_PAGE's rows
    included) runs at its head dim in the sanitizer's set, packed."""
    from vllm_fa4.testing.variants import served_configs

    served = {(k.head_dim, c) for k, c in served_configs() if k.fp8_kv == fp8}
    ran = {(k.head_dim, c) for _, k, c, padded in tool.pairs(fp8) if not padded}
    assert sorted((d, c.spec) for d, c in served - ran) == []


def test_only_narrows_the_set_to_matching_labels():
    """--only REGEX: a part of the set by label (e.g. one key's rows after a policy change),
    with the --fp8-only / --no-fp8 filters on top; a REGEX that matches nothing is refused."""
    local = tool.shapes(only=r"hd256 p16 .*w")
    assert [s.label for s in local] == [
        "bfloat16 hd256 p16 16/8 w4095 cap50",
        "bfloat16 hd256 p16 16/8 w1023",
        "bfloat16 hd256 p16 16/8 w4095 cap50 fp8",
    ]
    assert tool.shapes(fp8=False, only=r"hd256 p16 .*w") == local[:2]
    runs = list(tool.pairs(fp8=True, only=r"hd128 p(16|128) 32/8 fp8$"))
    assert {label for label, *_ in runs} == {
        "bfloat16 hd128 p16 32/8 fp8",
        "float16 hd128 p16 32/8 fp8",
        "bfloat16 hd128 p128 32/8 fp8",
        "float16 hd128 p128 32/8 fp8",
    }
    with pytest.raises(SystemExit) as refused:
        tool.main(["--only", "hd512"])
    assert refused.value.code == 2


@pytest.mark.parametrize("spec", ["queue+overlap+lazy_max+tma_epilogue", "queue+overlap+mma_wgs=3"])
def test_a_fixed_variant_replaces_the_picks_where_it_builds(monkeypatch, spec):
    """VLLM_FA4_VARIANT runs one candidate config instead of the table's picks (before its
    adoption), leaving out the keys it cannot build (mma_wgs=3: all but head dim 64)."""
    every = {key for _, key, _, _ in tool.pairs(fp8=False)}
    monkeypatch.setenv("VLLM_FA4_VARIANT", spec)
    runs = list(tool.pairs(fp8=False))
    config = KernelConfig.parse(spec)
    assert runs and {c for _, _, c, _ in runs} == {config}
    built = {key for _, key, _, _ in runs}
    assert built == {k for k in every if config.unsupported_reason(k) is None}
    if "mma_wgs=3" in spec:
        assert {k.head_dim for k in built} == {64}
