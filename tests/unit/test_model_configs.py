"""CPU checks of configs/: the committed model folders are exactly what
configs/make_model_configs.py writes, and vLLM accepts each one with the attention shape the
FA4-vs-FLASH_ATTN comparisons assume (head size, KV heads, which layers have a sliding window,
soft cap), plus a tokenizer that loads. No GPU, no network: the folders are local."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "make_model_configs", CONFIGS / "make_model_configs.py"
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


gen = _load_generator()

# Per folder: architecture, head size, KV heads, the even layers' sliding window (None: every
# layer full), attention soft cap, and the parameter count vLLM 0.26's model class creates
# (counted once on the meta device; the READMEs' weight sizes come from gen.n_params).
EXPECTED = {
    "llama-3.1-8b": ("LlamaForCausalLM", 128, 8, None, None, 8_030_261_248),
    "llama-3.2-1b": ("LlamaForCausalLM", 64, 8, None, None, 1_235_814_400),
    "llama-3.1-70b": ("LlamaForCausalLM", 128, 8, None, None, 70_553_706_496),
    "gemma-2-9b": ("Gemma2ForCausalLM", 256, 8, 4096, 50.0, 9_241_705_984),
    "gpt-oss-20b": ("GptOssForCausalLM", 64, 8, 128, None, 20_914_757_184),
}


def _config(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def test_every_model_is_checked_here():
    assert set(EXPECTED) == set(gen.MODELS)


def test_committed_folders_are_what_the_script_writes(tmp_path):
    gen.write_all(tmp_path)
    committed = {p.name for p in CONFIGS.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert committed == set(gen.MODELS), "a configs/ folder the script does not write, or no longer"
    for name in gen.MODELS:
        written = sorted(p.name for p in (tmp_path / name).iterdir())
        assert written == sorted(p.name for p in (CONFIGS / name).iterdir()), name
        for fname in written:
            assert (tmp_path / name / fname).read_bytes() == (
                CONFIGS / name / fname
            ).read_bytes(), f"configs/{name}/{fname} differs from what make_model_configs.py writes"


@pytest.mark.parametrize("name", list(EXPECTED))
def test_vllm_model_config(name):
    import torch
    from vllm.config import ModelConfig

    arch, head, kv, window, softcap, _ = EXPECTED[name]
    cfg = _config(name)
    model = ModelConfig(model=str(CONFIGS / name), max_model_len=8192)
    assert model.architectures == [arch]
    assert model.get_head_size() == head
    assert model.get_total_num_kv_heads() == kv
    assert model.get_sliding_window() == window
    assert model.dtype == torch.bfloat16
    assert model.quantization is None  # gpt-oss: bf16 experts, no MXFP4
    hf = model.hf_config
    assert getattr(hf, "attn_logit_softcapping", None) == softcap
    if window is not None:
        # Gemma 2 reads layer_types; vLLM's gpt-oss picks the window by layer_idx % 2 == 0
        # whatever layer_types says. Both must be the even layers.
        n = cfg["num_hidden_layers"]
        assert hf.layer_types == ["sliding_attention", "full_attention"] * (n // 2)


def test_gemma2_scale_and_final_soft_cap():
    from vllm.config import ModelConfig

    hf = ModelConfig(model=str(CONFIGS / "gemma-2-9b"), max_model_len=8192).hf_config
    assert hf.query_pre_attn_scalar**-0.5 == 1 / 16  # what gemma2.py passes as the scale
    assert hf.final_logit_softcapping == 30.0
    assert hf.tie_word_embeddings  # gemma2.py asserts it
    assert hf.hidden_activation == "gelu_pytorch_tanh"  # gemma2.py refuses anything else


def test_gpt_oss_moe_and_rope():
    from vllm.config import ModelConfig

    hf = ModelConfig(model=str(CONFIGS / "gpt-oss-20b"), max_model_len=8192).hf_config
    assert (hf.num_local_experts, hf.num_experts_per_tok) == (32, 4)
    assert getattr(hf, "quantization_config", None) is None
    # gpt_oss.py indexes these keys of rope_parameters directly
    rope = hf.rope_parameters
    assert (rope["rope_type"], rope["rope_theta"], rope["factor"]) == ("yarn", 150000.0, 32.0)
    assert (rope["beta_fast"], rope["beta_slow"]) == (32.0, 1.0)
    assert rope["original_max_position_embeddings"] == 4096


def test_gemma2_context_is_8192():
    """Why benchmarks/serving.py caps --max-model-len at max_position_embeddings."""
    from vllm.config import ModelConfig

    with pytest.raises(ValueError, match="max_model_len"):
        ModelConfig(model=str(CONFIGS / "gemma-2-9b"), max_model_len=8193)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_tokenizer_loads(name):
    from vllm.tokenizers import get_tokenizer

    tok = get_tokenizer(str(CONFIGS / name))
    ids = tok("héllo").input_ids
    assert ids[0] == gen.BOS_ID and len(ids) == 1 + len("héllo".encode())
    assert tok.decode(ids, skip_special_tokens=True) == "héllo"
    assert tok.eos_token_id == gen.EOS_ID
    assert len(tok) <= _config(name)["vocab_size"]


@pytest.mark.parametrize("name", [n for n, m in gen.MODELS.items() if m.hf_class])
def test_values_said_to_be_transformers_defaults_are(name):
    import transformers

    model = gen.MODELS[name]
    ours = transformers.AutoConfig.from_pretrained(str(CONFIGS / name))
    default = getattr(transformers, model.hf_class)(num_hidden_layers=ours.num_hidden_layers)
    for field in model.hf_defaults:
        assert getattr(ours, field) == getattr(default, field), field


@pytest.mark.parametrize("name", list(EXPECTED))
def test_parameter_count(name):
    assert gen.n_params(gen.model_config(name)) == EXPECTED[name][-1]


def test_help_and_bad_arguments_write_nothing(tmp_path):
    """``--help`` (and a misspelt option) exit before writing: a copy of the script in an empty
    folder, whose default output folder is that folder, stays alone there."""
    import shutil
    import subprocess

    script = tmp_path / "make_model_configs.py"
    shutil.copy(CONFIGS / "make_model_configs.py", script)
    for args, status in ((["--help"], 0), (["--bogus"], 2)):
        out = subprocess.run(
            [sys.executable, str(script), *args], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == status, out.stderr
        assert [p.name for p in tmp_path.iterdir()] == ["make_model_configs.py"], args
    helped = subprocess.run([sys.executable, str(script), "-h"], capture_output=True, text=True)
    assert "--out" in helped.stdout and "llama-3.1-8b" in helped.stdout


def test_out_writes_elsewhere(tmp_path):
    gen.main(["--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(gen.MODELS)
