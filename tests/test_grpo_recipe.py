"""The GRPO recipe: strict parameters, overrides that verl 0.9.1's own config accepts, console-metric
parsing on a verl-format log, rewards, results reading and the CLI."""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
from pathlib import Path

import pytest

from rlkit import patches
from rlkit.core import params as P
from rlkit.core.results import load_profile
from rlkit.experiments import estimates, grpo, grpo_runs
from rlkit.models import data, reward
from rlkit.models import offline as offline_model
from rlkit.recipes import check
from rlkit.recipes import grpo as R
from rlkit.recipes import job as verl_job
from rlkit.recipes.overrides import render_overrides
from rlkit.verl import logs as verl_logs

FIXTURE = Path(__file__).parent / "fixtures" / "verl_console_sample.log"


def _recipe(**changes) -> R.GRPORecipe:
    return R.GRPORecipe(**changes)


def test_defaults_are_the_mission_run():
    r = R.GRPORecipe()
    assert (r.model, r.data, r.train_batch_size, r.rollout_n) == ("qwen3-4b", "synthetic", 32, 8)
    assert (r.ppo_mini_batch_size, r.ppo_epochs, r.n_gpus, r.fsdp_size) == (32, 1, 2, 1)
    assert r.param_offload and r.free_cache_engine and r.gpu_memory_utilization == 0.85
    assert r.resolved_reward == "synthetic_hash"  # random-init weights
    assert _recipe(model="/models/Qwen3-4B").resolved_reward == "dapo_math"


@pytest.mark.parametrize("changes, key", [
    ({"ppo_mini_batch_size": 24}, "ppo_mini_batch_size"),
    ({"gpu_memory_utilization": 1.2}, "gpu_memory_utilization"),
    ({"patches": ("offload_views", "nope")}, "patches"),
    ({"patches": ("no_shard", "no_shard")}, "patches"),
    ({"optimizer": "HostAdamW"}, "optimizer_offload"),
    ({"n_gpus": 3}, "n_gpus"),
    ({"fsdp_size": 4}, "fsdp_size"),
    ({"data_rows": 8}, "data_rows"),
    ({"host_overlap_copies": True}, "optimizer"),
    ({"host_overlap_copies": True, "optimizer": "HostAdamW", "optimizer_offload": False, "host_pin_memory": False},
     "host_pin_memory"),
    ({"host_overlap_copies": True, "optimizer": "HostAdamW", "optimizer_offload": False, "host_rank0_owner": True},
     "host_rank0_owner"),
    ({"host_prefetch_grads": True}, "optimizer"),
    ({"host_prefetch_grads": True, "optimizer": "HostAdamW", "optimizer_offload": False, "host_pin_memory": False},
     "host_pin_memory"),
])
def test_bad_recipe_names_the_key_and_fix(changes, key):
    with pytest.raises(P.ParamError, match=rf"GRPORecipe\.{key}: .*Fix: "):
        _recipe(**changes)


@pytest.mark.parametrize("profile", ["tiny", "h200", "h200-seed", "h200-1gpu"])
def test_profiles_hold_exactly_the_recipe_fields(profile):
    values = load_profile(grpo.NOTEBOOK, profile)
    assert set(values) == set(P.field_names(R.GRPORecipe))
    P.build(R.GRPORecipe, values)


