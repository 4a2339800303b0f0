"""Notebook 05's explorer: pick GRPO arms, compare their phase timeline, memory per phase and the planner.

Plain functions first:

* :func:`arm_data` reads what the explorer needs from one arm's ``metrics.json`` once (phase seconds per step,
  the planner for its exact overrides via :func:`rlkit.experiments.estimates.planner_for_run`, the measured peaks, the outcome);
* :func:`draw` turns a state (the arms picked, which steps, which memory) into a View: figure ``timeline``
  (stacked seconds per phase for each arm and step), figure ``limits`` (per arm, steps 2..: each phase as measured
  beside the time it would take at its limit, :func:`rlkit.experiments.estimates.phase_limits`), figure ``memory`` (the planner's
  GiB per phase beside the measured peak, per arm) and text ``table`` (planner vs measured, per arm:
  :func:`rlkit.experiments.estimates.planner_check`).

:func:`arms_explorer` puts them under ipywidgets (:class:`rlkit.viz.explorer.Explorer`).
"""
from __future__ import annotations

import functools
from typing import Any

from rlkit.core.colours import phase_colour
from rlkit.viz.explorer import Explorer, View, esc, html_table, message_figure

STEP_CHOICES = {"all": "all steps", "steady": "steps 2.. (step 1 carries start-up)"}
MEMORY_CHOICES = {"actor": "actor allocated (planner vs verl's peak)",
                  "device": "device, all processes (planner total vs 1 Hz samples)"}
PLANNER_ACTOR_PHASES = ("log_prob", "update_fwd_bwd", "optimizer_step")
def arm_data(name: str, metrics: dict[str, Any], gpu: str | None = None) -> dict[str, Any]:
    """What the explorer draws of one arm, read once from its ``metrics.json`` content; ``gpu``: the GPU it ran on
    (its ``env.json``), which the phases' limits need."""
    from rlkit.experiments import estimates, grpo_runs
    from rlkit.planning import budget

    summary = metrics.get("summary") or {}
    planned = estimates.planner_for_run(metrics) if metrics.get("recipe") and metrics.get("overrides") else None
    check = estimates.planner_check(metrics, planned) if planned else None
    data: dict[str, Any] = {
        "name": name, "outcome": grpo_runs.outcome(metrics), "phase_rows": grpo_runs.phase_table(metrics.get("steps", [])),
        "measured_actor_peak_gib": summary.get("actor_max_allocated_gib"),
        "measured_device_peak_gib": max(summary["gpu_peak_used_gib"]) if summary.get("gpu_peak_used_gib") else None,
        "check": check, "card_gib": None, "planner_actor_gib": {}, "planner_device_gib": {},
        "limits": (estimates.phase_limits(metrics, gpu).get("phases") or {}) if gpu else {},
    }
    if planned:
        card, _, plan = planned
        data["card_gib"] = card
        data["planner_device_gib"] = dict(plan.device_total_gib)
        data["planner_actor_gib"] = {ph: sum(plan.device_gib[ph].get(c, 0.0) for c in budget.ACTOR_ALLOCATED_COMPONENTS)
                                     for ph in PLANNER_ACTOR_PHASES if ph in plan.device_gib}
    return data


def default_arms(names: list[str]) -> tuple[str, ...]:
    """The seed's arms (rlkit.recipes.grpo.ARMS) that are present, else every name."""
    from rlkit.recipes.grpo import ARMS

    canonical = tuple(n for n in names if n in ARMS)
    return canonical or tuple(names)


