"""vLLM's ``--kv-cache-dtype`` names, what FA4 serves of them, and the kernel key's ``kv_dtype``
(issue 30).

FA4 serves the model's own 16-bit cache (``auto``, or the dtype spelled out) and, where the
prefill kernel reads it (``route.kernel_reads_fp8``), an FP8 e4m3 cache with per-tensor scales:
vLLM 0.26-0.33 call it ``fp8`` or ``fp8_e4m3`` and both mean ``float8_e4m3fn`` on CUDA (the
cache tensor itself is uint8; vLLM writes it with ``reshape_and_cache_flash``). Everything else
(``fp8_e5m2``, ``fp8_inc``, the per-token-head, NVFP4 and TurboQuant caches) is refused at
startup, as is an FP8 cache under an fp16 model: FA3's FP8 kernel, which runs the decode rows,
writes bfloat16 output only ("For FP8 input, output must have dtype BF16"; FLASH_ATTN fails
there too, at its first FP8 forward).
"""

from __future__ import annotations

from vllm_fa4 import envs
from vllm_fa4.kernels.config import FP8_E4M3, SUPPORTED_HEAD_DIMS, KernelKey, dtype_name
from vllm_fa4.paged_prefill import route

FP8_E4M3_NAMES = ("fp8", "fp8_e4m3")
SIXTEEN_BIT_NAMES = ("float16", "bfloat16")
# The names vLLM's generic check may pass (FA4AttentionBackend.supported_kv_cache_dtypes);
# which of them a model gets is ``refusal``'s answer.
ACCEPTED_NAMES = ("auto", *SIXTEEN_BIT_NAMES, *FP8_E4M3_NAMES)


def key_kv_dtype(cache_dtype: str) -> str | None:
    """``KernelKey.for_layer``'s ``kv_dtype`` for vLLM's name: an FP8 name -> ``float8_e4m3fn``;
    ``auto`` -> None (the model's dtype); any other name as it is (``for_layer`` drops the
    model's own 16-bit dtype, ``unsupported_reason`` names any other)."""
    if cache_dtype in FP8_E4M3_NAMES:
        return FP8_E4M3
    return None if cache_dtype == "auto" else cache_dtype


Refusal = tuple[str, str | None]  # (what is not supported, what is) for the startup error


def refusal(
    cache_dtype: str, model_dtype, head_size: int, block_size: int | None
) -> Refusal | None:
    """Why FA4 does not serve ``--kv-cache-dtype cache_dtype`` for this model, or None: at
    backend selection and impl construction, before the layer groups are known. ``block_size``
    None: vLLM's default 16."""
    return name_refusal(cache_dtype, model_dtype) or kernel_refusal(
        cache_dtype, model_dtype, head_size, block_size
    )


def name_refusal(cache_dtype: str, model_dtype) -> Refusal | None:
    """The cache dtypes FA4 never serves with this model dtype, whatever the kernel reads."""
    model = dtype_name(model_dtype)
    if cache_dtype not in ACCEPTED_NAMES:
        return f"kv_cache_dtype {cache_dtype!r}", ", ".join(served_names(model))
    if cache_dtype in SIXTEEN_BIT_NAMES and cache_dtype != model:
        return f"kv_cache_dtype {cache_dtype} with model dtype {model}", None
    if cache_dtype in FP8_E4M3_NAMES and model != "bfloat16":
        return (
            f"kv_cache_dtype {cache_dtype!r} with model dtype {model} (the decode rows run on "
            "FA3's FP8 kernel, which writes bfloat16 only: serve with --dtype bfloat16)"
        ), None
    return None


def kernel_refusal(
    cache_dtype: str, model_dtype, head_size: int, block_size: int | None
) -> Refusal | None:
    """An FP8 cache the prefill kernel does not read at this head size (the builder asks
    ``select_route`` instead, with the group's full key)."""
    if cache_dtype not in FP8_E4M3_NAMES:
        return None
    key = KernelKey(dtype_name(model_dtype), head_size, block_size or 16, 1, kv_dtype=FP8_E4M3)
    if fp8_served(key):
        return None
    return (
        f"kv_cache_dtype {cache_dtype!r} at head size {head_size} (the prefill kernel does "
        "not read an FP8 cache yet)"
    ), None


def fp8_served(key: KernelKey) -> bool:
    """An FP8 ``key`` starts: its kernel reads FP8, or prefill is sent to the fp32 reference
    by ``VLLM_FA4_PREFILL_ROUTE=reference`` (debugging; a misspelt route is refused elsewhere)."""
    try:
        forced_reference = envs.prefill_route() == "reference"
    except ValueError:
        forced_reference = False
    return route.kernel_reads_fp8(key) or forced_reference


def served_names(model_dtype) -> tuple[str, ...]:
    """The ``--kv-cache-dtype`` names FA4 may serve a ``model_dtype`` model with (FP8 where
    the kernel reads it for some supported head size; ``refusal`` decides per model)."""
    model = dtype_name(model_dtype)
    names = ("auto", model) if model in SIXTEEN_BIT_NAMES else ("auto",)
    fp8 = model == "bfloat16" and any(
        fp8_served(KernelKey(model, d, 16, 1, kv_dtype=FP8_E4M3)) for d in SUPPORTED_HEAD_DIMS
    )
    return names + (FP8_E4M3_NAMES if fp8 else ())
