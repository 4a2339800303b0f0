"""Notebook 05's experiment: the seed's arms of the GRPO recipe launched through verl, measured and checked.

:func:`run` does the whole recipe (:mod:`rlkit.recipe`): data, model, overrides, ``rlkit preflight``, the
planner's verdict, verl's own config check in a subprocess that imports verl (so the rlkit plugin loads and
applies the chosen patches, recorded per process), then the launch (:func:`rlkit.verl_job.launch_job`) when
GPUs are present, with 1 Hz device and host memory samplers beside it; verl's per-step metrics go into
``metrics.json`` with the sanity bar (finite grad_norm and pg_loss, ranks bit-identical) and the planner's
prediction next to the measured actor peak.

Command line: ``rlkit grpo render|launch|collect|parse`` (also ``python -m rlkit.grpo``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from rlkit import params as P
from rlkit import verl_job
from rlkit.env import REPO_ROOT
from rlkit.recipe import ARMS, NOTEBOOK, GRPORecipe, arm_name, arm_values, default_paths, render_overrides
from rlkit.results import fmt
from rlkit.verl_logs import PHASES, averaged_steps, parse_console_metrics, summarize, training_steps

HOW_TO_RUN = "run the h200 profile on a GPU node (python -m rlkit.grpo launch --profile h200)"
METRICS_KEYS = ("recipe", "reward", "data", "model", "overrides", "command", "preflight", "verify",
                "launched", "launch_reason", "steps", "summary", "arms")  # launched runs add launch, sanity, limits


def _start_samplers() -> tuple[Any, Any]:
    """1 Hz samplers of device-wide GPU memory (when a GPU can be read) and of the node's used host memory;
    None for one that cannot run here."""
    from rlkit.measure import MemorySampler, SamplerUnavailable, host_memory_reader

    gpu = host = None
    try:
        gpu = MemorySampler(interval_s=1.0).start() if verl_job.gpu_count() else None
    except SamplerUnavailable as err:
        print(f"no GPU memory sampling: {err}")
    try:
        host = MemorySampler(interval_s=1.0, reader=host_memory_reader(), source="/proc/meminfo").start()
    except SamplerUnavailable as err:
        print(f"no host memory sampling: {err}")
    return gpu, host


def host_memory_summary(sampler) -> dict[str, Any]:
    """The node's used host memory over a launch: idle baseline (the first sample, before verl starts), peak,
    and the peak above the baseline (what the job added, other tenants of the node aside)."""
    used = [sample[0] for _, sample in sampler.samples]
    return {"source": sampler.source, "interval_s": sampler.interval_s, "samples": len(used),
            "baseline_gib": used[0], "peak_used_gib": max(used), "peak_above_baseline_gib": max(used) - used[0]}


# idle samples before verl starts: the device baseline each phase's peak is measured from
BASELINE_SAMPLES = 3


def _gpu_memory_record(sampler, processes) -> dict[str, Any]:
    """The device samples of a launch with their marks (``launch`` and ``logged:step<N>``, when each trained step's
    line arrived), so that each phase's peak can be placed afterwards (rlkit.experiments.util_sweep.timeline), and
    the per-process samples where they could be read."""
    return {**sampler.summary(), "timeline": [[round(t, 1), [round(u, 3) for u in used]] for t, used in sampler.samples],
            "marks": [[round(t, 2), name] for t, name in sampler.marks],
            "process_samples": None if processes is None else [
                [round(t, 1), [[pid, round(gib, 3), name] for pid, gib, name in held]] for t, held in processes.samples]}


def launch_verl(recipe: GRPORecipe, overrides: list[str], out_dir: Path) -> dict[str, Any]:
    """:func:`rlkit.verl_job.launch_job` beside the 1 Hz device and host memory samplers (the device one marks
    when each trained step's line arrives); the ranks' weights after each optimizer step are checked
    (``sanity_failures`` names every step where they differ)."""
    from rlkit.measure import MemorySampler, SamplerUnavailable, gpu_process_memory_reader
    from rlkit.verl_logs import logged_training_step

    sampler, host_sampler = _start_samplers()
    processes = None
    if sampler is not None:
        try:
            processes = MemorySampler(interval_s=sampler.interval_s, reader=gpu_process_memory_reader(),
                                      source="per-process", origin=sampler.origin).start()
        except SamplerUnavailable as err:
            print(f"no per-process GPU memory sampling: {err}")
        time.sleep(BASELINE_SAMPLES * sampler.interval_s)
        sampler.mark("launch")

    def mark_step(line: str) -> None:
        step = logged_training_step(line)
        if step is not None and sampler is not None:
            sampler.mark(f"logged:step{step}")

    try:
        result = verl_job.launch_job(recipe, overrides, out_dir, on_line=mark_step)
    finally:
        for running in (sampler, host_sampler, processes):
            if running is not None:
                running.stop()
    result["gpu_memory"] = None if sampler is None else _gpu_memory_record(sampler, processes)
    result["host_memory"] = None if host_sampler is None else host_memory_summary(host_sampler)
    bad = [r for r in result["rank_identity"] if r["max_abs_diff"] != 0.0 or r["differing_elements"]]
    if bad and result["failure"] is None:
        result["sanity_failures"] = [f"optimizer step {r['optimizer_step']}: ranks differ by up to "
                                     f"{r['max_abs_diff']:g} ({r['differing_elements']} elements)" for r in bad]
    return result


def sanity(steps: list[dict[str, Any]], rank_rows: list[dict[str, Any]], n_gpus: int) -> dict[str, Any]:
    """The issue's bar for every arm: finite non-zero grad_norm, finite pg_loss, no NaN, ranks bit-identical."""
    import math

    trained = training_steps(steps)
    grad = [s.get("actor/grad_norm") for s in trained]
    loss = [s.get("actor/pg_loss") for s in trained]
    nan_keys = sorted({k for s in trained for k, v in s.items() if isinstance(v, float) and math.isnan(v)})
    checks = {
        "grad_norm_finite_nonzero": bool(grad) and all(isinstance(g, (int, float)) and math.isfinite(g) and g != 0
                                                        for g in grad),
        "pg_loss_finite": bool(loss) and all(isinstance(v, (int, float)) and math.isfinite(v) for v in loss),
        "no_nan": not nan_keys,
    }
    if n_gpus > 1:
        checks["ranks_identical"] = (len(rank_rows) >= len(trained) > 0
                                     and all(r["max_abs_diff"] == 0.0 and not r["differing_elements"] for r in rank_rows))
    return {**checks, "passed": all(checks.values()), "nan_keys": nan_keys,
            "rank_max_abs_diff": max((r["max_abs_diff"] for r in rank_rows), default=None),
            "rank_check_s_mean": (sum(r["seconds"] for r in rank_rows) / len(rank_rows)) if rank_rows else None}


def with_selective_layers(recipe: GRPORecipe, overrides: list[str]) -> GRPORecipe:
    """``recipe`` with ``selective_layers: 0`` (selective checkpointing, as many layers as fit) replaced by pre-flight's
    choice for these overrides, so that the run's recorded recipe and its environment hold the count it ran with."""
    from dataclasses import replace

    from rlkit.preflight_memory import selective_layers_that_fit

    if recipe.activation_checkpointing != "selective" or recipe.selective_layers:
        return recipe
    fit = selective_layers_that_fit(overrides, recipe.active_patches, gpu_gib=recipe.planner_gpu_gib)
    if not fit:
        raise P.ParamError("GRPORecipe.selective_layers: 0 asks pre-flight for the most layers that fit, and "
                           + ("the planner cannot run on this model" if fit is None else "not one layer fits")
                           + ". Fix: set selective_layers to a number of layers, or activation_checkpointing: full")
    print(f"selective checkpointing: {fit} layers, the most the planner fits on {recipe.planner_gpu_gib} GiB")
    return replace(recipe, selective_layers=fit)


def run(recipe: GRPORecipe, out_dir: str | os.PathLike | None = None, *, how_to_run: str = HOW_TO_RUN) -> dict[str, Any]:
    """The whole recipe; returns ``metrics.json`` content (see ``METRICS_KEYS``). ``how_to_run``: where to run it
    when the launch is skipped (an experiment that runs the recipe names its own command)."""
    from rlkit.results import notebook_out_dir

    out = Path(out_dir) if out_dir else notebook_out_dir(NOTEBOOK)
    out.mkdir(parents=True, exist_ok=True)
    paths, data_info, model_info = prepare(recipe)
    overrides = render_overrides(recipe, paths, out)
    recipe = with_selective_layers(recipe, overrides)
    verl_job.write_overrides(out, overrides)  # a run stopped before its metrics.json can still be collected
    preflight = verl_job.preflight_findings(recipe, overrides)
    launched, reason = verl_job.launch_decision(recipe.launch, recipe.n_gpus, how_to_run)
    shortfall = verl_job.host_memory_shortfall(preflight)
    if launched and shortfall and recipe.host_memory_guard:
        raise P.ParamError(f"GRPORecipe.host_memory_guard: pre-flight refuses the launch: {shortfall['message']}. "
                           f"Fix: {shortfall['fix']}; or set host_memory_guard: false to launch anyway")
    if launched and not recipe.verify_before_launch:
        verify = {"skipped": "verify_before_launch is false: verl validates the same overrides at start-up and "
                             "every verl process's plugin record is checked after the run"}
    else:
        verify = verl_job.verify_subprocess(recipe, overrides, out)
    print(reason)
    metrics = recipe_metrics(recipe, data=data_info, model=model_info, overrides=overrides, preflight=preflight,
                             verify=verify, launch_reason=reason,
                             launch=launch_verl(recipe, overrides, out) if launched else None)
    if launched:
        from rlkit.env import gpu_name, gpus

        metrics["limits"] = phase_limits(metrics, gpu_name({"gpus": gpus()}))
    return metrics


def prepare(recipe: GRPORecipe):
    """The recipe's inputs (:func:`rlkit.recipe.prepare_inputs`), in a child process where there is a GPU: building
    a random-init model uses it, and this process (the samplers', for the whole job) must hold no CUDA memory."""
    from rlkit import recipe as R

    return R.prepare_inputs_isolated(recipe) if verl_job.gpu_count() else R.prepare_inputs(recipe)


def recipe_metrics(recipe: GRPORecipe, *, data: dict, model: dict, overrides: list[str], preflight: dict,
                   verify: dict, launch_reason: str, launch: dict[str, Any] | None) -> dict[str, Any]:
    """``metrics.json`` content of one run (``launch``: the verl launch's result, None when not launched)."""
    metrics: dict[str, Any] = {
        "recipe": P.as_dict(recipe),
        "reward": recipe.resolved_reward,
        "data": data,
        "model": model,
        "overrides": overrides,
        "command": verl_job.shell_command(recipe, overrides),
        "preflight": preflight,
        "verify": verify,
        "launched": launch is not None,
        "launch_reason": launch_reason,
        "steps": [],
        "summary": {},
    }
    if launch is not None:
        add_launch_result(metrics, recipe, launch)
    metrics["arms"] = [arm_row(arm_name(metrics["recipe"]), metrics)]
    return metrics


def optimizer_step_summary(records: list[dict[str, Any]], steps: list[int]) -> dict[str, Any]:
    """Mean optimizer-step seconds (clip + optimizer.step, from the rank-identity records) over ``steps``, and
    the threads the host step used; empty for records written before they carried these fields. With one
    mini-batch per training step, optimizer step n is training step n."""
    rows = [r for r in records if r.get("optimizer_step") in steps and "optimizer_step_s" in r]
    if not rows:
        return {}
    return {"optimizer_step_s": sum(r["optimizer_step_s"] for r in rows) / len(rows),
            "host_threads": rows[-1].get("host_threads"), "torch_threads": rows[-1].get("torch_threads")}


def add_launch_result(metrics: dict[str, Any], recipe: GRPORecipe, result: dict[str, Any]) -> None:
    """Steps, summary, sanity bar and outcome of a verl launch, into ``metrics``."""
    steps = result.pop("steps")
    summary = summarize(steps)
    if result.get("gpu_memory"):
        summary["gpu_peak_used_gib"] = result["gpu_memory"]["peak_used_gib"]
    if result.get("host_memory"):
        summary["host_peak_above_baseline_gib"] = result["host_memory"]["peak_above_baseline_gib"]
    summary.update(optimizer_step_summary(result.get("rank_identity", []), summary.get("steps_averaged", [])))
    metrics.update(steps=steps, summary=summary, launch=result,
                   sanity=sanity(steps, result.get("rank_identity", []), recipe.n_gpus) if training_steps(steps) else None)


def collect(run_dir: str | os.PathLike, note: str) -> dict[str, Any]:
    """``metrics.json`` content for a run folder whose launcher did not finish (killed by a time limit, say),
    from what the run left: params.yaml, overrides.json, verify_result.json, verl.log, plugin records.

    Everything is recomputed from those files by the same code as :func:`run`; what only the launcher knew
    (its exit code, wall time, the GPU sampler's timeline) is absent and ``launch.collected`` says so. A run
    launched before the launcher wrote overrides.json for every run (it did only with verify_before_launch) gets
    them rendered again from its params.yaml by this machine's rlkit; ``launch.collected.overrides`` says which.
    """
    import yaml

    run_dir = Path(run_dir)
    missing = [n for n in ("params.yaml", "verl.log") if not (run_dir / n).exists()]
    if missing:
        raise FileNotFoundError(f"{run_dir} lacks {missing}: not a run folder of `rlkit grpo launch`")
    recipe = P.build(GRPORecipe, yaml.safe_load((run_dir / "params.yaml").read_text()), where=str(run_dir / "params.yaml"))
    paths = default_paths(recipe)
    if (run_dir / "overrides.json").exists():
        overrides, source = json.loads((run_dir / "overrides.json").read_text()), "overrides.json"
    else:
        overrides = render_overrides(recipe, paths, run_dir)
        source = ("rendered again from params.yaml by the collecting machine's rlkit (the run wrote no "
                  "overrides.json): their paths are that machine's, and a rendering change since the run is in them")
    verify_path = run_dir / "verify_result.json"
    record_dir = run_dir / "plugin_records"
    launch = {**verl_job.read_run_files(run_dir, record_dir),
              "gpu_memory": None, "plugin_records": verl_job.read_plugin_records(record_dir),
              "collected": {"from": run_dir.name, "note": note, "overrides": source}}
    return recipe_metrics(
        recipe,
        data={"source": recipe.data, "path": paths.train_file, "rows": recipe.data_rows},
        model={"path": paths.model, "preset": recipe.model if recipe.random_init else None},
        overrides=overrides,
        preflight=_preflight_with_local_model(recipe, overrides, paths.model),
        verify=({**json.loads(verify_path.read_text()),
                 "plugin_records": verl_job.read_plugin_records(run_dir / "plugin_records_verify")}
                if verify_path.exists() else {}),
        launch_reason=f"collected from {run_dir.name} after the run: {note}",
        launch=launch,
    )


@contextmanager
def _local_model_overrides(recipe: GRPORecipe, overrides: list[str]):
    """``overrides`` with a random-init model's directory (written on the node, absent here) stood in for by a
    folder holding its preset's config.json and the length model's mean (what the planner reads); yields
    (overrides, that folder)."""
    import tempfile

    model_path = next((o.split("=", 1)[1] for o in overrides if o.startswith("actor_rollout_ref.model.path=")), "")
    if not recipe.random_init or (Path(model_path) / "config.json").exists():
        yield overrides, None
        return
    from rlkit import models, offline_model

    with tempfile.TemporaryDirectory() as tmp:
        models.preset_config(recipe.model).to_json_file(str(Path(tmp) / "config.json"))
        (Path(tmp) / offline_model.MARKER).write_text(json.dumps({"response_length_mean": recipe.response_length_mean}))
        yield [f"actor_rollout_ref.model.path={tmp}" if o.startswith("actor_rollout_ref.model.path=") else o
               for o in overrides], tmp


def _preflight_with_local_model(recipe: GRPORecipe, overrides: list[str], model_path: str) -> dict[str, Any]:
    """Preflight of a collected run, with :func:`_local_model_overrides`."""
    with _local_model_overrides(recipe, overrides) as (local, tmp):
        found = verl_job.preflight_findings(recipe, local)
    return json.loads(json.dumps(found).replace(tmp, model_path)) if tmp else found


def planner_for_run(metrics: dict[str, Any]):
    """``(card GiB, PlanSpec, Plan)``: the planner for this run's exact overrides on the card it ran on
    (the emulated one, else ``planner_gpu_gib``); None when the planner does not know the model."""
    from rlkit import budget, preflight

    recipe = P.build(GRPORecipe, dict(metrics["recipe"]), where="metrics.json recipe")
    card = recipe.emulate_gpu_gib or recipe.planner_gpu_gib
    # the random-init model's folder was written on the node: a stand-in gives the planner its preset's shapes and
    # the synthetic length model's mean (padded positions depend on it)
    with _local_model_overrides(recipe, metrics["overrides"]) as (overrides, stand_in):
        spec = preflight.planner_spec_for_overrides(overrides, recipe.active_patches, gpu_gib=card)
        if spec is None:
            return None
        plan = budget.plan(spec)
    # the stand-in folder is gone now: the spec names the preset whose shapes it held
    return card, (replace(spec, model=recipe.model) if stand_in else spec), plan


def planner_check(metrics: dict[str, Any], planned=None) -> dict[str, Any] | None:
    """The planner for this run's exact overrides next to what the actor measured: its peak over the step's
    compute phases (verl's actor/perf/max_memory_allocated_gb) against the planner's largest actor total, or,
    for a run that ran out of the card in a phase, whether the planner also puts that phase over the card."""
    from rlkit import budget

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
    """Each phase of a launched run's steps 2.. against its limit (:func:`rlkit.roofline.grpo_step_limits`), on the
    GPU ``gpu_name`` it ran on (its env.json), with the node's committed pinned copy bench and the newest committed
    standalone vLLM ceiling of the run's shape (:func:`rlkit.roofline.vllm_ceiling`)."""
    from rlkit import model_shape, roofline

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
    from rlkit.results import read_metrics

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
    completed run in it (:func:`rlkit.results.run_folders`: not a render's scratch copy, a CPU smoke run or a
    failed run); relative paths are the repository's."""
    from rlkit.results import run_folders

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
    from rlkit.results import read_metrics

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

    from rlkit.colours import phase_colour

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


def _recipe_from_cli(ns) -> GRPORecipe:
    from rlkit.results import load_profile, parse_overrides

    values = load_profile(NOTEBOOK, ns.profile)
    if getattr(ns, "arm", None):
        values.update(arm_values(ns.arm))
    values.update(parse_overrides(ns.param))
    values.pop("results_dir", None)
    return P.build(GRPORecipe, values, where=f"parameters of {NOTEBOOK}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkit grpo", description="the Qwen3-4B GRPO recipe on verl 0.9.1")
    sub = parser.add_subparsers(dest="action", required=True)
    for name, help_ in (("render", "print the verl command and its overrides"),
                        ("launch", "prepare inputs, verify, launch verl, write outputs/<notebook>/<tag>/")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--profile", default="tiny", help=f"nbs/params/{NOTEBOOK}.<profile>.yaml or a YAML path")
        p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE")
        p.add_argument("--arm", default=None, choices=list(ARMS), help="one of the seed's arms (its fields, "
                       "then -p overrides, go over the profile)")
        if name == "launch":
            p.add_argument("--tag", default=None, help="results folder name (default: the arm, else the profile)")
            p.add_argument("--out", default=None, help="results root (default: outputs/)")
    p = sub.add_parser("collect", help="metrics of a run folder whose launcher was stopped (a time limit), "
                       "into outputs/<notebook>/<tag>/")
    p.add_argument("run_dir")
    p.add_argument("--tag", required=True)
    p.add_argument("--note", required=True, help="why the launcher did not finish (kept in metrics.json)")
    p.add_argument("--out", default=None, help="results root (default: outputs/)")
    p = sub.add_parser("parse", help="per-step metrics of a verl console log, as JSON")
    p.add_argument("log")
    ns = parser.parse_args(argv)

    if ns.action == "parse":
        steps = parse_console_metrics(Path(ns.log).read_text(errors="replace"))
        print(json.dumps({"steps": steps, "summary": summarize(steps)}, indent=1))
        return 0
    if ns.action == "collect":
        import shutil

        from rlkit.results import ResultsFolder

        metrics = collect(ns.run_dir, ns.note)
        folder = ResultsFolder.create(NOTEBOOK, ns.tag, root=ns.out)
        with folder.writing() as work_dir:
            for item in Path(ns.run_dir).iterdir():
                # the launcher's own error, if it wrote one, is kept under a name that does not mark the folder failed
                name = {"FAILED.txt": "launcher_error.txt"}.get(item.name, item.name)
                if item.name != "metrics.json":
                    (shutil.copytree if item.is_dir() else shutil.copy2)(item, work_dir / name)
            folder.write_metrics(metrics)
        print(f"results: {folder.path} ({outcome(metrics)})")
        return 0
    try:
        recipe = _recipe_from_cli(ns)
    except (P.ParamError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if ns.action == "render":
        print(verl_job.shell_command(recipe, render_overrides(recipe)))
        return 0
    from rlkit.results import ResultsFolder

    folder = ResultsFolder.create(NOTEBOOK, ns.tag or ns.arm or Path(ns.profile).stem.split(".")[-1], root=ns.out)
    with folder.writing() as work_dir:
        folder.write_params(P.as_dict(recipe))
        folder.write_env()
        folder.write_metrics(run(recipe, out_dir=work_dir))
    print(f"results: {folder.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
