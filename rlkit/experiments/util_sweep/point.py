"""One point of the sweep: the launch with the memory samplers beside it, the measurement read from the
job's output, the planner beside it, and a saved point analysed again."""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlkit.core import env as env_mod
from rlkit.core import params as P
from rlkit.experiments.util_sweep.comparison import comparison_rows, cost_summary, emulated_verdict
from rlkit.experiments.util_sweep.config import (
    NOTEBOOK,
    Case,
    Config,
    build_recipe,
    emulation_info,
    planner_spec,
    planner_sweep,
)
from rlkit.experiments.util_sweep.timeline import label_samples, phase_intervals, phase_peaks, process_peaks
from rlkit.patches.instruments import old_log_prob_memory
from rlkit.planning import verdict
from rlkit.recipes import check
from rlkit.recipes import job as verl_job
from rlkit.verl import logs as verl_logs

VLLM_STATS_INTERVAL_S = 2.0  # VLLM_LOG_STATS_INTERVAL for the launch (vLLM's default is 10 s)
RELEASE_WAIT_S = 90.0  # after verl exits, wait this long at most for the device to return to idle
HOW_TO_RUN = ("run `python -m rlkit.experiments.util_sweep --profile h200` on a GPU node, then render its results "
              "folder with results_dir")


def measure_from_logs(steps: list[dict[str, Any]], log_text: str, samples: list[tuple[float, list[float]]],
                      marks: list[tuple[float, str]], case: Case, wall_s: float, returncode: Any,
                      process_samples: list[tuple[float, list[list]]] | None = None) -> dict[str, Any]:
    """Everything measured about one verl job, from its per-step metrics (:func:`rlkit.verl.logs.read_steps`), its
    console log (vLLM's lines, failures) and the sampler's samples and marks.

    ``marks``: ``(t, "launch")`` when verl started and ``(t, "logged:step<N>")`` when step N's metrics line
    arrived (the sampler's clock). ``process_samples``: ``(t, [[pid, GiB, title], ...])`` on the same clock,
    where per-process memory could be read.
    """
    trained = verl_logs.training_steps(steps)
    launch_t = next((t for t, name in marks if name == "launch"), 0.0)
    logged_at = {int(name.split("step", 1)[1]): t for t, name in marks if name.startswith("logged:step")}
    intervals = phase_intervals(trained, logged_at)
    timeline = label_samples(samples, intervals, launch_t)
    idle = [r["used_gib"] for r in timeline if r["phase"] == "idle" and r["used_gib"] is not None]
    baseline = min(idle) if idle else 0.0
    summary = verl_logs.summarize(steps)
    vllm = verl_logs.parse_vllm_log(log_text)
    verl_mem_keys = ("actor/perf/max_memory_allocated_gb", "actor/perf/max_memory_reserved_gb")
    verl_memory = {k.rsplit("/", 1)[-1]: max((s[k] for s in trained if isinstance(s.get(k), (int, float))), default=None)
                   for k in verl_mem_keys}
    gen_s = summary.get("gen_s")
    gen_tok = [s["generation_tok_s"] for s in vllm["stats"] if s["generation_tok_s"] > 0]
    failure = verl_logs.find_failure(log_text)
    # The actor's own peaks in old_log_prob (rlkit.patches.instruments.old_log_prob_memory); absent from runs before it.
    olp_memory = old_log_prob_memory.peaks_from_steps(trained)
    return {
        "returncode": returncode,
        "wall_s": wall_s,
        "steps_logged": len(trained),
        "steps": steps,
        "summary": summary,
        "step_s": summary.get("step_s"),
        "rollout_samples_per_s": case.samples_per_step / gen_s if gen_s else None,
        "vllm": vllm,
        "vllm_generation_tok_s_peak": max(gen_tok) if gen_tok else None,
        "verl_memory": verl_memory,
        "verl_memory_log": verl_logs.parse_verl_memory(log_text),
        "failure": failure,
        "update_oom": bool(failure and failure["kind"] == "torch_oom" and failure["phase"] == "update_actor"),
        "baseline_used_gib": baseline,
        "phase_intervals": intervals,
        "phase_peaks": phase_peaks(timeline, baseline),
        "timeline": timeline,
        "marks": [[t, name] for t, name in marks],
        "process_samples": [[t, held] for t, held in process_samples] if process_samples is not None else None,
        "process_phase_peaks": process_peaks(process_samples, intervals, launch_t) if process_samples else None,
        **({"old_log_prob_memory": olp_memory} if olp_memory else {}),
    }