def timeline_figure(data: dict[str, dict[str, Any]], picked: tuple[str, ...], steps: str):
    """Stacked seconds per verl phase, one bar per (arm, step)."""
    import plotly.graph_objects as go

    from rlkit.verl.logs import PHASES

    rows = [(arm, r) for arm in picked for r in data[arm]["phase_rows"] if steps == "all" or r["step"] >= 2]
    if not rows:
        return message_figure("no training steps in the arms picked: " + "; ".join(
            f"{a}: {data[a]['outcome']}" for a in picked), title="verl step phases", height=420)
    fig = go.Figure()
    for phase in (*PHASES, "other"):
        pts = [(arm, r) for arm, r in rows if r["phase"] == phase]
        if pts:
            fig.add_bar(name=phase, x=[[a for a, _ in pts], [f"step {r['step']}" for _, r in pts]],
                        y=[r["seconds"] for _, r in pts], marker_color=phase_colour(phase),
                        hovertemplate=f"{phase}: %{{y:.2f}} s<extra>%{{x}}</extra>")
    silent = [a for a in picked if not data[a]["phase_rows"]]
    title = "verl step phases per arm and step (seconds)"
    if silent:
        title += "<br><sup>no steps: " + "; ".join(f"{a} ({data[a]['outcome']})" for a in silent) + "</sup>"
    fig.update_layout(barmode="stack", title=title, yaxis_title="seconds", height=460, legend_title="phase")
    return fig


LIMIT_PHASES = ("gen", "old_log_prob", "update_actor", "update_weights", "between_phases")


def limits_figure(data: dict[str, dict[str, Any]], picked: tuple[str, ...]):
    """Per arm, two stacked bars over steps 2..: each phase's seconds as measured, and the seconds it would take at
    its limit (hatched where no limit is known: drawn as measured, so the bars stay comparable)."""
    import plotly.graph_objects as go

    arms = [a for a in picked if data[a]["limits"]]
    if not arms:
        return message_figure("no phase limits for the arms picked (they need two trained steps and the GPU they ran "
                              "on): " + "; ".join(f"{a}: {data[a]['outcome']}" for a in picked),
                              title="each phase against its limit", height=420)
    fig = go.Figure()
    for phase in LIMIT_PHASES:
        x, y, hatch, text = [[], []], [], [], []
        for arm in arms:
            entry = data[arm]["limits"].get(phase) or {}
            seconds, limit = entry.get("seconds") or 0.0, entry.get("limit_s")
            share = f"{entry['fraction']:.0%} of its limit" if entry.get("fraction") else entry.get("basis", "")
            for side, value in (("measured", seconds), ("at its limit", seconds if limit is None else limit)):
                x[0].append(arm)
                x[1].append(side)
                y.append(value)
                hatch.append("/" if side != "measured" and limit is None else "")
                text.append(share)
        label = "other" if phase == "between_phases" else phase  # the timeline's name for the rest of the step
        fig.add_bar(name=label, x=x, y=y, customdata=text,
                    marker={"color": phase_colour(label), "pattern": {"shape": hatch}},
                    hovertemplate=f"{phase}: %{{y:.2f}} s (%{{customdata}})<extra>%{{x}}</extra>")
    fig.update_layout(barmode="stack", height=460, yaxis_title="seconds per step (steps 2..; step 1 if alone)", legend_title="phase",
                      title="each phase against its limit (rlkit.planning.roofline)<br><sup>hatched: no limit known, drawn as "
                            "measured</sup>")
    return fig


def memory_figure(data: dict[str, dict[str, Any]], picked: tuple[str, ...], memory: str):
    """Per arm: the planner's GiB per phase (bars) beside the measured peak (black bar), the card as a line."""
    import plotly.graph_objects as go

    key = "planner_actor_gib" if memory == "actor" else "planner_device_gib"
    measured_key = "measured_actor_peak_gib" if memory == "actor" else "measured_device_peak_gib"
    arms = [a for a in picked if data[a][key] or data[a][measured_key] is not None]
    if not arms:
        return message_figure("the planner does not know these arms' model and nothing was measured",
                              title="memory per phase", height=420)
    fig = go.Figure()
    phases = list(dict.fromkeys(ph for a in arms for ph in data[a][key]))
    for ph in phases:
        fig.add_bar(name=f"planner: {ph}", x=arms, y=[data[a][key].get(ph) for a in arms],
                    marker_color=phase_colour(ph), hovertemplate=f"planner {ph}: %{{y:.2f}} GiB<extra>%{{x}}</extra>")
    label = "measured: actor peak allocated (verl)" if memory == "actor" else "measured: device peak (1 Hz, all processes)"
    fig.add_bar(name=label, x=arms, y=[data[a][measured_key] for a in arms], marker_color="#222222",
                hovertemplate="measured: %{y:.2f} GiB<extra>%{x}</extra>")
    cards = {data[a]["card_gib"] for a in arms if data[a]["card_gib"]}
    for card in cards:
        fig.add_hline(y=card, line_dash="dash", annotation_text=f"card {card:g} GiB")
    fig.update_layout(barmode="group", height=460, yaxis_title="GiB per GPU", legend_title="",
                      title="memory per phase: " + MEMORY_CHOICES[memory])
    return fig


