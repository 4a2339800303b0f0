"""Where each notebook's closing findings come from: the function that states them and the metrics it reads.

Every notebook in ``nbs/`` ends with two cells, the Markdown heading :data:`HEADING` and a code cell printing its
experiment's ``describe`` (``print(<module>.describe(metrics))``; 06 prints ``describe(runs)``, the runs of its
metrics). :func:`read_folder` reads a results folder the way the notebook's ``results_dir`` does, and
:func:`describe` states its findings, so a committed executed notebook's closing prose can be written again from its
folder's ``metrics.json`` (``rlkit render``, :mod:`rlkit.tools.render`) and checked against it.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

HEADING = "## What this run shows"

# notebook -> the module whose describe() states its findings
MODULES = {
    "00_phase_budget": "rlkit.experiments.phase_budget",
    "01_offload_bug": "rlkit.experiments.offload_bug",
    "02_host_adamw": "rlkit.experiments.update_phase",
    "03_cast_once": "rlkit.experiments.cast_once",
    "04_skip_old_logprob": "rlkit.experiments.skip_old_logprob",
    "05_grpo_qwen3_4b": "rlkit.experiments.grpo_runs",
    "06_util_sweep": "rlkit.experiments.util_sweep",
    "07_does_it_learn": "rlkit.experiments.learning",
    "08_where_the_time_goes": "rlkit.experiments.time_budget",
}
# notebooks whose describe() takes the list of runs in the metrics (a sweep), not the metrics
_TAKES_RUNS = {"06_util_sweep"}


class MissingMetrics(FileNotFoundError):
    """A results folder without the metrics.json its findings are generated from."""


def read_folder(notebook: str, folder: str | os.PathLike) -> dict[str, Any]:
    """The metrics of results folder ``folder`` of ``notebook``, read as the notebook's ``results_dir`` reads them
    (the experiment's ``read_results`` where it has one; a sweep's folder of points for 06)."""
    from rlkit.core.results import read_metrics

    path = Path(folder)
    module = importlib.import_module(MODULES[notebook])
    has_points = notebook == "06_util_sweep" and bool(module.point_folders(path))
    if not (path / "metrics.json").exists() and not has_points:
        raise MissingMetrics(
            f"{path}: no metrics.json, and the findings are generated from it. Fix: put the run's metrics.json in "
            f"{path} (the run that made it writes one: rlkit run nbs/{notebook}.ipynb), or leave this folder out.")
    reader = getattr(module, "read_results", None)
    return reader(path) if reader else read_metrics(path)


def describe(notebook: str, metrics: dict[str, Any]) -> str:
    """``notebook``'s findings in plain sentences, every number read from ``metrics``."""
    module = importlib.import_module(MODULES[notebook])
    return module.describe(module.runs_of(metrics) if notebook in _TAKES_RUNS else metrics)
