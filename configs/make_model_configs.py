"""Write the Llama-architecture model folders used with ``--load-format dummy``.

Each folder gets a Hugging Face ``config.json`` with the real model's shapes and a small
byte-level tokenizer generated here (no network, no downloaded weights): 256 byte tokens plus
BOS/EOS. Token ids above 257 exist in the model's vocabulary but are never produced by it.

    python configs/make_model_configs.py          # rewrites configs/<model>/
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
BOS_ID, EOS_ID = 256, 257

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

MODELS = {
    "llama-3.1-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
        rope_scaling={**LLAMA3_ROPE, "factor": 8.0},
    ),
    "llama-3.2-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        tie_word_embeddings=True,
        rope_scaling={**LLAMA3_ROPE, "factor": 32.0},
    ),
    "llama-3.1-70b": dict(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
        rope_scaling={**LLAMA3_ROPE, "factor": 8.0},
    ),
}


def model_config(shape: dict) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 128256,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        **shape,
    }


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


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "add_bos_token": True,
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
        "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: "
        "{{ m['content'] }}\n{% endfor %}assistant:",
    }


def write_all(root: Path = HERE) -> list[Path]:
    tokenizer = byte_tokenizer_json()
    folders = []
    for name, shape in MODELS.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        files = {
            "config.json": model_config(shape),
            "tokenizer.json": tokenizer,
            "tokenizer_config.json": tokenizer_config(),
            "special_tokens_map.json": {"bos_token": BOS, "eos_token": EOS},
            "generation_config.json": {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID},
        }
        for fname, content in files.items():
            (folder / fname).write_text(json.dumps(content, indent=1, sort_keys=True) + "\n")
        folders.append(folder)
    return folders


if __name__ == "__main__":
    for folder in write_all():
        print(folder)
