"""Deterministic mode reaches the measuring child processes, and every check is read against the baseline's own
spread: real runs of the tiny profiles of notebooks 01, 03 and 04, with verl hidden from the children (the GPU
node has none); plus the node script that reruns them on one GPU."""
from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import torch
from torch._prims_common import alert_not_deterministic

from rlkit.core.params import build
from rlkit.core.results import load_profile
from rlkit.measure import determinism

REPO = Path(__file__).resolve().parent.parent
NODE_SCRIPT = REPO / "scripts" / "node_determinism.sh"
NODE_BUDGET_S = 540  # the whole script inside 9 minutes


# ------------------------------------------------------------------------------------------ the helpers
def test_a_refused_op_is_recorded_by_name_and_other_errors_propagate():
    result = {"status": "ok"}
    torch.use_deterministic_algorithms(True)
    try:
        with determinism.recording_nondeterministic_op(result):
            alert_not_deterministic("scatter_reduce_cuda")  # torch's own refusal, as a kernel without one raises
        with pytest.raises(RuntimeError, match="no such kernel"), determinism.recording_nondeterministic_op({}):
            raise RuntimeError("no such kernel")
    finally:
        torch.use_deterministic_algorithms(False)
    assert result["status"] == "nondeterministic_op" and result["nondeterministic_op"] == "scatter_reduce_cuda"
    assert "does not have a deterministic implementation" in result["error"]


def test_cublas_without_its_workspace_setting_is_named():
    # aten's words when cuBLAS runs in deterministic mode without CUBLAS_WORKSPACE_CONFIG (Context.cpp)
    err = RuntimeError("Deterministic behavior was enabled with either `torch.use_deterministic_algorithms(True)` or "
                       "`at::Context::setDeterministicAlgorithms(true)`, but this operation is not deterministic "
                       "because it uses CuBLAS and you have CUBLAS_WORKSPACE_CONFIG unset.")
    assert determinism.nondeterministic_op(err).startswith("cuBLAS")
    assert determinism.nondeterministic_op(RuntimeError("CUDA out of memory")) is None


@pytest.mark.parametrize("diff, spread, verdict", [
    (0.0, 0.0, "bit-exact"), (0.0, None, "bit-exact"), (1e-5, 2e-5, "within the baseline's own spread"),
    (1e-5, 0.0, "exceeds the baseline's own spread"), (1e-5, None, "differs (no repeat of the baseline to compare with)"),
    (None, 0.0, "not measured"),
])
def test_verdict_reads_a_difference_against_the_baselines_own(diff, spread, verdict):
    assert determinism.check("x", diff, spread)["verdict"] == verdict


def test_probe_of_a_large_tensor_stays_in_bounds_and_ends_on_the_last_element():
    # 2**24 + 3, the last index, is no float32: a float32 linspace of positions rounds it up to one past the end
    t = torch.arange(2**24 + 4, dtype=torch.int64)
    probe = determinism.probe(t, k=1000)
    assert len(probe) == 1000 and probe[0] == 0 and probe[-1] == t[-1].float()
    assert torch.equal(determinism.probe(torch.arange(5.0)), torch.arange(5.0))  # small: all of it


# ------------------------------------------------------------------------------------------ real tiny runs
@pytest.fixture(scope="module")
def child_env(tmp_path_factory):
    """The children see no verl (like the GPU node) and inherit no CUBLAS_WORKSPACE_CONFIG from this process."""
    shim = tmp_path_factory.mktemp("no-verl")
    (shim / "verl").mkdir()
    (shim / "verl" / "__init__.py").write_text("raise ImportError('verl is hidden: the GPU node has none')\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", f"{shim}:{REPO}")
        mp.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
        yield


def assert_deterministic_child(settings: dict) -> None:
    """What the child read back from torch and its environment after rlkit.measure.determinism.enable."""
    assert settings["deterministic_algorithms"] is True and settings["warn_only"] is False
    assert settings["cudnn_deterministic"] is True and settings["cudnn_benchmark"] is False
    assert settings["cublas_workspace_config_inherited"] == determinism.CUBLAS_WORKSPACE_CONFIG  # from the launcher


def assert_spread_recorded(metrics: dict, checks: int) -> None:
    d = metrics["determinism"]
    assert len(d["checks"]) == checks and not d["nondeterministic_ops"]
    for c in d["checks"]:  # CPU kernels: the baseline reproduces itself exactly, and so does the patch
        assert c["unpatched_vs_itself"] == 0.0 and c["patched_vs_unpatched"] == 0.0, c
    assert d["baseline_reproduces_itself"] and d["all_bit_exact"]


