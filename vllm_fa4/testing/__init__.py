"""Test helpers shared by the CPU unit tests and the GPU kernel tests.

- ``cases.make_paged_case``: a vLLM-shaped paged KV cache with a poisoned null block, permuted
  block ids and NaN in every unused slot.
- ``checks.assert_attention_close``: the project's accuracy bar.
- ``variants``: the kernel configs the GPU tests and variant benchmarks sweep.
- ``fuzz``: random vLLM-shaped batches and a shrinker for the fuzz suite (tests/gpu/test_fuzz.py).
- ``fake_kernels``: a fake compiler and loader for the kernel-cache fault tests.

The ground truth is ``paged_prefill.reference.paged_attention_reference`` (also a prefill route,
``VLLM_FA4_PREFILL_ROUTE=reference``, so it lives there). Nothing here imports vLLM or the CuTe
DSL; ``testing`` sits above ``paged_prefill`` and may import it, never the other way round.
"""
