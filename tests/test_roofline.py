"""rlkit.planning.roofline: model FLOPs from the shape (against torch's FlopCounterMode on the tiny model and verl's own estimator),
the peak table, and a
committed GRPO run's phases against their limits."""
import dataclasses
import json

import pytest

from rlkit.core.env import REPO_ROOT
from rlkit.experiments import estimates, grpo_runs
from rlkit.models import lengths as length_model
from rlkit.models import shape as model_shape
from rlkit.planning import roofline


def _counted(lens, *, backward: bool = False) -> dict[str, int]:
    """FLOPs torch's FlopCounterMode counts on the tiny random-init Qwen3 (eager attention, so that the attention's
    matmuls are counted too), one sequence at a time: ``linear`` every aten.mm (the projections and the lm_head),
    ``attention`` the decoder layers' aten.bmm (QK^T and AV, over the full L x L square: no causal mask in the count)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from rlkit.models.qwen import build_random_model

    model = build_random_model("tiny", seed=0, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    linear = attention = 0
    for n in lens:
        counter = FlopCounterMode(display=False)
        with counter:
            out = model(torch.arange(n).view(1, n)).logits
            if backward:
                out.sum().backward()
        counts = counter.get_flop_counts()
        linear += sum(v for op, v in counts["Global"].items() if str(op) == "aten.mm")
        attention += sum(v for name, ops in counts.items() if name.endswith("self_attn")
                         for op, v in ops.items() if str(op) == "aten.bmm")
    return {"linear": linear, "attention": attention}


def test_forward_flops_agree_with_torchs_flop_counter_on_the_tiny_model():
    """The linear FLOPs exactly; the attention half of the full square the counter sees (a causal mask leaves
    half of QK^T and AV to compute, which is what rlkit counts)."""
    s = model_shape.resolve_model("tiny")
    counted, ours = _counted([3, 5]), roofline.forward_flops(s, [3, 5])
    assert ours["linear"] == counted["linear"] > 0
    assert 2 * ours["attention"] == counted["attention"] > 0
    assert ours["total"] == ours["linear"] + ours["attention"]


def test_linear_params_are_the_tiny_models_linear_weights():
    import torch

    from rlkit.models.qwen import build_random_model

    model = build_random_model("tiny", seed=0)
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))  # the lm_head included
    assert roofline.linear_params(model_shape.resolve_model("tiny")) == weights


def test_update_model_flops_are_a_forward_and_a_backward_by_the_flop_counter():
    s = model_shape.resolve_model("tiny")
    work = roofline.StepShape(real_lens=(3, 5), padded_lens=(3, 5), gradient_checkpointing=False)
    update = roofline.compute_limits(s, work, 1e15, update_s=None, log_prob_s=None)["update_actor"]
    counted = _counted([3, 5], backward=True)
    assert update["model_flops"] == counted["linear"] + counted["attention"] / 2  # causal half, as above
    assert update["hardware_flops"] == update["model_flops"]  # no padding, no recompute


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
    assert limits["peak_bf16_flops"] is None and "not in rlkit.planning.roofline" in limits["peak_source"]
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
    # the fraction of the peak: the time the model FLOPs take at the peak over the time they took (2 s)
    assert lim["fraction"] == pytest.approx(lim["limit_s"] / 2.0, rel=1e-12) and lim["fraction"] < lim["hardware_fraction"]
    at_twice_the_peak = roofline.compute_limits(s, work, 2e15, update_s=2.0, log_prob_s=None)["update_actor"]
    assert at_twice_the_peak["limit_s"] == pytest.approx(lim["limit_s"] / 2, rel=1e-12)
    unpadded = roofline.step_shape({**recipe, "use_remove_padding": True}, {"prompt_length/mean": 20.0,
                                                                            "response_length/mean": 30.0})
    assert unpadded.padded_lens == unpadded.real_lens


def test_the_committed_full_arc_arm_against_its_limits():
    """Arm 5 as committed: its update runs far below the bf16 peak; old_log_prob is skipped, not compared."""
    run = REPO_ROOT / "outputs/05_grpo_qwen3_4b/5-master-on-host-cast-once"
    metrics = grpo_runs.read_results(run)
    gpu = json.loads((run / "env.json").read_text())["gpus"][0]["name"]
    limits = estimates.phase_limits(metrics, gpu)
    update = limits["phases"]["update_actor"]
    assert 0 < update["fraction"] < update["hardware_fraction"] < 1
    assert update["seconds"] == metrics["summary"]["update_actor_s"]
    assert limits["phases"]["old_log_prob"]["fraction"] is None  # skip_old_logprob: no pass to measure
    assert limits["tokens_per_sequence"]["computed"] == 512  # padded: 256 + 256, no remove-padding
    assert 0 <= limits["phases"]["between_phases"]["share_of_step"] < 1


# gen's bound from the memory bandwidth (rlkit.planning.roofline.decode_bound)

def _bound(shape, pmf, **kw):
    return roofline.decode_bound(shape, sequences=kw.pop("sequences", 2), prompt_tokens=kw.pop("prompt_tokens", 3),
                                 response_pmf=pmf, hbm_bytes_per_s=1e9, **kw)


def test_decode_bound_by_hand_for_two_sequences_of_the_tiny_preset():
    """Prompt 3, responses of 2 or 4 tokens (even odds). By hand: a 2-token response has one decode step reading 4
    KV tokens, a 4-token one three reading 4 + 5 + 6 = 15; the mean is 9.5 per sequence, 19 for the two. The longest
    of two responses is 4 with probability 3/4: E[max] = 3.5, so 2.5 decode steps read the weights."""
    s = model_shape.resolve_model("tiny")
    b = _bound(s, {2: 0.5, 4: 0.5})
    kv_token = 2 * s.layers * s.kv_heads * s.head_dim * 2
    assert b["kv_bytes"] == pytest.approx(19 * kv_token, rel=1e-12)
    assert b["decode_steps"] == pytest.approx(2.5, rel=1e-12) and b["steps_set_by"] == "the longest response"
    assert b["weight_bytes"] == pytest.approx(2.5 * roofline.linear_params(s) * 2, rel=1e-12)
    assert b["limit_s"] == pytest.approx((b["kv_bytes"] + b["weight_bytes"]) / 1e9, rel=1e-12)


def test_without_a_kv_cache_the_bound_is_the_weights_read_once_per_decode_step():
    s = dataclasses.replace(model_shape.resolve_model("tiny"), kv_heads=0)
    b = _bound(s, {10: 1.0})
    assert b["kv_bytes"] == 0 and b["limit_s"] == pytest.approx(9 * roofline.linear_params(s) * 2 / 1e9, rel=1e-12)


def test_decode_bound_grows_with_the_context_and_the_responses():
    s = model_shape.resolve_model("tiny")
    by_prompt = [_bound(s, {8: 1.0}, prompt_tokens=p)["limit_s"] for p in (0, 10, 100, 1000)]
    assert by_prompt == sorted(by_prompt) and len(set(by_prompt)) == 4
    by_mean = [_bound(s, length_model.response_length_pmf(m, 256), sequences=16)["limit_s"] for m in (2, 8, 64, 0)]
    assert by_mean == sorted(by_mean) and len(set(by_mean)) == 4


def test_decode_steps_are_set_by_the_tightest_of_length_concurrency_and_kv_pool():
    s = model_shape.resolve_model("tiny")
    assert _bound(s, {5: 1.0}, sequences=8, max_num_seqs=8)["decode_steps"] == 4  # all run at once
    few = _bound(s, {5: 1.0}, sequences=8, max_num_seqs=2)  # 8 x 4 decode tokens, 2 at a time
    assert few["decode_steps"] == 16 and few["steps_set_by"] == "max_num_seqs"
    small_pool = _bound(s, {5: 1.0}, sequences=8, prompt_tokens=3, kv_pool_tokens=8)  # 8 x (4+5+6+7) KV reads, 8 a step
    assert small_pool["decode_steps"] == 22 and small_pool["steps_set_by"] == "the KV pool"


def test_expected_longest_response_agrees_with_sampled_lengths():
    pmf = length_model.response_length_pmf(50, 300)
    sampled = [max(length_model.sample_response_lengths(50, 300, 64, seed=i)) for i in range(400)]
    assert roofline.expected_max(pmf, 64) == pytest.approx(sum(sampled) / len(sampled), rel=0.03)


def _committed_runs_with_gen():
    from rlkit.verl.logs import training_steps

    for run in sorted((REPO_ROOT / "outputs/05_grpo_qwen3_4b").glob("*/metrics.json")):
        metrics = grpo_runs.read_results(run.parent)
        if metrics.get("launched") and len(training_steps(metrics.get("steps", []))) >= 2:
            yield run.parent, metrics


def test_the_length_model_matches_the_committed_runs_lengths():
    """The distribution the bound integrates over is the runs' own: the mean of every step of a committed run with the
    synthetic length model within four standard errors of the model's mean of 256 draws (every step at lr 0, the first
    rollout otherwise: updates move the lengths), the longest response of 256 at the cap, as the model expects."""
    checked = 0
    for _, metrics in _committed_runs_with_gen():
        recipe = metrics["recipe"]
        if not recipe.get("response_length_mean"):
            continue
        pmf = length_model.response_length_pmf(recipe["response_length_mean"], recipe["max_response_length"])
        mean = sum(k * p for k, p in pmf.items())
        standard_error = (sum(k * k * p for k, p in pmf.items()) - mean**2) ** 0.5 / 256**0.5
        for step in metrics["steps"] if recipe["lr"] == 0 else metrics["steps"][:1]:
            assert abs(step["response_length/mean"] - mean) < 4 * standard_error
            assert step["response_length/max"] == recipe["max_response_length"]
        assert roofline.expected_max(pmf, 256) == pytest.approx(recipe["max_response_length"], abs=1)
        checked += 1
    assert checked >= 3


def test_gens_hbm_bound_never_exceeds_a_committed_gen_and_matches_the_hand_count():
    """A lower bound below every measured rollout; at the h200-1gpu shape it is the hand count in results.md (256
    decode steps of 8.0 GB weights and 2.0 TB of KV cache: 0.85 s at 4.8 TB/s)."""
    for run, metrics in _committed_runs_with_gen():
        gpu = json.loads((run / "env.json").read_text())["gpus"][0]["name"]
        hbm = estimates.phase_limits(metrics, gpu)["phases"]["gen"]["hbm_bound"]
        assert 0 < hbm["fraction"] < 1, run.name
    one_gpu = REPO_ROOT / "outputs/05_grpo_qwen3_4b/h200-1gpu-5-master-on-host-cast-once"
    hbm = estimates.phase_limits(grpo_runs.read_results(one_gpu), "NVIDIA H200")["phases"]["gen"]["hbm_bound"]
    assert hbm["limit_s"] == pytest.approx(0.85, abs=0.01) and hbm["hbm_source"].startswith("NVIDIA H200")


def test_length_distribution_is_a_distribution_with_the_models_mean():
    pmf = length_model.response_length_pmf(40, 100)
    assert sum(pmf.values()) == pytest.approx(1.0, abs=1e-12) and min(pmf) == 1 and max(pmf) == 100
    assert sum(k * p for k, p in pmf.items()) == pytest.approx(length_model.expected_response_tokens(40, 100), rel=1e-12)
    assert length_model.response_length_pmf(0, 100) == {100: 1.0}  # off: a random model runs to the cap


def test_each_vllm_replica_decodes_its_share_of_the_batch():
    recipe = {"train_batch_size": 4, "rollout_n": 4, "n_gpus": 1, "max_response_length": 64, "response_length_mean": 0}
    mean = {"prompt_length/mean": 10.0, "response_length/mean": 64.0}
    s = model_shape.resolve_model("tiny")
    one, two = (roofline.gen_hbm_bound({**recipe, "n_gpus": n}, mean, s, "NVIDIA H200", 1.0) for n in (1, 2))
    assert two["kv_bytes"] * 2 == one["kv_bytes"] and two["decode_steps"] == one["decode_steps"] == 63
    assert roofline.gen_hbm_bound(recipe, mean, s, "GTX 1080", 1.0) is None


@pytest.mark.parametrize("step, update, mfu, gen", [(84.9, 39.0, 0.24, 44.8), (74.1, 36.1, 0.26, 36.8),
                                                    (30.0, 25.0, 0.38, 3.0)])
def test_a_step_cut_given_by_the_update_or_gen_lands_on_the_target_step(step, update, mfu, gen):
    """Put back into the step, each answer of step_cut_needs gives the target step; the update's FLOPs stay the same
    (MFU x seconds is constant); a cut longer than the update leaves it no answer."""
    need = roofline.step_cut_needs(step, update, mfu, gen, 0.25, 0.40)
    rest = step - update - gen
    assert need["target_step_s"] == pytest.approx(0.75 * step)
    assert rest + need["update_alone_s"] + gen == pytest.approx(need["target_step_s"])
    assert need["update_alone_mfu"] * need["update_alone_s"] == pytest.approx(mfu * update)
    assert need["update_at_target_s"] * 0.40 == pytest.approx(mfu * update)
    assert rest + update + need["gen_alone_s"] == pytest.approx(need["target_step_s"])
    # with the update at the MFU target, gen gives only what the update leaves of the cut
    at_target = rest + need["update_at_target_s"] + need["gen_then_s"]
    assert at_target == pytest.approx(min(need["target_step_s"], rest + need["update_at_target_s"] + gen))
    assert roofline.step_cut_needs(step, 0.2 * step, mfu, gen, 0.25, 0.40)["update_alone_s"] is None
