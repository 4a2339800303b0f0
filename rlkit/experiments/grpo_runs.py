"""Notebook 05's runs read back: each run's outcome, its row in the arms table, a run or a folder of arms loaded from
``outputs/``, the phase table and figure of its steps, and what it found, in words.

:mod:`rlkit.experiments.grpo` writes these runs; the report (:mod:`rlkit.report`), the explorer (:mod:`rlkit.viz.arms`)
and notebook 05 read them through this module.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlkit.core.env import REPO_ROOT
from rlkit.core.results import fmt
from rlkit.verl.logs import PHASES, training_steps


def outcome(metrics: dict[str, Any]) -> str:
    """What a run did, in a few words: trained, or how it failed."""
    if not metrics.get("launched"):
        return "not launched"
    recipe, launch = metrics.get("recipe", {}), metrics.get("launch", {})
    failure, trained = launch.get("failure"), len(training_steps(metrics.get("steps", [])))
    if failure is not None:
        at = f" at step {trained + 1}" if trained else ""  # a failure after trained steps: which step it was
        return f"{failure['kind']} in {failure['phase']}{at}" + (" (expected)" if recipe.get("expect_failure") else "")
    if trained < recipe.get("steps", 0):
        return f"stopped after {trained}/{recipe['steps']} steps"
    return "trained" + (" (a failure was expected)" if recipe.get("expect_failure") else "")


def arm_row(name: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """One row of the arms table: what varied (patches, optimizer, offload) and the headline numbers."""
    recipe = metrics.get("recipe", {})
    row = {
        "arm": name,
        "patches": ",".join(recipe.get("patches", [])) or "(none)",
        "optimizer": recipe.get("optimizer"),
        "param_offload": recipe.get("param_offload"),
        "optimizer_offload": recipe.get("optimizer_offload"),
        "gpu_memory_utilization": recipe.get("gpu_memory_utilization"),
        "launched": metrics.get("launched"),
        "outcome": outcome(metrics),
        "sanity_passed": (metrics.get("sanity") or {}).get("passed"),
        "steps": len(training_steps(metrics.get("steps", []))),
    }
    row.update({k: v for k, v in metrics.get("summary", {}).items() if k != "steps_averaged"})
    return row


def read_results(results_dir: str | os.PathLike) -> dict[str, Any]:
    """Saved results: one run's ``metrics.json``, or a folder of arm folders each with one.

    For a folder of arms, the metrics of the first arm (sorted by name) are returned with ``arms``
    holding a row per arm, so the notebook renders the same way in both cases.
    """
    from rlkit.core.results import read_metrics

    path = Path(results_dir)
    path = path if path.is_absolute() else REPO_ROOT / path
    if (path / "metrics.json").exists():
        metrics = read_metrics(path)
        metrics["arms"] = [arm_row(path.name, metrics)]
        return metrics
    loaded = read_arms(path)
    name, first = next(iter(loaded.items()))
    first = {**first, "shown_arm": name, "arms": [arm_row(n, m) for n, m in loaded.items()]}
    return first


def which_run(metrics: dict[str, Any]) -> str:
    """The run a single-run cell describes: over a folder of arms (:func:`read_results`) that is the first of
    them, which the notebook says rather than describing it as if it were the only one."""
    arms = metrics.get("arms") or []
    name = metrics.get("shown_arm") or (arms[0]["arm"] if arms else "this run")
    if len(arms) > 1:
        return (f"{name}, the first of the {len(arms)} arms read (render one arm's folder to describe another; the "
                "arms table and the explorer below compare them all)")
    return name


def no_steps_reason(metrics: dict[str, Any]) -> str:
    """Why a run has no training step to draw: how a launched run ended, else why it was not launched."""
    if metrics.get("launched"):
        return f"no training step to draw: {outcome(metrics)}"
    return f"not launched: {metrics.get('launch_reason')}"


def arm_folders(results_dir: str | os.PathLike) -> dict[str, Path]:
    """The run folders under ``results_dir`` by name (sorted): the folder itself when it is one run, else each
    completed run in it (:func:`rlkit.core.results.run_folders`: not a render's scratch copy, a CPU smoke run or a
    failed run); relative paths are the repository's."""
    from rlkit.core.results import run_folders

    path = Path(results_dir)
    path = path if path.is_absolute() else REPO_ROOT / path
    if (path / "metrics.json").exists():
        return {path.name: path}
    arms = run_folders(path)
    if not arms:
        raise FileNotFoundError(f"{path} holds no metrics.json, directly or in a completed run folder; fix results_dir")
    return {p.name: p for p in arms}


