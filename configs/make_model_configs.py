"""Write the model folders used with ``--load-format dummy``: real models' shapes, no weights.

Each folder gets a Hugging Face ``config.json`` and a small byte-level tokenizer generated here
(no network, no downloaded weights): 256 byte tokens plus BOS/EOS. Token ids above 257 exist in
the model's vocabulary but are never produced by it. Three families, each with the
architecture, ``model_type`` and fields its vLLM model class reads:

- Llama (llama-3.1-8b, llama-3.2-1b, llama-3.1-70b): the published shapes.
- Gemma 2 (gemma-2-9b): the published shape, all of it: sliding window 4096 on the even layers,
  attention and final logit soft caps, ``query_pre_attn_scalar``, head dim 256.
- gpt-oss (gpt-oss-20b): the published shape, all of it (24 layers, 32 experts top-4, sinks,
  window 128 on the even layers), except that the experts are bf16: the published checkpoint's
  ``quantization_config`` (MXFP4) is left out, so vLLM builds its unquantized MoE (Triton on
  Hopper). 21B parameters in bf16 are about 42 GB, which fits one 80 GB H100.

The Gemma 2 and gpt-oss folders also get a README.md: every value and where it came from.
``tests/unit/test_model_configs.py`` checks that vLLM accepts every folder and that running this
script reproduces the committed files byte for byte.

    python configs/make_model_configs.py              # rewrites configs/<model>/
    python configs/make_model_configs.py --out DIR    # writes DIR/<model>/ instead
    python configs/make_model_configs.py --help       # says so, writes nothing
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
BOS_ID, EOS_ID = 256, 257

# Fields every folder shares: the byte tokenizer's special ids, and the dtype we serve in.
COMMON = {
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "vocab_size": 128256,
}

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

GEMMA2 = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_activation": "gelu_pytorch_tanh",  # vLLM's Gemma2MLP refuses anything else
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,  # vLLM's Gemma2ForCausalLM asserts it
    "vocab_size": 256000,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
}

GPT_OSS = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "attention_bias": True,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 150000.0,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "original_max_position_embeddings": 4096,
        "truncate": False,
    },
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "vocab_size": 201088,
}


def alternating_layers(n: int) -> list[str]:
    """Sliding window on the even layers (0, 2, ...), full attention on the odd ones: Gemma 2's
    and gpt-oss's pattern (and the transformers default for both)."""
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]


@dataclass(frozen=True)
class Model:
    config: dict
    # Provenance, for README.md: the transformers config class whose defaults these
    # `hf_defaults` fields equal (the unit test compares them), the fields taken from the
    # published config.json, and ours (fields -> why they differ from the published model).
    hf_class: str = ""
    hf_defaults: tuple[str, ...] = ()
    published: tuple[str, ...] = ()
    published_from: str = ""
    ours: dict[str, str] = field(default_factory=dict)
    notes: str = ""

    @property
    def has_readme(self) -> bool:
        return bool(self.notes)


def _model(family: dict, **shape) -> dict:
    return {**COMMON, **family, **shape}


