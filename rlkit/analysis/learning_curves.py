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
# the rising part of the reward ends at the first step where the baseline runs' mean reward has covered this share of its
# rise (first window to last window); the steps from there on are the plateau (rising_part)
PLATEAU_SHARE = 0.9
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


def resolved_floor(baselines: list[list[list[float]]], noise_floor: float | None) -> float | None:
    """The band's floor: ``noise_floor`` when one is given (a fixed number, as results before issue 46 had it), else
    the measured one: the baseline runs' mean range per step (:func:`mean_range`; None without two of them)."""
    return noise_floor if noise_floor is not None else mean_range(baselines)


def _common(baselines: list[list[list[float]]]) -> tuple[list[dict], list[int]]:
    tables = [{s: v for s, v in curve} for curve in baselines]
    return tables, sorted(set.intersection(*(set(t) for t in tables))) if tables else []


def mean_range(baselines: list[list[list[float]]]) -> float | None:
    """The baseline runs' range (highest - lowest) at each step they share, averaged over those steps: the measured
    run-to-run noise per step (with two runs, their :func:`curve_distance`). None without two runs or a shared step."""
    tables, steps = _common(baselines)
    if len(tables) < 2 or not steps:
        return None
    return sum(max(t[s] for t in tables) - min(t[s] for t in tables) for s in steps) / len(steps)


def baseline_band(baselines: list[list[list[float]]], *, noise_factor: float,
                  noise_floor: float | None) -> dict[int, tuple[float, float, float, float]]:
    """At each step all ``baselines`` share: their (lowest, highest, mean) value and the band around the mean,
    ``max(noise_factor x (highest - lowest), floor)``; the floor is :func:`resolved_floor` (measured when None)."""
    tables, steps = _common(baselines)
    floor = resolved_floor(baselines, noise_floor) or 0.0
    out = {}
    for s in steps:
        values = [t[s] for t in tables]
        lo, hi = min(values), max(values)
        out[s] = (lo, hi, sum(values) / len(values), max(noise_factor * (hi - lo), floor))
    return out


def rising_part(baselines: list[list[list[float]]], window: int, share: float = PLATEAU_SHARE) -> dict[str, Any] | None:
    """Where the baseline's reward stops rising: the first step at which the baseline runs' mean reward has covered
    ``share`` of its rise (from the mean of its first ``window`` steps to that of its last ``window``). The steps
    before it are the rising part, the rest the plateau, where runs that all sample the same responses agree by
    construction. None without two baseline runs, ``2 x window`` shared steps, or a rise."""
    tables, steps = _common(baselines)
    if len(tables) < 2 or len(steps) < 2 * window:
        return None
    mean = [sum(t[s] for t in tables) / len(tables) for s in steps]
    first, final = sum(mean[:window]) / window, sum(mean[-window:]) / window
    if not final > first:
        return None
    target = first + share * (final - first)
    plateau_from = next(s for s, m in zip(steps, mean) if m >= target)  # the last window's mean reaches it
    return {"share": share, "first": first, "final": final, "target": target, "plateau_from": plateau_from,
            "rising_steps": sum(s < plateau_from for s in steps)}


def _counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    return {"steps": len(rows), "in_range": sum(r["in_range"] for r in rows),
            "within_band": sum(r["within_band"] for r in rows)}


def per_step_band(compared: list[list[float]], baselines: list[list[list[float]]], *, noise_factor: float,
                  noise_floor: float | None, plateau_from: int | None = None) -> dict[str, Any] | None:
    """The compared curve step by step against the baseline runs' spread at that step (:func:`baseline_band`).

    At each step all curves share: whether the compared value lies in the baseline runs' [lowest, highest] range (the
    literal count), and whether its distance to their mean is within the band. With ``plateau_from`` the counts are
    also given apart for the rising steps (before it) and the plateau (from it), so that a plateau, where the runs
    agree by construction, cannot inflate them. ``expected_in_range`` is the share of steps a further run of the
    baseline arm itself would lie in the range of ``b`` runs: (b - 1) / (b + 1), a third with two. Returns the
    counts and the step where the distance is the largest share of its band (None without two baseline runs).
    """
    if len(baselines) < 2:
        return None
    ours = {s: v for s, v in compared}
    bands = baseline_band(baselines, noise_factor=noise_factor, noise_floor=noise_floor)
    rows = [{"step": s, "difference": ours[s] - mean, "band": band, "in_range": lo <= ours[s] <= hi,
             "within_band": abs(ours[s] - mean) <= band}
            for s, (lo, hi, mean, band) in bands.items() if s in ours]
    if not rows:
        return None
    worst = max(rows, key=lambda r: abs(r["difference"]) / r["band"] if r["band"] else
                (float("inf") if r["difference"] else 0.0))
    out = {**_counts(rows), "worst": worst, "expected_in_range": (len(baselines) - 1) / (len(baselines) + 1)}
    if plateau_from is not None:
        out["rising"] = _counts([r for r in rows if r["step"] < plateau_from])
        out["plateau"] = _counts([r for r in rows if r["step"] >= plateau_from])
    return out