def test_overrides_carry_the_recipe():
    r = _recipe(optimizer="HostAdamW", optimizer_offload=False, patches=("offload_views",), steps=3)
    paths = R.Paths(model="/m", train_file="/d.parquet")
    ov = render_overrides(r, paths)
    for expected in ("data.train_batch_size=32", "actor_rollout_ref.rollout.n=8",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.actor.ppo_epochs=1",
                     "actor_rollout_ref.actor.fsdp_config.fsdp_size=1", "actor_rollout_ref.model.path=/m",
                     "actor_rollout_ref.actor.fsdp_config.param_offload=True",
                     "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
                     "actor_rollout_ref.actor.optim.optimizer_impl=rlkit.optim",
                     "actor_rollout_ref.actor.optim.optimizer=HostAdamW",
                     "actor_rollout_ref.rollout.gpu_memory_utilization=0.85",
                     "actor_rollout_ref.rollout.free_cache_engine=True", "trainer.total_training_steps=3",
                     "trainer.logger=[console,file]", "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                     "actor_rollout_ref.model.use_remove_padding=False", "ray_kwargs.ray_init.num_cpus=64",
                     "reward.custom_reward_function.path=pkg://rlkit.models.reward",
                     "reward.custom_reward_function.name=synthetic_hash"):
        assert expected in ov, expected
    env = verl_job.launch_env(r, "/rec", base={"VERL_USE_EXTERNAL_MODULES": "other"})
    assert env["RLKIT_PATCHES"] == "offload_views" and env["RLKIT_RECORD_DIR"] == "/rec"
    assert env["VERL_USE_EXTERNAL_MODULES"] == "other,rlkit.patches.verl_plugin"
    assert env["HF_HUB_OFFLINE"] == "1" and env["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] == "0"


RECIPES = {
    "default": {},
    "host_adamw_static_bsz": {"optimizer": "HostAdamW", "optimizer_offload": False, "use_dynamic_bsz": False},
    "skip_old_logprob": {"patches": ("offload_views", "no_shard", "skip_old_logprob")},
    "real_data_reward": {"model": "/models/Qwen3-4B", "reward": "dapo_math"},
}


@pytest.mark.verl
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_overrides_compose_with_verls_own_config(name):
    r = _recipe(**RECIPES[name])
    config = check.compose_verl_config(render_overrides(r))
    arr = config.actor_rollout_ref
    assert config.data.train_batch_size == r.train_batch_size and arr.rollout.n == r.rollout_n
    assert arr.actor.ppo_mini_batch_size == r.ppo_mini_batch_size and arr.actor.fsdp_config.fsdp_size == 1
    assert arr.rollout.gpu_memory_utilization == 0.85 and arr.model.override_config.attn_implementation == "sdpa"
    assert config.trainer.n_gpus_per_node == 2 and list(config.trainer.logger) == ["console", "file"]
    assert arr.actor.optim.optimizer == r.optimizer
    expected_fn = None if r.resolved_reward == "dapo_math" else "synthetic_hash"
    assert (config.reward.custom_reward_function.path is None) == (expected_fn is None)
    if "skip_old_logprob" in r.patches:
        assert config.trainer.v1.trainer_mode == "rlkit_onpolicy"
        assert arr.actor.calculate_entropy is True


@pytest.mark.verl
def test_unknown_override_is_rejected_by_verls_config():
    r = _recipe(extra_overrides=("actor_rollout_ref.actor.fsdp_config.no_such_key=1",))
    with pytest.raises(Exception, match="no_such_key"):
        check.compose_verl_config(render_overrides(r))


@pytest.mark.verl
def test_verify_subprocess_validates_and_loads_the_plugin(tmp_path):
    """The tiny profile's overrides through verl's validate_config + config dataclasses in a fresh
    process that imported verl, with the chosen patches applied by the plugin and recorded."""
    r = P.build(R.GRPORecipe, load_profile(grpo.NOTEBOOK, "tiny"))
    dataset = data.synthetic_dapo(r.data_rows, out_path=tmp_path / "train.parquet")
    model = offline_model.write_offline_model(r.model, tmp_path / "model", device="cpu")
    ov = render_overrides(r, R.Paths(model=model["path"], train_file=dataset.path), tmp_path)
    result = check.verify_subprocess(r, ov, tmp_path)
    assert result["active_patches"] == list(r.patches) == ["offload_views", "no_shard"]
    assert "actor_rollout_ref.model" in result["validated_sections"]
    assert [rec["applied"] for rec in result["plugin_records"]] == [list(r.patches)]
    bad = dataclasses.replace(r, micro_batch_size_per_gpu=2, use_dynamic_bsz=False,
                              extra_overrides=("actor_rollout_ref.rollout.log_prob_micro_batch_size=4",))
    with pytest.raises(RuntimeError, match="log_prob_micro_batch_size"):
        check.verify_subprocess(bad, render_overrides(bad, R.Paths(model["path"], dataset.path)), tmp_path)


@pytest.mark.verl
def test_verify_subprocess_accepts_the_full_arc_in_its_own_order(tmp_path):
    """The last arm names every patch in the arc's order, not the registry's; the plugin applies them in
    that order and the check compares the sets (a verify of arm 5 once failed on the order alone)."""
    values = {**load_profile(grpo.NOTEBOOK, "tiny"), **R.arm_values("5-master-on-host-cast-once")}
    r = P.build(R.GRPORecipe, values)
    assert list(r.patches) != [p for p in patches.KNOWN_PATCHES if p in r.patches]
    dataset = data.synthetic_dapo(r.data_rows, out_path=tmp_path / "train.parquet")
    model = offline_model.write_offline_model(r.model, tmp_path / "model", device="cpu")
    ov = render_overrides(r, R.Paths(model=model["path"], train_file=dataset.path), tmp_path)
    result = check.verify_subprocess(r, ov, tmp_path)
    assert sorted(result["active_patches"]) == sorted(r.patches)
    assert [rec["applied"] for rec in result["plugin_records"]] == [list(r.patches)]
    assert result["plugin_records"][0]["wiring"] == ["master_on_host_verl"]


def test_parse_console_log_fixture():
    steps = verl_logs.parse_console_metrics(FIXTURE.read_text())
    assert [s["step"] for s in steps] == [0, 1, 2, 3]
    assert [s["step"] for s in verl_logs.training_steps(steps)] == [1, 2, 3]
    one = steps[1]
    assert one["timing_s/gen"] == 18.2 and one["timing_s/update_actor"] == 80.4 and one["timing_s/step"] == 138.0
    assert one["actor/grad_norm"] == 1.7612 and one["actor/pg_loss"] == -0.00421  # np.float64(...) unwrapped
    assert one["actor/lr"] == 1e-06 and one["training/num_turns/max"] == 2 and one["training/global_step"] == 1
    summary = verl_logs.summarize(steps)
    assert summary["steps_averaged"] == [2, 3]
    assert summary["step_s"] == pytest.approx((76.1 + 75.4) / 2)
    assert summary["actor_max_allocated_gib"] == 75.0 and summary["ref_s"] is None
    table = grpo_runs.phase_table(steps)
    step1 = {row["phase"]: row["seconds"] for row in table if row["step"] == 1}
    assert step1["other"] == pytest.approx(138.0 - sum(v for k, v in step1.items() if k != "other"))


@pytest.mark.verl
def test_parser_reads_what_verls_console_logger_prints():
    import numpy as np
    from verl.utils.logger.aggregate_logger import concat_dict_to_str

    metrics = {"timing_s/gen": 1.5, "actor/pg_loss": np.float64(-2.5e-05), "actor/grad_norm": np.float32(0.75),
               "training/num_turns/max": np.int64(3), "perf/total_num_tokens": 4096, "critic/score/mean": float("nan")}
    line = "(TaskRunnerV1 pid=7) " + concat_dict_to_str(metrics, step=12)
    (parsed,) = verl_logs.parse_console_metrics(line + "\n")
    assert math.isnan(parsed.pop("critic/score/mean"))
    assert parsed == {"step": 12, "timing_s/gen": 1.5, "actor/pg_loss": -2.5e-05, "actor/grad_norm": 0.75,
                      "training/num_turns/max": 3, "perf/total_num_tokens": 4096}


def test_hash_reward_is_deterministic_response_dependent_and_bounded():
    texts = [f"response {i}" for i in range(64)]
    scores = [reward.synthetic_hash("math_dapo", t, "7")["score"] for t in texts]
    assert all(-1.0 <= s < 1.0 for s in scores) and len(set(scores)) == len(texts)
    digest = int.from_bytes(hashlib.blake2b(b"abc", digest_size=8).digest(), "big")
    assert reward.hash_reward("abc") == 2 * digest / 2**64 - 1
    assert reward.verl_overrides("dapo_math") == []


@pytest.mark.verl
def test_dapo_math_reward_is_verls_scoring():
    assert reward.dapo_math("math_dapo", "so the result is 12.\nAnswer: 42", "42")["score"] == 1.0
    assert reward.dapo_math("math_dapo", "Answer: 41", "42")["score"] == -1.0


def test_read_results_tabulates_arms(tmp_path):
    base = {"recipe": {"patches": [], "optimizer": "AdamW"}, "launched": True,
            "steps": verl_logs.parse_console_metrics(FIXTURE.read_text())}
    base["summary"] = verl_logs.summarize(base["steps"])
    for arm, arm_patches in (("stock", []), ("offload_views", ["offload_views"])):
        (tmp_path / arm).mkdir()
        metrics = {**base, "recipe": {**base["recipe"], "patches": arm_patches}}
        (tmp_path / arm / "metrics.json").write_text(json.dumps(metrics))
        (tmp_path / arm / "env.json").write_text("{}")  # every run records where it ran
    merged = grpo_runs.read_results(tmp_path)
    assert [a["arm"] for a in merged["arms"]] == ["offload_views", "stock"]
    assert merged["arms"][0]["patches"] == "offload_views" and merged["arms"][1]["step_s"] == base["summary"]["step_s"]
    single = grpo_runs.read_results(tmp_path / "stock")
    assert len(single["arms"]) == 1 and single["arms"][0]["steps"] == 3


def test_launch_is_skipped_without_enough_gpus():
    launched, reason = verl_job.launch_decision("auto", 8, "run it on a GPU node")
    if verl_job.gpu_count() < 8:
        assert not launched and "n_gpus=8" in reason and reason.endswith("run it on a GPU node")
    assert verl_job.launch_decision("never", 1, "-") == (False, "launch: never (set launch: auto or always to run verl)")
    assert verl_job.launch_decision("always", 8, "-")[0]


def test_cli_render(capsys):
    assert grpo.main(["render", "--profile", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "python -m verl.trainer.main_ppo" in out and "RLKIT_PATCHES=offload_views,no_shard" in out
    assert grpo.main(["render", "--profile", "tiny", "-p", "rollout_n=0"]) == 2
    assert "GRPORecipe.rollout_n" in capsys.readouterr().err


@pytest.mark.parametrize("changes", [{"optimizer": "AdamW", "optimizer_offload": True},
                                     {"optimizer": "HostAdamW", "optimizer_offload": False, "param_offload": False}])
def test_master_on_host_needs_param_offload_and_host_adamw(changes):
    with pytest.raises(P.ParamError, match=r"GRPORecipe.patches: master_on_host .* Fix: set optimizer: HostAdamW"):
        R.GRPORecipe(patches=("offload_views", "master_on_host"), **changes)
    R.GRPORecipe(patches=("offload_views", "master_on_host", "cast_once"), optimizer="HostAdamW",
                    optimizer_offload=False)


@pytest.mark.verl
@pytest.mark.parametrize("arm", list(R.ARMS))
def test_every_arm_is_a_valid_h200_recipe_that_verl_composes(arm):
    values = {**load_profile(grpo.NOTEBOOK, "h200"), **R.arm_values(arm)}
    r = P.build(R.GRPORecipe, values, where=arm)
    config = check.compose_verl_config(render_overrides(r))
    optim = config.actor_rollout_ref.actor.optim
    if r.optimizer == "HostAdamW":
        assert optim.optimizer_impl == "rlkit.optim" and not config.actor_rollout_ref.actor.fsdp_config.optimizer_offload
        assert dict(optim.override_optimizer_config) == {"pin_memory": r.host_pin_memory,
                                                         "rank0_owner": r.host_rank0_owner,
                                                         "overlap_copies": r.host_overlap_copies,
                                                         "prefetch_grads": r.host_prefetch_grads}
    else:
        assert optim.override_optimizer_config is None
    env = verl_job.launch_env(r, "/tmp/records", base={})
    assert env["RLKIT_EMULATE_GPU_GIB"] == "47.4" and env["RLKIT_CHECK_RANK_IDENTITY"] == "1"
    assert env["VLLM_LOGGING_LEVEL"] == "INFO"  # vLLM's KV-cache report; verl would set WARN


def test_arms_are_cumulative_in_the_seeds_order():
    names = list(R.ARMS)
    assert names[0] == "0-stock" and R.ARMS["0-stock"]["expect_failure"]
    for before, after in itertools.pairwise(names[1:]):
        assert set(R.ARMS[before]["patches"]) <= set(R.ARMS[after]["patches"])
    with pytest.raises(P.ParamError, match="unknown arm"):
        R.arm_values("9-nothing")


def test_sanity_bar_fails_on_nan_zero_grad_or_differing_ranks():
    ok_steps = [{"step": i, "timing_s/step": 1.0, "actor/grad_norm": 0.05, "actor/pg_loss": -0.01} for i in (1, 2, 3)]
    same = [{"optimizer_step": i, "max_abs_diff": 0.0, "differing_elements": 0, "seconds": 0.1} for i in (1, 2, 3)]
    assert grpo.sanity(ok_steps, same, n_gpus=2)["passed"]
    zero = [dict(s, **{"actor/grad_norm": 0.0}) for s in ok_steps]
    assert not grpo.sanity(zero, same, n_gpus=2)["grad_norm_finite_nonzero"]
    nan = [dict(s, **{"actor/pg_loss": float("nan")}) for s in ok_steps]
    result = grpo.sanity(nan, same, n_gpus=2)
    assert not result["pg_loss_finite"] and result["nan_keys"] == ["actor/pg_loss"] and not result["passed"]
    drift = [dict(r, max_abs_diff=3e-8, differing_elements=5) for r in same]
    assert not grpo.sanity(ok_steps, drift, n_gpus=2)["ranks_identical"]
    assert not grpo.sanity(ok_steps, same[:1], n_gpus=2)["ranks_identical"]  # a step without a check fails too
    assert "ranks_identical" not in grpo.sanity(ok_steps, [], n_gpus=1)


def test_optimizer_step_summary_averages_the_window_and_skips_old_records():
    records = [{"optimizer_step": i, "optimizer_step_s": float(i), "host_threads": 16, "torch_threads": 1}
               for i in (1, 2, 3)]
    assert grpo.optimizer_step_summary(records, [2, 3]) == {"optimizer_step_s": 2.5, "host_threads": 16,
                                                             "torch_threads": 1}
    old = [{"optimizer_step": i, "max_abs_diff": 0.0} for i in (1, 2, 3)]  # written before these fields existed
    assert grpo.optimizer_step_summary(old, [2, 3]) == {}


def test_collected_arm_metrics_are_what_collect_computes_from_the_committed_logs():
    from conftest import committed_run

    from rlkit.core.results import OUTPUTS_DIR

    run = committed_run(OUTPUTS_DIR / grpo.NOTEBOOK / "1-fixes-hostadamw-resp512-tok8192")
    committed = json.loads((run / "metrics.json").read_text())
    again = grpo.collect(run, committed["launch"]["collected"]["note"])
    for key in ("steps", "sanity", "overrides"):
        assert again[key] == committed[key], key
    # recipe fields added since the run take their defaults, summary keys added since (the response-length
    # extremes) are computed from the same steps; every field and key the run had is unchanged
    assert {k: again["recipe"][k] for k in committed["recipe"]} == committed["recipe"]
    assert {k: again["summary"][k] for k in committed["summary"]} == committed["summary"]
    # extremes, not means: the plain random model samples its EOS id now and then (p ~ 1/151,936 per token)
    assert (again["summary"]["response_length_min"], again["summary"]["response_length_max"]) == (485, 512)
    assert again["summary"]["response_length_mean"] > 511
    assert grpo_runs.outcome(again) == "stopped after 2/3 steps" and again["sanity"]["rank_max_abs_diff"] == 0.0


def test_collect_renders_the_overrides_again_for_a_run_that_wrote_none(tmp_path):
    """Runs launched with verify_before_launch off wrote no overrides.json before the launcher wrote it for every
    run; collect renders them from params.yaml with this machine's rlkit and says so."""
    import shutil

    from conftest import committed_run

    from rlkit.core.results import OUTPUTS_DIR

    run = tmp_path / "run"
    shutil.copytree(committed_run(OUTPUTS_DIR / grpo.NOTEBOOK / "1-fixes-hostadamw-resp512-tok8192"), run)
    committed = json.loads((run / "overrides.json").read_text())
    (run / "overrides.json").unlink()
    again = grpo.collect(run, "note")
    assert again["launch"]["collected"]["overrides"].startswith("rendered again from params.yaml")
    recipe = P.build(R.GRPORecipe, again["recipe"])
    assert again["overrides"] == render_overrides(recipe, R.default_paths(recipe), run)
    assert f"data.train_files={R.default_paths(recipe).train_file}" in again["overrides"]
    assert committed != again["overrides"]  # the run's own paths were the node's
    assert again["steps"] == json.loads((run / "metrics.json").read_text())["steps"]


def test_collect_refuses_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="params.yaml"):
        grpo.collect(tmp_path, "note")


def test_planner_agrees_with_every_committed_gpu_arm():
    """The phase-budget planner, given each measured arm's exact overrides, predicts what the arm did: the
    actor's peak within 10 %, an OOM in the phase that ran out of the card, vLLM refusing to start with the
    free memory vLLM read within 10 % (outputs/05_grpo_qwen3_4b/, 2 x H200 emulating 47.4 GiB cards)."""
    from conftest import committed_runs

    from rlkit.core.results import OUTPUTS_DIR

    arms = committed_runs(OUTPUTS_DIR / grpo.NOTEBOOK)  # not the tiny/ folder `make demo` writes beside them
    if not arms:
        pytest.skip("no committed GPU arms")
    checks = {p.name: estimates.planner_check(grpo_runs.read_results(p)) for p in arms}
    assert all(c is not None and c["agrees"] for c in checks.values()), checks
    assert any(c["ratio"] is not None and c["measured_actor_peak_gib"] for c in checks.values())


@pytest.mark.parametrize("arm", list(R.ARMS))
def test_workload_levers_survive_every_arm(arm):
    """Arms replace ``patches`` wholesale; the seed workload's kernels are fields, so each arm keeps them."""
    values = {**load_profile(grpo.NOTEBOOK, "h200-seed"), **R.arm_values(arm)}
    r = P.build(R.GRPORecipe, values, where=arm)
    assert r.active_patches == (*r.patches, "varlen_attention", "chunked_logprobs")
    env = verl_job.launch_env(r, "/tmp/records", base={})
    assert env["RLKIT_PATCHES"].split(",") == list(r.active_patches)
    ov = render_overrides(r, R.Paths(model="/m", train_file="/d.parquet"))
    for expected in ("actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.model.use_fused_kernels=True",
                     "actor_rollout_ref.model.fused_kernel_options.impl_backend=torch",
                     "+actor_rollout_ref.model.override_config.attn_implementation=rlkit_varlen",
                     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24576", "data.max_response_length=4096"):
        assert expected in ov
    padded = dataclasses.replace(r, attn_implementation="sdpa", use_remove_padding=False, logits="full")
    assert padded.active_patches == r.patches
    assert not [o for o in render_overrides(padded, R.Paths("/m", "/d.parquet")) if "fused" in o]


@pytest.mark.parametrize("changes, field", [
    ({"patches": ("offload_views", "chunked_logprobs")}, "logits"),
    ({"patches": ("varlen_attention",)}, "attn_implementation"),
    ({"patches": ("grad_prefetch",)}, "host_prefetch_grads"),
])
def test_a_lever_patch_without_its_field_names_the_field(changes, field):
    with pytest.raises(P.ParamError, match=rf"GRPORecipe\.patches: .*Fix: set {field}: "):
        _recipe(**changes)


def test_host_prefetch_grads_adds_its_patch_and_reaches_hostadamw():
    r = _recipe(optimizer="HostAdamW", optimizer_offload=False, host_prefetch_grads=True)
    assert r.active_patches[-1] == "grad_prefetch"
    assert verl_job.launch_env(r, "/tmp/records", base={})["RLKIT_PATCHES"].split(",")[-1] == "grad_prefetch"
    (options,) = [o for o in render_overrides(r, R.Paths("/m", "/d.parquet")) if "override_optimizer_config" in o]
    assert options.endswith("overlap_copies:false,prefetch_grads:true}")


def test_the_seed_profile_is_the_issues_shape():
    r = P.build(R.GRPORecipe, load_profile(grpo.NOTEBOOK, "h200-seed"))
    assert (r.max_prompt_length, r.max_response_length, r.ppo_max_token_len_per_gpu) == (256, 4096, 24576)
    assert (r.train_batch_size, r.rollout_n, r.emulate_gpu_gib) == (32, 8, 47.4) and r.steps >= 4
    from rlkit.models.lengths import expected_response_tokens

    assert 0.25 <= expected_response_tokens(r.response_length_mean, r.max_response_length) / r.max_response_length <= 0.60
    assert r.lr == 0.0  # the synthetic lengths must not drift between arms and steps (the profile's header says why)


@pytest.mark.verl
def test_verify_subprocess_applies_the_seed_levers_with_an_arm(tmp_path):
    """The seed profile's levers under arm 5, through verl's own config check in a fresh process: the plugin
    applies the arm's patches and the levers' (varlen attention now, chunked log-probs at its target import)."""
    values = {**load_profile(grpo.NOTEBOOK, "tiny"), **R.arm_values("5-master-on-host-cast-once"),
              "attn_implementation": "rlkit_varlen", "use_remove_padding": True, "logits": "chunked"}
    r = P.build(R.GRPORecipe, values)
    dataset = data.synthetic_dapo(r.data_rows, out_path=tmp_path / "train.parquet")
    model = offline_model.write_offline_model(r.model, tmp_path / "model", device="cpu")
    ov = render_overrides(r, R.Paths(model=model["path"], train_file=dataset.path), tmp_path)
    result = check.verify_subprocess(r, ov, tmp_path)
    assert sorted(result["active_patches"]) == sorted(r.active_patches) and not result["pending_patches"]


def test_selective_checkpointing_is_a_field_that_adds_its_patch_and_its_layer_count():
    r = _recipe(activation_checkpointing="selective", selective_layers=5)
    assert "selective_checkpoint" in r.active_patches
    assert verl_job.recipe_env(r)["RLKIT_SELECTIVE_LAYERS"] == "5"
    assert "RLKIT_SELECTIVE_LAYERS=5" in verl_job.shell_command(r, [])
    assert verl_job.recipe_env(_recipe())["RLKIT_SELECTIVE_LAYERS"] == ""  # full: cleared, the patch absent
    for changes, field in (({"selective_layers": 3}, "selective_layers"),
                           ({"activation_checkpointing": "selective", "gradient_checkpointing": False},
                            "activation_checkpointing"),
                           ({"patches": ("selective_checkpoint",)}, "patches")):
        with pytest.raises(P.ParamError, match=rf"GRPORecipe\.{field}: .*Fix: "):
            _recipe(**changes)


def test_pre_flight_picks_the_most_selective_layers_that_fit_and_plans_with_them():
    """selective_layers 0: the planner's largest count for the run's own overrides (arm 5 at the seed's workload),
    which the run then records and its pre-flight plans with."""
    from rlkit.planning import verdict
    from rlkit.planning.preflight_memory import planner_spec_for_overrides

    values = {**load_profile(grpo.NOTEBOOK, "h200-seed"), **R.arm_values("5-master-on-host-cast-once"),
              "host_rank0_owner": False, "activation_checkpointing": "selective"}
    r = P.build(R.GRPORecipe, values, where="seed-sac")
    ov = render_overrides(r, R.Paths(model="qwen3-4b", train_file="/d.parquet"))
    chosen = grpo.with_selective_layers(r, ov)
    spec = planner_spec_for_overrides(ov, r.active_patches, gpu_gib=r.planner_gpu_gib)
    assert chosen.selective_layers == verdict.most_selective_layers(spec) > 0
    assert grpo.with_selective_layers(chosen, ov) is chosen  # a count set by hand is kept
    planned = verl_job.preflight_findings(chosen, ov)["planner"][0]["message"]
    more = dataclasses.replace(chosen, selective_layers=chosen.selective_layers + 1)
    assert "fits" in planned and verl_job.preflight_findings(more, ov)["planner"][0]["severity"] == "error"
