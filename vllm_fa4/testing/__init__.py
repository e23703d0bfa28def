"""Test helpers shared by the CPU unit tests and the GPU kernel tests.

- ``reference.paged_attention_reference``: paged, varlen, bottom-right causal, GQA attention
  in plain PyTorch (fp32 ground truth, or the "same math in bf16" error baseline).
- ``cases.make_paged_case``: a vLLM-shaped paged KV cache with a poisoned null block, permuted
  block ids and NaN in every unused slot.
- ``checks.assert_attention_close``: the project's accuracy bar.

Nothing here imports vLLM or the CuTe DSL.
"""
