"""Test helpers shared by the CPU unit tests and the GPU kernel tests.

- ``cases.make_paged_case``: a vLLM-shaped paged KV cache with a poisoned null block, permuted
  block ids and NaN in every unused slot.
- ``checks.assert_attention_close``: the project's accuracy bar.
- ``variants``: the kernel configs the GPU tests and variant benchmarks sweep.

The ground truth is ``paged_prefill.reference.paged_attention_reference`` (a production route
too, so it lives there). Nothing here imports vLLM or the CuTe DSL; ``testing`` sits above
``paged_prefill`` and may import it, never the other way round.
"""