@pytest.mark.parametrize("deterministic", [True, False])
def test_skip_old_logprob_child_runs_in_the_mode_asked_for(child_env, deterministic):
    from rlkit.experiments import skip_old_logprob as exp

    values = {**load_profile(exp.NOTEBOOK, "tiny"), "num_sequences": 4, "timing_repeats": 1,
              "deterministic": deterministic}
    metrics = exp.run(build(exp.Config, values))
    assert metrics["status"] == "ok" and metrics["implementation"]["source"] == "local"
    assert "verl not importable" in metrics["implementation"]["why_local"]
    settings = metrics["determinism"]["settings"]
    if deterministic:
        assert_deterministic_child(settings)
    else:
        assert settings["deterministic_algorithms"] is False and settings["cublas_workspace_config_inherited"] is None
    assert metrics["setup"]["deterministic_algorithms"] is deterministic
    assert_spread_recorded(metrics, checks=len(exp.CHECKS))
    # timing_repeats=1: the repeat of the old pass is an extra, untimed one
    assert metrics["phases"]["old_log_prob"]["count"] == 1


def test_cast_once_arms_and_the_repeat_of_a_run_deterministic(child_env):
    from rlkit.experiments import cast_once as exp

    values = {**load_profile(exp.NOTEBOOK, "tiny"), "arms": ["A", "C"], "deterministic": True}
    values.pop("noise_dir")  # notebook-only (rendering)
    metrics = exp.run(build(exp.Config, values))
    repeat = metrics["baseline_repeat"]
    for arm in [*metrics["arms"], repeat]:
        assert arm["status"] == "ok", arm.get("error")
        assert_deterministic_child(arm["determinism"])
    assert repeat["arm"] == "A" and repeat["parity_vs_A"]["bit_exact"]
    assert repeat["parity_vs_A"]["grad_probe_max_abs_diff"] == [0.0] * values["steps"]
    assert_spread_recorded(metrics, checks=len(exp.CHECKS))
    assert [r["arm"] for r in exp.rerun_noise_table(metrics)] == ["A repeated", "C"]  # the notebook's table


def test_offload_rows_and_ranks_run_deterministic(child_env):
    from rlkit.experiments import offload_bug as exp

    values = {**load_profile(exp.NOTEBOOK, "tiny"), "use_orig_params": [False], "forward_first": [False],
              "deterministic": True}
    metrics = exp.run(build(exp.Config, values))
    bug, fixed = metrics["rows"]
    for row in (bug, fixed):
        assert row["status"] == "ok" and row["offload_impl"].endswith("(verl not installed)")
        assert_deterministic_child(row["determinism"])
    assert bug["repeat_train_loss"] == bug["train_loss"]  # the unfixed row ran twice from the same weights
    assert_spread_recorded(metrics, checks=3)
    for run in ("with_fix", "without_fix"):  # both ranks of the gradient check, rank 0 reporting
        assert_deterministic_child(metrics["grad_sync"][run]["determinism"])


# ------------------------------------------------------------------------------------------ the node script
def node_experiments() -> list[list[str]]:
    """The script's ``run_experiment NOTEBOOK MODULE LIMIT_S [-p KEY=VALUE ...]`` lines, split like bash does."""
    lines = [ln for ln in NODE_SCRIPT.read_text().splitlines() if ln.startswith("run_experiment ")]
    return [shlex.split(ln)[1:] for ln in lines]


def test_node_script_is_valid_bash_and_runs_every_experiment_within_the_budget():
    subprocess.run(["bash", "-n", str(NODE_SCRIPT)], check=True)
    experiments = node_experiments()
    assert [e[0] for e in experiments] == ["03_cast_once", "04_skip_old_logprob", "01_offload_bug"]
    kill_grace_s = 10  # run_experiment's `timeout -k 10`
    assert sum(int(e[2]) + kill_grace_s for e in experiments) <= NODE_BUDGET_S


@pytest.mark.parametrize("spec", node_experiments(), ids=lambda spec: spec[0])
def test_node_script_parameters_validate_for_the_experiment(spec):
    """The h200 profile + deterministic=true + the script's overrides build the experiment's Config."""
    import importlib

    from rlkit.core.results import parse_overrides

    notebook, module, _, *args = spec
    exp = importlib.import_module(f"rlkit.experiments.{module}")
    assert exp.NOTEBOOK == notebook
    assert args[::2] == ["-p"] * (len(args) // 2) and len(args) % 2 == 0
    values = {**load_profile(notebook, "h200"), "deterministic": True, **parse_overrides(args[1::2])}
    values.pop("noise_dir", None)  # notebook-only (rendering), as experiment_main drops it
    cfg = build(exp.Config, values)
    assert cfg.deterministic is True
