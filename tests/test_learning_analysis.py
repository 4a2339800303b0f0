"""Notebook 07's analysis after issue 46 on made-up verl step records: both sides' spreads, the literal in-range count
beside the band, the rising part counted apart from the plateau, the measured floor, the compared variant's config
refusals, and results from before issue 46 (one compared run, a fixed floor) still read."""
from __future__ import annotations

import json

import pytest

from rlkit.analysis import learning_curves as LC
from rlkit.core import params as P
from rlkit.core.env import REPO_ROOT
from rlkit.core.results import load_profile
from rlkit.experiments import learning as L
from rlkit.viz import learning as VL

BASE, FAST = "1-fixes-hostadamw", "5-fastest"
CRITERIA = {"baseline_arm": BASE, "compare_arm": FAST, "window": 3, "min_gain": 0.05, "noise_factor": 2.0}
# a rise over steps 1-10, then a plateau (steps 11-30) where every run samples the same responses: equal rewards
RISE = [0.01 * 1.5 ** i for i in range(10)]
PLATEAU = [0.5] * 20


def _steps(rewards):
    return [{"step": i + 1, "timing_s/step": 5.0, "critic/score/mean": r, "actor/entropy": 8.0, "actor/grad_norm": 0.5,
             "actor/pg_loss": 0.0, "response_length/mean": 128.0} for i, r in enumerate(rewards)]


def _runs(base: list[list[float]], fast: list[list[float]]) -> dict:
    runs = {f"{BASE}.r{i}": {"arm": BASE, "steps": _steps(r)} for i, r in enumerate(base, 1)}
    return runs | {f"{FAST}.r{i}": {"arm": FAST, "steps": _steps(r)} for i, r in enumerate(fast, 1)}


def _shift(curve, by):
    return [v + by for v in curve]


B1, B2 = RISE + PLATEAU, _shift(RISE, 0.004) + PLATEAU


def test_the_plateau_is_counted_apart_so_it_cannot_inflate_the_literal_count():
    """A compared run above the baseline range at every rising step and equal to it on the plateau: 20 of 30 steps
    inside the range overall, 0 of 10 in the rising part."""
    a = LC.analyze(_runs([B1, B2], [_shift(RISE, 0.006) + PLATEAU, _shift(RISE, 0.007) + PLATEAU]), **CRITERIA)
    rising = a["rising"]
    mean = [(x + y) / 2 for x, y in zip(B1, B2)]
    first, final = sum(mean[:3]) / 3, sum(mean[-3:]) / 3
    assert rising["target"] == pytest.approx(first + 0.9 * (final - first))
    assert rising["plateau_from"] == 11 and rising["rising_steps"] == 10  # step 10's mean (0.386) is short of 0.45
    for comp in a["compared"].values():
        steps = comp["per_step"]
        assert (steps["in_range"], steps["steps"]) == (20, 30)  # the overall count: two thirds, all of it plateau
        assert steps["rising"] == {"steps": 10, "in_range": 0, "within_band": 10}
        assert steps["plateau"] == {"steps": 20, "in_range": 20, "within_band": 20}
    text = L.describe(_metrics(a))
    assert "inside at 0 of 10" in text and "steps 1-10 are the rising part" in text
    assert text.splitlines()[-1].endswith(f"range {FAST}.r1 at 0 of 10, {FAST}.r2 at 0 of 10 steps.")


def test_no_rise_no_rising_part():
    flat = [0.3] * 30
    assert LC.rising_part([[[i + 1, v] for i, v in enumerate(flat)]] * 2, 3) is None
    a = LC.analyze(_runs([flat, flat], [flat, flat]), **CRITERIA)
    assert a["rising"] is None and "rising" not in a["compared"][f"{FAST}.r1"]["per_step"]


