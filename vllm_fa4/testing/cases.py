"""vLLM-shaped paged prefill test cases.

The cache follows vLLM 0.26's FlashAttention layout: physically NHD
``[num_blocks, page_size, Hkv, 2*D]`` with K in ``[..., :D]`` and V in ``[..., D:]``; the
tensor vLLM hands to ``forward`` is the logical permuted view ``[num_blocks, Hkv, page_size, 2*D]``
(``PagedCase.kv_cache_vllm``). Block 0 is the null block; used block ids are a random
permutation of the rest (with spare blocks left over); unused slots (rest of each request's
last page, spare blocks, block 0) hold NaN when ``poison_unused``.

Model features (issue 11) ride along as runtime values: ``window_left`` (keys a row sees left
of its diagonal), ``softcap`` and ``sinks`` ([Hq] float32 logits); ``key``, ``plan``,
``reference`` and ``fa3`` all use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vllm_fa4.kernels.config import KernelConfig, KernelKey
from vllm_fa4.paged_prefill import PrefillPlan, paged_attention_reference, plan_prefill
from vllm_fa4.paged_prefill.policy import serving_configs

TABLE_SLACK = 3  # extra block-table columns beyond the longest request (entries = null block 0)


@dataclass
class PagedCase:
    specs: list[tuple[int, int]]  # (q_len, k_len) per request
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype
    q: torch.Tensor  # [total_q, Hq, D], non-contiguous view (token stride > Hq*D)
    kv_cache: torch.Tensor  # [num_blocks, page_size, Hkv, 2*D], physical NHD, contiguous
    k_cache: torch.Tensor  # kv_cache[..., :D]
    v_cache: torch.Tensor  # kv_cache[..., D:]
    cu_seqlens_q: torch.Tensor  # [B+1] int32, device
    seqused_k: torch.Tensor  # [B] int32, device
    page_table: torch.Tensor  # [B, max_pages + TABLE_SLACK] int32, device (== block_table)
    block_table: torch.Tensor  # same tensor as page_table; unused entries 0
    slot_mapping: torch.Tensor  # [total_q] int64, device: cache slot of each new token
    query_start_loc_cpu: torch.Tensor  # [B+1] int32, CPU
    seq_lens_cpu: torch.Tensor  # [B] int32, CPU
    softmax_scale: float
    window_left: int | None = None  # sliding window: keys left of the diagonal a row sees
    softcap: float | None = None  # logit soft cap (> 0)
    sinks: torch.Tensor | None = None  # [Hq] float32 on the case's device (bf16-exact values)

    @property
    def kv_cache_vllm(self) -> torch.Tensor:
        """The cache as vLLM's attention forward receives it: [blocks, Hkv, page, 2*D] view."""
        return self.kv_cache.transpose(1, 2)

    def ramp_keys(self, top: float) -> None:
        """Scale each request's keys in place by a factor falling linearly from ``top`` on its
        first page to 1 on its last: the kernel visits blocks right to left, so row maxima keep
        rising by large steps (the path where a lazily kept running max has to move)."""
        d = self.head_dim
        for b in range(len(self.specs)):
            n = -(-self.specs[b][1] // self.page_size)
            for p in range(n):
                factor = top - (top - 1.0) * p / max(n - 1, 1)
                blk = int(self.block_table[b, p])
                self.kv_cache[blk, :, :, :d] *= factor

    @property
    def num_tokens(self) -> int:
        return self.q.shape[0]

    @property
    def num_blocks(self) -> int:
        return self.kv_cache.shape[0]

    @property
    def max_seqlen_q(self) -> int:
        return max((s[0] for s in self.specs), default=0)

    @property
    def max_seqlen_k(self) -> int:
        return max((s[1] for s in self.specs), default=0)

    @property
    def features(self) -> dict:
        """The case's model-feature values as the reference takes them (``run_prefill`` takes
        softcap and sinks; its window is the plan's)."""
        return dict(window_left=self.window_left, softcap=self.softcap, sinks=self.sinks)

    def reference(self, q: torch.Tensor | None = None, **kwargs):
        """``paged_attention_reference`` on this case (``q`` overrides the case's queries;
        ``kwargs`` override the case's window / softcap / sinks and set compute_dtype)."""
        kwargs = {**self.features, **kwargs}
        return paged_attention_reference(
            self.q if q is None else q,
            self.k_cache,
            self.v_cache,
            self.cu_seqlens_q,
            self.seqused_k,
            self.page_table,
            self.softmax_scale,
            **kwargs,
        )

    @property
    def key(self) -> KernelKey:
        return KernelKey.for_layer(
            self.dtype,
            self.head_dim,
            self.page_size,
            self.num_q_heads,
            self.num_kv_heads,
            sliding_window=self.window_left is not None,
            softcap=self.softcap is not None,
            sinks=self.sinks is not None,
        )

    def plan(self, config: KernelConfig | None = None, **options) -> PrefillPlan:
        """``plan_prefill`` for this case (what the metadata builder would produce; config
        None: the key's serving configs, picked per batch; a config: that one for every
        batch); ``options`` go to plan_prefill (e.g. ``l2_section_bytes``)."""
        return plan_prefill(
            self.query_start_loc_cpu,
            self.seq_lens_cpu,
            key=self.key,
            configs=serving_configs(self.key, config),
            num_kv_heads=self.num_kv_heads,
            cu_seqlens_q=self.cu_seqlens_q,
            seqused_k=self.seqused_k,
            page_table=self.page_table,
            **{"window_left": self.window_left, **options},
        )

    def fa3(self, out: torch.Tensor, q=None, k_cache=None, v_cache=None) -> torch.Tensor:
        """vLLM's FA3 (the baseline of every ratio) on this case into ``out``; ``q`` and the
        cache views override the case's own (e.g. a cache copy with the NaN slots zeroed).

        The case's features map to FA3's arguments: ``window_size=[window_left, 0]`` (right 0:
        causal; None is FA3's ``[-1, -1]``, unlimited), ``softcap`` (0.0 = off) and
        ``s_aux=sinks`` (FA3 takes bf16 only: the case's sinks are bf16-exact)."""
        from vllm.vllm_flash_attn import flash_attn_varlen_func

        features = {}
        if self.window_left is not None:
            features["window_size"] = [self.window_left, 0]
        if self.softcap is not None:
            features["softcap"] = float(self.softcap)
        if self.sinks is not None:
            features["s_aux"] = self.sinks.to(torch.bfloat16).contiguous()

        flash_attn_varlen_func(
            self.q if q is None else q,
            self.k_cache if k_cache is None else k_cache,
            self.v_cache if v_cache is None else v_cache,
            max_seqlen_q=self.max_seqlen_q,
            cu_seqlens_q=self.cu_seqlens_q,
            max_seqlen_k=self.max_seqlen_k,
            seqused_k=self.seqused_k,
            softmax_scale=self.softmax_scale,
            causal=True,
            block_table=self.page_table,
            fa_version=3,
            out=out,
            **features,
        )
        return out

    def ours(self, plan: PrefillPlan, out, q=None, lse=None, num_ctas=None) -> torch.Tensor:
        """Our kernel on this case into ``out``, launched directly (no route or validation):
        ``plan`` from :meth:`plan`; the window is the plan's, soft cap and sinks the case's
        (the kernel takes each iff its key says so); ``q`` overrides the case's queries."""
        from vllm_fa4.kernels.launch import prefill_forward

        prefill_forward(
            plan.key,
            plan.config,
            self.q if q is None else q,
            self.k_cache,
            self.v_cache,
            out,
            lse,
            plan.args,
            self.softmax_scale,
            num_ctas,
            window_left=plan.window_left,
            softcap=self.softcap,
            sinks=self.sinks,
        )
        return out

    def new_out(self, poison: bool = True) -> torch.Tensor:
        """An output buffer [total_q, Hq, D] in q's dtype, NaN-filled so unwritten rows show."""
        fill = float("nan") if poison else 0.0
        return torch.full(
            (self.num_tokens, self.num_q_heads, self.head_dim),
            fill,
            dtype=self.dtype,
            device=self.q.device,
        )


def make_paged_case(
    specs: Sequence[tuple[int, int]],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int = 0,
    poison_unused: bool = True,
    extra_blocks: int | None = None,
    window_left: int | None = None,
    softcap: float | None = None,
    sinks: bool = False,
) -> PagedCase:
    """Build a paged prefill case.

    Args:
        specs: (q_len, k_len) per request, 0 <= q_len <= k_len (q_len 0 allowed).
        extra_blocks: spare (unused, poisoned) blocks besides block 0; default
            ``max(4, used_blocks // 2)``.
        window_left: sliding window (keys a row sees left of its diagonal, >= 0) or None.
        softcap: logit soft cap (> 0) or None.
        sinks: draw seeded [Hq] float32 sink logits in [-2, 4] (rounded to bf16-exact values,
            so FA3, which takes bf16 sinks, computes the same thing): some dominate their
            rows, some hardly matter.
    """
    if window_left is not None and window_left < 0:
        raise ValueError(f"window_left must be >= 0, got {window_left}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be positive, got {softcap}")
    specs = [(int(a), int(b)) for a, b in specs]
    for i, (q_len, k_len) in enumerate(specs):
        if not 0 <= q_len <= k_len:
            raise ValueError(f"request {i}: need 0 <= q_len <= k_len, got ({q_len}, {k_len})")
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(f"Hq={num_q_heads} is not a multiple of Hkv={num_kv_heads}")
    device = torch.device(device)
    gen_cpu = torch.Generator().manual_seed(seed)
    gen_dev = torch.Generator(device=device).manual_seed(seed + 1)

    num_reqs = len(specs)
    q_lens = [s[0] for s in specs]
    k_lens = [s[1] for s in specs]
    pages = [-(-k // page_size) for k in k_lens]
    used_blocks = sum(pages)
    if extra_blocks is None:
        extra_blocks = max(4, used_blocks // 2)
    num_blocks = 1 + used_blocks + extra_blocks

    # Block ids: a random permutation of 1..num_blocks-1; the first used_blocks go to requests.
    perm = torch.randperm(num_blocks - 1, generator=gen_cpu) + 1
    max_pages = max(pages, default=0)
    block_table_cpu = torch.zeros(num_reqs, max_pages + TABLE_SLACK, dtype=torch.int32)
    start = 0
    for b, n in enumerate(pages):
        block_table_cpu[b, :n] = perm[start : start + n].to(torch.int32)
        start += n

    kv_cache = torch.randn(
        num_blocks, page_size, num_kv_heads, 2 * head_dim, generator=gen_dev, device=device
    ).to(dtype)
    slots = []  # valid slots of every request, in token order
    for b, k_len in enumerate(k_lens):
        t = torch.arange(k_len)
        slots.append(block_table_cpu[b].long()[t // page_size] * page_size + t % page_size)
    all_slots = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.long)
    if poison_unused:
        valid = torch.zeros(num_blocks * page_size, dtype=torch.bool)
        valid[all_slots] = True
        flat = kv_cache.view(num_blocks * page_size, num_kv_heads, 2 * head_dim)
        flat[(~valid).to(device)] = float("nan")
    slot_mapping = (
        torch.cat([s[k - q :] for s, q, k in zip(slots, q_lens, k_lens)])
        if slots
        else torch.zeros(0, dtype=torch.long)
    )

    total_q = sum(q_lens)
    # q is a view of a wider qkv-like buffer: token stride (Hq + 2*Hkv) * D > Hq * D.
    width = (num_q_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(total_q, width, generator=gen_dev, device=device).to(dtype)
    q = qkv[:, : num_q_heads * head_dim].view(total_q, num_q_heads, head_dim)

    cu = torch.zeros(num_reqs + 1, dtype=torch.int32)
    if num_reqs:
        cu[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)
    seq_lens = torch.tensor(k_lens, dtype=torch.int32)
    block_table = block_table_cpu.to(device)
    sink_logits = None
    if sinks:
        # Drawn on the CPU generator after everything else, so other tensors do not move.
        sink_logits = torch.rand(num_q_heads, generator=gen_cpu) * 6 - 2
        sink_logits = sink_logits.to(torch.bfloat16).float().to(device)

    return PagedCase(
        specs=specs,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        page_size=page_size,
        dtype=dtype,
        q=q,
        kv_cache=kv_cache,
        k_cache=kv_cache[..., :head_dim],
        v_cache=kv_cache[..., head_dim:],
        cu_seqlens_q=cu.to(device),
        seqused_k=seq_lens.to(device),
        page_table=block_table,
        block_table=block_table,
        slot_mapping=slot_mapping.to(device),
        query_start_loc_cpu=cu,
        seq_lens_cpu=seq_lens,
        softmax_scale=head_dim**-0.5,
        window_left=window_left,
        softcap=softcap,
        sinks=sink_logits,
    )
