"""vLLM-shaped paged prefill test cases.

The cache follows vLLM 0.26's FlashAttention layout: physically NHD
``[num_blocks, page_size, Hkv, 2*D]`` with K in ``[..., :D]`` and V in ``[..., D:]``; the
tensor vLLM hands to ``forward`` is the logical permuted view ``[num_blocks, Hkv, page_size, 2*D]``
(``PagedCase.kv_cache_vllm``). Block 0 is the null block; used block ids are a random
permutation of the rest (with spare blocks left over); unused slots (rest of each request's
last page, spare blocks, block 0) hold NaN when ``poison_unused``.

Layouts (issue 27): the cache is a strided view of one flat buffer (``PagedCase.kv_buffer``)
whose block stride is ``layers * page_size * token stride + block_pad`` elements, the view
starting at layer ``layer``'s slice: contiguous (1 layer, no pad, the default), padded (vLLM's
``page_size_padded`` for hybrid models: ``block_pad`` elements after each page) or cross-layer
(vLLM's ``(num_blocks, num_layers, page, Hkv, 2*D)`` allocation: ``layers`` pages per block).
The pad and the other layers' slices are NaN, like unused slots; the reference and FA3 read
the same views. Unused block-table entries are the null block 0, or with ``junk_table`` ids
of NaN blocks and ids past the cache (vLLM leaves stale ids there).

FP8 caches (issue 30, ``fp8_kv``): the values are drawn as for a 16-bit cache, divided by the
case's seeded per-tensor ``k_scale`` / ``v_scale`` and stored as ``float8_e4m3fn`` (what vLLM's
``reshape_and_cache_flash`` writes); unused slots hold e4m3's NaN (byte 0x7f). ``dtype`` stays
the model's (q and out).

Model features (issue 11) ride along as runtime values: ``window_left`` (keys a row sees left
of its diagonal), ``softcap`` and ``sinks`` ([Hq] float32 logits); ``key``, ``plan``,
``reference`` and ``fa3`` all use them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vllm_fa4.kernels.config import Fp8Qk, KernelConfig, KernelKey
from vllm_fa4.paged_prefill import PrefillPlan, paged_attention_reference, plan_prefill
from vllm_fa4.paged_prefill.policy import serving_configs

TABLE_SLACK = 3  # extra block-table columns beyond the longest request (entries = null block 0)
MAX_LAYERS = 8  # cross-layer layouts: layers sharing one block stride


@dataclass
class PagedCase:
    specs: list[tuple[int, int]]  # (q_len, k_len) per request
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    dtype: torch.dtype
    q: torch.Tensor  # [total_q, Hq, D], non-contiguous view (token stride > Hq*D)
    # [num_blocks, page_size, Hkv, 2*D] NHD view of kv_buffer: dtype, or float8_e4m3fn
    kv_cache: torch.Tensor
    k_cache: torch.Tensor  # kv_cache[..., :D]
    v_cache: torch.Tensor  # kv_cache[..., D:]
    cu_seqlens_q: torch.Tensor  # [B+1] int32, device
    seqused_k: torch.Tensor  # [B] int32, device
    page_table: torch.Tensor  # [B, max_pages + table_slack] int32, device (== block_table)
    block_table: torch.Tensor  # same tensor as page_table; unused entries 0 (or junk)
    slot_mapping: torch.Tensor  # [total_q] int64, device: cache slot of each new token
    query_start_loc_cpu: torch.Tensor  # [B+1] int32, CPU
    seq_lens_cpu: torch.Tensor  # [B] int32, CPU
    softmax_scale: float
    window_left: int | None = None  # sliding window: keys left of the diagonal a row sees
    softcap: float | None = None  # logit soft cap (> 0)
    sinks: torch.Tensor | None = None  # [Hq] float32 on the case's device (bf16-exact values)
    kv_buffer: torch.Tensor | None = None  # flat storage of kv_cache: pads, other layers
    block_pad: int = 0  # elements after each block's pages (vLLM's page_size_padded)
    layers: int = 1  # pages per block (cross-layer layout); kv_cache is layer ``layer``'s
    layer: int = 0
    k_scale: float = 1.0  # an FP8 cache's per-tensor scales (K = k8 * k_scale); 1.0 otherwise
    v_scale: float = 1.0

    @property
    def fp8_kv(self) -> bool:
        return self.kv_cache.dtype == torch.float8_e4m3fn

    @property
    def kv_scales(self) -> dict:
        """``run_prefill``'s / the reference's scale keywords for this case's cache."""
        return dict(k_scale=self.k_scale, v_scale=self.v_scale)

    def dequantized_kv_cache(self) -> torch.Tensor:
        """The cache as fp32 values (an FP8 cache times its scales; NaN slots stay NaN)."""
        d = self.head_dim
        kv = self.kv_cache.float()
        if self.fp8_kv:
            kv[..., :d] *= self.k_scale
            kv[..., d:] *= self.v_scale
        return kv

    @property
    def block_stride(self) -> int:
        """Elements from one block to the next (page_size token strides when contiguous)."""
        return self.kv_cache.stride(0)

    @property
    def page_size_padded(self) -> int | None:
        """vLLM's ``AttentionSpec.page_size_padded`` (bytes) for this layout: None unless
        padded (a cross-layer layout keeps each layer's own spec unpadded)."""
        if not self.block_pad:
            return None
        return (self.page_size * self.num_kv_heads * 2 * self.head_dim + self.block_pad) * (
            self.kv_cache.element_size()
        )

    def kv_view(self, buffer: torch.Tensor) -> torch.Tensor:
        """The [num_blocks, page_size, Hkv, 2*D] view of ``buffer`` (a copy of ``kv_buffer``,
        e.g. a NaN-free one for FA3) with this case's strides and offset."""
        return buffer.as_strided(
            self.kv_cache.shape, self.kv_cache.stride(), self.kv_cache.storage_offset()
        )

    def slot_index(self, slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(blocks, offsets)`` of cache slots: ``kv_cache[blocks, offsets]`` gathers and
        writes work on any layout (a padded view cannot be flattened into slots)."""
        return slot_mapping // self.page_size, slot_mapping % self.page_size

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
            **{**self.kv_scales, **kwargs},
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
            kv_dtype=self.kv_cache.dtype,
        )

    def plan(self, config: KernelConfig | None = None, overlay: str = "", **options) -> PrefillPlan:
        """``plan_prefill`` for this case (what the metadata builder would produce; config
        None: the key's serving configs, picked per batch; a config: that one for every
        batch); ``overlay`` (config None only): values set on both serving configs
        (``KernelConfig.overlaid``), e.g. one axis to A/B against the served pick;
        ``options`` go to plan_prefill (e.g. ``l2_section_bytes``)."""
        configs = serving_configs(self.key, config)
        if overlay:
            assert config is None, "an overlay applies to the served configs only"
            configs = dataclasses.replace(
                configs,
                long=configs.long.overlaid(overlay),
                short=configs.short.overlaid(overlay),
            )
        return plan_prefill(
            self.query_start_loc_cpu,
            self.seq_lens_cpu,
            key=self.key,
            configs=configs,
            num_kv_heads=self.num_kv_heads,
            cu_seqlens_q=self.cu_seqlens_q,
            seqused_k=self.seqused_k,
            page_table=self.page_table,
            **{"window_left": self.window_left, **options},
        )

    def table_within_cache(self) -> torch.Tensor:
        """The block table with ids past the cache (``junk_table``) replaced by the null block:
        what vLLM's stale entries can hold, for FA3 (whose unused entries it must not read
        either, but a wild id would fault the whole run rather than fail one batch)."""
        return torch.where(
            self.page_table >= self.num_blocks, torch.zeros_like(self.page_table), self.page_table
        )

    def fa3(
        self, out: torch.Tensor, q=None, k_cache=None, v_cache=None, page_table=None
    ) -> torch.Tensor:
        """vLLM's FA3 (the baseline of every ratio) on this case into ``out``; ``q``, the
        cache views and the block table override the case's own (e.g. a cache copy with the NaN
        slots zeroed).

        The case's features map to FA3's arguments: ``window_size=[window_left, 0]`` (right 0:
        causal; None is FA3's ``[-1, -1]``, unlimited), ``softcap`` (0.0 = off) and
        ``s_aux=sinks`` (FA3 takes bf16 only: the case's sinks are bf16-exact)."""
        from vllm.vllm_flash_attn import flash_attn_varlen_func

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
            block_table=self.page_table if page_table is None else page_table,
            fa_version=3,
            out=out,
            **self.fa3_features,
        )
        return out

    @property
    def fa3_features(self) -> dict:
        """The case's model features as ``flash_attn_varlen_func`` keywords."""
        features = {}
        if self.window_left is not None:
            features["window_size"] = [self.window_left, 0]
        if self.softcap is not None:
            features["softcap"] = float(self.softcap)
        if self.sinks is not None:
            features["s_aux"] = self.sinks.to(torch.bfloat16).contiguous()
        return features

    def ours(self, plan: PrefillPlan, out, q=None, lse=None, num_ctas=None) -> torch.Tensor:
        """Our kernel on this case into ``out``, launched directly (no route or validation):
        ``plan`` from :meth:`plan`; the window is the plan's, soft cap and sinks the case's
        (the kernel takes each iff its key says so); ``q`` overrides the case's queries. An
        FP8 cache's scales go as run_prefill passes them: k_scale in the softmax scale,
        v_scale to the epilogue."""
        from vllm_fa4.kernels.launch import prefill_forward
        from vllm_fa4.paged_prefill.run import fp8_scale_args

        prefill_forward(
            plan.key,
            plan.config,
            self.q if q is None else q,
            self.k_cache,
            self.v_cache,
            out,
            lse,
            plan.args,
            self.softmax_scale * self.k_scale,
            num_ctas,
            window_left=plan.window_left,
            softcap=self.softcap,
            sinks=self.sinks,
            **fp8_scale_args(plan.key, self.v_scale),
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
    block_pad: int = 0,
    layers: int = 1,
    layer: int = 0,
    table_slack: int = TABLE_SLACK,
    junk_table: bool = False,
    junk_past_cache: bool = True,
    fp8_kv: bool = False,
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
        block_pad: elements of padding after each block (any value >= 0; the kernel and
            vLLM's startup check need the block stride 16-byte aligned).
        layers, layer: the block holds ``layers`` pages (1 to MAX_LAYERS), the cache is the
            ``layer``-th.
        table_slack: block-table columns beyond the longest request's pages (0: exactly as
            wide as needed).
        junk_table: unused block-table entries hold, instead of the null block, ids of NaN
            blocks (spare ones or block 0) and, with ``junk_past_cache``, ids past the end of
            the cache (up to 2^31-1; vLLM's stale entries are in range), drawn after
            everything else (the other tensors do not move).
        fp8_kv: an FP8 e4m3 cache: the same values divided by per-tensor scales that depend
            on ``seed`` only (no draw: the other tensors do not move), rounded to e4m3.
    """
    if window_left is not None and window_left < 0:
        raise ValueError(f"window_left must be >= 0, got {window_left}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be positive, got {softcap}")
    if block_pad < 0 or not 1 <= layers <= MAX_LAYERS or not 0 <= layer < layers:
        raise ValueError(
            f"layout: need block_pad >= 0, 1 <= layers <= {MAX_LAYERS}, 0 <= layer < layers; "
            f"got block_pad={block_pad}, layers={layers}, layer={layer}"
        )
    if table_slack < 0:
        raise ValueError(f"table_slack must be >= 0, got {table_slack}")
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
    block_table_cpu = torch.zeros(num_reqs, max_pages + table_slack, dtype=torch.int32)
    start = 0
    for b, n in enumerate(pages):
        block_table_cpu[b, :n] = perm[start : start + n].to(torch.int32)
        start += n

    values = torch.randn(
        num_blocks, page_size, num_kv_heads, 2 * head_dim, generator=gen_dev, device=device
    ).to(dtype)
    k_scale, v_scale = fp8_scales(seed) if fp8_kv else (1.0, 1.0)
    if fp8_kv:
        values = quantize_fp8(values, head_dim, k_scale, v_scale)
    kv_buffer, kv_cache = _layout(values, block_pad, layers, layer)
    slots = []  # valid slots of every request, in token order
    for b, k_len in enumerate(k_lens):
        t = torch.arange(k_len)
        slots.append(block_table_cpu[b].long()[t // page_size] * page_size + t % page_size)
    all_slots = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.long)
    if poison_unused:
        valid = torch.zeros(num_blocks * page_size, dtype=torch.bool)
        valid[all_slots] = True
        unused = (~valid).view(num_blocks, page_size).to(device)
        if fp8_kv:  # torch has no NaN fill for e4m3: its bit pattern
            kv_cache.view(torch.uint8)[unused] = FP8_NAN_BYTE
        else:
            kv_cache[unused] = float("nan")
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
    sink_logits = None
    if sinks:
        # Drawn on the CPU generator after everything else, so other tensors do not move.
        sink_logits = torch.rand(num_q_heads, generator=gen_cpu) * 6 - 2
        sink_logits = sink_logits.to(torch.bfloat16).float().to(device)
    if junk_table:
        _fill_junk(block_table_cpu, pages, perm[used_blocks:], num_blocks, junk_past_cache, gen_cpu)
    block_table = block_table_cpu.to(device)

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
        kv_buffer=kv_buffer,
        block_pad=block_pad,
        layers=layers,
        layer=layer,
        k_scale=k_scale,
        v_scale=v_scale,
    )


FP8_NAN_BYTE = 0x7F  # float8_e4m3fn's NaN (0xff too); e4m3fn has no infinity
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


def fp8_scales(seed: int) -> tuple[float, float]:
    """Per-tensor (k_scale, v_scale) of a case's FP8 cache: around 1/64, not powers of two (a
    dequantization that drops or doubles a scale shows), keeping N(0, 1) draws in e4m3 range."""
    return (1 + (seed % 7) / 8) / 64, (1 + ((seed + 3) % 7) / 8) / 80


def quantize_fp8(kv: torch.Tensor, head_dim: int, k_scale: float, v_scale: float) -> torch.Tensor:
    """``kv`` [..., 2*D] (K then V) as an e4m3 cache: each half divided by its scale in fp32,
    clamped to e4m3's range and rounded (vLLM's cache write, ``reshape_and_cache_flash``)."""
    x = kv.float()
    x[..., :head_dim] /= k_scale
    x[..., head_dim:] /= v_scale
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def q_rounded_to_e4m3(q: torch.Tensor) -> torch.Tensor:
    """Q as `fp8_qk_rounded` reads it (fwd_sm90 split_q, its hi part alone): each row (token,
    head) divided by the power of two p that puts its largest |q| / p in [128, 256) (the
    largest's biased fp32 exponent clamped to [8, 254], as fp8_kv.row_scale_pow2), rounded to
    e4m3 and multiplied back, in ``q``'s dtype (exact there: 4 significant bits)."""
    x = q.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    biased = ((amax.view(torch.int32) >> 23) & 0xFF).clamp(8, 254)
    p = torch.pow(2.0, (biased - 134).float())
    hi = (x / p).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    return (hi * p).to(q.dtype)


def q_as_read_by(config: KernelConfig | None, case: PagedCase, q: torch.Tensor) -> torch.Tensor:
    """The queries ``config``'s kernel for ``case``'s key computes with, for a test's
    references: ``q`` itself, or where `fp8_qk_rounded` builds (an FP8 cache, head dim 128 or 256)
    Q rounded to e4m3 as that kernel rounds it (q_rounded_to_e4m3). None: the exact mode's
    serving picks (never it). The key is read only for that config (a fuzz shape may have none)."""
    if config is None or config.fp8_qk is not Fp8Qk.ROUNDED_Q:
        return q
    key = case.key
    if key.fp8_kv and config.unsupported_reason(key) is None:
        return q_rounded_to_e4m3(q)
    return q


def _layout(
    values: torch.Tensor, block_pad: int, layers: int, layer: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat NaN buffer, view of ``values``' shape holding ``values``): block stride
    ``layers * page + block_pad`` elements, the view at layer ``layer``'s page of each block
    (the contiguous layout is the buffer itself)."""
    if values.dtype == torch.float8_e4m3fn:  # laid out as bytes: NaN is a bit pattern there
        buffer, view = _layout(values.view(torch.uint8), block_pad, layers, layer)
        return buffer.view(values.dtype), view.view(values.dtype)
    num_blocks = values.shape[0]
    page = values[0].numel()
    block_stride = layers * page + block_pad
    if block_stride == page:
        return values.view(-1), values
    fill = FP8_NAN_BYTE if values.dtype == torch.uint8 else float("nan")
    buffer = torch.full(
        (num_blocks * block_stride,), fill, dtype=values.dtype, device=values.device
    )
    token_stride = values.shape[2] * values.shape[3]
    view = buffer.as_strided(
        values.shape, (block_stride, token_stride, values.shape[3], 1), layer * page
    )
    view.copy_(values)
    return buffer, view


def _fill_junk(
    table: torch.Tensor,
    pages: list[int],
    spare: torch.Tensor,
    num_blocks: int,
    past_cache: bool,
    gen: torch.Generator,
) -> None:
    """Unused entries of ``table`` (in place): ids of NaN blocks (the spare ones, or the null
    block 0), and with ``past_cache`` half of them ids past the cache (a read of either
    shows: NaN, or a fault)."""
    for b, n in enumerate(pages):
        width = table.shape[1] - n
        if width <= 0:
            continue
        nan_blocks = torch.cat([torch.zeros(1, dtype=spare.dtype), spare])
        pick = nan_blocks[torch.randint(len(nan_blocks), (width,), generator=gen)]
        past = torch.randint(num_blocks, 2**31 - 1, (width,), generator=gen)
        use_past = (torch.rand(width, generator=gen) < 0.5) & past_cache
        table[b, n:] = torch.where(use_past, past, pick).to(table.dtype)