def test_the_floor_is_the_measured_mean_range_and_not_a_chosen_number():
    """Without noise_floor the band never narrows below the baseline runs' mean range per step (measured); where they
    agree exactly, a compared run off by more than that is outside the band, which a fixed 0.02 would have hidden."""
    b1, b2 = RISE + PLATEAU, _shift(RISE, 0.003) + PLATEAU
    off = [v + (0.01 if i >= 10 else 0.0015) for i, v in enumerate(RISE + PLATEAU)]
    a = LC.analyze(_runs([b1, b2], [off, off]), **CRITERIA)
    assert a["criteria"]["noise_floor"] is None and a["noise"]["floor_from"].startswith("measured")
    assert a["noise"]["mean_range"] == a["noise"]["floor"] == pytest.approx(0.003 * 10 / 30)
    comp = a["compared"][f"{FAST}.r1"]
    assert comp["per_step"]["plateau"]["within_band"] == 0 and comp["per_step"]["rising"]["within_band"] == 10
    assert comp["every_step_within_band"] is False and not a["verdict"]["passed"]
    assert comp["per_step"]["worst"]["band"] == pytest.approx(a["noise"]["floor"])
    fixed = LC.analyze(_runs([b1, b2], [off, off]), **CRITERIA, noise_floor=0.02)
    assert fixed["compared"][f"{FAST}.r1"]["every_step_within_band"] is True  # the chosen floor hides it
    assert fixed["noise"]["floor"] == 0.02 and fixed["noise"]["floor_from"].startswith("fixed")
    # bands: noise_factor x the range at the step, at least the measured floor
    bands = LC.baseline_band([[[1, 0.1], [2, 0.2]], [[1, 0.1], [2, 0.3]]], noise_factor=2.0, noise_floor=None)
    assert bands[1][3] == pytest.approx(0.05) and bands[2][3] == pytest.approx(0.2)
    assert LC.mean_range([[[1, 0.1]]]) is None


def test_identical_baseline_runs_give_a_zero_band_and_no_division_by_it():
    a = LC.analyze(_runs([B1, B1], [B1, _shift(B1, 0.001)]), **CRITERIA)
    assert a["noise"]["floor"] == 0.0
    assert a["compared"][f"{FAST}.r1"]["every_step_within_band"] is True
    assert a["compared"][f"{FAST}.r2"]["per_step"]["within_band"] == 0  # any difference is outside a zero band
    assert a["verdict"]["compare_spread_within_noise"] is False


def test_both_sides_have_a_spread_and_the_compared_one_is_held_to_the_threshold():
    close = LC.analyze(_runs([B1, B2], [B1, B2]), **CRITERIA)
    spread = close["compare_spread"]
    assert spread["curve_distance"] == pytest.approx(close["noise"]["curve_distance"])
    assert close["verdict"]["compare_spread_within_noise"] and close["verdict"]["passed"]
    assert close["verdict"]["compare_runs"] == 2 and set(close["compared"]) == {f"{FAST}.r1", f"{FAST}.r2"}
    # each compared run within the noise and the band on its own, but the two 0.010 apart where the baseline runs
    # are 0.004 apart: the compared side's own spread is outside the threshold, and that alone fails the verdict
    low, high = _shift(RISE, -0.003) + PLATEAU, _shift(RISE, 0.007) + PLATEAU
    wide = LC.analyze(_runs([B1, B2], [low, high]), **CRITERIA)
    assert all(c["within_noise"] and c["every_step_within_band"] for c in wide["compared"].values())
    assert wide["compare_spread"]["curve_distance"] == pytest.approx(0.010 * 10 / 30)
    assert wide["verdict"]["compare_spread_within_noise"] is False and not wide["verdict"]["passed"]
    one = LC.analyze({k: v for k, v in _runs([B1, B2], [B1]).items()}, **CRITERIA)
    assert one["compare_spread"] is None and one["verdict"]["compare_spread_within_noise"] is None
    assert "One compared run: no compared spread." in L.describe(_metrics(one))


def test_expected_in_range_share_follows_the_number_of_baseline_runs():
    curves = [[[1, v]] for v in (0.1, 0.2, 0.3)]
    assert LC.per_step_band([[1, 0.15]], curves, noise_factor=2.0, noise_floor=None)["expected_in_range"] == 0.5


def _cfg(**changes):
    return P.build(L.Config, {**load_profile(L.NOTEBOOK, "tiny"), **changes})


@pytest.mark.parametrize("overrides, words", [
    ({"rmsnorn": "compiled"}, r"'rmsnorn' is not a field of rlkit.recipes.grpo.GRPORecipe.*Fix: correct the spelling"),
    ({"lr": 1e-4}, r"'lr' is the workload every run shares, set by Config.lr.*Fix: remove it"),
    ({"gpu_memory_utilization": 0.95}, r"'gpu_memory_utilization' is the workload every run shares"),
    ({"rmsnorm": "compild"}, r"its recipe is refused .*rmsnorm.*Fix: "),
    ({"host_overlap_copies": True}, r"its recipe is refused .*host_rank0_owner.*Fix: "),  # arm 5 has the owner on
])
def test_the_compared_variant_refuses_what_is_not_a_lever(overrides, words):
    with pytest.raises(P.ParamError, match=rf"Config\.compare_overrides: {words}"):
        _cfg(compare_overrides=overrides)


def test_unknown_params_stay_an_error_and_the_floor_is_no_parameter():
    with pytest.raises(P.ParamError, match=r"unknown parameters \['noise_floor'\]"):
        _cfg(noise_floor=0.02)