def entropy_collapse(curve: list[list[float]], share: float = ENTROPY_COLLAPSE) -> int | None:
    """The first step whose entropy is at most ``share`` of the first step's (None if it never falls that far)."""
    if not curve:
        return None
    first = curve[0][1]
    return next((s for s, v in curve if v <= share * first), None)


def _per_run(runs, all_curves, window: int, min_gain: float) -> dict[str, dict[str, Any]]:
    """Each run that trained a step: its first- and last-window reward, gain, whether it learned, its entropy."""
    per_run = {}
    for name, r in runs.items():
        reward = all_curves[name]["reward"]
        if not reward:
            continue
        first, last = window_means(reward, window)
        gain = None if first is None else last - first
        entropy = all_curves[name]["entropy"]
        per_run[name] = {"arm": r["arm"], "steps_trained": len(reward), "reward_first": first,
                         "reward_last": last, "gain": gain, "learned": None if gain is None else gain >= min_gain,
                         "entropy_first": entropy[0][1] if entropy else None,
                         "entropy_last": entropy[-1][1] if entropy else None,
                         "entropy_collapsed_at": entropy_collapse(entropy)}
    return per_run


def _spread(names: list[str], reward, per_run) -> dict[str, Any]:
    """How far apart the runs of one side are: each pair's curve distance, the largest, the last-window spread."""
    pairs = [[a, b, curve_distance(reward[a], reward[b])] for a, b in itertools.combinations(names, 2)]
    pair_d = [d for *_, d in pairs if d is not None]
    lasts = [per_run[n]["reward_last"] for n in names if per_run[n]["reward_last"] is not None]
    return {"pairs": pairs, "curve_distance": max(pair_d) if pair_d else None,
            "last_window_spread": max(lasts) - min(lasts) if len(lasts) >= 2 else None}


def _compare_one(name: str, base: list[str], reward, per_run, threshold: float, *, noise_factor: float,
                 noise_floor: float | None, plateau_from: int | None) -> dict[str, Any]:
    """One compared run against the baseline runs: mean distance, within the threshold, last-window difference, and
    step by step (:func:`per_step_band`)."""
    dist = {b: curve_distance(reward[name], reward[b]) for b in base}
    known = [d for d in dist.values() if d is not None]
    mean_d = sum(known) / len(known) if known else None
    lasts = [per_run[b]["reward_last"] for b in base if per_run[b]["reward_last"] is not None]
    base_last = sum(lasts) / len(lasts) if lasts else None
    last = per_run[name]["reward_last"]
    steps = per_step_band(reward[name], [reward[b] for b in base], noise_factor=noise_factor, noise_floor=noise_floor,
                          plateau_from=plateau_from)
    return {"run": name, "distance_to_baseline": dist, "mean_distance": mean_d, "threshold": threshold,
            "within_noise": None if mean_d is None else mean_d <= threshold,
            "last_window_difference": None if last is None or base_last is None else last - base_last,
            "per_step": steps,
            "every_step_within_band": None if steps is None else steps["within_band"] == steps["steps"]}


def _all(values: list[bool | None]) -> bool | None:
    return None if not values or any(v is None for v in values) else all(values)


