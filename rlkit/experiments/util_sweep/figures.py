"""The sweep's plotly figures (plotly imported inside each function)."""
from __future__ import annotations

from typing import Any

from rlkit.core.colours import phase_colour
from rlkit.experiments.util_sweep.config import VERL_ROLLOUT_POLL_S
from rlkit.experiments.util_sweep.tables import sweep_rows


def timeline_figure(run_metrics: dict[str, Any]):
    """Plotly: device GiB over time for one run, one colour per verl phase (plotly imported here only)."""
    import plotly.graph_objects as go

    m = run_metrics.get("measured") or {}
    fig = go.Figure()
    timeline = m.get("timeline") or []
    for phase in dict.fromkeys(row["phase"] for row in timeline):
        pts = [row for row in timeline if row["phase"] == phase]
        fig.add_scatter(x=[p["t"] for p in pts], y=[p["used_gib"] for p in pts], mode="markers", name=phase,
                        marker_color=phase_colour(phase))
    fig.add_scatter(x=[row["t"] for row in timeline], y=[row["used_gib"] for row in timeline], mode="lines",
                    line={"color": "lightgrey"}, showlegend=False)
    card = run_metrics["emulation"]["emulated_total_gib"] + (m.get("baseline_used_gib") or 0.0)
    fig.add_hline(y=card, line_dash="dash", annotation_text=f"emulated card ({run_metrics['emulation']['emulated_total_gib']} GiB)")
    fig.update_layout(title=f"{run_metrics['case']['name']} util {run_metrics['config']['gpu_memory_utilization']}: "
                      f"device memory at {1 / (m.get('sampler') or {}).get('interval_s', 1.0):.0f} Hz",
                      xaxis_title="seconds since the sampler started", yaxis_title="GiB used (device)", height=380)
    return fig


def throughput_figure(runs: list[dict[str, Any]]):
    """Plotly: rollout samples/s vs utilization per case (measured runs only), planner KV pool alongside."""
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    rows = sweep_rows(runs)
    for case in dict.fromkeys(r["case"] for r in rows):
        pts = [r for r in rows if r["case"] == case]
        done = [r for r in pts if r["rollout_samples_per_s"] is not None]
        if done:
            upper = [(r["rollout_samples_per_s_upper"] or r["rollout_samples_per_s"]) - r["rollout_samples_per_s"] for r in done]
            fig.add_scatter(x=[r["util"] for r in done], y=[r["rollout_samples_per_s"] for r in done],
                            error_y={"type": "data", "array": upper, "arrayminus": [0.0] * len(done)},
                            mode="lines+markers", name=f"{case}: rollout samples/s (measured; bar: up to one "
                                                       f"{VERL_ROLLOUT_POLL_S:g}-s poll earlier)")
        fig.add_scatter(x=[r["util"] for r in pts], y=[r["planner_kv_pool_gib"] for r in pts], mode="lines+markers",
                        line={"dash": "dot"}, name=f"{case}: KV pool GiB (planner)", secondary_y=True)
    fig.update_layout(title="throughput and KV pool vs gpu_memory_utilization", xaxis_title="gpu_memory_utilization "
                      "(emulated card)", height=400)
    fig.update_yaxes(title_text="rollout samples/s", secondary_y=False)
    fig.update_yaxes(title_text="KV pool GiB", secondary_y=True)
    return fig
