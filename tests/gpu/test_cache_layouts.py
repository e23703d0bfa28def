"""Every config serving can pick for a key, on every cache layout vLLM can hand it (issue 27):
contiguous, padded block strides (vLLM's ``page_size_padded``: pads of whole 16-byte units,
none a whole number of token strides or boxes, and pads of whole token strides) and
cross-layer block strides (several layers' pages per block, the layer's page at an offset),
at every head dim and page size. The pads and the other layers are NaN, so a read of them
shows; plan_prefill + run_prefill against the fp32 reference (testing.checks' bar), the whole
cache buffer bit-for-bit unchanged."""

import pytest
import torch

from vllm_fa4.kernels.config import SUPPORTED_HEAD_DIMS, SUPPORTED_PAGE_SIZES, KernelKey
from vllm_fa4.paged_prefill.policy import serving_configs

pytestmark = pytest.mark.gpu

HQ, HKV = 16, 4
LAYOUTS = {
    "contiguous": {},
    "pad-16B": dict(block_pad=8),  # what issue 27 tried (16-128 bytes)
    "pad-48B": dict(block_pad=24),
    "pad-token": "token",  # one token stride: a whole number of rows, not of boxes
    "cross-layer-2": dict(layers=2, layer=1),
    "cross-layer-5": dict(layers=5, layer=3),
}
# a short request, one long enough for the long config's batches, a chunk after a prefix,
# a decode-like row and an empty one
SPECS = [(77, 77), (1500, 1500 + 3000), (300, 4096), (1, 2000), (0, 40)]


def _layout(name, head_dim):
    layout = LAYOUTS[name]
    if layout == "token":
        return dict(block_pad=HKV * 2 * head_dim)
    return layout


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("page", SUPPORTED_PAGE_SIZES)
@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_every_served_config_on_every_layout(head_dim, page, layout):
    from vllm_fa4.paged_prefill import run_prefill
    from vllm_fa4.testing import cases, checks

    case = cases.make_paged_case(
        SPECS,
        HQ,
        HKV,
        head_dim,
        page,
        torch.bfloat16,
        "cuda",
        seed=head_dim + page,
        **_layout(layout, head_dim),
    )
    before = case.kv_buffer.clone()
    ref, _ = case.reference()
    lowp, _ = case.reference(compute_dtype=torch.bfloat16)
    key = KernelKey.for_layer(torch.bfloat16, head_dim, page, HQ, HKV)
    for config in serving_configs(key).all:
        out = case.new_out()
        run_prefill(
            case.plan(config),
            case.q,
            case.k_cache,
            case.v_cache,
            out,
            softmax_scale=case.softmax_scale,
        )
        torch.cuda.synchronize()
        try:
            checks.assert_attention_close(out, ref, lowp, cu_seqlens_q=case.cu_seqlens_q)
        except AssertionError as e:
            raise AssertionError(f"config {config.spec}, {layout}: {e}") from None
        assert torch.equal(case.kv_buffer.view(torch.int16), before.view(torch.int16)), (
            f"config {config.spec} wrote into the cache buffer ({layout})"
        )