STOPPED_RUN = REPO_ROOT / "outputs/_node/session29/learning-stopped/5-fastest.r1/verl_metrics.jsonl"


def test_the_profiles_change_the_lr_or_length_from_the_committed_runs():
    """The h200 profile is not the committed lr 1e-3 run in a new folder: it moves the knobs its comments name, and its
    steps hold the rise session 29 measured at its lr (the last step under 90% of the best mean reward) and three
    windows of plateau after it."""
    h200, committed = load_profile(L.NOTEBOOK, "h200"), json.loads(
        (REPO_ROOT / "outputs/07_does_it_learn/h200/metrics.json").read_text())["config"]
    assert h200["lr"] < committed["lr"]
    assert h200["runs_dir"] != committed["runs_dir"]  # the committed runs' recipes differ: never read back as these
    rows = [json.loads(line) for line in STOPPED_RUN.read_text().splitlines()]
    assert {r["data"]["actor/lr"] for r in rows} == {h200["lr"]}
    best = max(r["data"]["critic/score/mean"] for r in rows)
    rise_end = max(r["step"] for r in rows if r["data"]["critic/score/mean"] < 0.9 * best)
    assert h200["steps"] >= rise_end + 3 * h200["window"]
    text = (REPO_ROOT / "nbs/params/07_does_it_learn.h200.yaml").read_text()
    assert f"lr 1e-3 -> 5e-4, steps {committed['steps']} -> {h200['steps']}" in text


# ------------------------------------------------------------------------------------------ results before issue 46

COMMITTED = REPO_ROOT / "outputs" / "07_does_it_learn" / "h200" / "metrics.json"


def _metrics(a):
    cfg = _cfg(steps=30, window=3)
    runs = {n: {"arm": r["arm"], "variant": r["arm"]} for n, r in a["per_run"].items()}
    return {"config": P.as_dict(cfg), "synthetic": {"task": True, "model": True},
            "task": {"reward": "target_chars"}, "data": {"rows": 3, "source": "synthetic"}, "model": {},
            "probe": None, "plan": [{"run": n} for n in runs], "pending": [], "launched": True,
            "launch_reason": "1 GPU", "analysis": a, "runs": runs, "curves": {}}


@pytest.mark.skipif(not COMMITTED.exists(), reason="no committed GPU runs of notebook 07")
def test_results_from_before_issue_46_are_read_and_said_to_be_so():
    m = json.loads(COMMITTED.read_text())
    assert "compared" not in m["analysis"] and list(LC.compared_runs(m["analysis"])) == [m["analysis"]["compare"]["run"]]
    text = L.describe(m)
    assert "One compared run: no compared spread." in text and "a fixed 0.02, not a measurement" in text
    assert "split no rising part from the plateau" in text and "at 22 of 40 steps" in text
    rows = VL.count_rows(m["analysis"])
    assert rows[0]["inside range, all"] == "22 of 40" and rows[0]["inside range, rising"] == "-"
    # the committed runs again, with the measured floor: the rising part is steps 1-8, arm 5 inside at 4 of them
    again = LC.analyze(LC.analysis_runs(m), **{**m["analysis"]["criteria"], "noise_floor": None})
    steps = LC.compared_runs(again)[m["analysis"]["compare"]["run"]]["per_step"]
    assert again["rising"]["plateau_from"] == 9 and steps["rising"]["in_range"] == 4 and steps["in_range"] == 22


def test_the_explorer_redraws_new_results_with_the_measured_floor():
    runs = _runs([B1, B2], [_shift(RISE, 0.006) + PLATEAU, B2])
    a = LC.analyze(runs, **CRITERIA)
    m = {**_metrics(a), "steps": {n: r["steps"] for n, r in runs.items()},
         "curves": {n: LC.curves(r["steps"]) for n, r in runs.items()},
         "runs": {n: {"arm": "x", "variant": r["arm"]} for n, r in runs.items()}}
    knobs = {"window": 3, "noise_factor": 2.0, "noise_floor": None}
    assert VL.reanalyze(m, **knobs, last_step=30) == a  # the sides come from each run's variant, not its arm
    view = VL.draw({"curve": "reward", "last_step": 30, **knobs}, m)
    band = view.figures["curve"].data[-1]
    assert band.fill == "toself" and "floor 0.0013 (measured)" in view.texts["verdict"]
    assert "rising part: inside at 0 of 10" in view.texts["verdict"]
    fixed = VL.draw({"curve": "reward", "last_step": 30, **knobs, "noise_floor": 0.02}, m)
    assert "floor 0.0200 (fixed)" in fixed.texts["verdict"]
    assert VL.learning_explorer(m).controls["noise_floor"].value is None
