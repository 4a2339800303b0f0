"""Every notebook in nbs/: committed stripped, follows the conventions, and runs with its tiny profile."""
import json
from pathlib import Path

import nbformat
import pytest

from rlkit.core.results import NBS_DIR, PARAMS_DIR, load_profile
from rlkit.tools import run as R

NOTEBOOKS = sorted(NBS_DIR.glob("[0-9]*.ipynb"))
IDS = [p.stem for p in NOTEBOOKS]
CELL_TIMEOUT_S = 600  # a tiny-profile cell takes seconds; a longer one is a hung kernel client

# Top-level keys each notebook's metrics.json must have (the smoke run checks them).
METRICS_KEYS: dict[str, set[str]] = {
    "00_phase_budget": {"units", "seed_table", "seed_diff", "plans", "ablations", "cost_examples"},
    "01_offload_bug": {"model", "device", "model_params", "model_gib", "memory_measured", "rows", "grad_sync"},
    "02_host_adamw": {"config", "arms", "bench_copy", "bench_adam", "summary"},
    "03_cast_once": {"config", "arms", "summary"},
    "04_skip_old_logprob": {"implementation", "setup", "bit_exactness", "timing", "phases", "guard", "overrides",
                            "metrics_with_skip"},
    "05_grpo_qwen3_4b": {"recipe", "reward", "data", "model", "overrides", "command", "preflight", "verify",
                         "launched", "launch_reason", "steps", "summary", "arms"},
    "06_util_sweep": {"units", "config", "case", "emulation", "planner", "planner_sweep", "launched",
                      "launch_reason", "measured", "comparison", "emulated_verdict", "cost"},
    "07_does_it_learn": {"config", "synthetic", "task", "data", "model", "reward_examples", "probe", "plan", "runs",
                         "pending", "complete", "launched", "launch_reason", "steps", "curves", "analysis"},
    "08_where_the_time_goes": {"config", "source", "rows", "speculative"},
}


def _claims_00(m):
    assert len(m["seed_table"]) == 9 and all(p["verdict"] for p in m["plans"].values())
    assert m["plans"]["none"]["verdict"] != "fits"  # stock verl does not fit; the patched sets are compared to it


def _claims_01(m):
    with_fix = m["grad_sync"]["with_fix"]
    assert m["grad_sync"]["max_abs_grad_diff_with_fix"] == 0.0 < m["grad_sync"]["max_abs_grad_diff_without_fix"]
    assert with_fix["grad_reduce_group_size"] == with_fix.get("ranks", m["grad_sync"]["ranks"])
    assert all(r["logits_max_abs_diff_vs_unfixed"] == 0.0 for r in m["rows"])  # the fix changes no logits
    for r in m["rows"]:
        if r["memory_measured"] and r["fix"] and not r["use_orig_params"] and not r["forward_first"]:
            assert r["after_offload_gib"] < 1e-3 and r["after_reload_gib"] <= r["after_wrap_gib"] * 1.01


def _claims_02(m):
    assert m["summary"]["parity_ok"] is True and all(m["summary"]["cross_rank_identical"].values())
    assert {a["arm"]: a["status"] for a in m["arms"]}.get("host_pinned") == "ok"


def _claims_03(m):
    assert set(m["summary"]["status"].values()) == {"ok"}
    assert m["summary"]["all_bit_exact_vs_A"] is True and m["summary"]["resident_copy_fresh"] is True  # on the CPU


def _claims_04(m):
    b = m["bit_exactness"]
    assert b["served_vs_old_log_prob_max_abs_diff"] == 0.0 and b["loss_abs_diff"] == 0.0
    assert b["is_weights_token_max_abs_diff"] == 0.0 and b["is_weights_sequence_max_abs_diff"] == 0.0
    guard = [g["ok"] for g in m["guard"]]
    assert guard[0] is True and not any(guard[1:])  # on-policy passes; every off-policy config falls back


def _claims_05(m):
    from rlkit.verl.logs import summarize, training_steps

    assert m["preflight"]["available"]
    if not m["launched"] or "validated_sections" in m["verify"]:  # verl's config checked: the patches as selected
        assert "actor_rollout_ref.actor" in m["verify"]["validated_sections"]
        assert sorted(m["verify"]["active_patches"]) == sorted(m["recipe"]["patches"])
    if not m["launched"]:  # nothing measured, and nothing claimed as measured
        assert m["launch_reason"] and m["preflight"]["errors"] == 0 and not training_steps(m["steps"] or [])
        assert "step_s" not in (m["summary"] or {})
        return
    # launched: every headline number is the mean over the steps it names, recomputed here from the run's steps
    recomputed = summarize(m["steps"])
    assert ("step_s" in m["summary"]) == bool(training_steps(m["steps"]))
    shared = set(recomputed) & set(m["summary"])
    assert shared >= ({"steps_averaged", "step_s"} if recomputed else set())
    for k in shared:  # the sums of older runs were taken in another order: equal to the last bits or so
        assert m["summary"][k] == (recomputed[k] if recomputed[k] is None else pytest.approx(recomputed[k], rel=1e-12)), k