def table_rows(data: dict[str, dict[str, Any]], picked: tuple[str, ...]) -> list[dict[str, Any]]:
    """Planner vs measured per arm (``rlkit.experiments.estimates.planner_check``), with the run's outcome."""
    rows = []
    for a in picked:
        c = data[a]["check"] or {}
        rows.append({"arm": a, "outcome": data[a]["outcome"], "planner verdict": c.get("planner_verdict"),
                     "planner actor peak GiB": c.get("planner_actor_peak_gib"),
                     "peak phase": c.get("planner_actor_peak_phase"),
                     "measured actor peak GiB": c.get("measured_actor_peak_gib"),
                     "ratio": c.get("ratio"), "agrees (10%)": c.get("agrees"),
                     "device peak GiB": data[a]["measured_device_peak_gib"]})
    return rows


def draw(state: dict[str, Any], data: dict[str, dict[str, Any]]) -> View:
    """The View for ``state`` (``arms``: names picked, ``steps``: all | steady, ``memory``: actor | device)."""
    picked = tuple(a for a in state["arms"] if a in data)
    if not picked:
        empty = "pick at least one arm"
        return View(figures={"timeline": message_figure(empty, height=420), "limits": message_figure(empty, height=420),
                             "memory": message_figure(empty, height=420)},
                    texts={"table": f"<p class='arms-table'><i>{empty}</i></p>"})
    table = html_table(table_rows(data, picked))
    note = ("<p><small>ratio: planner / measured actor peak; for a run that failed, whether the planner also puts "
            "that phase over the card (or, for vLLM refusing to start, the free memory it leaves against vLLM's "
            "reading). Steps shown: " + esc(STEP_CHOICES[state["steps"]]) + ".</small></p>")
    return View(figures={"timeline": timeline_figure(data, picked, state["steps"]), "limits": limits_figure(data, picked),
                         "memory": memory_figure(data, picked, state["memory"])},
                texts={"table": f"<div class='arms-table'>{table}{note}</div>"})


def load(results_dir: str | None = None, metrics: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Arm data: every arm under ``results_dir`` (``rlkit.experiments.grpo_runs.read_arms``), else the one run ``metrics``."""
    from rlkit.core.env import gpu_name, read_saved
    from rlkit.experiments import grpo_runs
    from rlkit.recipes.grpo import arm_name

    if not results_dir:  # this kernel's run: a launched one recorded its GPU with its limits
        name = arm_name(metrics["recipe"])
        return {name: arm_data(name, metrics, (metrics.get("limits") or {}).get("gpu"))}
    folders = grpo_runs.arm_folders(results_dir)
    return {name: arm_data(name, m, gpu_name(read_saved(folders[name])))
            for name, m in grpo_runs.read_arms(results_dir).items()}


def arms_explorer(results_dir: str | None = None, metrics: dict[str, Any] | None = None) -> Explorer:
    """The explorer over a folder of arms (``results_dir``) or over the one run of this notebook (``metrics``)."""
    import ipywidgets as W

    data = load(results_dir, metrics)
    names = list(data)
    controls = {
        "arms": W.SelectMultiple(options=names, value=default_arms(names), rows=min(len(names), 10),
                                 description="arms", layout=W.Layout(width="460px")),
        "steps": W.ToggleButtons(options=[(v, k) for k, v in STEP_CHOICES.items()], value="all", description="steps"),
        "memory": W.ToggleButtons(options=[(v, k) for k, v in MEMORY_CHOICES.items()], value="actor",
                                  description="memory"),
    }
    return Explorer(controls, functools.partial(draw, data=data), css="rlkit-arms", columns=1,
                    title="Arms explorer: pick arms (ctrl/shift-click), the figures are redrawn")
