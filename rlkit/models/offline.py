"""A random-init checkpoint + tokenizer directory that transformers, verl and vLLM load with no network.

``write_offline_model(preset, out_dir)`` writes, for a preset of :mod:`rlkit.models.qwen` (every field of
the published config):

- ``config.json`` + ``model.safetensors`` (``save_pretrained``), ``generation_config.json``;
- a tokenizer trained offline with the ``tokenizers`` library: byte-level BPE (so any text
  round-trips exactly) on the synthetic DAPO texts, Qwen-style special tokens
  (``<|endoftext|>`` = the config's bos/pad id, ``<|im_end|>`` = its eos id, ``<|im_start|>``) and a
  Qwen-style chat template. Its vocabulary is **padded to the model's vocab_size** with tokens
  ``<|filler_N|>``: a random model samples every id, and ids the tokenizer does not know decode to
  empty strings, which makes a text-hash reward constant within a group (zero advantages; seen on the
  GPU node with a 151,936-row model).

With ``response_length_mean`` > 0 the weights also carry :mod:`rlkit.models.lengths`, a synthetic length model:
responses end on EOS after a geometric number of tokens of that mean (same architecture, same parameter
count; one embedding column and one final-norm weight hold other values). 0, the default, is the plain
random model, bit for bit as before. The option and its calibration are recorded in the directory's ``rlkit_offline_model.json``.

The real path needs nothing from here: pass a hub id or a local directory as the recipe's ``model``.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from rlkit.core.env import REPO_ROOT
from rlkit.core.jsonio import partial_suffix
from rlkit.models import lengths as length_model
from rlkit.models import qwen as models

GENERATED_MODELS = REPO_ROOT / "data" / "generated" / "models"
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# Qwen2.5/Qwen3-style template without the thinking switch: user/assistant turns framed by
# <|im_start|>role ... <|im_end|>, and an open assistant turn when add_generation_prompt is set.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def special_token_ids(bos_token_id: int, eos_token_id: int) -> dict[str, int]:
    """Where the special tokens sit: Qwen's layout (151643/151644/151645) for the Qwen presets."""
    im_start = bos_token_id + 1 if bos_token_id + 1 != eos_token_id else eos_token_id + 1
    return {ENDOFTEXT: bos_token_id, IM_START: im_start, IM_END: eos_token_id}


def build_tokenizer(texts: list[str], vocab_size: int, bos_token_id: int, eos_token_id: int,
                    bpe_vocab_size: int = 8192):
    """A byte-level BPE ``PreTrainedTokenizerFast`` with exactly ``vocab_size`` ids (padded)."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors, trainers
    from tokenizers import models as tk_models
    from transformers import PreTrainedTokenizerFast

    specials = special_token_ids(bos_token_id, eos_token_id)
    if max(specials.values()) >= vocab_size:
        raise ValueError(f"special token ids {specials} do not fit a vocabulary of {vocab_size}")
    trained = Tokenizer(tk_models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=min(bpe_vocab_size, vocab_size - len(specials)),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    trained.train_from_iterator(texts, trainer=trainer)
    learned = json.loads(trained.to_str())["model"]
    # Re-number: special ids first (their fixed places), learned tokens in the free ids in their
    # order, fillers up to vocab_size. BPE merges are by token string, so re-numbering is safe.
    vocab: dict[str, int] = dict(specials)
    free = (i for i in range(vocab_size) if i not in set(specials.values()))
    for token, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        vocab[token] = next(free)
    for filler, token_id in enumerate(free):
        vocab[f"<|filler_{filler}|>"] = token_id
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tokenizer = Tokenizer(tk_models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens(list(specials))  # already in the vocab: keeps their ids
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )


def default_dir(preset: str, seed: int = 0, response_length_mean: int = 0) -> Path:
    suffix = f"-len{response_length_mean}" if response_length_mean else ""
    return GENERATED_MODELS / f"{preset}-random-seed{seed}{suffix}"


def write_offline_model(preset: str, out_dir: str | Path | None = None, *, seed: int = 0, dtype: str = "bfloat16",
                        device: str | None = None, texts: list[str] | None = None, response_length_mean: int = 0,
                        overwrite: bool = False) -> dict[str, Any]:
    """Write a random-init ``preset`` checkpoint and its padded tokenizer into ``out_dir``.

    ``response_length_mean`` > 0 calibrates the synthetic length model (:mod:`rlkit.models.lengths`) into the
    weights; 0 writes the plain random model. An existing complete directory (``rlkit_offline_model.json``
    matching preset, seed, dtype and response_length_mean) is reused unless ``overwrite``. The checkpoint is
    written into a sibling folder and renamed into place, so concurrent jobs (two sweep points starting
    together) never read a half-written one. Returns a description (path, parameter count, vocab sizes, the
    length model's calibration or None).
    """
    import torch
    from transformers import GenerationConfig

    out = Path(out_dir) if out_dir else default_dir(preset, seed, response_length_mean)
    wanted = {"preset": preset, "seed": seed, "dtype": dtype, "response_length_mean": response_length_mean}
    existing = _complete(out, wanted)
    if existing is not None and not overwrite:
        return existing
    if texts is None:
        from rlkit.models.data import corpus, synthetic_rows

        texts = corpus(synthetic_rows(2000, seed=seed))
    config = models.preset_config(preset)
    length_model.validate_mean(response_length_mean, config.vocab_size)
    tokenizer = build_tokenizer(texts, config.vocab_size, config.bos_token_id, config.eos_token_id)
    torch_dtype = getattr(torch, dtype)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = models.random_model(config, seed=seed, dtype=torch_dtype, device=device)
    calibration = length_model.apply_length_model(model, response_length_mean, seed=seed) if response_length_mean else None
    tmp = out.with_name(f"{out.name}.{partial_suffix()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.bos_token_id, do_sample=True).save_pretrained(tmp)
    info = {**wanted, "path": str(out), "parameters": models.count_parameters(model),
            "vocab_size": config.vocab_size, "tokenizer_size": len(tokenizer),
            "special_tokens": special_token_ids(config.bos_token_id, config.eos_token_id),
            "length_model": calibration}
    del model
    (tmp / MARKER).write_text(json.dumps(info, indent=2))
    if out.exists() and (overwrite or _complete(out, wanted) is None):
        shutil.rmtree(out)  # an incomplete leftover, or one to overwrite
    try:
        os.rename(tmp, out)
    except OSError:  # another process put the same checkpoint there first
        shutil.rmtree(tmp)
        if _complete(out, wanted) is None:
            raise
    return info


MARKER = "rlkit_offline_model.json"


def _complete(out: Path, wanted: dict[str, Any]) -> dict[str, Any] | None:
    """The description of a finished checkpoint in ``out`` matching ``wanted`` (None otherwise)."""
    marker = out / MARKER
    if not marker.exists():
        return None
    info = json.loads(marker.read_text())
    info.setdefault("response_length_mean", 0)  # markers written before the length model: the plain model
    return info if all(info.get(k) == v for k, v in wanted.items()) else None


def read_marker(model_dir: str | Path) -> dict[str, Any] | None:
    """The description in a model directory written here (None for any other directory)."""
    marker = Path(model_dir) / MARKER
    return json.loads(marker.read_text()) if marker.is_file() else None
