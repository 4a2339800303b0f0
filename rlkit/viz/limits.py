"""Notebook 08's figure: each phase of a run against its limit (:mod:`rlkit.experiments.time_budget`), seconds per
step beside the seconds the phase would take at its limit; gen's second limit is the decode's memory-bandwidth bound."""
from __future__ import annotations

from typing import Any

from rlkit.core.colours import phase_colour


def limits_figure(rows: list[dict[str, Any]]):
    """Grouped bars per run and phase: measured seconds (the phase's colour) and its limit's seconds (grey)."""
    import plotly.graph_objects as go

    from rlkit.experiments.time_budget import PHASES

    fig = go.Figure()
    for phase in PHASES:
        have = [r for r in rows if r.get(f"{phase}_s") is not None]
        x = [[r["arm"] for r in have], [phase] * len(have)]
        fig.add_bar(name=f"{phase} measured", x=x, y=[r[f"{phase}_s"] for r in have], marker_color=phase_colour(phase))
        fig.add_bar(name=f"{phase} at its limit", x=x, y=[r.get(f"{phase}_limit_s") for r in have],
                    marker_color="#9e9e9e", showlegend=phase == PHASES[0])
    hbm = [r for r in rows if r.get("gen_hbm_limit_s") is not None]
    fig.add_scatter(name="gen's memory-bandwidth bound", mode="markers", marker_symbol="line-ew-open", marker_size=30,
                    x=[[r["arm"] for r in hbm], ["gen"] * len(hbm)], y=[r["gen_hbm_limit_s"] for r in hbm])
    fig.update_layout(barmode="group", title="Each phase against its limit (seconds per step, steps 2..)",
                      yaxis_title="seconds per step")
    return fig
