"""Learning curves of GRPO runs and whether one arm learns as another does (notebook 07's analysis, issue 25).

Pure functions of verl's per-step records (:func:`rlkit.verl.logs.read_steps`): the curves, their first and last
windows, the distance between two runs' curves, the band a compared run is held to at each step, the step a run's
entropy collapsed at, and :func:`analyze`, which turns runs of a baseline arm and a compared arm into a verdict.
:mod:`rlkit.experiments.learning` runs the experiment and calls them; :mod:`rlkit.viz.learning` re-runs them with
the criteria a reader picks.
"""
from __future__ import annotations

import itertools
from typing import Any

# a run's entropy at or below this share of its first step's: the policy samples nearly one response per prompt, so
# the group's advantages, and with them the updates, vanish (the curves after it say little about the patches)
ENTROPY_COLLAPSE = 0.01
# verl's per-step metric behind each curve (verl 0.9.1 metric names)
CURVES = {"reward": "critic/score/mean", "grad_norm": "actor/grad_norm", "pg_loss": "actor/pg_loss",
          "entropy": "actor/entropy", "response_length": "response_length/mean"}


def curves(steps: list[dict[str, Any]]) -> dict[str, list[list[float]]]:
    """``{curve: [[step, value], ...]}`` over the trained steps, for every curve in :data:`CURVES`."""
    from rlkit.verl.logs import training_steps

    trained = training_steps(steps)
    return {name: [[s["step"], float(s[key])] for s in trained if isinstance(s.get(key), (int, float))]
            for name, key in CURVES.items()}


def window_means(curve: list[list[float]], window: int) -> tuple[float | None, float | None]:
    """Mean of the first and of the last ``window`` points (None without ``2 x window`` points)."""
    values = [v for _, v in curve]
    if len(values) < 2 * window:
        return None, None
    return sum(values[:window]) / window, sum(values[-window:]) / window


def curve_distance(a: list[list[float]], b: list[list[float]]) -> float | None:
    """Mean absolute difference of two curves over the steps both have (None when they share none)."""
    left, right = {s: v for s, v in a}, {s: v for s, v in b}
    common = sorted(set(left) & set(right))
    return sum(abs(left[s] - right[s]) for s in common) / len(common) if common else None


def baseline_band(baselines: list[list[list[float]]], *, noise_factor: float,
                  noise_floor: float) -> dict[int, tuple[float, float, float, float]]:
    """At each step all ``baselines`` share: their (lowest, highest, mean) value and the band around the mean,
    ``max(noise_factor x (highest - lowest), noise_floor)``."""
    tables = [dict((s, v) for s, v in curve) for curve in baselines]
    out = {}
    for s in sorted(set.intersection(*(set(t) for t in tables))) if tables else []:
        values = [t[s] for t in tables]
        lo, hi = min(values), max(values)
        out[s] = (lo, hi, sum(values) / len(values), max(noise_factor * (hi - lo), noise_floor))
    return out


def per_step_band(compared: list[list[float]], baselines: list[list[list[float]]], *, noise_factor: float,
                  noise_floor: float) -> dict[str, Any] | None:
    """The compared curve step by step against the baseline runs' spread at that step (:func:`baseline_band`).

    At each step all curves share: whether the compared value lies in the baseline runs' range, and whether its
    distance to their mean is within the band. The range alone is no test with two repeats: a third run of the same
    arm falls between two others only a third of the time. Returns the counts and the step where the distance is the
    largest share of its band (None without two baseline runs).
    """
    if len(baselines) < 2:
        return None
    ours = dict((s, v) for s, v in compared)
    bands = baseline_band(baselines, noise_factor=noise_factor, noise_floor=noise_floor)
    rows = [{"step": s, "difference": ours[s] - mean, "band": band, "in_range": lo <= ours[s] <= hi,
             "within_band": abs(ours[s] - mean) <= band}
            for s, (lo, hi, mean, band) in bands.items() if s in ours]
    if not rows:
        return None
    worst = max(rows, key=lambda r: abs(r["difference"]) / r["band"])
    return {"steps": len(rows), "in_range": sum(r["in_range"] for r in rows),
            "within_band": sum(r["within_band"] for r in rows), "worst": worst}


def entropy_collapse(curve: list[list[float]], share: float = ENTROPY_COLLAPSE) -> int | None:
    """The first step whose entropy is at most ``share`` of the first step's (None if it never falls that far)."""
    if not curve:
        return None
    first = curve[0][1]
    return next((s for s, v in curve if v <= share * first), None)


