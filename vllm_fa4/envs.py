"""Every environment variable vllm-fa4 reads, read here and nowhere else in the package.

VLLM_FA4_VARIANT        kernel config spec (``KernelConfig.parse``), read by the metadata
                        builder at startup; unset or ``default``: each key's
                        ``policy.serving_configs``
VLLM_FA4_PREFILL_ROUTE  ``auto`` / ``kernel`` / ``reference`` (``paged_prefill.route``)
VLLM_FA4_FP8_QUERY      ``exact`` (default) / ``e4m3``: how an FP8 cache's long prefill
                        batches read Q for Q K^T (``policy.Fp8Query``)
VLLM_FA4_CACHE_DIR      compiled-kernel disk cache (``kernels.cache``; default
                        ``~/.cache/vllm_fa4/kernels``); must be a directory only this user
                        (or root) can write, else kernels are compiled in memory
VLLM_FA4_CACHE_MAX_AGE_DAYS  kernel cache entries not loaded or written for this many days
                        are removed at a process's first use of the cache; default 30, 0 keeps
                        every entry
VLLM_FA4_CHECK          ``1``: each prefill step compares the lengths the kernel reads on the
                        GPU with the host copies its plan was built from (a sync per step;
                        for debugging vLLM or us, one error line on a difference)
VLLM_FA4_TEST_VARIANTS  config specs, or ``all``, that GPU tests and variant benchmarks sweep
                        (``testing.variants``)
VLLM_FA4_FUZZ_COUNT     batches per kernel config in the fuzz suite (``tests/gpu/test_fuzz.py``,
                        ``testing.fuzz``); default 300
VLLM_FA4_FUZZ_SEED      base seed of the fuzz suite's batches; default 0
VLLM_FA4_FUZZ_REPLAY    one fuzz batch as JSON (printed by a failure): run only that batch

Each function reads the environment when called, so a test can set a variable and call again.
A leaf: strings and ints only, the callers parse them (nothing here imports the package).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

VARIANT = "VLLM_FA4_VARIANT"
PREFILL_ROUTE = "VLLM_FA4_PREFILL_ROUTE"
CACHE_DIR = "VLLM_FA4_CACHE_DIR"
CACHE_MAX_AGE_DAYS = "VLLM_FA4_CACHE_MAX_AGE_DAYS"
DEFAULT_CACHE_MAX_AGE_DAYS = 30
CHECK = "VLLM_FA4_CHECK"
TEST_VARIANTS = "VLLM_FA4_TEST_VARIANTS"
FUZZ_COUNT = "VLLM_FA4_FUZZ_COUNT"
FUZZ_SEED = "VLLM_FA4_FUZZ_SEED"
FUZZ_REPLAY = "VLLM_FA4_FUZZ_REPLAY"
DEFAULT_FUZZ_COUNT = 300
PREFILL_ROUTES = ("auto", "kernel", "reference")
FP8_QUERY = "VLLM_FA4_FP8_QUERY"
FP8_QUERIES = ("exact", "e4m3")
# The way out every refusal of a setting names (the user may not want to debug ours).
WAY_OUT = "or serve with --attention-backend FLASH_ATTN"
SERVING_DEFAULTS = "default"  # VLLM_FA4_VARIANT spelling of "unset": the per-batch defaults


def kernel_config_spec() -> str | None:
    """The kernel config spec the environment names, or None (unset or ``default``: each
    key's serving configs); the caller parses it (``paged_prefill.policy.configured_config``)."""
    spec = os.environ.get(VARIANT, "").strip()
    return None if spec in ("", SERVING_DEFAULTS) else spec


def prefill_route() -> str:
    route = os.environ.get(PREFILL_ROUTE, "auto").strip().lower() or "auto"
    if route not in PREFILL_ROUTES:
        raise ValueError(
            f"{PREFILL_ROUTE}={route!r}: expected one of {', '.join(PREFILL_ROUTES)}. "
            f"Fix or unset {PREFILL_ROUTE}, {WAY_OUT}"
        )
    return route


def fp8_query() -> str:
    value = os.environ.get(FP8_QUERY, "").strip().lower() or FP8_QUERIES[0]
    if value not in FP8_QUERIES:
        raise ValueError(
            f"{FP8_QUERY}={value!r}: expected one of {', '.join(FP8_QUERIES)}. "
            f"Fix or unset {FP8_QUERY}, {WAY_OUT}"
        )
    return value


def kernel_cache_dir() -> Path:
    root = os.environ.get(CACHE_DIR)
    return Path(root) if root else Path.home() / ".cache" / "vllm_fa4" / "kernels"


def sweep_variants_spec() -> str | None:
    return os.environ.get(TEST_VARIANTS)


def _int_env(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={value}: must be >= {minimum}")
    return value


def check_lengths() -> bool:
    raw = os.environ.get(CHECK, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{CHECK}={raw!r}: expected 0 or 1")
    return raw == "1"


def cache_max_age_days() -> int:
    return _int_env(CACHE_MAX_AGE_DAYS, DEFAULT_CACHE_MAX_AGE_DAYS, 0)


def fuzz_count() -> int:
    return _int_env(FUZZ_COUNT, DEFAULT_FUZZ_COUNT, 0)


def fuzz_seed() -> int:
    return _int_env(FUZZ_SEED, 0, 0)


def fuzz_replay() -> str | None:
    return os.environ.get(FUZZ_REPLAY, "").strip() or None


def default_cute_dsl_env() -> None:
    """CuTe-DSL settings unless the caller chose others (must run before cutlass is imported):

    - ``CUTE_DSL_ARCH=sm_90a``: compile for Hopper (also what lets a CPU machine compile);
    - ``CUTE_DSL_CACHE_DIR`` inside our kernel cache directory: otherwise cutlass creates
      ``$TMPDIR/$USER/cutlass_python_cache`` at import without checking who owns it, and
      ``@cute.jit`` calls (not our ``cute.compile``, which never uses that cache) would load
      IR from it: a planting spot on a shared host. Only a path: cutlass creates nothing
      there unless it writes IR.
    """
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    with contextlib.suppress(RuntimeError):  # no home directory: cutlass keeps its default
        # Each DSL of the family reads its own prefix: nvidia-cutlass-dsl 4.8 also makes a
        # CUTE_EXPERIMENTAL_DSL at import, whose cache would land in $TMPDIR/$USER again.
        for prefix in ("CUTE_DSL", "CUTE_EXPERIMENTAL_DSL"):
            os.environ.setdefault(f"{prefix}_CACHE_DIR", str(kernel_cache_dir() / prefix.lower()))