MODELS: dict[str, Model] = {
    "llama-3.1-8b": Model(
        _model(
            LLAMA,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            tie_word_embeddings=False,
            rope_scaling={**LLAMA3_ROPE, "factor": 8.0},
        )
    ),
    "llama-3.2-1b": Model(
        _model(
            LLAMA,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            tie_word_embeddings=True,
            rope_scaling={**LLAMA3_ROPE, "factor": 32.0},
        )
    ),
    "llama-3.1-70b": Model(
        _model(
            LLAMA,
            hidden_size=8192,
            intermediate_size=28672,
            num_hidden_layers=80,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=128,
            tie_word_embeddings=False,
            rope_scaling={**LLAMA3_ROPE, "factor": 8.0},
        )
    ),
    "gemma-2-9b": Model(
        _model(
            GEMMA2,
            hidden_size=3584,
            intermediate_size=14336,
            num_hidden_layers=42,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=4096,
            layer_types=alternating_layers(42),
        ),
        hf_class="Gemma2Config",
        hf_defaults=(
            "vocab_size",
            "head_dim",
            "max_position_embeddings",
            "query_pre_attn_scalar",
            "sliding_window",
            "layer_types",
            "attn_logit_softcapping",
            "final_logit_softcapping",
            "rms_norm_eps",
            "hidden_activation",
            "rope_parameters",
            "tie_word_embeddings",
            "attention_bias",
        ),
        published=(
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
        ),
        published_from=(
            "google/gemma-2-9b's (not fetched here: written from the issue and public copies of "
            "it; the same five numbers, with head dim 256 and query_pre_attn_scalar 256, are "
            "the 9b variant in transformers' PaliGemma 2 converter, "
            "src/transformers/models/paligemma/convert_paligemma2_weights_to_hf.py, which the "
            "wheel leaves out). Gemma2Config's own widths are Gemma-2-2B's (2304, 9216, 26 "
            "layers, 8/4 heads)"
        ),
        ours={
            "bos_token_id, eos_token_id": "the byte tokenizer's BOS/EOS (Gemma's are 2 and 1)",
            "torch_dtype": "the dtype we serve in",
        },
        notes=(
            "Gemma-2-9B's shape for vLLM with `--load-format dummy`; nothing is reduced. "
            "Attention per layer: {num_attention_heads} query heads, {num_key_value_heads} KV "
            "heads, head dim {head_dim}, scale 1/{inv_scale:g} (`query_pre_attn_scalar` "
            "{query_pre_attn_scalar} ** -0.5), logit soft cap {attn_logit_softcapping:g}; the "
            "even layers (0, 2, ..., {last_even}) have a {sliding_window}-token sliding window, "
            "the odd ones full attention (vLLM's gemma2.py reads `layer_types`). Final logits "
            "soft-capped at {final_logit_softcapping:g}. The context is "
            "{max_position_embeddings} tokens (`max_position_embeddings`) and a prompt plus its "
            "output must fit in it: with one output token the longest prompt is {max_prompt}."
            "\n\n{weights}"
        ),
    ),
    "gpt-oss-20b": Model(
        _model(
            GPT_OSS,
            hidden_size=2880,
            intermediate_size=2880,
            num_hidden_layers=24,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            sliding_window=128,
            layer_types=alternating_layers(24),
            num_local_experts=32,
            num_experts_per_tok=4,
        ),
        hf_class="GptOssConfig",
        hf_defaults=(
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "sliding_window",
            "layer_types",
            "num_experts_per_tok",
            "max_position_embeddings",
            "rms_norm_eps",
            "rope_parameters",
            "swiglu_limit",
            "attention_bias",
            "tie_word_embeddings",
        ),
        published=("num_hidden_layers", "num_local_experts"),
        published_from=(
            "openai/gpt-oss-20b's (not fetched here: written from the issue and public copies "
            "of it). GptOssConfig's own depth and expert count are gpt-oss-120b's (36 layers, "
            "128 experts)"
        ),
        ours={
            "bos_token_id, eos_token_id": "the byte tokenizer's BOS/EOS",
            "torch_dtype": "the dtype we serve in",
            "quantization_config": (
                "left out: the published checkpoint's experts are MXFP4; here they are bf16"
            ),
        },
        notes=(
            "gpt-oss-20b's shape for vLLM with `--load-format dummy`. The attention is the "
            "real model's: {num_attention_heads} query heads, {num_key_value_heads} KV heads, "
            "head dim {head_dim}, scale 1/{inv_scale:g}, a learned sink per query head "
            "(vLLM's gpt_oss.py always creates them), a {sliding_window}-token sliding window "
            "on the even layers (vLLM's gpt_oss.py picks them by `layer_idx % 2 == 0`; "
            "`layer_types` says the same), full attention on the odd ones, YaRN RoPE. Layers "
            "({num_hidden_layers}), widths, experts ({num_local_experts}, top-"
            "{num_experts_per_tok}) and vocabulary are the real ones too.\n\n"
            "One difference: no `quantization_config`, so the experts are bf16 instead of "
            "MXFP4 and vLLM runs its unquantized fused MoE (on Hopper: Triton, with the "
            "swigluoai activation and the expert biases). The attention is the real model's; "
            "the MoE layers take more memory and run at a different speed. {weights}"
        ),
    ),
}


def model_config(name: str) -> dict:
    return MODELS[name].config


def n_params(cfg: dict) -> int:
    """Parameters vLLM 0.26 creates for this config (the unit test has its counts, taken once
    from the model classes on the meta device)."""
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    attn = h * (q + 2 * kv) * hd + q * hd * h
    if cfg["attention_bias"]:
        attn += (q + 2 * kv) * hd + h
    if cfg["model_type"] == "gpt_oss":
        attn += q  # the sinks
    i = cfg["intermediate_size"]
    if "num_local_experts" in cfg:  # experts with biases (gate/up fused), plus the router
        e = cfg["num_local_experts"]
        mlp = e * (h * 2 * i + 2 * i + i * h + h) + h * e + e
    else:
        mlp = 3 * h * i
    norms = (4 if cfg["model_type"] == "gemma2" else 2) * h
    embeddings = cfg["vocab_size"] * h * (1 if cfg["tie_word_embeddings"] else 2)
    return cfg["num_hidden_layers"] * (attn + mlp + norms) + h + embeddings


