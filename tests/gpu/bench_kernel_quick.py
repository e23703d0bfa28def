"""Quick timing: our SM90 paged prefill vs vLLM's FA3 on Llama-3.1-8B shapes.

Run: python tests/gpu/bench_kernel_quick.py   (env VLLM_FA4_OVERLAP=1 for the stage-B path)
"""

import math

import torch
from vllm.vllm_flash_attn import flash_attn_varlen_func

from vllm_fa4.kernels.compile import INTRA_WG_OVERLAP, prefill_forward
from vllm_fa4.kernels.config import KernelKey, tile_shape, tokens_per_tile

HQ, HKV, HD, PAGE, DT = 32, 8, 128, 16, torch.bfloat16


def work_tiles(specs, qpk):
    _, tile_n = tile_shape(HD)
    tpt = tokens_per_tile(HD, qpk)
    rows = []
    for b, (q_len, k_len) in enumerate(specs):
        for m in range(math.ceil(q_len / tpt)):
            last = min((m + 1) * tpt, q_len) - 1
            cost = math.ceil((k_len - q_len + last + 1) / tile_n)
            rows += [(b, h, m, cost) for h in range(HKV)]
    rows.sort(key=lambda r: -r[3])
    return torch.tensor(rows, dtype=torch.int32, device="cuda")


def bench(fn, iters=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1e-3


def run(name, specs):
    dev = "cuda"
    pages = [math.ceil(k / PAGE) for _, k in specs]
    nblocks = sum(pages) + 1
    kv = torch.randn(nblocks, PAGE, HKV, 2 * HD, dtype=DT, device=dev)
    k_cache, v_cache = kv[..., :HD], kv[..., HD:]
    perm = torch.randperm(nblocks - 1, device=dev).to(torch.int32) + 1
    pt = torch.zeros(len(specs), max(pages), dtype=torch.int32, device=dev)
    off = 0
    for b, n in enumerate(pages):
        pt[b, :n] = perm[off : off + n]
        off += n
    total_q = sum(q for q, _ in specs)
    q = torch.randn(total_q, HQ, HD, dtype=DT, device=dev)
    cu = torch.tensor(
        [0] + list(torch.tensor([s[0] for s in specs]).cumsum(0)), dtype=torch.int32, device=dev
    )
    seqk = torch.tensor([k for _, k in specs], dtype=torch.int32, device=dev)
    out = torch.empty_like(q)
    scale = HD**-0.5
    key = KernelKey("bfloat16", HD, PAGE, HQ // HKV)
    wt = work_tiles(specs, HQ // HKV)
    flops = sum(4 * HQ * HD * sum(k - q_len + j + 1 for j in range(q_len)) for q_len, k in specs)

    ours = bench(
        lambda: prefill_forward(key, q, k_cache, v_cache, out, None, cu, seqk, pt, wt, scale)
    )
    fa3 = bench(
        lambda: flash_attn_varlen_func(
            q,
            k_cache,
            v_cache,
            max_seqlen_q=max(s[0] for s in specs),
            cu_seqlens_q=cu,
            max_seqlen_k=max(s[1] for s in specs),
            seqused_k=seqk,
            softmax_scale=scale,
            causal=True,
            block_table=pt,
            fa_version=3,
        )
    )
    print(
        f"{name:>22}: ours {flops / ours / 1e12:6.1f} TFLOP/s ({ours * 1e3:.3f} ms)  "
        f"FA3 {flops / fa3 / 1e12:6.1f} TFLOP/s ({fa3 * 1e3:.3f} ms)  ratio {fa3 / ours:.3f}"
    )


if __name__ == "__main__":
    print(f"overlap={INTRA_WG_OVERLAP} device={torch.cuda.get_device_name()}")
    run("4k x 4", [(4096, 4096)] * 4)
    run("16k x 1", [(16384, 16384)])
    run("2k chunk after 16k", [(2048, 16384 + 2048)])