def launch_measured(recipe, overrides: list[str], out_dir: Path, cfg: Config) -> dict[str, Any]:
    """:func:`rlkit.recipes.job.launch_job` with the device sampler (and the per-process one, where it can read) beside
    it, each trained step's console line marked on the sampler's clock; returns :func:`measure_from_logs` plus the
    launch facts. A memory failure (OOM, vLLM refusing to start) is a result; any other failure raises."""
    from rlkit.measure.samplers import MemorySampler

    sampler = MemorySampler(interval_s=cfg.sample_interval_s).start()
    processes, process_source = _process_sampler(cfg.sample_interval_s, sampler.origin)
    time.sleep(3 * cfg.sample_interval_s)  # idle samples: the baseline the job's memory is measured from
    sampler.mark("launch")

    def mark_step(line: str) -> None:
        step = verl_logs.logged_training_step(line)
        if step is not None:
            sampler.mark(f"logged:step{step}")

    try:
        job = verl_job.launch_job(recipe, overrides, out_dir, on_line=mark_step,
                                  extra_env={"VLLM_LOG_STATS_INTERVAL": str(VLLM_STATS_INTERVAL_S)})
    finally:
        sampler.mark("exited")
        released = _wait_for_release(sampler, RELEASE_WAIT_S)
        sampler.stop()
        if processes is not None:
            processes.stop()
    text = Path(job["log_path"]).read_text(errors="replace")
    measured = measure_from_logs(job["steps"], text, sampler.samples, sampler.marks, cfg.case_spec, job["wall_s"],
                                 job["returncode"], processes.samples if processes is not None else None)
    measured.update(log_path=job["log_path"], metrics_source=job["metrics_source"],
                    sampler={"source": sampler.source, "interval_s": sampler.interval_s, "samples": len(sampler.samples),
                             "per_process": process_source}, device_released_after_s=released)
    if measured["failure"] is None:
        measured["plugin_records"] = job["plugin_records"]
    return measured


def _process_sampler(interval_s: float, origin: float):
    """A started per-process sampler on the device sampler's clock and its source, or ``(None, why not)``."""
    from rlkit.measure.samplers import MemorySampler, SamplerUnavailable, gpu_process_memory_reader

    try:
        reader = gpu_process_memory_reader()
    except SamplerUnavailable as err:
        return None, f"unavailable: {err}"
    return MemorySampler(interval_s=interval_s, reader=reader, source="per-process", origin=origin).start(), "per-process"


def _wait_for_release(sampler, limit_s: float) -> float | None:
    """Seconds until the device is back within 1 GiB of its idle baseline (None: not within ``limit_s``).

    The next point of the sweep must start on an idle device: vLLM's memory profiling fails when another
    process frees memory meanwhile (notes/gpu-node.md).
    """
    idle = [max(u) for t, u in sampler.samples if u and t < sampler.marks[0][0]]
    baseline = min(idle) if idle else 0.0
    start = time.time()
    while time.time() - start < limit_s:
        if sampler.samples and max(sampler.samples[-1][1] or [0.0]) <= baseline + 1.0:
            return time.time() - start
        time.sleep(sampler.interval_s)
    return None


def point_metrics(cfg: Config, emulation: dict[str, Any], measured: dict[str, Any] | None,
                  launch_reason: str, gpu_name: str | None = None) -> dict[str, Any]:
    """The planner and measured side of one point: planner at this and every sweep value, the measurement
    (None without a GPU), planner-vs-measured rows, the emulated-card verdict, the cost metric, and each phase
    against its limit on the GPU ``gpu_name`` it ran on (:func:`rlkit.planning.roofline.grpo_step_limits`)."""
    case = cfg.case_spec
    plan = verdict.plan(planner_spec(cfg)).as_dict()
    return {
        "units": "GiB",
        "config": P.as_dict(cfg),
        "case": {"name": cfg.case, **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(case).items()}},
        "emulation": emulation,
        "planner": plan,
        "planner_sweep": planner_sweep(cfg),
        "launched": measured is not None,
        "launch_reason": launch_reason,
        "measured": measured,
        "comparison": comparison_rows(plan, measured, case),
        "emulated_verdict": emulated_verdict(measured, case.emulated_total_gib, plan),
        "cost": cost_summary(measured, case, cfg.price_per_gpu_hour),
        "limits": point_limits(cfg, measured, gpu_name),
    }


def point_limits(cfg: Config, measured: dict[str, Any] | None, gpu_name: str | None) -> dict[str, Any]:
    """The measured steps 2.. of a point against their limits (empty without a measurement or a GPU name)."""
    from rlkit.models import shape as model_shape
    from rlkit.planning import roofline

    window = verl_logs.averaged_steps((measured or {}).get("steps", []))
    if not window or not gpu_name:
        return {}
    return roofline.grpo_step_limits(P.as_dict(build_recipe(cfg)), window, model_shape.resolve_model(cfg.case_spec.model),
                                     gpu_name, pinned_gbps=roofline.pinned_bench_gbps())


