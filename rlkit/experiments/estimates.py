"""A notebook 05 run against its estimates: the planner's device memory for the run's exact overrides (the actor's
peak, each verl phase's peak on the sampler's clock) and each phase's time against its roofline limit.

Read by notebook 05's explorer (:mod:`rlkit.viz.arms`), the arc (:mod:`rlkit.viz.arc`, :mod:`rlkit.report.arc`) and the
report's limits (:mod:`rlkit.report.limits`); :func:`rlkit.experiments.grpo.run` records :func:`phase_limits`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlkit.core import params as P
from rlkit.recipes.grpo import GRPORecipe, local_model_overrides
from rlkit.verl.logs import PHASES, averaged_steps


def planner_for_run(metrics: dict[str, Any]):
    """``(card GiB, PlanSpec, Plan)``: the planner for this run's exact overrides on the card it ran on
    (the emulated one, else ``planner_gpu_gib``); None when the planner does not know the model."""
    from rlkit.planning import preflight, verdict

    recipe = P.build(GRPORecipe, dict(metrics["recipe"]), where="metrics.json recipe")
    card = recipe.emulate_gpu_gib or recipe.planner_gpu_gib
    # the random-init model's folder was written on the node: a stand-in gives the planner its preset's shapes and
    # the synthetic length model's mean (padded positions depend on it)
    with local_model_overrides(recipe, metrics["overrides"]) as (overrides, stand_in):
        spec = preflight.planner_spec_for_overrides(overrides, recipe.active_patches, gpu_gib=card)
        if spec is None:
            return None
        plan = verdict.plan(spec)
    # the stand-in folder is gone now: the spec names the preset whose shapes it held
    return card, (replace(spec, model=recipe.model) if stand_in else spec), plan


def planner_check(metrics: dict[str, Any], planned=None) -> dict[str, Any] | None:
    """The planner for this run's exact overrides next to what the actor measured: its peak over the step's
    compute phases (verl's actor/perf/max_memory_allocated_gb) against the planner's largest actor total, or,
    for a run that ran out of the card in a phase, whether the planner also puts that phase over the card."""
    from rlkit.planning import budget

    planned = planned or planner_for_run(metrics)
    if planned is None:
        return None
    card, spec, plan = planned
    actor = {phase: sum(plan.device_gib[phase].get(c, 0.0) for c in budget.ACTOR_ALLOCATED_COMPONENTS)
             for phase in ("log_prob", "update_fwd_bwd", "optimizer_step") if phase in plan.device_gib}
    peak_phase = max(actor, key=actor.get)
    summary, failure = metrics.get("summary") or {}, (metrics.get("launch") or {}).get("failure")
    measured = summary.get("actor_max_allocated_gib")
    out = {"card_gib": card, "options": spec.options, "logits_path": spec.logits_path,
           "planner_actor_gib": actor, "planner_actor_peak_phase": peak_phase,
           "planner_actor_peak_gib": actor[peak_phase], "planner_verdict": plan.verdict,
           "measured_actor_peak_gib": measured, "ratio": None, "agrees": None}
    if measured:
        out["ratio"] = actor[peak_phase] / measured
        out["agrees"] = abs(out["ratio"] - 1.0) <= 0.10
    elif failure and failure["kind"] == "torch_oom":
        phase = {"update_actor": "update_fwd_bwd", "old_log_prob": "log_prob"}.get(failure["phase"], failure["phase"])
        out["measured_oom_phase"] = phase
        out["agrees"] = actor.get(phase, 0.0) > card  # the planner also puts that phase over the card
    elif failure and failure["kind"] == "vllm_startup":
        # what the actor (and its process overhead) leaves free when vLLM starts, against vLLM's own reading
        residue = sum(plan.device_gib["rollout"].get(c, 0.0) for c in (*budget.ACTOR_ALLOCATED_COMPONENTS, "actor_non_torch"))
        out["planner_free_at_vllm_start_gib"] = card - residue
        out["measured_free_at_vllm_start_gib"] = failure["free_gib"]
        out["ratio"] = out["planner_free_at_vllm_start_gib"] / failure["free_gib"]
        out["agrees"] = plan.verdict == "vLLM refuses to start" and abs(out["ratio"] - 1.0) <= 0.10
    return out


def phase_memory(metrics: dict[str, Any]) -> dict[str, Any] | None:
    """Each verl phase's device peak over steps 2.. (the most loaded GPU's used memory minus the idle baseline before
    the launch), placed on the sampler's clock from the launch's marks as notebook 06 places them; per process where
    the node could read that. None for a run recorded without marks (before they were recorded)."""
    from rlkit.experiments.util_sweep.timeline import label_samples, phase_intervals, phase_peaks, process_peaks

    record = (metrics.get("launch") or {}).get("gpu_memory") or {}
    marks = record.get("marks")
    if not marks:
        return None
    launch_t = next(t for t, name in marks if name == "launch")
    logged_at = {int(name.split("step", 1)[1]): t for t, name in marks if name.startswith("logged:step")}
    steps = [s for s in averaged_steps(metrics.get("steps", [])) if s["step"] in logged_at]
    intervals = phase_intervals(steps, logged_at)
    timeline = label_samples([(t, used) for t, used in record["timeline"]], intervals, launch_t)
    idle = [r["used_gib"] for r in timeline if r["phase"] == "idle" and r["used_gib"] is not None]
    baseline = min(idle) if idle else 0.0
    samples = record.get("process_samples")
    return {"baseline_gib": baseline, "steps": [s["step"] for s in steps],
            "phase_peaks": {p: v for p, v in phase_peaks(timeline, baseline).items() if p in PHASES},
            "process_phase_peaks": process_peaks(samples, intervals, launch_t) if samples else None}


def planner_phase_check(metrics: dict[str, Any], planned=None) -> dict[str, dict[str, Any]] | None:
    """Each verl phase's measured device peak (:func:`phase_memory`) against the planner's device total for the
    phases it covers (rlkit.experiments.util_sweep.comparison.PHASE_MAP), with the ratio and whether it is within
    the planner's 10% bar; a phase the 1 Hz sampler saw fewer than MIN_PHASE_SAMPLES times is left out of the bar.
    None without per-phase peaks or a planner for the run."""
    from rlkit.experiments.util_sweep.comparison import MIN_PHASE_SAMPLES, PHASE_MAP, TOLERANCE

    measured, planned = phase_memory(metrics), planned or planner_for_run(metrics)
    if measured is None or planned is None:
        return None
    plan = planned[2]
    out = {}
    for phase, entry in measured["phase_peaks"].items():
        estimate = max(plan.device_total_gib.get(p, 0.0) for p in PHASE_MAP[phase]) if phase in PHASE_MAP else 0.0
        if not estimate:
            continue
        ratio = entry["peak_job_gib"] / estimate if entry["samples"] >= MIN_PHASE_SAMPLES else None
        out[phase] = {"planner_gib": estimate, "measured_gib": entry["peak_job_gib"], "samples": entry["samples"],
                      "ratio": ratio, "within": None if ratio is None else abs(ratio - 1.0) <= TOLERANCE}
    return out


def phase_limits(metrics: dict[str, Any], gpu_name: str | None) -> dict[str, Any]:
    """Each phase of a launched run's steps 2.. against its limit (:func:`rlkit.planning.roofline.grpo_step_limits`), on the
    GPU ``gpu_name`` it ran on (its env.json), with the node's committed pinned copy bench and the newest committed
    standalone vLLM ceiling of the run's shape (:func:`rlkit.planning.roofline.vllm_ceiling`)."""
    from rlkit.models import shape as model_shape
    from rlkit.planning import roofline

    summary = metrics.get("summary") or {}
    window = averaged_steps(metrics.get("steps", []))
    if not window or not gpu_name:
        return {}
    pinned = roofline.pinned_bench_gbps()
    shape = model_shape.resolve_model(metrics["recipe"]["model"] if metrics["model"].get("preset") else metrics["model"]["path"])
    ceiling = roofline.vllm_ceiling(metrics["recipe"], gpu_name)
    return {**roofline.grpo_step_limits(metrics["recipe"], window, shape, gpu_name, pinned_gbps=pinned,
                                        gen_ceiling=ceiling, optimizer_step_s=summary.get("optimizer_step_s")),
            "pinned_bench": roofline.PINNED_BENCH if pinned else None, "vllm_ceiling": ceiling["source"]}


def limits_row(name: str, limits: dict[str, Any]) -> dict[str, Any]:
    """One arm's phases against their limits, flat: seconds and fraction of the limit per phase."""
    phases = limits.get("phases") or {}
    row = {"arm": name, "gpu": limits.get("gpu"), "tokens_real": (limits.get("tokens_per_sequence") or {}).get("real"),
           "tokens_computed": (limits.get("tokens_per_sequence") or {}).get("computed")}
    for phase in ("gen", "old_log_prob", "update_actor", "optimizer_step", "update_weights"):
        entry = phases.get(phase) or {}
        row[f"{phase}_s"], row[f"{phase}_fraction"] = entry.get("seconds"), entry.get("fraction")
        row[f"{phase}_limit_s"] = entry.get("limit_s")
    row["update_actor_hardware_fraction"] = (phases.get("update_actor") or {}).get("hardware_fraction")
    hbm = (phases.get("gen") or {}).get("hbm_bound") or {}
    row["gen_hbm_limit_s"], row["gen_hbm_fraction"] = hbm.get("limit_s"), hbm.get("fraction")
    row["between_phases_share"] = (phases.get("between_phases") or {}).get("share_of_step")
    return row
