"""Notebook 06's explorer: pick a case and a gpu_memory_utilization; see that point's device timeline with the
planner's estimate per phase, its KV use as vLLM logged it, and the planner against the measurement.

:func:`draw` is a plain function of the state (``case``, ``util``, ``kv``: which vLLM statistic) and the
sweep's runs (``rlkit.experiments.util_sweep.runs_of``); it returns figures ``timeline``, ``kv``, ``compare``
and text ``point``. :func:`sweep_explorer` puts it under ipywidgets; changing the case offers that case's
utilizations.
"""
from __future__ import annotations

import functools
from typing import Any

from rlkit.viz.explorer import Explorer, View, esc, html_table, message_figure

KV_SERIES = {"kv_cache_usage_pct": "KV cache usage (%)", "running_reqs": "running requests",
             "waiting_reqs": "waiting requests", "generation_tok_s": "generation tokens/s"}


def points(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Utilizations with a run, per case (sorted)."""
    out: dict[str, list[float]] = {}
    for r in runs:
        out.setdefault(r["case"]["name"], []).append(r["config"]["gpu_memory_utilization"])
    return {case: sorted(set(utils)) for case, utils in out.items()}


def find_run(runs: list[dict[str, Any]], case: str, util: float) -> dict[str, Any] | None:
    return next((r for r in runs if r["case"]["name"] == case
                 and abs(r["config"]["gpu_memory_utilization"] - util) < 1e-9), None)


def timeline_figure(run: dict[str, Any]):
    """The run's device timeline (``util_sweep.timeline_figure``) with the planner's total per verl phase drawn
    over that phase's interval (on the idle baseline, as the samples are)."""
    from rlkit.experiments import util_sweep

    m = run.get("measured")
    if not m:
        return message_figure(f"not measured: {run.get('launch_reason') or 'no run'}", title="device memory timeline",
                              height=400)
    fig = util_sweep.timeline_figure(run)
    base = m.get("baseline_used_gib") or 0.0
    totals = run["planner"]["device_total_gib"]
    xs, ys = [], []
    for iv in m.get("phase_intervals") or []:
        planner_phases = util_sweep.PHASE_MAP.get(iv["phase"])
        if not planner_phases:
            continue
        estimate = max((totals.get(p, 0.0) for p in planner_phases), default=0.0)
        xs += [iv["start"], iv["end"], None]
        ys += [base + estimate, base + estimate, None]
    if xs:
        fig.add_scatter(x=xs, y=ys, mode="lines", name="planner, per phase (+ idle baseline)",
                        line={"color": "black", "dash": "dot", "width": 2})
    fig.update_layout(height=420)
    return fig


def kv_figure(run: dict[str, Any], series: str):
    """vLLM's periodic statistics lines for the run (in log order): the chosen series, and the KV pool's size."""
    import plotly.graph_objects as go

    m = run.get("measured") or {}
    stats = (m.get("vllm") or {}).get("stats") or []
    if not stats:
        return message_figure("no vLLM statistics logged for this point" + ("" if m else " (not measured)"),
                              title="KV use", height=340)
    y = [s.get(series) for s in stats]
    fig = go.Figure(go.Scatter(x=list(range(1, len(stats) + 1)), y=y, mode="lines+markers", name=KV_SERIES[series]))
    vllm = m.get("vllm") or {}
    pool = (vllm.get("kv_cache_gib") or [None])[0]
    conc = (vllm.get("max_concurrency") or [{}])[0]
    planner = run["planner"]
    title = (f"{KV_SERIES[series]} per vLLM stats line; KV pool {pool if pool is not None else '-'} GiB measured vs "
             f"{planner['kv_pool_gib']:.2f} planned, concurrency {conc.get('concurrency', '-')} vs "
             f"{planner['max_concurrent_seqs']}")
    fig.update_layout(title=title, xaxis_title="vLLM statistics line, in log order (one per VLLM_LOG_STATS_INTERVAL, 10 s by default)",
                      yaxis_title=KV_SERIES[series], height=340)
    if series == "kv_cache_usage_pct":
        fig.update_yaxes(range=[0, 100])
    return fig


def compare_figure(run: dict[str, Any]):
    """Planner vs measured for the run's GiB quantities (``run["comparison"]``), ratio in the hover."""
    import plotly.graph_objects as go

    rows = [r for r in run.get("comparison", []) if r["quantity"].endswith("_gib")]
    names = [r["quantity"].removesuffix("_gib") for r in rows]
    fig = go.Figure()
    fig.add_bar(name="planner", x=names, y=[r["planner"] for r in rows], marker_color="#636efa")
    fig.add_bar(name="measured", x=names, y=[r["measured"] for r in rows], marker_color="#222222",
                customdata=[f"{r['ratio']:.2f}" if r["ratio"] is not None else "-" for r in rows],
                hovertemplate="measured %{y:.2f} GiB, ratio %{customdata}<extra>%{x}</extra>")
    fig.update_layout(barmode="group", height=380, yaxis_title="GiB",
                      title=f"planner vs measured, {run['case']['name']} util {run['config']['gpu_memory_utilization']}")
    return fig


def point_html(run: dict[str, Any]) -> str:
    m = run.get("measured") or {}
    failure = m.get("failure")
    state = ("not measured: " + str(run.get("launch_reason")) if not m else
             f"failure: {failure['kind']} in {failure['phase']}" if failure else
             f"measured; step {m.get('step_s') or 0:.1f} s, rollout {m.get('rollout_samples_per_s') or 0:.1f} samples/s")
    rows = [{"quantity": r["quantity"], "planner": r["planner"], "measured": r["measured"], "ratio": r["ratio"],
             "off >10%": r["off_by_more_than_10pct"]} for r in run.get("comparison", [])]
    planner = run["planner"]
    return (f"<div class='point'><p><b>{esc(run['case']['name'])}, gpu_memory_utilization "
            f"{run['config']['gpu_memory_utilization']}</b> on an emulated {run['emulation']['emulated_total_gib']} GiB "
            f"card: {esc(state)}. Planner: <b>{esc(planner['verdict'])}</b> ({esc(planner['reason'])}).</p>"
            f"{html_table(rows)}</div>")


def draw(state: dict[str, Any], runs: list[dict[str, Any]]) -> View:
    """The View for ``state`` (``case``, ``util``, ``kv``) over the sweep's ``runs``."""
    run = find_run(runs, state["case"], state["util"])
    if run is None:
        text = f"no run for {state['case']} at util {state['util']}"
        return View(figures={k: message_figure(text) for k in ("timeline", "kv", "compare")},
                    texts={"point": f"<div class='point'>{esc(text)}</div>"})
    return View(figures={"timeline": timeline_figure(run), "kv": kv_figure(run, state["kv"]),
                         "compare": compare_figure(run)},
                texts={"point": point_html(run)})


def _case_changed(by_case: dict[str, list[float]], explorer: Explorer, name: str) -> None:
    """Offer the picked case's utilizations, keeping the current one when that case has it."""
    if name != "case":
        return
    util = explorer.controls["util"]
    options = by_case[explorer.controls["case"].value]
    keep = util.value if util.value in options else min(options, key=lambda u: abs(u - util.value))
    util.options = options
    util.value = keep


def sweep_explorer(runs: list[dict[str, Any]], case: str | None = None, util: float | None = None) -> Explorer:
    """The explorer over the sweep's ``runs``, starting at (``case``, ``util``) when that point was measured, else at
    a measured point (of ``case`` where it has one): a reader with measured points loaded never opens on nothing."""
    import ipywidgets as W

    by_case = points(runs)
    measured = points([r for r in runs if r.get("measured")]) or by_case
    if case not in measured:
        case = next(iter(measured))
    if util not in measured[case]:
        util = measured[case][len(measured[case]) // 2]
    controls = {
        "case": W.Dropdown(options=list(by_case), value=case, description="case"),
        "util": W.ToggleButtons(options=by_case[case], value=util, description="util"),
        "kv": W.Dropdown(options=[(v, k) for k, v in KV_SERIES.items()], value="kv_cache_usage_pct",
                         description="vLLM series"),
    }
    return Explorer(controls, functools.partial(draw, runs=runs), css="rlkit-sweep",
                    links=(functools.partial(_case_changed, by_case),), columns=3,
                    title="Sweep explorer: pick a case and a utilization")