def _claims_06(m):
    assert m["comparison"] and all(c["planner"] is not None for c in m["comparison"])
    if not m["launched"]:
        assert m["measured"] is None and all(c["measured"] is None for c in m["comparison"])
        return
    # launched: the run finished, and each estimate | measured | ratio row divides what it shows
    assert m["measured"]["returncode"] == 0 and m["measured"]["steps_logged"] >= 1
    compared = [c for c in m["comparison"] if c["ratio"] is not None]  # (None: a phase too short to compare)
    assert compared and all(c["ratio"] == pytest.approx(c["measured"] / c["planner"], rel=1e-12) for c in compared)


def _claims_07(m):
    from rlkit.analysis.learning_curves import analysis_runs, analyze, disagreements

    runs = m["runs"].values()
    assert [r["arm"] for r in runs] == [p["arm"] for p in m["plan"]][:len(runs)]
    assert m["task"]["rows_set_from_prompt"] == m["task"]["rows"] == m["data"]["rows"]  # every set from its prompt
    examples = m["reward_examples"]
    assert len(examples) >= 10 and all(e["score"] == e["expected"] for e in examples if e["expected"] is not None)
    scores = [s for g in m["probe"]["groups"] for s in g["scores"]]
    assert len(scores) == m["config"]["probe_groups"] * m["config"]["rollout_n"] and all(0 <= s <= 1 for s in scores)
    # the verdict is the analysis of the steps the metrics carry, recomputed here (launched or not); results from before
    # issue 46 (one compared run, a fixed noise_floor) hold fewer fields, each of which the analysis gives again
    c = m["config"]
    again = analyze(analysis_runs(m), baseline_arm=c["baseline_arm"], compare_arm=c.get("compare_name", c["compare_arm"]),
                    window=c["window"], min_gain=c["min_gain"], noise_factor=c["noise_factor"],
                    noise_floor=c.get("noise_floor"))
    assert m["analysis"] == again if "compare_name" in c else not disagreements(m["analysis"], again)
    if not m["launched"]:
        assert m["complete"] is False and not m["pending"]
        assert [r["variant"] for r in runs] == [c["baseline_arm"], c["compare_name"]] * 2 == [p["variant"] for p in m["plan"]]
        assert c["compare_repeats"] >= 2 and "noise_floor" not in c
        assert all(r["outcome"] == "not launched" and "n_gpus=1" in r["launch_reason"] for r in runs)
        assert all(sorted(r["verified_patches"]) == sorted(r["patches"]) for r in runs)  # verl's config, the arm's
        assert m["analysis"]["per_run"] == {} and m["analysis"]["verdict"]["passed"] is False  # no steps, no claim
        return
    # launched: every run that trained is analysed, and a passed verdict needs every run to have learned
    trained = {name for name, r in m["runs"].items() if r["outcome"] == "trained"}
    assert trained and trained == set(m["analysis"]["per_run"])
    verdict = m["analysis"]["verdict"]
    assert not verdict["passed"] or (verdict["all_learned"] and all(r["learned"] for r in m["analysis"]["per_run"].values()))


def _claims_08(m):
    """Every committed seed-workload run with two trained steps has its row, and each fraction is its phase's seconds
    over its limit's (the limit a faster phase than which is impossible)."""
    from rlkit.core.results import OUTPUTS_DIR, committed_runs
    from rlkit.verl.logs import training_steps

    runs = [p.name for p in committed_runs(OUTPUTS_DIR / "05_grpo_qwen3_4b") if p.name.startswith(m["config"]["prefix"])
            and len(training_steps(json.loads((p / "metrics.json").read_text()).get("steps", []))) >= 2]
    assert runs and [r["arm"] for r in m["rows"]] == runs
    for r in m["rows"]:
        for phase in ("update_weights", "optimizer_step"):  # a copy's time over the pinned copy rate's
            if r[f"{phase}_s"] and r[f"{phase}_limit_s"]:
                assert r[f"{phase}_fraction"] == pytest.approx(r[f"{phase}_limit_s"] / r[f"{phase}_s"])
        assert 0 < r["update_actor_fraction"] < r["update_actor_hardware_fraction"] <= 1  # recompute counts on top
        assert r["gen_hbm_limit_s"] < r["gen_s"]  # a bound: no gen beats it
    assert m["speculative"]  # outputs/speculative_bound/ is committed: what speculation could give gen
    for s in m["speculative"]:
        assert s["bound_s"] < s["measured_gen_s"] and all(r["speedup_of_bound"] > 1 for r in s["rows"])
    assert m["engine_settings"]  # outputs/engine_settings/ is committed: whether vLLM's settings could move gen
    for e in m["engine_settings"]:
        assert e["bound_s"] < e["measured_gen_s"] and 0 < e["prefix_cache_share"] < e["prefill_share"] < 1


# What each notebook claims, checked on its tiny-profile run: status, parity 0.0 where the claim is bit-exactness.
CLAIMS = {"00_phase_budget": _claims_00, "01_offload_bug": _claims_01, "02_host_adamw": _claims_02,
          "03_cast_once": _claims_03, "04_skip_old_logprob": _claims_04, "05_grpo_qwen3_4b": _claims_05,
          "06_util_sweep": _claims_06, "07_does_it_learn": _claims_07, "08_where_the_time_goes": _claims_08}


