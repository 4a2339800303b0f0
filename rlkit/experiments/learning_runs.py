"""Notebook 07's runs (:mod:`rlkit.experiments.learning`): the plan, each run's recipe, and the runs themselves.

Each run is its own results folder under ``runs_dir`` (written whole or left ``.failed``); a launched run found there
with the same recipe is read back instead of launched again, ``launch_limit`` caps the launches of one invocation,
and ``parallel`` runs go side by side on the same GPU(s) (each its own verl session on ``n_gpus`` ranks).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit.core import params as P
from rlkit.core.env import REPO_ROOT
from rlkit.experiments.learning_config import Config, compare_recipe_values, recipe_values
from rlkit.measure.environment import environment_report

HOW_TO_RUN = ("run `python -m rlkit.experiments.learning --profile h200` (one GPU per run; `--profile h200-2gpu`: two "
              "ranks per run) on a GPU node (it launches the runs missing from runs_dir), then render its results "
              "folder with results_dir")


def run_plan(cfg: Config) -> list[tuple[str, str]]:
    """``(run name, side)`` in launch order, the side being ``baseline_arm`` or ``compare_name``: the two sides'
    first runs, then their second ones, and so on (``repeats`` of the baseline, ``compare_repeats`` of the
    compared variant), so that a capped invocation (``launch_limit``) still adds runs of both."""
    plan = []
    for i in range(1, max(cfg.repeats, cfg.compare_repeats) + 1):
        plan += [(f"{side}.r{i}", side) for side, n in ((cfg.baseline_arm, cfg.repeats),
                                                         (cfg.compare_name, cfg.compare_repeats)) if i <= n]
    return plan


def arm_of(cfg: Config, side: str) -> str:
    """The arm of :data:`rlkit.recipes.grpo.ARMS` a side's runs start from."""
    return cfg.compare_arm if side == cfg.compare_name else side


def build_recipe(cfg: Config, side: str):
    """The GRPO recipe of one run of ``side``: the profile's workload on ``n_gpus`` GPUs with the arm's patches and
    optimizer, and for the compared variant its ``compare_overrides`` on top."""
    from rlkit.recipes.grpo import GRPORecipe

    values = compare_recipe_values(cfg) if side == cfg.compare_name else recipe_values(cfg, side)
    return P.build(GRPORecipe, values, where=f"the recipe of {side}")


def _runs_root(cfg: Config, out: Path) -> Path:
    if not cfg.runs_dir:
        return out / "runs"
    path = Path(cfg.runs_dir)
    return path if path.is_absolute() else REPO_ROOT / path


def saved_run(run_dir: Path, recipe) -> dict[str, Any] | None:
    """The metrics of a launched run saved in ``run_dir`` for this very recipe; None when there is none (a CPU pass
    that launched nothing is not a run to keep). A launched run of another recipe raises: it is not overwritten."""
    from rlkit.core.results import read_metrics
    from rlkit.recipes.grpo import GRPORecipe

    if not (run_dir / "metrics.json").exists():
        return None
    metrics = read_metrics(run_dir)
    if not metrics.get("launched"):
        return None
    if P.build(GRPORecipe, metrics["recipe"], where=f"{run_dir}/metrics.json") != recipe:
        raise P.ParamError(f"{run_dir} holds a launched run of another recipe. Fix: point runs_dir at another folder, "
                           "or move that run away if it is to be replaced")
    return metrics


