"""Random-init Qwen models from exact configs (no downloads), and the real loading path.

Presets carry every field of the published config: ``transformers.Qwen3Config()`` defaults are not
Qwen3-4B, so nothing is left to defaults. ``qwen3-735m`` is Qwen3-0.6B's layer shape with 37 layers
(tied embeddings), the ~735M-parameter model of the offload-bug reproduction; ``qwen3-30m`` is the ~31M
model of the learning check (notebook 07); ``tiny`` runs on a CPU in milliseconds; the Qwen2.5 presets are the second source document's models (Qwen2 architecture:
biases on the q/k/v projections).
"""
from __future__ import annotations

from typing import Any

_QWEN3_COMMON: dict[str, Any] = {
    "model_type": "qwen3",
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 36,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}

_QWEN25_COMMON: dict[str, Any] = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_act": "silu",
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_position_embeddings": 32768,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}

PRESETS: dict[str, dict[str, Any]] = {
    # Qwen/Qwen2.5-0.5B-Instruct config.json.
    "qwen2.5-0.5b": {
        **_QWEN25_COMMON,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_window_layers": 21,
    },
    # Qwen/Qwen2.5-7B-Instruct config.json.
    "qwen2.5-7b": {
        **_QWEN25_COMMON,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
        "max_window_layers": 28,
    },
    # Qwen/Qwen3-4B config.json (packaging notes): 4,022,468,096 parameters.
    "qwen3-4b": {
        **_QWEN3_COMMON,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_position_embeddings": 40960,
    },
    # Qwen/Qwen3-8B config.json.
    "qwen3-8b": {
        **_QWEN3_COMMON,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "max_position_embeddings": 40960,
    },
    # Qwen3-0.6B's layer shape, 37 layers: ~738M parameters (the offload-bug model).
    "qwen3-735m": {
        **_QWEN3_COMMON,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 37,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_position_embeddings": 40960,
        "max_window_layers": 37,
    },
    # A ~31M-parameter Qwen3 (qk-norm, GQA, SiLU MLP, tied embeddings) for the learning check of notebook 07:
    # dozens of GRPO steps take minutes on one GPU. Its vocabulary is sized to the offline tokenizer
    # (rlkit.models.offline trains ~4.6k byte-level BPE tokens on the synthetic DAPO texts), so nearly every id
    # is a learned token and a sampled response is text, not <|filler_N|> padding; ids 1/2 are bos/eos as in
    # "tiny". 30,681,728 parameters (tests/test_learning.py counts them from this config).
    "qwen3-30m": {
        **_QWEN3_COMMON,
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 9,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "vocab_size": 4608,
        "tie_word_embeddings": True,
        "max_position_embeddings": 4096,
        "max_window_layers": 9,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    # A CPU-sized Qwen3 for tests and tiny notebook profiles.
    "tiny": {
        **_QWEN3_COMMON,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 512,
        "tie_word_embeddings": True,
        "max_position_embeddings": 2048,
        "max_window_layers": 2,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}


def preset_config(name: str, **overrides: Any):
    """The transformers config (Qwen3Config or Qwen2Config) for preset ``name``, every field set, with overrides."""
    from transformers import AutoConfig

    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
    fields = {**PRESETS[name], **overrides}
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def build_random_model(name: str, *, seed: int = 0, dtype=None, device=None, **overrides: Any):
    """A randomly initialised causal LM for preset ``name`` (deterministic per seed)."""
    return random_model(preset_config(name, **overrides), seed=seed, dtype=dtype, device=device)


def random_model(config, *, seed: int = 0, dtype=None, device=None):
    """A randomly initialised causal LM of ``config`` (deterministic per seed)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    return model


def count_parameters(model) -> int:
    """Parameters counted once (tied embeddings are one tensor)."""
    return sum(p.numel() for p in model.parameters())