def analyze(runs: dict[str, dict[str, Any]], *, baseline_arm: str, compare_arm: str, window: int, min_gain: float,
            noise_factor: float, noise_floor: float) -> dict[str, Any]:
    """The result from the runs' reward curves. ``runs``: ``{name: {"arm": arm, "steps": verl step records}}``.

    Returns, per run, the first- and last-window mean reward, their difference, whether it learned, and its entropy
    (first, last, the step it collapsed at); the noise (the largest distance between two baseline runs, and the
    spread of their last-window means); the compared arm's mean distance to the baseline runs, the threshold and
    whether it is within, and the same step by step (:func:`per_step_band`); and the verdict. Runs that
    trained no step are left out, and a check that lacks its runs is None (never passed).
    """
    all_curves = {name: curves(r["steps"]) for name, r in runs.items()}
    reward = {name: c["reward"] for name, c in all_curves.items()}
    per_run = {}
    for name, r in runs.items():
        if not reward[name]:
            continue
        first, last = window_means(reward[name], window)
        gain = None if first is None else last - first
        entropy = all_curves[name]["entropy"]
        per_run[name] = {"arm": r["arm"], "steps_trained": len(reward[name]), "reward_first": first,
                         "reward_last": last, "gain": gain, "learned": None if gain is None else gain >= min_gain,
                         "entropy_first": entropy[0][1] if entropy else None,
                         "entropy_last": entropy[-1][1] if entropy else None,
                         "entropy_collapsed_at": entropy_collapse(entropy)}
    base = [n for n in per_run if runs[n]["arm"] == baseline_arm]
    comp = [n for n in per_run if runs[n]["arm"] == compare_arm]
    pairs = [[a, b, curve_distance(reward[a], reward[b])] for a, b in itertools.combinations(base, 2)]
    pair_d = [d for *_, d in pairs if d is not None]
    lasts = [per_run[n]["reward_last"] for n in base if per_run[n]["reward_last"] is not None]
    noise = {"pairs": pairs, "curve_distance": max(pair_d) if pair_d else None,
             "last_window_spread": max(lasts) - min(lasts) if len(lasts) >= 2 else None}
    compare = None
    if comp and noise["curve_distance"] is not None:
        dist = {b: curve_distance(reward[comp[0]], reward[b]) for b in base}
        known = [d for d in dist.values() if d is not None]
        threshold = max(noise_factor * noise["curve_distance"], noise_floor)
        mean_d = sum(known) / len(known) if known else None
        base_last = sum(lasts) / len(lasts) if lasts else None
        comp_last = per_run[comp[0]]["reward_last"]
        steps = per_step_band(reward[comp[0]], [reward[b] for b in base], noise_factor=noise_factor,
                              noise_floor=noise_floor)
        compare = {"run": comp[0], "distance_to_baseline": dist, "mean_distance": mean_d, "threshold": threshold,
                   "within_noise": None if mean_d is None else mean_d <= threshold,
                   "last_window_difference": None if comp_last is None or base_last is None else comp_last - base_last,
                   "per_step": steps,
                   "every_step_within_band": None if steps is None else steps["within_band"] == steps["steps"]}
    learned = [per_run[n]["learned"] for n in per_run]
    verdict = {"runs_analyzed": len(per_run), "baseline_runs": len(base), "compare_runs": len(comp),
               "all_learned": all(v is True for v in learned) if learned else None,
               "compare_within_noise": compare["within_noise"] if compare else None,
               "compare_every_step_within_band": compare["every_step_within_band"] if compare else None}
    verdict["passed"] = (verdict["all_learned"] is True and verdict["compare_within_noise"] is True
                         and verdict["compare_every_step_within_band"] is True)
    return {"criteria": {"window": window, "min_gain": min_gain, "noise_factor": noise_factor,
                         "noise_floor": noise_floor, "baseline_arm": baseline_arm, "compare_arm": compare_arm},
            "per_run": per_run, "noise": noise, "compare": compare, "verdict": verdict}


def up_to(runs: dict[str, dict[str, Any]], last_step: int) -> dict[str, dict[str, Any]]:
    """``runs`` (as :func:`analyze` takes them) with each run's step records cut after ``last_step``."""
    return {name: {**r, "steps": [s for s in r["steps"] if s.get("step", 0) <= last_step]} for name, r in runs.items()}


def analyze_before_collapse(runs: dict[str, dict[str, Any]], analysis: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`analyze` again, with the same criteria, over the steps before the first run's entropy collapsed: the
    steps whose updates still move the policy (None when no run collapsed)."""
    collapsed = [r["entropy_collapsed_at"] for r in analysis["per_run"].values() if r["entropy_collapsed_at"]]
    if not collapsed:
        return None
    last = min(collapsed) - 1
    return {"last_step": last, **analyze(up_to(runs, last), **analysis["criteria"])}
