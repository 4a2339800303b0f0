"""rlkit.roofline: model FLOPs from the shape (cross-checked with verl's own estimator), the peak table, and a
committed GRPO run's phases against their limits."""
import json

import pytest

from rlkit import grpo, model_shape, roofline
from rlkit.env import REPO_ROOT


def test_forward_flops_by_hand_for_the_tiny_preset():
    s = model_shape.resolve_model("tiny")
    per_layer = s.hidden * s.q_dim + 2 * s.hidden * s.kv_dim + s.q_dim * s.hidden + 3 * s.hidden * s.intermediate
    f = roofline.forward_flops(s, [3, 5])
    assert f["linear"] == 2 * (s.layers * per_layer + s.vocab * s.hidden) * 8
    assert f["attention"] == 2 * s.layers * s.q_dim * (9 + 25)
    assert f["total"] == f["linear"] + f["attention"]


@pytest.mark.verl
def test_update_flops_agree_with_verls_estimator_less_its_embedding_term():
    """verl's flops_counter counts 6 x (linear + embedding + lm_head) per token and 6 x L^2 x q_dim per layer:
    rlkit's update (3 x forward, no recompute) is that minus the embedding lookup, which is no matmul."""
    from transformers import AutoConfig
    from verl.utils.flops_counter import _estimate_qwen2_flops

    shape = model_shape.resolve_model("qwen3-4b")
    config = AutoConfig.for_model(**model_shape.presets()["qwen3-4b"])
    lens = [337, 512, 100]
    verl_flops = _estimate_qwen2_flops(config, sum(lens), lens, 1.0) * 1e12
    ours = 3 * roofline.forward_flops(shape, lens)["total"]
    assert ours == pytest.approx(verl_flops - 6 * shape.vocab * shape.hidden * sum(lens), rel=1e-12)


def test_peak_table_matches_the_longest_name_and_says_when_it_does_not_know():
    assert roofline.peak_bf16_flops("NVIDIA H100 PCIe")[0] == 756.0e12
    assert roofline.peak_bf16_flops("NVIDIA H100 80GB HBM3")[0] == 989.4e12
    assert roofline.peak_bf16_flops("NVIDIA GeForce GTX 1080") is None
    steps = [{"timing_s/step": 10.0, "timing_s/update_actor": 5.0, "prompt_length/mean": 10.0, "response_length/mean": 20.0}]
    recipe = {"train_batch_size": 2, "rollout_n": 2, "n_gpus": 1, "max_prompt_length": 16, "max_response_length": 32}
    limits = roofline.grpo_step_limits(recipe, steps, model_shape.resolve_model("tiny"), "GTX 1080", pinned_gbps=None)
    assert limits["peak_bf16_flops"] is None and "not in rlkit.roofline" in limits["peak_source"]
    assert "update_actor" not in limits["phases"] and limits["phases"]["between_phases"]["seconds"] == 5.0


def test_padding_and_recompute_are_hardware_flops_not_model_flops():
    s = model_shape.resolve_model("tiny")
    recipe = {"train_batch_size": 4, "rollout_n": 2, "n_gpus": 2, "max_prompt_length": 64, "max_response_length": 64,
              "use_remove_padding": False, "gradient_checkpointing": True}
    work = roofline.step_shape(recipe, {"prompt_length/mean": 20.0, "response_length/mean": 30.0})
    assert work.real_lens == (50,) * 4 and work.padded_lens == (128,) * 4
    lim = roofline.compute_limits(s, work, 1e15, update_s=2.0, log_prob_s=None)["update_actor"]
    assert lim["model_flops"] == 3 * roofline.forward_flops(s, [50] * 4)["total"]
    assert lim["hardware_flops"] == 4 * roofline.forward_flops(s, [128] * 4)["total"]
    assert lim["fraction"] == lim["model_flops"] / 2.0 / 1e15 and lim["limit_s"] == lim["model_flops"] / 1e15
    unpadded = roofline.step_shape({**recipe, "use_remove_padding": True}, {"prompt_length/mean": 20.0,
                                                                            "response_length/mean": 30.0})
    assert unpadded.padded_lens == unpadded.real_lens


def test_the_committed_full_arc_arm_against_its_limits():
    """Arm 5 as committed: its update runs far below the bf16 peak; old_log_prob is skipped, not compared."""
    run = REPO_ROOT / "outputs/05_grpo_qwen3_4b/5-master-on-host-cast-once"
    metrics = grpo.read_results(run)
    gpu = json.loads((run / "env.json").read_text())["gpus"][0]["name"]
    limits = grpo.phase_limits(metrics, gpu)
    update = limits["phases"]["update_actor"]
    assert 0 < update["fraction"] < update["hardware_fraction"] < 1
    assert update["seconds"] == metrics["summary"]["update_actor_s"]
    assert limits["phases"]["old_log_prob"]["fraction"] is None  # skip_old_logprob: no pass to measure
    assert limits["tokens_per_sequence"]["computed"] == 512  # padded: 256 + 256, no remove-padding
    assert 0 <= limits["phases"]["between_phases"]["share_of_step"] < 1