def readme(name: str) -> str:
    m = MODELS[name]
    cfg = m.config
    params = n_params(cfg)
    facts = {
        **cfg,
        "last_even": (cfg["num_hidden_layers"] - 1) // 2 * 2,
        "max_prompt": cfg["max_position_embeddings"] - 1,
        "inv_scale": cfg.get("query_pre_attn_scalar", cfg["head_dim"]) ** 0.5,
        "weights": f"Weights in bf16: {params / 1e9:.2f}B parameters, {params * 2 / 1e9:.1f} GB "
        f"({params * 2 / 2**30:.1f} GiB) of the H100's 80 GB.",
    }

    def items(fields) -> str:
        return "\n".join(f"- `{f}`: {_value(f, cfg)}" for f in fields)

    ours = "\n".join(f"- `{f}`: {_value(f, cfg)}; {why}" for f, why in m.ours.items())
    return (
        f"# {name} (dummy weights)\n\n"
        "Written by `configs/make_model_configs.py` (edit that, then rerun it).\n\n"
        f"{m.notes.format(**facts)}\n\n"
        f"`{cfg['architectures'][0]}`, `model_type` {cfg['model_type']}. Where the values come "
        "from:\n\n"
        f"The defaults of transformers' `{m.hf_class}` (as of transformers 5.23.0; "
        "`tests/unit/test_model_configs.py` compares them with the installed one):\n\n"
        f"{items(m.hf_defaults)}\n\n"
        f"The published config.json, {m.published_from}:\n\n"
        f"{items(m.published)}\n\n"
        f"Ours:\n\n{ours}\n"
    )


def _value(fields: str, cfg: dict) -> str:
    """The value(s) of one README line, from the config itself so the text cannot drift."""
    values = []
    for f in fields.split(", "):
        if f == "rope_parameters":  # transformers folds rope_theta and rope_scaling into it
            scaling = cfg.get("rope_scaling")
            values.append(
                f"rope_theta {cfg['rope_theta']:g}"
                + (f", rope_scaling {json.dumps(scaling, sort_keys=True)}" if scaling else "")
            )
        elif f == "layer_types":
            lt = cfg[f]
            values.append(f"{lt[0]}, {lt[1]}, ... ({len(lt)} layers)")
        else:
            values.append(json.dumps(cfg[f]) if f in cfg else "(absent)")
    return "; ".join(values)


def byte_tokenizer_json() -> dict:
    """A byte-level BPE with no merges: every UTF-8 byte is one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BOS, EOS])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, BOS_ID)]
    )
    data = json.loads(tok.to_str())
    assert [t["id"] for t in data["added_tokens"]] == [BOS_ID, EOS_ID]
    return data


def tokenizer_config(max_len: int) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "add_bos_token": True,
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": False,
        "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: "
        "{{ m['content'] }}\n{% endfor %}assistant:",
    }


def folder_files(name: str, tokenizer: dict) -> dict[str, str]:
    """File name -> exact text, for one model folder."""
    cfg = model_config(name)
    files = {
        "config.json": cfg,
        "tokenizer.json": tokenizer,
        "tokenizer_config.json": tokenizer_config(cfg["max_position_embeddings"]),
        "special_tokens_map.json": {"bos_token": BOS, "eos_token": EOS},
        "generation_config.json": {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID},
    }
    texts = {f: json.dumps(c, indent=1, sort_keys=True) + "\n" for f, c in files.items()}
    if MODELS[name].has_readme:
        texts["README.md"] = readme(name)
    return texts


def write_all(root: Path = HERE) -> list[Path]:
    tokenizer = byte_tokenizer_json()
    folders = []
    for name in MODELS:
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for fname, text in folder_files(name, tokenizer).items():
            (folder / fname).write_text(text)
        folders.append(folder)
    return folders


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Write the model folders used with --load-format dummy (config.json, a byte "
        "tokenizer, README.md for Gemma 2 and gpt-oss): " + ", ".join(MODELS) + "."
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=HERE,
        help="folder to write <model>/ into (default: %(default)s, the committed configs)",
    )
    args = parser.parse_args(argv)  # --help and bad arguments exit here, before any write
    for folder in write_all(args.out):
        print(folder)


if __name__ == "__main__":
    main()