def test_every_notebook_has_its_claims_checked():
    assert set(CLAIMS) == set(IDS)


def test_there_are_notebooks():
    assert NOTEBOOKS, "nbs/ holds no notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_is_stripped(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; executed copies belong in outputs/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_conventions(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), "first cell: title + claim"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    declared = R.declared_parameters(path)
    assert "results_dir" in declared
    after = nb.cells[nb.cells.index(tagged[0]) + 1].source
    assert "rlkit.core.params.from_namespace(" in after, "the cell after the parameters validates them"
    for profile in ("tiny", "h200"):
        assert (PARAMS_DIR / f"{path.stem}.{profile}.yaml").exists(), f"missing {profile} parameter file"
        R.check_parameters(path, load_profile(path.stem, profile), f"{profile} profile")


def _committed_launched_runs():
    """The committed GPU runs of the notebooks that launch (executed by papermill, so their metrics are a notebook's)."""
    from rlkit.core.env import REPO_ROOT

    for stem in ("05_grpo_qwen3_4b", "06_util_sweep", "07_does_it_learn"):
        for executed in sorted((REPO_ROOT / "outputs" / stem).glob("**/executed.ipynb")):
            if not (executed.parent / "metrics.json").exists():  # a sweep's executed notebook: its points have theirs
                continue
            metrics = json.loads((executed.parent / "metrics.json").read_text())
            if metrics.get("launched") and not METRICS_KEYS[stem] - set(metrics):
                yield pytest.param(stem, metrics, id=str(executed.parent.relative_to(REPO_ROOT / "outputs")))


@pytest.mark.parametrize("stem, metrics", list(_committed_launched_runs()))
def test_the_claims_of_a_launched_notebook_hold_for_its_committed_gpu_runs(stem, metrics):
    """The tiny profile does not launch on a CPU; what 05-07 claim once they launched is checked on their committed
    GPU runs: each headline number recomputed from the steps the run carries."""
    CLAIMS[stem](metrics)


def test_every_launching_notebook_has_a_committed_launched_run():
    assert {stem for stem, _ in (p.values for p in _committed_launched_runs())} == {
        "05_grpo_qwen3_4b", "06_util_sweep", "07_does_it_learn"}


@pytest.mark.notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_with_tiny_profile(path, tmp_path):
    (_, values, tag), = R.plan_runs(path.stem, "tiny", [], [], "smoke")
    result = R.run_one(path, values, tag, progress=False, root=tmp_path, cell_timeout_s=CELL_TIMEOUT_S)
    if not result.ok and "CellTimeoutError" in result.error:
        # jupyter's kernel client now and then never sees the reply to a widget cell (nbclient #312;
        # seen once in CI on 00's old planner form): the tiny cells take seconds, so run it once more.
        result = R.run_one(path, values, tag, progress=False, root=tmp_path, cell_timeout_s=CELL_TIMEOUT_S)
    assert result.ok, result.error
    metrics = json.loads(Path(result.folder, "metrics.json").read_text())
    missing = METRICS_KEYS.get(path.stem, set()) - set(metrics)
    assert not missing, f"metrics.json lacks {sorted(missing)}"
    CLAIMS[path.stem](metrics)
    # it ends with its findings: the describe() of the metrics it wrote, as print shows it
    from rlkit.experiments import findings

    last = json.loads(Path(result.folder, "executed.ipynb").read_text())["cells"][-1]
    printed = "".join("".join(o["text"]) for o in last["outputs"] if o["output_type"] == "stream")
    assert printed == findings.describe(path.stem, metrics) + "\n", path.stem
    if path.stem in COMMITTED_GPU_RESULTS:  # they open on any machine, before this kernel's own run
        marker, first_line, figures = COMMITTED_GPU_RESULTS[path.stem]()
        cells = json.loads(Path(result.folder, "executed.ipynb").read_text())["cells"]
        shown = next(json.dumps(c["outputs"]) for c in cells if marker in "".join(c["source"]))
        assert json.dumps(first_line)[1:-1][:200] in shown and shown.count("application/vnd.plotly") == figures


def _arc_shown():
    from rlkit.report import arc

    return "seed_arc_table", arc.seed_arc_table()[0], 2


def _sweep_shown():
    from rlkit.experiments import util_sweep

    return "gpu_sweep", util_sweep.answer_lines(util_sweep.read_results("outputs/06_util_sweep")["runs"])[0], 0


def _learning_shown():
    from rlkit.experiments import learning

    return "gpu_learning", learning.describe(learning.read_results("outputs/07_does_it_learn/h200")).splitlines()[0], 1


# What notebooks 05-07 show of the committed GPU results on any machine: (a word of the cell, the first line it must
# print, the interactive figures it draws).
COMMITTED_GPU_RESULTS = {"05_grpo_qwen3_4b": _arc_shown, "06_util_sweep": _sweep_shown,
                         "07_does_it_learn": _learning_shown}
