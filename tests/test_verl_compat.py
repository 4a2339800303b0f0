"""The compatibility tier's verdicts (rlkit.tools.verl_compat): what counts as a regression, and what the committed runs say.
The tier itself (verl's own tests three ways) is `make verl-compat`, which CI runs after the suite."""
from __future__ import annotations

from rlkit.core.results import OUTPUTS_DIR, read_metrics
from rlkit.tools import verl_compat as V

RUNS = OUTPUTS_DIR / V.EXPERIMENT


def test_a_regression_passes_stock_and_not_with_rlkit():
    stock = {"a": "passed", "b": "failed", "c": "passed", "d": "passed", "e": "skipped"}
    mode = {"a": "passed", "b": "passed", "c": "failed", "e": "failed"}  # d did not run at all
    assert V.regressions({"stock": stock, "unselected": mode}) == {"unselected": ["c", "d"]}


def test_baseline_drift_names_each_moved_stock_outcome():
    assert V.baseline_drift({"a": "passed", "b": "failed"}, {"a": "failed", "c": "passed"}) == [
        "a: passed -> failed", "b: failed -> absent", "c: absent -> passed"]


def test_junit_cases_map_to_pytest_node_ids(tmp_path):
    (tmp_path / "tests" / "trainer").mkdir(parents=True)
    (tmp_path / "tests" / "trainer" / "test_x_on_cpu.py").write_text("")
    assert V._node_id(tmp_path, "tests.trainer.test_x_on_cpu", "test_a[1-2]") == \
        "tests/trainer/test_x_on_cpu.py::test_a[1-2]"
    assert V._node_id(tmp_path, "tests.trainer.test_x_on_cpu.TestK", "test_b") == \
        "tests/trainer/test_x_on_cpu.py::TestK::test_b"


def test_the_tier_caught_the_guard_that_broke_verls_single_process_checkpoints():
    """Run against rlkit before issue 43 (before-43/COMMAND.txt): verl's LoRA-only checkpoint tests pass stock and
    fail with rlkit installed, selected or not."""
    metrics = read_metrics(RUNS / "before-43")
    for mode in ("unselected", "selected"):
        found = metrics["regressions"][mode]
        assert len(found) == 5 and all("TestFSDPCheckpointManagerLoraOnly" in t for t in found), found
    assert not metrics["ok"]


def test_the_committed_run_has_no_regression():
    metrics = read_metrics(RUNS / "cpu")
    assert metrics["ok"] and metrics["regressions"] == {"unselected": [], "selected": []}
    assert metrics["counts"]["stock"]["passed"] > 300 and set(metrics["outcomes"]) == {"stock", "unselected", "selected"}