def run(cfg: Config, out_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """One point of the sweep; returns ``metrics.json`` content (keys: :data:`METRICS_KEYS`)."""
    from rlkit.core.results import notebook_out_dir
    from rlkit.measure.environment import gpus
    from rlkit.recipes import grpo as R
    from rlkit.recipes.overrides import render_overrides

    out = Path(out_dir) if out_dir else notebook_out_dir(NOTEBOOK)
    out.mkdir(parents=True, exist_ok=True)
    emulation = emulation_info(cfg)
    recipe = build_recipe(cfg)
    paths, data_info, model_info = R.prepare_inputs_isolated(recipe) if verl_job.gpu_count() else R.prepare_inputs(recipe)
    overrides = render_overrides(recipe, paths, out)
    preflight = verl_job.preflight_findings(recipe, overrides)
    verify = check.verify_subprocess(recipe, overrides, out)
    launched, reason = verl_job.launch_decision(cfg.launch, recipe.n_gpus, HOW_TO_RUN)
    print(reason)
    measured = launch_measured(recipe, overrides, out, cfg) if launched else None
    return {
        **point_metrics(cfg, emulation, measured, reason, env_mod.gpu_name({"gpus": gpus()})),
        "recipe": P.as_dict(recipe),
        "data": data_info,
        "model": model_info,
        "overrides": overrides,
        "command": verl_job.shell_command(recipe, overrides),
        "preflight": preflight,
        "verify": verify,
    }


def saved_samples_and_marks(measured: dict[str, Any]) -> tuple[list[tuple[float, list[float]]], list[tuple[float, str]]]:
    """The sampler's samples and marks of a saved run, for analysing it again.

    Runs saved before ``marks`` was stored: the launch mark is the first sample not labelled idle (the
    labels depend on it only through that comparison) and each step's logged mark is its interval's end.
    The timeline stores the most loaded GPU's GiB, which is what the labels and peaks are computed from.
    """
    timeline = measured["timeline"]
    samples = [(row["t"], [] if row["used_gib"] is None else [row["used_gib"]]) for row in timeline]
    if measured.get("marks"):
        return samples, [(float(t), str(name)) for t, name in measured["marks"]]
    launch = next((row["t"] for row in timeline if row["phase"] != "idle"), math.inf)
    marks = [(launch, "launch")] + [(iv["end"], f"logged:step{iv['step']}") for iv in measured["phase_intervals"]
                                    if iv["phase"] == "step"]
    return samples, marks


def reanalyze(folder: str | os.PathLike) -> dict[str, Any]:
    """A saved run analysed again by this code: its ``verl.log`` and saved samples, the current planner.

    Rewrites ``metrics.json`` in place (atomically). What the node measured (log, samples, wall time,
    return code, plugin records) is kept; what is derived from it (phase placement, peaks, planner, the
    comparison, verdict, cost) is recomputed, and ``analysis`` records the commit that did it and the comparison it
    replaced.
    """
    from rlkit.core.env import git_sha
    from rlkit.core.jsonio import write_json_atomic
    from rlkit.core.results import read_metrics

    path = Path(folder)
    metrics = read_metrics(path)
    old = metrics.get("measured")
    if not old:
        raise ValueError(f"{path}/metrics.json has no measurement to analyse again (launched: "
                         f"{metrics.get('launched')}); run the point on a GPU node first")
    log_path = path / "verl.log"
    if not log_path.exists():
        raise FileNotFoundError(f"{log_path} is missing: the run's console log is the input of the analysis")
    cfg = P.build(Config, metrics["config"], where=f"{path}/metrics.json config")
    samples, marks = saved_samples_and_marks(old)
    process_samples = [(t, held) for t, held in old["process_samples"]] if old.get("process_samples") else None
    steps, source = verl_logs.read_steps(path)
    measured = measure_from_logs(steps, log_path.read_text(errors="replace"), samples, marks, cfg.case_spec,
                                 old["wall_s"], old["returncode"], process_samples)
    measured["metrics_source"] = source
    for kept in ("log_path", "sampler", "device_released_after_s", "plugin_records"):
        if kept in old:
            measured[kept] = old[kept]
    history = list((metrics.get("analysis") or {}).get("history", []))
    history.append({"rlkit_sha": git_sha(), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "replaced_comparison": metrics.get("comparison")})  # what the docs said before, kept for them
    metrics.update(point_metrics(cfg, metrics["emulation"], measured, metrics["launch_reason"],
                                 env_mod.gpu_name(env_mod.read_saved(path))))
    metrics["analysis"] = {"source": "verl.log and the saved 1 Hz samples, analysed again", "history": history}
    write_json_atomic(path / "metrics.json", metrics)
    return metrics


METRICS_KEYS = ("units", "config", "case", "emulation", "recipe", "data", "model", "overrides", "command",
                "preflight", "verify", "planner", "planner_sweep", "launched", "launch_reason", "measured",
                "comparison", "emulated_verdict", "cost", "limits")


def main(argv: list[str] | None = None) -> int:
    """One point (``--profile``/``-p``, see :func:`rlkit.experiments.experiment_main`), or
    ``reanalyze FOLDER...``: saved points analysed again by this code (:func:`reanalyze`)."""
    from rlkit.experiments import experiment_main

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["reanalyze"]:
        if len(argv) < 2:
            print("error: reanalyze needs results folders, e.g. outputs/06_util_sweep/h200/doc_small-u0.4", file=sys.stderr)
            return 2
        for folder in argv[1:]:
            reanalyze(folder)
            print(f"analysed again: {folder}")
        return 0

    return experiment_main(Config, run, NOTEBOOK, argv,
                           default_tag=lambda cfg: f"{cfg.case}-u{cfg.gpu_memory_utilization}")


if __name__ == "__main__":
    sys.exit(main())
