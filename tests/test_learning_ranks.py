"""Notebook 07 on two ranks (issue 46 item 2, "when two GPUs are lent, the same on two ranks"), on the CPU: Config.n_gpus
reaches every run of both sides, a bad count is refused naming the key, every profile of notebook 07 is a Config the
notebook and the runner accept, the h200-2gpu profile's variant is the h200 one with the rank-0 owner in place of the
overlapped copies, and the words say where the runs ran."""
from __future__ import annotations

import pytest

from rlkit.core import params as P
from rlkit.core.env import REPO_ROOT
from rlkit.core.results import PARAMS_DIR, load_profile
from rlkit.experiments import learning as L
from rlkit.experiments import learning_runs as LR
from rlkit.recipes import grpo as R
from rlkit.recipes.overrides import render_overrides
from rlkit.tools import run as runner

PROFILES = sorted(p.name.split(".")[1] for p in PARAMS_DIR.glob(f"{L.NOTEBOOK}.*.yaml"))


def _cfg(profile: str = "tiny", **changes) -> L.Config:
    return P.build(L.Config, {**load_profile(L.NOTEBOOK, profile), **changes})


def _recipes(cfg: L.Config) -> list[R.GRPORecipe]:
    return [LR.build_recipe(cfg, side) for _, side in LR.run_plan(cfg)]


@pytest.mark.parametrize("n_gpus", [1, 2, 4])
def test_n_gpus_reaches_every_run_of_both_sides(n_gpus):
    cfg = _cfg(n_gpus=n_gpus)
    recipes = _recipes(cfg)
    assert {r.n_gpus for r in recipes} == {n_gpus} and len({r.patches for r in recipes}) == 2  # both sides
    for recipe in recipes:
        assert f"trainer.n_gpus_per_node={n_gpus}" in render_overrides(recipe, R.Paths(model="/m", train_file="/d.parquet"))


@pytest.mark.parametrize("value, why", [(0, "not a positive number"), (-2, "not a positive number"),
                                        (True, "not a positive number"),
                                        (3, "4x4 sequences per step do not split over 3 ranks")])
def test_a_bad_n_gpus_is_refused_naming_the_key_and_the_fix(value, why):
    with pytest.raises(P.ParamError, match=rf"Config\.n_gpus: .*{why}.*Fix: "):
        _cfg(n_gpus=value)


def test_n_gpus_is_the_workload_not_a_lever_of_the_compared_variant():
    with pytest.raises(P.ParamError, match=r"'n_gpus' is the workload every run shares, set by Config\.n_gpus"):
        _cfg(compare_overrides={"n_gpus": 2})


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_is_a_config_the_notebook_and_the_runner_accept(profile):
    """Every nbs/params/07_does_it_learn.*.yaml: the Config's fields exactly, the notebook's parameters cell, the
    runner's plan (`rlkit run 07_does_it_learn --profile <profile>`), and both sides' recipes."""
    values = load_profile(L.NOTEBOOK, profile)
    assert set(values) == set(P.field_names(L.Config)), profile
    runner.check_parameters(runner.notebook_path(L.NOTEBOOK), values, f"{profile} profile")
    ((_, planned, tag),) = runner.plan_runs(L.NOTEBOOK, profile, [], [], None)
    assert tag == profile and planned == values
    recipes = _recipes(P.build(L.Config, values))
    assert {r.n_gpus for r in recipes} == {values["n_gpus"]}


def test_the_two_rank_profile_is_the_h200_workload_on_two_ranks_with_the_rank0_owner():
    """h200-2gpu: the h200 profile's values but n_gpus 2, its own runs_dir and name, and the variant's overlapped copies
    (which refuse the rank-0 owner) swapped for arm 5's owner, measured on two GPUs (the yaml's comment says where)."""
    one, two = load_profile(L.NOTEBOOK, "h200"), load_profile(L.NOTEBOOK, "h200-2gpu")
    assert {k for k in one if one[k] != two[k]} == {"n_gpus", "compare_overrides", "compare_name", "runs_dir"}
    assert (one["n_gpus"], two["n_gpus"]) == (1, 2)
    assert two["runs_dir"] == "outputs/07_does_it_learn/h200-2gpu-runs"
    assert two["compare_overrides"] == {**one["compare_overrides"], "host_rank0_owner": True, "host_overlap_copies": False}
    cfg = P.build(L.Config, two)
    base, fast = (LR.build_recipe(cfg, side) for side in (cfg.baseline_arm, cfg.compare_name))
    assert base.n_gpus == fast.n_gpus == 2 and (base.train_batch_size * base.rollout_n) % 2 == 0
    assert fast.host_rank0_owner and not fast.host_overlap_copies and fast.host_pin_memory
    assert {"chunked_logprobs", "compiled_rmsnorm", "compiled_pointwise", "replay_poll", "no_shard",
            "master_on_host"} <= set(fast.active_patches)
    assert "rank0_owner:true" in " ".join(render_overrides(fast, R.Paths(model="/m", train_file="/d.parquet")))
    with pytest.raises(P.ParamError, match=r"GRPORecipe\.host_rank0_owner: with a rank-0 owner"):
        P.build(R.GRPORecipe, {**P.as_dict(fast), "host_overlap_copies": True})  # one or the other, never both
    # the four runs side by side on the two cards: each card holds one rank of every run, vLLM's total as h200's one card
    assert cfg.parallel == len(LR.run_plan(cfg)) == 4
    assert cfg.parallel * cfg.gpu_memory_utilization <= one["parallel"] * one["gpu_memory_utilization"] <= 0.8 + 1e-9
    text = (PARAMS_DIR / f"{L.NOTEBOOK}.h200-2gpu.yaml").read_text()
    for words in ("UNTESTED ON A GPU", "rlkit/recipes/grpo.py", "docs/results.md", "docs/lab-notes.md",
                  "docs/patches.md", "parallel 4", "--profile h200-2gpu --tag h200-2gpu", "learning-2gpu"):
        assert words in text, words


def _metrics(**config) -> dict:
    cfg = {**P.as_dict(_cfg()), **config}
    runs = {"a.r1": {"update_actor_mfu": 0.001}}
    return {"config": cfg, "synthetic": {"task": True, "model": True}, "task": {"reward": "target_chars"},
            "data": {"rows": 3, "source": "synthetic"}, "model": {}, "probe": None, "plan": [{"run": "a.r1"}],
            "pending": [], "launched": True, "launch_reason": "2 GPUs", "runs": runs,
            "analysis": {"per_run": {}, "noise": {"curve_distance": None}, "criteria": {}, "compare": None,
                         "verdict": {"passed": False, "all_learned": False, "compare_within_noise": False,
                                     "compare_every_step_within_band": False}}}


def test_the_words_say_two_ranks_at_n_gpus_2_and_one_gpu_at_1_or_before_the_field():
    two = L.describe(_metrics(n_gpus=2))
    assert "steps each on two ranks (one GPU each)" in two and "the runs shared two GPUs" in two
    assert "on one GPU" not in two and "shared one GPU" not in two
    one = L.describe(_metrics(n_gpus=1))
    assert "steps each on one GPU" in one and "the runs shared one GPU" in one and "ranks" not in one
    older = _metrics()
    del older["config"]["n_gpus"]  # results written before Config.n_gpus: their recipes all had n_gpus 1
    assert L.describe(older) == one


def test_the_committed_results_from_before_n_gpus_still_read_as_one_gpu():
    metrics = L.read_results(REPO_ROOT / "outputs" / "07_does_it_learn" / "h200")
    assert "n_gpus" not in metrics["config"]
    assert "steps each on one GPU" in L.describe(metrics)
