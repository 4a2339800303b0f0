"""Notebook 07's figures and explorer: the runs' curves, and the analysis re-run with the criteria a reader picks.

The verdict of :mod:`rlkit.experiments.learning` rests on choices (the window, the noise factor and floor, the
steps it reads). :func:`reanalyze` runs the same :func:`~rlkit.analysis.learning_curves.analyze` on the saved step
records with other choices, for example only the steps before the entropy collapsed, and :func:`draw` shows the
picked curve, the band the compared arm is held to, and what the analysis then says. Nothing is measured again.
"""
from __future__ import annotations

import functools
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from rlkit.analysis import learning_curves as LC
from rlkit.core.results import fmt
from rlkit.viz.explorer import Explorer, View, esc, html_table, message_figure


def curve_figure(metrics: dict[str, Any], curve: str = "reward", title: str | None = None):
    """One line per run of one curve; the baseline's repeats share a colour."""
    fig = go.Figure()
    _add_curves(fig, metrics, curve)
    fig.update_layout(title=title or f"{curve} per step", xaxis_title="step", yaxis_title=curve)
    return fig


def curves_grid(metrics: dict[str, Any], names: tuple[str, ...] = ("grad_norm", "pg_loss", "entropy", "response_length")):
    """The other curves, one panel each, one line per run."""
    cols = 2
    fig = make_subplots(rows=(len(names) + cols - 1) // cols, cols=cols, subplot_titles=names)
    for i, name in enumerate(names):
        _add_curves(fig, metrics, name, row=i // cols + 1, col=i % cols + 1, legend=i == 0)
    fig.update_layout(title="grad_norm, pg_loss, entropy and response length per step", height=650)
    return fig


def _side(metrics: dict[str, Any], name: str) -> str:
    """The side a run is on: its variant (the baseline arm or the compared variant), or before issue 46 its arm."""
    return metrics["runs"][name].get("variant", metrics["runs"][name]["arm"])


def _add_curves(fig, metrics, curve, row=None, col=None, legend=True) -> None:
    cfg = metrics["config"]
    colours = {cfg["baseline_arm"]: "#1f77b4", cfg.get("compare_name", cfg["compare_arm"]): "#d62728"}
    for i, (name, per_curve) in enumerate(metrics["curves"].items()):
        points = per_curve.get(curve) or []
        arm = _side(metrics, name)
        fig.add_scatter(x=[s for s, _ in points], y=[v for _, v in points], mode="lines+markers", name=name,
                        legendgroup=name, showlegend=legend, marker={"size": 4},
                        line={"color": colours.get(arm), "dash": "solid" if name.endswith(".r1") else "dot"},
                        **({"row": row, "col": col} if row else {}))


def reanalyze(metrics: dict[str, Any], *, window: int, noise_factor: float, noise_floor: float | None,
              last_step: int) -> dict[str, Any]:
    """:func:`~rlkit.analysis.learning_curves.analyze` over each run's steps up to ``last_step``, with these criteria
    (the sides and ``min_gain`` as the experiment had them; ``noise_floor`` None: the measured floor)."""
    criteria = metrics["analysis"]["criteria"]
    runs = LC.up_to(LC.analysis_runs(metrics), last_step)
    return LC.analyze(runs, baseline_arm=criteria["baseline_arm"], compare_arm=criteria["compare_arm"], window=window,
                     min_gain=criteria["min_gain"], noise_factor=noise_factor, noise_floor=noise_floor)


def band_traces(fig, metrics: dict[str, Any], *, noise_factor: float, noise_floor: float | None, last_step: int) -> None:
    """The baseline runs' mean reward +- the compared runs' per-step band (:func:`~rlkit.analysis.learning_curves.baseline_band`;
    ``noise_floor`` None: the measured floor), shaded (translucent, over the runs' lines)."""
    base_arm = metrics["analysis"]["criteria"]["baseline_arm"]
    base = [c["reward"] for n, c in metrics["curves"].items() if _side(metrics, n) == base_arm]
    if len(base) < 2:
        return
    bands = {s: b for s, b in LC.baseline_band(base, noise_factor=noise_factor, noise_floor=noise_floor).items()
             if s <= last_step}
    steps = list(bands)
    mean, band = [b[2] for b in bands.values()], [b[3] for b in bands.values()]
    fig.add_scatter(x=steps + steps[::-1], y=[m + d for m, d in zip(mean, band)] + [m - d for m, d in
                    zip(mean[::-1], band[::-1])], fill="toself", mode="lines", line={"width": 0},
                    fillcolor="rgba(31,119,180,0.15)", name=f"{base_arm} mean +- band", hoverinfo="skip")


def count_rows(analysis: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per compared run: its mean distance and threshold, and the literal count of steps inside the baseline
    runs' range beside the band's count, over all steps, the rising part and the plateau ("-" where not split)."""
    rows = []
    for name, comp in LC.compared_runs(analysis).items():
        steps = comp["per_step"] or {}
        row = {"run": name, "mean distance": comp["mean_distance"], "threshold": comp["threshold"],
               "steps": steps.get("steps")}
        for part, counts in (("all", steps), ("rising", steps.get("rising")), ("plateau", steps.get("plateau"))):
            row[f"inside range, {part}"] = f"{counts['in_range']} of {counts['steps']}" if counts else "-"
            row[f"within band, {part}"] = f"{counts['within_band']} of {counts['steps']}" if counts else "-"
        rows.append(row)
    return rows


def verdict_html(analysis: dict[str, Any]) -> str:
    rows = [{"run": name, "steps": r["steps_trained"], "reward first": r["reward_first"], "reward last": r["reward_last"],
             "gain": r["gain"], "learns": r["learned"], "entropy collapsed at": r["entropy_collapsed_at"]}
            for name, r in analysis["per_run"].items()]
    v, noise, lines = analysis["verdict"], analysis["noise"], []
    floor = noise.get("floor", analysis["criteria"]["noise_floor"])
    lines.append(f"Noise {fmt(noise['curve_distance'], '.4f')}; floor {fmt(floor, '.4f')} "
                 f"({'measured' if analysis['criteria']['noise_floor'] is None else 'fixed'}); compared spread "
                 + (fmt(analysis['compare_spread']['curve_distance'], '.4f') if analysis.get("compare_spread")
                    else "none (one compared run)") + ".")
    for name, comp in LC.compared_runs(analysis).items():
        steps = comp["per_step"] or {}
        rising = steps.get("rising")
        lines.append(f"{esc(name)}: mean distance {fmt(comp['mean_distance'], '.4f')} to the baseline runs "
                     f"(threshold {comp['threshold']:.4f}); inside the baseline runs' range at {steps.get('in_range', '-')} "
                     f"of {steps.get('steps', '-')} steps, within the band at {steps.get('within_band', '-')}"
                     + (f"; rising part: inside at {rising['in_range']} of {rising['steps']}, band at "
                        f"{rising['within_band']}" if rising else "") + ".")
    lines.append(f"<b>Verdict: {'passed' if v['passed'] else 'not passed'}</b> (every run learns: {v['all_learned']}; "
                 f"within the noise: {v['compare_within_noise']}; at every step: {v['compare_every_step_within_band']}; "
                 f"compared spread within the noise: {v.get('compare_spread_within_noise')}).")
    return html_table(rows) + "".join(f"<p>{line}</p>" for line in lines)


def draw(state: dict[str, Any], metrics: dict[str, Any]) -> View:
    """The View for ``state`` (``curve``, ``window``, ``noise_factor``, ``noise_floor``, ``last_step``)."""
    if 2 * state["window"] > state["last_step"]:
        text = f"the window ({state['window']}) needs at least {2 * state['window']} steps; read more steps"
        return View(figures={"curve": message_figure(text, height=420)}, texts={"verdict": f"<p>{esc(text)}</p>"})
    analysis = reanalyze(metrics, window=state["window"], noise_factor=state["noise_factor"],
                         noise_floor=state["noise_floor"], last_step=state["last_step"])
    shown = {**metrics, "curves": {n: {k: [p for p in c if p[0] <= state["last_step"]] for k, c in per.items()}
                                   for n, per in metrics["curves"].items()}}
    fig = curve_figure(shown, state["curve"], f"{state['curve']} per step, steps 1-{state['last_step']}")
    if state["curve"] == "reward":
        band_traces(fig, shown, noise_factor=state["noise_factor"], noise_floor=state["noise_floor"],
                    last_step=state["last_step"])
    fig.update_layout(height=420)
    return View(figures={"curve": fig}, texts={"verdict": verdict_html(analysis)})


def _floor_options(own: float | None) -> list[tuple[str, float | None]]:
    """The floor control's choices: the measured floor (the baseline runs' mean range per step), or a fixed one."""
    fixed = sorted({0.0, 0.005, 0.01, 0.02, 0.05} | ({own} if own is not None else set()))
    return [("measured", None)] + [(f"{f:g} (fixed)", f) for f in fixed]


def learning_explorer(metrics: dict[str, Any]) -> Explorer:
    """The explorer over notebook 07's ``metrics``, starting at the experiment's own criteria and every step."""
    import ipywidgets as W

    criteria = metrics["analysis"]["criteria"]
    steps = max((s.get("step", 0) for per_run in metrics["steps"].values() for s in per_run), default=0)
    controls = {
        "curve": W.Dropdown(options=list(LC.CURVES), value="reward", description="curve"),
        "last_step": W.IntSlider(value=steps, min=2, max=max(steps, 2), description="steps read"),
        "window": W.IntSlider(value=criteria["window"], min=1, max=max(steps // 2, 1), description="window"),
        "noise_factor": W.FloatSlider(value=criteria["noise_factor"], min=0.5, max=5.0, step=0.5,
                                      description="noise factor"),
        "noise_floor": W.Dropdown(options=_floor_options(criteria["noise_floor"]), value=criteria["noise_floor"],
                                  description="noise floor"),
    }
    return Explorer(controls, functools.partial(draw, metrics=metrics), css="rlkit-learning", columns=3,
                    title="Learning explorer: the curves, and the analysis with other criteria or fewer steps")
