"""rlkit.experiments.estimates.phase_memory / planner_phase_check: notebook 05's runs place each phase's device peak from the launch's
marks by notebook 06's rule, so the planner is held against every phase of every arm (issue 41). The samples and marks
are a committed notebook-06 point's, written as notebook 05's launcher records them."""
from __future__ import annotations

import copy
import json

import pytest

from rlkit.core.results import OUTPUTS_DIR
from rlkit.experiments import estimates
from rlkit.verl.logs import PHASES

POINT = OUTPUTS_DIR / "06_util_sweep" / "qwen3_4b_48g-u0.7" / "metrics.json"


def _as_notebook_05(point: dict) -> dict:
    measured = point["measured"]
    return {**{k: point[k] for k in ("recipe", "overrides", "model")}, "steps": measured["steps"],
            "launch": {"failure": None, "gpu_memory": {
                "timeline": [[r["t"], [r["used_gib"]]] for r in measured["timeline"]],
                "marks": measured["marks"], "process_samples": None}}}


@pytest.fixture(scope="module")
def point() -> dict:
    return json.loads(POINT.read_text())


def test_each_phase_peak_over_steps_2_on_is_notebook_06s(point):
    found = estimates.phase_memory(_as_notebook_05(point))
    measured = point["measured"]
    assert found["steps"] == [2] and found["baseline_gib"] == measured["baseline_used_gib"]
    for phase in ("gen", "old_log_prob", "update_actor"):
        assert found["phase_peaks"][phase]["by_step"] == {"2": measured["phase_peaks"][phase]["by_step"]["2"]}
        assert found["phase_peaks"][phase]["peak_job_gib"] == pytest.approx(
            measured["phase_peaks"][phase]["by_step"]["2"] - measured["baseline_used_gib"], abs=0)
    assert set(found["phase_peaks"]) <= set(PHASES)  # idle, init and shutdown are not phases of a step


def test_a_run_recorded_without_marks_has_no_phase_peaks(point):
    run = _as_notebook_05(point)
    del run["launch"]["gpu_memory"]["marks"]
    assert estimates.phase_memory(run) is None and estimates.planner_phase_check(run) is None


def test_the_planner_is_held_against_each_phase(point):
    run = _as_notebook_05(point)
    check = estimates.planner_phase_check(run)
    peaks = estimates.phase_memory(run)["phase_peaks"]
    assert set(check) == {"gen", "old_log_prob", "update_actor", "update_weights"}
    olp = check["old_log_prob"]
    assert olp["measured_gib"] == peaks["old_log_prob"]["peak_job_gib"]
    assert olp["ratio"] == pytest.approx(olp["measured_gib"] / olp["planner_gib"]) and olp["within"] == (
        abs(olp["ratio"] - 1) <= 0.10)
    assert check["update_weights"]["ratio"] is None  # seen in fewer than 3 samples: too short to judge at 1 Hz
    shifted = copy.deepcopy(run)  # step marks 20 s early move the phases, and the peaks with them
    shifted["launch"]["gpu_memory"]["marks"] = [[t - (20.0 if name.startswith("logged") else 0.0), name]
                                                 for t, name in run["launch"]["gpu_memory"]["marks"]]
    assert estimates.phase_memory(shifted)["phase_peaks"].get("old_log_prob") != peaks["old_log_prob"]
