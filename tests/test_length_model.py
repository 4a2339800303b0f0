"""The synthetic length model of random-init checkpoints (rlkit.models.lengths): real transformers sampling on the
tiny preset ends every response on EOS after a geometric number of tokens of the configured mean, with the
architecture, config and parameter count of the plain random model; 0 (off) is the old checkpoint bit for bit."""
from __future__ import annotations

import json
import math

import pytest
import torch

from rlkit.core import params as P
from rlkit.models import lengths as length_model
from rlkit.models import offline as offline_model
from rlkit.models import qwen as models
from rlkit.models.data import corpus, synthetic_rows
from rlkit.planning import preflight
from rlkit.recipes import grpo as R

MEAN = 8  # tokens: short responses keep the sampling test to a few tens of decode steps on a CPU
SAMPLES = 1024


def _tensors(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("length-model")
    texts = corpus(synthetic_rows(300))  # the tokenizer's training texts (the weights do not depend on them)
    plain = offline_model.write_offline_model("tiny", root / "plain", seed=0, device="cpu", texts=texts)
    length = offline_model.write_offline_model("tiny", root / "len", seed=0, device="cpu", texts=texts,
                                               response_length_mean=MEAN)
    return root / "plain", plain, root / "len", length


def test_off_reproduces_the_plain_random_weights_bit_exactly(dirs):
    plain_dir, plain, _, _ = dirs
    assert plain["response_length_mean"] == 0 and plain["length_model"] is None
    assert offline_model.default_dir("tiny", 0) == offline_model.default_dir("tiny", 0, 0)  # the old folder name
    # the checkpoint as it was written before the length model existed: random_model of the preset, in bf16
    old = models.random_model(models.preset_config("tiny"), seed=0, dtype=torch.bfloat16).state_dict()
    written = _tensors(plain_dir)
    assert set(written) <= set(old) and set(old) - set(written) <= {"lm_head.weight"}  # tied: saved once
    for name, tensor in written.items():
        assert tensor.dtype == old[name].dtype and torch.equal(tensor.view(torch.int16), old[name].view(torch.int16)), name
    # a directory whose marker predates the option is the plain model, reused as it is
    marker = json.loads((plain_dir / offline_model.MARKER).read_text())
    for key in ("response_length_mean", "length_model"):
        marker.pop(key)
    (plain_dir / offline_model.MARKER).write_text(json.dumps(marker))
    before = (plain_dir / "model.safetensors").stat().st_mtime_ns
    assert offline_model.write_offline_model("tiny", plain_dir, seed=0)["response_length_mean"] == 0
    assert (plain_dir / "model.safetensors").stat().st_mtime_ns == before


def test_length_model_keeps_config_architecture_and_parameter_count(dirs):
    from transformers import AutoModelForCausalLM

    plain_dir, plain, len_dir, length = dirs
    assert json.loads((len_dir / "config.json").read_text()) == json.loads((plain_dir / "config.json").read_text())
    assert length["parameters"] == plain["parameters"] == models.count_parameters(AutoModelForCausalLM.from_pretrained(len_dir))
    assert length["response_length_mean"] == MEAN and length["length_model"]["response_length_mean"] == MEAN
    a, b = _tensors(plain_dir), _tensors(len_dir)
    assert {k: (v.shape, v.dtype) for k, v in a.items()} == {k: (v.shape, v.dtype) for k, v in b.items()}
    # the only values that differ: one embedding column (tied: also the lm_head) and one final-norm weight
    k, eos = length_model.COORDINATE, models.PRESETS["tiny"]["eos_token_id"]
    changed = {name for name in a if not torch.equal(a[name], b[name])}
    assert changed == {"model.embed_tokens.weight", "model.norm.weight"}
    emb_diff = (a["model.embed_tokens.weight"] != b["model.embed_tokens.weight"]).nonzero()
    assert set(emb_diff[:, 1].tolist()) == {k}
    assert (b["model.norm.weight"] != a["model.norm.weight"]).nonzero().flatten().tolist() == [k]
    column = b["model.embed_tokens.weight"][:, k].float()
    assert column[eos] == 0 and torch.all(column[torch.arange(len(column)) != eos] == length["length_model"]["embedding_constant"])
    calibration = length["length_model"]
    assert calibration["coordinate_share_min"] > 0.99
    assert calibration["eos_probability"]["mean"] == pytest.approx(1 / MEAN, rel=0.02)


def test_sampled_responses_end_on_eos_with_lengths_of_the_configured_mean(dirs):
    """Real transformers sampling (temperature 1, no top-k / top-p: verl's rollout defaults) from chat-templated
    synthetic DAPO prompts.

    Tolerance on the mean of SAMPLES lengths: if the model is what it claims, a length is Geometric(p = 1/MEAN)
    (EOS counted), standard deviation sigma = sqrt(1 - p) / p = 7.48 tokens, so the sample mean has a standard error
    sigma / sqrt(SAMPLES) = 0.23 (normal by the CLT at this N). Allowed: 4 standard errors (a correct model
    lands outside with probability 6e-5) plus 5 % of the mean for what the calibration cannot reach (the bf16
    final-norm weight sets p to ~1 %, and p varies by +-3 % between contexts). 1.33 tokens in all; the plain
    random model (every response 20 x MEAN tokens, no EOS) is 150 tokens away. The spread: the sample standard
    deviation of a geometric has a relative standard error ~sqrt((kurtosis - 1) / 4N) = 4.4 %; allowed 25 %.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, _, len_dir, _ = dirs
    tokenizer = AutoTokenizer.from_pretrained(len_dir)
    tokenizer.padding_side = "left"
    # the checkpoint's bf16 values, computed in fp32 (exact upcast; twice as fast on a CPU); one thread, as the
    # batch is small work per decode step and extra threads only contend on a shared CPU
    model = AutoModelForCausalLM.from_pretrained(len_dir, dtype=torch.float32).eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
             for r in synthetic_rows(SAMPLES, seed=3)]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    cap = 20 * MEAN
    torch.manual_seed(0)
    try:
        with torch.no_grad():
            out = model.generate(**batch, do_sample=True, top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=cap,
                                 eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    finally:
        torch.set_num_threads(threads)
    responses = out[:, batch["input_ids"].shape[1]:]
    is_eos = responses == tokenizer.eos_token_id
    assert bool(is_eos.any(dim=1).all()), "every response ends on EOS"
    lengths = (is_eos.float().argmax(dim=1) + 1).float()  # up to and including the first EOS, as verl counts it
    p = length_model.eos_probability(MEAN)
    sigma = math.sqrt(1 - p) / p
    tolerance = 4 * sigma / math.sqrt(SAMPLES) + 0.05 * MEAN
    expected = length_model.expected_response_tokens(MEAN, cap)
    print(f"{SAMPLES} responses: mean {lengths.mean().item():.3f} (expected {expected:.3f} +- {tolerance:.2f}), "
          f"std {lengths.std().item():.2f} (geometric {sigma:.2f}), min {lengths.min().item():.0f}, max {lengths.max().item():.0f}")
    assert abs(lengths.mean().item() - expected) <= tolerance, (lengths.mean().item(), expected, tolerance)
    assert abs(lengths.std().item() / sigma - 1) <= 0.25, lengths.std().item()
    assert lengths.min().item() == 1 and lengths.max().item() > 4 * MEAN and len(set(lengths.tolist())) > 20


def test_expected_response_tokens_is_the_capped_geometric_mean():
    assert length_model.expected_response_tokens(0, 256) == 256
    assert length_model.expected_response_tokens(2, 1) == 1.0  # one token: always that one
    assert length_model.expected_response_tokens(4, 3) == pytest.approx(1 + 0.75 + 0.75**2)  # sum of P(L > i)
    assert length_model.expected_response_tokens(256, 10**6) == pytest.approx(256)
    with pytest.raises(ValueError, match="response_length_mean"):
        length_model.validate_mean(1, 512)
    with pytest.raises(ValueError, match="response_length_mean"):
        length_model.validate_mean(512, 512)


def test_recipe_field_reaches_the_model_folder_and_the_planner(dirs):
    assert R.default_paths(R.GRPORecipe(model="tiny", response_length_mean=MEAN)).model.endswith("tiny-random-seed0-len8")
    assert R.default_paths(R.GRPORecipe(model="tiny")).model.endswith("tiny-random-seed0")
    assert R.GRPORecipe().response_length_mean == 0  # off unless asked for
    for bad in ({"response_length_mean": 1}, {"response_length_mean": -3}, {"model": "/models/Qwen3-4B", "response_length_mean": 256}):
        with pytest.raises(P.ParamError, match=r"GRPORecipe\.response_length_mean: .*Fix: "):
            R.GRPORecipe(**{"model": "tiny", **bad})
    # pre-flight reads the mean from the model folder's marker: the planner counts the expected tokens
    _, _, len_dir, _ = dirs
    base = ["actor_rollout_ref.rollout.n=2", "data.train_batch_size=4", "data.max_prompt_length=64",
            "data.max_response_length=64", "trainer.n_gpus_per_node=1", "actor_rollout_ref.actor.use_dynamic_bsz=True",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=512"]
    spec = preflight.planner_spec_for_overrides(base + [f"actor_rollout_ref.model.path={len_dir}"], gpu_gib=10.0)
    assert spec.mean_response_tokens == pytest.approx(length_model.expected_response_tokens(MEAN, 64))
    plain = preflight.planner_spec_for_overrides(base + [f"actor_rollout_ref.model.path={dirs[0]}"], gpu_gib=10.0)
    assert plain.mean_response_tokens == 0


def test_sampled_lengths_follow_the_capped_geometric_model():
    """sample_response_lengths (workloads that need only the lengths, e.g. rlkit.experiments.update_profile): their
    mean is expected_response_tokens' E[min(L, cap)] to sampling error, the cap holds, a seed repeats itself."""
    n = 20000
    lengths = length_model.sample_response_lengths(1200, 4096, n, seed=0)
    expected = length_model.expected_response_tokens(1200, 4096)
    # sd of min(L, cap) < 1200 (a geometric's sd is ~ its mean), so the sample mean is within 4 sd / sqrt(n) ~ 34
    assert abs(sum(lengths) / n - expected) < 4 * 1200 / math.sqrt(n)
    assert min(lengths) >= 1 and max(lengths) == 4096  # P(L > 4096) = 3 %: capped ones occur
    assert length_model.sample_response_lengths(1200, 4096, 50, seed=0) == lengths[:50]
    assert length_model.sample_response_lengths(1200, 4096, 50, seed=1) != lengths[:50]
    assert length_model.sample_response_lengths(0, 64, 3) == [64, 64, 64]  # off: every response runs to the cap
    short = length_model.sample_response_lengths(2, 10, 4000, seed=0)
    assert abs(sum(short) / 4000 - length_model.expected_response_tokens(2, 10)) < 0.1
    for bad in (1, -3, 2.5):
        with pytest.raises(ValueError, match="mean_tokens"):
            length_model.sample_response_lengths(bad, 10, 1)