def run_all(cfg: Config, out: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every planned run, read back from ``runs_dir`` or run by :func:`rlkit.experiments.grpo.run` into its own results folder;
    returns ``{name: {"arm", "variant", "folder", "reused", "metrics"}}`` and the names left for a later invocation. Up to
    ``parallel`` runs go at once (threads, each waiting on its own verl session); where nothing is launched (no
    GPU), a repeat whose identical recipe was already checked is not checked again (before the launch nothing
    differs). One run's failure lets the runs beside it finish and be saved, then is raised."""
    from rlkit.recipes import job as verl_job

    root = _runs_root(cfg, out)
    where = f"{cfg.runs_dir.rstrip('/')}/" if cfg.runs_dir else "runs/"  # as the results folder says it
    done, queue = {}, []
    for name, side in run_plan(cfg):
        recipe = build_recipe(cfg, side)
        metrics = saved_run(root / name, recipe)
        if metrics is not None:
            done[name] = {"arm": arm_of(cfg, side), "variant": side, "folder": where + name, "reused": "read back",
                          "metrics": metrics}
        else:
            queue.append((name, side, recipe))
    will_launch = bool(queue) and verl_job.launch_decision(queue[0][2].launch, queue[0][2].n_gpus, HOW_TO_RUN)[0]
    dry, launches, pending = {}, 0, []
    while queue:
        batch, rest = [], []
        for name, side, recipe in queue:
            if recipe in dry:
                done[name] = {"arm": arm_of(cfg, side), "variant": side, "folder": where + dry[recipe],
                              "reused": f"not launched, as {dry[recipe]}", "metrics": done[dry[recipe]]["metrics"]}
            elif cfg.launch_limit and launches + len(batch) >= cfg.launch_limit:
                pending.append(name)
            elif len(batch) < cfg.parallel and (will_launch or all(recipe != r for _, _, r in batch)):
                batch.append((name, side, recipe))
            else:
                rest.append((name, side, recipe))
        for (name, side, recipe), metrics in zip(batch, _run_batch(root, batch)):
            launches += bool(metrics["launched"])
            if not metrics["launched"]:
                dry[recipe] = name
            done[name] = {"arm": arm_of(cfg, side), "variant": side, "folder": where + name, "reused": None,
                          "metrics": metrics}
        queue = rest
    return {name: done[name] for name, _ in run_plan(cfg) if name in done}, pending


def _run_batch(root: Path, batch: list[tuple[str, str, Any]]) -> list[dict[str, Any]]:
    """The metrics of each ``(name, side, recipe)`` of ``batch``, run side by side, each written whole into
    ``root/name`` (or left ``.failed``); the first failure is raised once every run of the batch has ended. An
    interrupt while waiting stops the runs' verl sessions first (they wait in the pool's threads)."""
    from concurrent.futures import ThreadPoolExecutor, wait

    from rlkit.core.results import ResultsFolder
    from rlkit.experiments import grpo
    from rlkit.recipes import job as verl_job

    def one(name: str, recipe) -> dict[str, Any]:
        folder = ResultsFolder(root.name, name, root=root.parent)
        with folder.writing() as work:
            folder.write_params(P.as_dict(recipe))
            folder.write_env(environment_report())
            metrics = grpo.run(recipe, out_dir=work, how_to_run=HOW_TO_RUN)
            folder.write_metrics(metrics)
        return metrics

    if not batch:  # every run of this round was a repeat of a checked recipe (no GPU): nothing to run
        return []
    pool = ThreadPoolExecutor(max_workers=len(batch))
    futures = [pool.submit(one, name, recipe) for name, _, recipe in batch]
    try:
        wait(futures)
    except BaseException:
        verl_job.stop_running_sessions()
        raise
    finally:
        pool.shutdown(wait=True)
    return [f.result() for f in futures]


def run_row(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """One run in a few fields: arm, variant (its side: the baseline arm or the compared variant's name), folder,
    whether it was launched (or read back) and how it ended; ``patches`` are the ones the run applies (the arm's and
    its levers', :attr:`rlkit.recipes.grpo.GRPORecipe.active_patches`)."""
    from rlkit.experiments import grpo_runs
    from rlkit.recipes.grpo import GRPORecipe

    m = entry["metrics"]
    recipe = P.build(GRPORecipe, m["recipe"], where=f"the recipe of {name}")
    summary = m.get("summary") or {}
    return {"run": name, "arm": entry["arm"], "variant": entry.get("variant", entry["arm"]), "folder": entry["folder"],
            "reused": entry["reused"],
            "launched": m["launched"], "outcome": grpo_runs.outcome(m), "launch_reason": m["launch_reason"],
            "patches": list(recipe.active_patches), "optimizer": m["recipe"]["optimizer"],
            "verified_patches": (m.get("verify") or {}).get("active_patches"), "step_s": summary.get("step_s"),
            "update_actor_mfu": (((m.get("limits") or {}).get("phases") or {}).get("update_actor") or {}).get("fraction"),
            "sanity_passed": (m.get("sanity") or {}).get("passed")}

