"""vllm-fa4: a vLLM plugin adding the attention backend ``FA4`` for NVIDIA Hopper.

Prefill tokens run on the project's own CuTe-DSL SM90 kernels; decode tokens stay on vLLM's
FlashAttention (FA3) path. ``register`` is the ``vllm.general_plugins`` entry point; it runs in
every vLLM process, so it must stay cheap: no torch or cutlass import at module top.
"""

from __future__ import annotations

import logging

__version__ = "0.1.0"

BACKEND_NAME = "FA4"
BACKEND_CLASS_PATH = "vllm_fa4.backend.FA4AttentionBackend"

logger = logging.getLogger("vllm_fa4")


def _fa4_member():
    """Unpickling target of the enum member (module-level so pickle finds it by name).

    Enum members pickle by value; a spawned or Ray worker unpickles the engine config before it
    loads plugins, so the member must be able to re-create itself on demand.
    """
    return ensure_registered()


def _reduce_fa4_member(protocol):
    return (_fa4_member, ())


def ensure_registered():
    """Add ``AttentionBackendEnum.FA4`` if missing and return it."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum as Enum_

    member = Enum_._member_map_.get(BACKEND_NAME)
    if member is not None:
        return member
    if hasattr(Enum_, "register"):  # vLLM >= 0.33 ships this API (PR #41091)
        member = Enum_.register(BACKEND_NAME, BACKEND_CLASS_PATH)
    else:  # vLLM 0.26: the same few steps, done by hand
        member = object.__new__(Enum_)
        member._name_ = BACKEND_NAME
        member._value_ = BACKEND_CLASS_PATH
        member.__objclass__ = Enum_
        type.__setattr__(Enum_, BACKEND_NAME, member)
        Enum_._member_map_[BACKEND_NAME] = member
        Enum_._value2member_map_[BACKEND_CLASS_PATH] = member
        Enum_._member_names_.append(BACKEND_NAME)
    # Instance attribute: pickle looks __reduce_ex__ up on the object first.
    member.__reduce_ex__ = _reduce_fa4_member
    return member


def _log_like_vllm() -> None:
    """Print our log lines (route choice, warmup progress) through vLLM's own handlers."""
    vllm_logger = logging.getLogger("vllm")
    if vllm_logger.handlers and not logger.handlers:
        for handler in vllm_logger.handlers:
            logger.addHandler(handler)
        logger.setLevel(vllm_logger.level or logging.INFO)
        logger.propagate = False


def register() -> None:
    """Entry point (``vllm.general_plugins``). Idempotent; never raises."""
    try:
        ensure_registered()
        _log_like_vllm()
    except Exception as exc:  # a broken plugin must not take vLLM down
        logger.warning("vllm-fa4: could not register the FA4 attention backend: %s", exc)
