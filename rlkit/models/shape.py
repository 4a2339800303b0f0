"""Model shapes for the planner and the roofline: layer counts, widths and parameter counts from a config.

A model is a transformers ``config.json`` dict, a local folder holding one, or a preset name of
:mod:`rlkit.models.qwen` (a hub id is matched to its preset by name). Pure arithmetic: no torch import.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.core.params import ParamError


def presets() -> dict[str, dict[str, Any]]:
    """Every model preset the planner knows: rlkit.models.qwen' Qwen2.5 and Qwen3 presets."""
    from rlkit.models.qwen import PRESETS

    return PRESETS


def preset_name(model: str) -> str | None:
    """``"Qwen/Qwen2.5-7B-Instruct"`` or ``"qwen2.5-7b"`` -> ``"qwen2.5-7b"``; None when no preset matches."""
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix in ("-instruct", "-base"):
        name = name.removesuffix(suffix)
    return name if name in presets() else None


@dataclass(frozen=True)
class ModelShape:
    """The shapes that decide memory: a Llama-style decoder (Qwen2 / Qwen3)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool  # tie_word_embeddings: lm_head shares the embedding matrix (counted once)
    qkv_bias: bool  # Qwen2: q/k/v projections have biases
    qk_norm: bool  # Qwen3: RMSNorm of head_dim on q and k in every layer

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.qkv_bias else 0)
        mlp = 3 * h * self.intermediate
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return attn + mlp + norms

    @property
    def root_params(self) -> int:
        """Embedding, final norm and (untied) lm_head: verl's root FSDP unit."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    @property
    def largest_flat_param(self) -> int:
        """verl wraps every decoder layer in its own FSDP unit; the root unit holds the rest."""
        return max(self.layer_params, self.root_params)

    @property
    def flat_params(self) -> int:
        return self.layers + 1

    def lora_params(self, rank: int) -> int:
        """LoRA A and B on every linear layer of every decoder layer (verl's ``target_modules: all-linear``)."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        in_plus_out = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
        return self.layers * rank * in_plus_out


_REQUIRED_CONFIG_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


_SUPPORTED_TYPES = ("qwen2", "qwen3", "llama", "mistral")


def shape_from_config(config: Mapping[str, Any], name: str = "config") -> ModelShape:
    """A :class:`ModelShape` from a transformers ``config.json`` dict.

    Required: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size and a
    supported model_type. As in transformers, num_key_value_heads defaults to num_attention_heads,
    head_dim to hidden_size // num_attention_heads and tie_word_embeddings to False.
    """
    model_type = config.get("model_type")
    if model_type not in _SUPPORTED_TYPES:
        raise ParamError(
            f"{name}: model_type {model_type!r} is not supported; supported: {list(_SUPPORTED_TYPES)}. "
            f"Fix: pass the config.json of a Llama-style decoder or a preset ({sorted(presets())})."
        )
    missing = [k for k in _REQUIRED_CONFIG_FIELDS if k not in config]
    if missing:
        raise ParamError(f"{name}: config is missing {missing}. Fix: pass the model's complete config.json.")
    for key in _REQUIRED_CONFIG_FIELDS:
        if not isinstance(config[key], int) or config[key] <= 0:
            raise ParamError(f"{name}: {key} must be a positive integer, got {config[key]!r}")
    heads = config["num_attention_heads"]
    return ModelShape(
        name=name,
        hidden=config["hidden_size"],
        intermediate=config["intermediate_size"],
        layers=config["num_hidden_layers"],
        heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        vocab=config["vocab_size"],
        tied=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
    )


def resolve_model(model: str | Mapping[str, Any]) -> ModelShape:
    """A preset name (or HF id matching one), a path to config.json (or its folder), or a config dict."""
    if isinstance(model, Mapping):
        return shape_from_config(model, str(model.get("_name_or_path", "config")))
    name = preset_name(model)
    if name is not None:
        return shape_from_config(presets()[name], name)
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return shape_from_config(json.loads(path.read_text()), str(path))
    raise ParamError(
        f"model: {model!r} is neither a preset ({sorted(presets())}) nor a config.json path. "
        f"Fix: use a preset name or the path of the model's config.json."
    )


def kv_bytes_per_seq(shape: ModelShape, seq_len: int, dtype_bytes: int = 2) -> int:
    """K and V of every layer for one sequence of ``seq_len`` tokens (the document's formula, in bytes)."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes * seq_len