def analyze(runs: dict[str, dict[str, Any]], *, baseline_arm: str, compare_arm: str, window: int, min_gain: float,
            noise_factor: float, noise_floor: float | None = None) -> dict[str, Any]:
    """The result from the runs' reward curves. ``runs``: ``{name: {"arm": side, "steps": verl step records}}``, the
    side being ``baseline_arm`` or ``compare_arm`` (the compared arm, or the name of the compared variant).

    Returns, per run, the first- and last-window mean reward, their difference, whether it learned, and its entropy;
    the ``noise`` (the largest curve distance between two baseline runs, their mean range per step, the spread of
    their last-window means, and the band's floor: ``noise_floor`` if given, else that measured mean range); the
    compared side's own ``compare_spread`` (None with one compared run: no compared spread); the baseline's
    ``rising`` part (:func:`rising_part`); each compared run against the baseline runs (``compared``: mean distance,
    threshold ``max(noise_factor x noise, floor)``, the literal in-range count and the band count, overall, rising
    and plateau); and the verdict. Runs that trained no step are left out; a check that lacks its runs is None.
    """
    all_curves = {name: curves(r["steps"]) for name, r in runs.items()}
    reward = {name: c["reward"] for name, c in all_curves.items()}
    per_run = _per_run(runs, all_curves, window, min_gain)
    base = [n for n in per_run if runs[n]["arm"] == baseline_arm]
    comp = [n for n in per_run if runs[n]["arm"] == compare_arm]
    noise = _spread(base, reward, per_run)
    measured = mean_range([reward[b] for b in base])
    floor = resolved_floor([reward[b] for b in base], noise_floor)
    noise.update({"mean_range": measured, "floor": floor,
                  "floor_from": "fixed (noise_floor)" if noise_floor is not None else "measured (mean range per step)"})
    rising = rising_part([reward[b] for b in base], window)
    compared = {}
    if noise["curve_distance"] is not None:
        threshold = max(noise_factor * noise["curve_distance"], floor or 0.0)
        compared = {n: _compare_one(n, base, reward, per_run, threshold, noise_factor=noise_factor,
                                    noise_floor=noise_floor, plateau_from=rising and rising["plateau_from"])
                    for n in comp}
    spread = _spread(comp, reward, per_run) if len(comp) >= 2 else None
    limit = next(iter(compared.values()))["threshold"] if compared else None
    learned = [per_run[n]["learned"] for n in per_run]
    verdict = {"runs_analyzed": len(per_run), "baseline_runs": len(base), "compare_runs": len(comp),
               "all_learned": all(v is True for v in learned) if learned else None,
               "compare_within_noise": _all([c["within_noise"] for c in compared.values()]),
               "compare_every_step_within_band": _all([c["every_step_within_band"] for c in compared.values()]),
               "compare_spread_within_noise": None if spread is None or spread["curve_distance"] is None or limit is None
               else spread["curve_distance"] <= limit}
    verdict["passed"] = (verdict["all_learned"] is True and verdict["compare_within_noise"] is True
                         and verdict["compare_every_step_within_band"] is True
                         and verdict["compare_spread_within_noise"] is not False)
    return {"criteria": {"window": window, "min_gain": min_gain, "noise_factor": noise_factor,
                         "noise_floor": noise_floor, "baseline_arm": baseline_arm, "compare_arm": compare_arm},
            "per_run": per_run, "noise": noise, "compare_spread": spread, "rising": rising, "compared": compared,
            "verdict": verdict}


def compared_runs(analysis: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each compared run's comparison, by name: ``compared``, or in results from before issue 46 (one compared run,
    so no compared spread) their single ``compare``."""
    if "compared" in analysis:
        return analysis["compared"]
    comp = analysis.get("compare")
    return {comp["run"]: comp} if comp else {}


def disagreements(saved: Any, again: Any, path: str = "analysis") -> list[str]:
    """Where ``again`` (an analysis recomputed now) differs from ``saved`` on what ``saved`` holds: every field of
    ``saved`` must be in ``again`` with the same value; fields ``again`` adds are not compared. A saved analysis from
    before issue 46 holds its one compared run as ``compare``: that is held to the run's entry of ``compared``."""
    if not (isinstance(saved, dict) and isinstance(again, dict)):
        return [] if saved == again else [f"{path}: {saved!r} != {again!r}"]
    out = []
    if path == "analysis" and "compare" in saved and "compared" in again:
        comp, saved = saved["compare"], {k: v for k, v in saved.items() if k != "compare"}
        if comp is not None:
            out += disagreements(comp, again["compared"].get(comp["run"]), f"{path}.compared[{comp['run']}]")
    out += [f"{path}.{k}: missing" for k in saved if k not in again]
    return out + [d for k in saved if k in again for d in disagreements(saved[k], again[k], f"{path}.{k}")]


def analysis_runs(metrics: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The runs of notebook 07's ``metrics`` as :func:`analyze` takes them: each run's side (its ``variant``, or in
    results from before issue 46 its arm) and its step records."""
    return {name: {"arm": metrics["runs"][name].get("variant", metrics["runs"][name]["arm"]), "steps": steps}
            for name, steps in metrics["steps"].items()}


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
