"""The offline random-init model directory loads with transformers alone, with a padded tokenizer."""
from __future__ import annotations

import pytest
import torch

from rlkit.models import offline as offline_model
from rlkit.models import qwen as models
from rlkit.models.data import corpus, synthetic_rows

TEXTS = [
    "Solve: (12 + 7) \\times 3 = ?\nAnswer: 57",
    "  leading spaces, tabs\tand\nnewlines  ",
    "Ünïcödé ✓ 日本語 — emoji 🙂 and symbols ∑∫",
    "",
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-model")
    info = offline_model.write_offline_model("tiny", out, seed=0, dtype="float32", device="cpu")
    return out, info


def test_loads_offline_with_auto_classes(tiny_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, info = tiny_dir
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    config = models.preset_config("tiny")
    assert info["parameters"] == models.count_parameters(model)
    assert len(tokenizer) == model.config.vocab_size == config.vocab_size == info["tokenizer_size"]
    assert tokenizer.eos_token_id == model.config.eos_token_id == config.eos_token_id
    assert tokenizer.pad_token_id == config.bos_token_id
    ids = tokenizer(TEXTS[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size)


def test_tokenizer_round_trips_text(tiny_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir[0])
    for text in TEXTS:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text


def test_every_id_decodes_to_text(tiny_dir):
    # Unknown ids would decode to "" and make a response-hash reward constant within a group.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir[0])
    specials = {i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special}
    assert specials == set(offline_model.special_token_ids(1, 2).values())
    empty = [i for i in range(len(tokenizer)) if i not in specials
             and tokenizer.decode([i], skip_special_tokens=True) == ""]
    assert empty == []


def test_chat_template_is_qwen_style(tiny_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir[0])
    text = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=True,
                                        add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_existing_directory_is_reused(tiny_dir):
    out, info = tiny_dir
    weights = out / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert offline_model.write_offline_model("tiny", out, seed=0, dtype="float32") == info
    assert weights.stat().st_mtime_ns == before


def test_qwen_vocabulary_is_padded_with_qwen_special_ids():
    config = models.preset_config("qwen3-4b")
    tokenizer = offline_model.build_tokenizer(corpus(synthetic_rows(300)), config.vocab_size,
                                              config.bos_token_id, config.eos_token_id)
    assert len(tokenizer) == 151936
    assert tokenizer.convert_ids_to_tokens([151643, 151644, 151645]) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert tokenizer.eos_token_id == 151645 and tokenizer.pad_token_id == 151643
    assert tokenizer.decode([151935, 100000]) != ""


def test_an_incomplete_directory_is_replaced_and_nothing_partial_is_left(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"half written")  # no marker: a crashed writer's leftover
    info = offline_model.write_offline_model("tiny", out, seed=0, dtype="float32", device="cpu")
    assert info["path"] == str(out) and (out / offline_model.MARKER).exists()
    assert (out / "model.safetensors").stat().st_size > 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
