"""Notebook 05's opening figures: the seed's arc at the seed's workload, one bar per committed run of the arc's commit
(:func:`rlkit.report.arc.arc_runs`), so that an arm run in two leases shows its spread as two bars side by side.

* :func:`phase_figure`: seconds per verl phase, stacked, means over steps 2.. (``other`` is the step's untimed rest);
* :func:`memory_figure`: the actor's allocated peak beside the planner's actor peak for the run's exact overrides.

A run that did not train (arm 0: vLLM refuses to start) has no bar and says why in its label.
"""
from __future__ import annotations

from typing import Any

from rlkit.core.colours import phase_colour

PHASES = ("gen", "old_log_prob", "adv", "update_actor", "update_weights")


def _label(name: str, metrics: dict[str, Any]) -> str:
    from rlkit.experiments.grpo_runs import outcome
    from rlkit.report.arc import split_name

    arm, variant = split_name(name)
    lease = name.split(".", 1)[1] if "." in name else ""
    trained = outcome(metrics) == "trained"
    return f"{arm}{' ' + variant if variant else ''}<br>{lease}" + ("" if trained else f"<br>({outcome(metrics)})")


def phase_figure(runs: dict[str, dict[str, Any]]):
    """Stacked seconds per phase (means over steps 2..) for each run of the arc, in the table's order."""
    import plotly.graph_objects as go

    labels = [_label(n, m) for n, m in runs.items()]
    summaries = [m.get("summary") or {} for m in runs.values()]
    fig = go.Figure()
    for phase in PHASES:
        fig.add_bar(name=phase, x=labels, y=[s.get(f"{phase}_s") for s in summaries], marker_color=phase_colour(phase))
    other = [None if s.get("step_s") is None else s["step_s"] - sum(s.get(f"{p}_s") or 0.0 for p in PHASES)
             for s in summaries]
    fig.add_bar(name="other", x=labels, y=other, marker_color=phase_colour("other"))
    fig.update_layout(barmode="stack", title="The arc's step, phase by phase (steps 2.., one bar per run)",
                      yaxis_title="seconds per step", legend_title="verl phase")
    return fig


def memory_figure(runs: dict[str, dict[str, Any]]):
    """The actor's allocated peak (verl's actor/perf/max_memory_allocated_gb) beside the planner's actor peak for
    the run's exact overrides (rlkit.experiments.estimates.planner_check), per run."""
    import plotly.graph_objects as go

    from rlkit.experiments.estimates import planner_check

    labels = [_label(n, m) for n, m in runs.items()]
    checks = [planner_check(m) or {} for m in runs.values()]
    fig = go.Figure()
    fig.add_bar(name="measured actor peak", x=labels, y=[(m.get("summary") or {}).get("actor_max_allocated_gib")
                                                         for m in runs.values()], marker_color="#444444")
    fig.add_bar(name="planner", x=labels, y=[c.get("planner_actor_peak_gib") if c.get("measured_actor_peak_gib") else None
                                             for c in checks], marker_color="#9e9e9e")
    card = next((c["card_gib"] for c in checks if c.get("card_gib")), None)
    if card:
        fig.add_hline(y=card, line_dash="dot", annotation_text=f"card {card:g} GiB")
    fig.update_layout(barmode="group", title="The actor's memory against the planner (GiB allocated)",
                      yaxis_title="GiB")
    return fig