def read_arms(results_dir: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Every arm's ``metrics.json`` in a folder of arm folders (:func:`arm_folders`), by folder name (sorted). A
    folder that is one run gives that run under its folder name."""
    from rlkit.core.results import read_metrics

    return {name: read_metrics(p) for name, p in arm_folders(results_dir).items()}


def phase_table(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (step, phase) with seconds, plus the unattributed rest of the step."""
    rows = []
    for s in training_steps(steps):
        total = s.get("timing_s/step")
        known = 0.0
        for phase in PHASES:
            value = s.get(f"timing_s/{phase}")
            if isinstance(value, (int, float)):
                rows.append({"step": s["step"], "phase": phase, "seconds": float(value)})
                known += float(value)
        if isinstance(total, (int, float)):
            rows.append({"step": s["step"], "phase": "other", "seconds": max(float(total) - known, 0.0)})
    return rows


def phase_figure(steps: list[dict[str, Any]], title: str = "verl step phases"):
    """Stacked bars: seconds per phase for each training step (plotly, imported here only)."""
    import plotly.graph_objects as go

    from rlkit.core.colours import phase_colour

    rows = phase_table(steps)
    fig = go.Figure()
    for phase in (*PHASES, "other"):
        points = [r for r in rows if r["phase"] == phase]
        if points:
            fig.add_bar(name=phase, x=[r["step"] for r in points], y=[r["seconds"] for r in points],
                        marker_color=phase_colour(phase))
    fig.update_layout(barmode="stack", title=title, xaxis_title="step", yaxis_title="seconds",
                      xaxis={"dtick": 1})
    return fig


def describe(metrics: dict[str, Any]) -> str:
    """The findings of a run in words, every number taken from ``metrics``."""
    recipe = metrics["recipe"]
    lines = _before_launch_lines(metrics)
    launch = metrics.get("launch") or {}
    if metrics.get("launched"):
        lines.append(f"Outcome: {outcome(metrics)}." + (f" verl: {launch['failure']['line'][:420]}"
                                                          if launch.get("failure") else "")
                     + (f" Fix: {launch['failure']['fix']}." if (launch.get("failure") or {}).get("fix") else ""))
        if launch.get("collected"):
            lines.append(f"Metrics collected after the run from {launch['collected']['from']}: "
                         f"{launch['collected']['note']}.")
    emulated = recipe.get("emulate_gpu_gib")
    if emulated:
        lines.append(f"Card emulated: every verl process saw a {emulated:g} GiB card (torch.cuda.mem_get_info) and "
                     f"its allocator was capped at {emulated:g} GiB; vLLM reserved "
                     f"{recipe['gpu_memory_utilization']:g} x {emulated:g} GiB.")
    check = metrics.get("sanity")
    if check:
        rank = (f"; ranks' weights after each step: max abs diff {fmt(check['rank_max_abs_diff'], '.3g')} "
                f"(check {check['rank_check_s_mean']:.2f} s/step)" if "ranks_identical" in check else "")
        lines.append(f"Sanity bar {'passed' if check['passed'] else 'FAILED'}: grad_norm finite and non-zero "
                     f"{check['grad_norm_finite_nonzero']}, pg_loss finite {check['pg_loss_finite']}, no NaN "
                     f"{check['no_nan']}{rank}.")
    summary = metrics.get("summary") or {}
    if summary.get("gpu_peak_used_gib"):
        lines.append(f"Device-wide peak per GPU (all processes, 1 Hz samples): "
                     f"{', '.join(f'{g:.2f}' for g in summary['gpu_peak_used_gib'])} GiB.")
    if summary.get("host_peak_above_baseline_gib") is not None:
        lines.append(f"Host memory (the node's used memory, 1 Hz): peak {summary['host_peak_above_baseline_gib']:.1f} GiB "
                     "above its value before verl started.")
    if summary.get("steps_averaged"):
        lines.append(
            f"Measured over steps {summary['steps_averaged']}: step {summary['step_s']:.1f} s (gen "
            f"{summary['gen_s'] or 0:.1f} s, old_log_prob {summary['old_log_prob_s'] or 0:.1f} s, update_actor "
            f"{summary['update_actor_s'] or 0:.1f} s, update_weights {summary['update_weights_s'] or 0:.2f} s); "
            f"grad_norm {fmt(summary['grad_norm'], '.4g')}, actor peak allocated "
            f"{fmt(summary['actor_max_allocated_gib'], '.2f')} GiB, "
            f"{summary['throughput_tok_s_per_gpu'] or 0:.0f} tokens/s/GPU."
        )
    elif not metrics.get("launched"):
        lines.append(f"No training steps: {metrics.get('launch_reason')}")
    return "\n".join(lines)


def _before_launch_lines(metrics: dict[str, Any]) -> list[str]:
    """The run, its recipe, verl's check of its config and the preflight: what :func:`describe` says before the launch."""
    recipe, verify = metrics["recipe"], metrics.get("verify", {})
    lines = [
        f"Run: {which_run(metrics)}.",
        (f"Recipe: {recipe['model']} on {metrics['data']['rows']} {metrics['data']['source']} prompts "
        f"({metrics['data'].get('duplicates_removed', 0)} duplicates removed), {recipe['train_batch_size']} prompts x "
        f"{recipe['rollout_n']} samples per step, reward {metrics['reward']}, patches "
        f"{', '.join(recipe['patches']) or 'none'}; attention {recipe.get('attn_implementation', 'sdpa')}"
        f"{', unpadded' if recipe.get('use_remove_padding') else ', padded'}, logits {recipe.get('logits', 'full')}, "
        f"replay-buffer poll {recipe.get('replay_poll_s', 2.0):g} s, RMSNorm {recipe.get('rmsnorm', 'eager')}, "
        f"rotary and SwiGLU {recipe.get('pointwise', 'eager')}"
        f"{', HostAdamW copies overlapped' if recipe.get('host_overlap_copies') else ''}."),
    ]
    if verify.get("skipped"):
        lines.append(f"Config check before the launch skipped: {verify['skipped']}.")
    else:
        lines.append(f"verl's own config accepted the {len(metrics['overrides'])} overrides (sections validated: "
                     f"{', '.join(verify.get('validated_sections', []))}); the plugin applied "
                     f"{verify.get('active_patches')} in {len(verify.get('plugin_records', []))} verl process(es).")
    preflight = metrics.get("preflight", {})
    if preflight.get("available"):
        severities = [f["severity"] for f in preflight["findings"] + preflight["planner"]]
        lines.append(f"Preflight: {severities.count('error')} error(s), {severities.count('warning')} warning(s); "
                     f"planner: {'; '.join(f['message'] for f in preflight['planner']) or 'no verdict'}.")
    return lines
