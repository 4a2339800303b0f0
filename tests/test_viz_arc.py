"""rlkit.viz.arc: notebook 05's opening figures over the committed arc, one bar per run."""
from __future__ import annotations

import pytest

from rlkit.report import arc as report_arc
from rlkit.viz import arc


@pytest.fixture(scope="module")
def runs():
    commit, found, _ = report_arc.arc_runs()
    if commit is None:
        pytest.skip("no committed arc")
    return found


def test_each_trained_runs_stack_is_its_step_and_a_failed_run_says_why(runs):
    fig = arc.phase_figure(runs)
    for i, (name, m) in enumerate(runs.items()):
        stack = [t.y[i] for t in fig.data if t.y[i] is not None]
        if m["summary"].get("step_s") is None:
            assert not stack and "(" in fig.data[0].x[i]  # no bar; the label carries the outcome
        else:
            assert sum(stack) == pytest.approx(m["summary"]["step_s"])
    assert [t.name for t in fig.data] == [*arc.PHASES, "other"]


def test_memory_sets_the_planner_beside_each_measured_peak(runs):
    from rlkit.experiments.estimates import planner_check

    fig = arc.memory_figure(runs)
    measured, planner = fig.data
    for i, m in enumerate(runs.values()):
        check = planner_check(m)
        if m["summary"].get("actor_max_allocated_gib"):
            assert measured.y[i] == m["summary"]["actor_max_allocated_gib"] and planner.y[i] == check["planner_actor_peak_gib"]
        else:
            assert measured.y[i] is None and planner.y[i] is None
