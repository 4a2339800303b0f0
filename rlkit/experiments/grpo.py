"""Notebook 05's experiment: the seed's arms of the GRPO recipe launched through verl, measured and checked.

:func:`run` does the whole recipe (:mod:`rlkit.recipes.grpo`): data, model, overrides, ``rlkit preflight``, the
planner's verdict, verl's own config check in a subprocess that imports verl (so the rlkit plugin loads and
applies the chosen patches, recorded per process), then the launch (:func:`rlkit.recipes.job.launch_job`) when
GPUs are present, with 1 Hz device and host memory samplers beside it; verl's per-step metrics go into
``metrics.json`` with the sanity bar (finite grad_norm and pg_loss, ranks bit-identical) and the planner's
prediction next to the measured actor peak.

Command line: ``rlkit grpo render|launch|collect|parse`` (also ``python -m rlkit.experiments.grpo``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rlkit.core import params as P
from rlkit.experiments.estimates import phase_limits
from rlkit.experiments.grpo_runs import arm_row, outcome
from rlkit.measure.environment import environment_report
from rlkit.recipes import check
from rlkit.recipes import job as verl_job
from rlkit.recipes.grpo import (
    ARMS,
    NOTEBOOK,
    GRPORecipe,
    arm_name,
    arm_values,
    default_paths,
    local_model_overrides,
)
from rlkit.recipes.overrides import render_overrides
from rlkit.verl.logs import parse_console_metrics, summarize, training_steps

HOW_TO_RUN = "run the h200 profile on a GPU node (python -m rlkit.experiments.grpo launch --profile h200)"
METRICS_KEYS = ("recipe", "reward", "data", "model", "overrides", "command", "preflight", "verify",
                "launched", "launch_reason", "steps", "summary", "arms")  # launched runs add launch, sanity, limits


def _start_samplers() -> tuple[Any, Any]:
    """1 Hz samplers of device-wide GPU memory (when a GPU can be read) and of the node's used host memory;
    None for one that cannot run here."""
    from rlkit.measure.samplers import MemorySampler, SamplerUnavailable, host_memory_reader

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
    """:func:`rlkit.recipes.job.launch_job` beside the 1 Hz device and host memory samplers (the device one marks
    when each trained step's line arrives); the ranks' weights after each optimizer step are checked
    (``sanity_failures`` names every step where they differ)."""
    from rlkit.measure.samplers import MemorySampler, SamplerUnavailable, gpu_process_memory_reader
    from rlkit.verl.logs import logged_training_step

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

    from rlkit.planning.preflight_memory import selective_layers_that_fit

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
    from rlkit.core.results import notebook_out_dir

    out = Path(out_dir) if out_dir else notebook_out_dir(NOTEBOOK)
    out.mkdir(parents=True, exist_ok=True)
    paths, data_info, model_info = prepare(recipe)
    overrides = render_overrides(recipe, paths, out)
    recipe = with_selective_layers(recipe, overrides)
    check.write_overrides(out, overrides)  # a run stopped before its metrics.json can still be collected
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
        verify = check.verify_subprocess(recipe, overrides, out)
    print(reason)
    metrics = recipe_metrics(recipe, data=data_info, model=model_info, overrides=overrides, preflight=preflight,
                             verify=verify, launch_reason=reason,
                             launch=launch_verl(recipe, overrides, out) if launched else None)
    if launched:
        from rlkit.core.env import gpu_name
        from rlkit.measure.environment import gpus

        metrics["limits"] = phase_limits(metrics, gpu_name({"gpus": gpus()}))
    return metrics


def prepare(recipe: GRPORecipe):
    """The recipe's inputs (:func:`rlkit.recipes.grpo.prepare_inputs`), in a child process where there is a GPU: building
    a random-init model uses it, and this process (the samplers', for the whole job) must hold no CUDA memory."""
    from rlkit.recipes import grpo as R

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


def _preflight_with_local_model(recipe: GRPORecipe, overrides: list[str], model_path: str) -> dict[str, Any]:
    """Preflight of a collected run, with :func:`local_model_overrides`."""
    with local_model_overrides(recipe, overrides) as (local, tmp):
        found = verl_job.preflight_findings(recipe, local)
    return json.loads(json.dumps(found).replace(tmp, model_path)) if tmp else found


def _recipe_from_cli(ns) -> GRPORecipe:
    from rlkit.core.results import load_profile, parse_overrides

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

        from rlkit.core.results import ResultsFolder

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
    from rlkit.core.results import ResultsFolder

    folder = ResultsFolder.create(NOTEBOOK, ns.tag or ns.arm or Path(ns.profile).stem.split(".")[-1], root=ns.out)
    with folder.writing() as work_dir:
        folder.write_params(P.as_dict(recipe))
        folder.write_env(environment_report())
        folder.write_metrics(run(recipe, out_dir=work_dir))
    print(f"results: {folder.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
