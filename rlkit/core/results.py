"""Results folders ``outputs/<notebook>/<tag>/`` and parameter files ``nbs/params/<notebook>.<profile>.yaml``.

A results folder is written under a temporary name and renamed into place only when the run
succeeded, so a folder named ``<tag>`` is always complete. A failed run leaves ``<tag>.failed/`` with
``FAILED.txt`` saying why, and never a ``metrics.json``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from rlkit.core.env import REPO_ROOT, gpu_name, read_saved, summary
from rlkit.core.jsonio import write_json_atomic

NBS_DIR = REPO_ROOT / "nbs"
PARAMS_DIR = NBS_DIR / "params"
OUTPUTS_DIR = REPO_ROOT / "outputs"


class ProfileError(ValueError):
    """A parameter file is missing or malformed."""


def profiles(notebook: str) -> list[str]:
    return sorted(p.name[len(notebook) + 1 : -len(".yaml")] for p in PARAMS_DIR.glob(f"{notebook}.*.yaml"))


def load_profile(notebook: str, profile: str) -> dict[str, Any]:
    """Parameters of ``notebook`` for ``profile`` (a name, or a path to a YAML file)."""
    path = Path(profile) if profile.endswith((".yaml", ".yml")) else PARAMS_DIR / f"{notebook}.{profile}.yaml"
    if not path.exists():
        known = profiles(notebook)
        raise ProfileError(
            f"no parameter file {path} for notebook {notebook!r}; profiles there: {known or 'none'}. "
            f"Fix: pick one of them or write {path.name}."
        )
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ProfileError(f"{path} must hold a mapping of parameter names to values, got {type(data).__name__}")
    return data


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["lr=1e-5", "arms=[a, b]"]`` -> ``{"lr": 1e-05, "arms": ["a", "b"]}`` (values are YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ProfileError(f"override {item!r} is not KEY=VALUE. Fix: write it as -p {item}=<value>")
        key, raw = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(raw)
    return out


class ResultsFolder:
    def __init__(self, notebook: str, tag: str, root: str | os.PathLike | None = None) -> None:
        if not tag or "/" in tag or tag.startswith("."):
            raise ValueError(f"bad results tag {tag!r}: use a plain folder name such as 'h200'")
        self.notebook = notebook
        self.tag = tag
        self.root = Path(root) if root else OUTPUTS_DIR
        self.path = self.root / notebook / tag
        self.partial = self.root / notebook / f".{tag}.partial-{os.getpid()}"
        self.failed = self.root / notebook / f"{tag}.failed"

    @classmethod
    def create(cls, notebook: str, tag: str, root=None) -> "ResultsFolder":
        return cls(notebook, tag, root)

    @property
    def work_dir(self) -> Path:
        """Where files go while the run is in progress."""
        return self.partial

    @contextmanager
    def writing(self):
        if self.partial.exists():
            shutil.rmtree(self.partial)
        self.partial.mkdir(parents=True)
        try:
            yield self.partial
        except BaseException as err:
            # the files are read where they end up: paths into the partial folder name the failed one
            report = f"run failed: {type(err).__name__}: {err}\n\n{traceback.format_exc()}"
            for partial in {str(self.partial.resolve()), str(self.partial)}:
                report = report.replace(partial, str(self.failed))
            (self.partial / "FAILED.txt").write_text(report)
            if self.failed.exists():
                shutil.rmtree(self.failed)
            self.partial.rename(self.failed)
            print(f"run failed; partial files kept in {self.failed} (see FAILED.txt)")
            raise
        else:
            if self.path.exists():
                shutil.rmtree(self.path)
            if self.failed.exists():
                shutil.rmtree(self.failed)
            self.partial.rename(self.path)

    def write_params(self, values: dict[str, Any]) -> None:
        (self.partial / "params.yaml").write_text(yaml.safe_dump(values, sort_keys=False))

    def write_env(self, env: dict[str, Any]) -> None:
        """``env.json``: where the run ran (:func:`rlkit.measure.environment.environment_report`)."""
        write_json_atomic(self.partial / "env.json", env)

    def write_metrics(self, metrics: dict[str, Any]) -> None:
        write_json_atomic(self.partial / "metrics.json", metrics)
        self.record_processes(metrics)

    def record_processes(self, metrics: dict[str, Any]) -> None:
        """Add to ``env.json`` the patches active in every process the run launched (:func:`with_processes`)."""
        env_path = self.partial / "env.json"
        if env_path.exists():
            write_json_atomic(env_path, with_processes(json.loads(env_path.read_text()), metrics))


def with_processes(env: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """``env`` with the processes a run launched: the plugin's record of each verl process (``metrics["launch"]``
    and the verify step's ``metrics["verify"]``), each with the patches active in it, and ``active_patches`` the
    union over the driver and every one of them (the driver alone selects none: the patches act in verl's workers).
    The driver's own list stays as ``driver_active_patches``. ``env`` unchanged where no process was recorded."""
    records = [r for key in ("launch", "verify") for r in ((metrics.get(key) or {}).get("plugin_records") or [])]
    if not records:
        return env
    driver = env.get("driver_active_patches", env.get("active_patches") or [])
    processes = [{"role": r.get("role"), "pid": r.get("pid"), "rank": r.get("rank"), "active": r.get("active") or []}
                 for r in records]
    union = sorted({*driver, *(name for p in processes for name in p["active"])})
    return {**env, "driver_active_patches": driver, "active_patches": union, "processes": processes}


def read_metrics(results_dir: str | os.PathLike) -> dict[str, Any]:
    """``metrics.json`` of a results folder (relative paths are taken from the repository root)."""
    path = Path(results_dir)
    if not path.is_absolute():
        path = REPO_ROOT / path
    metrics = path / "metrics.json"
    if not metrics.exists():
        raise FileNotFoundError(f"{metrics} does not exist; run the experiment first or fix results_dir")
    return json.loads(metrics.read_text())


def notebook_out_dir(notebook: str, reading: str | os.PathLike = "") -> Path:
    """Where a notebook writes its metrics and figures: the runner's folder, or a scratch folder.

    ``reading``: the saved results a render reads. A render never writes inside them (the scratch folder
    ``outputs/<notebook>/interactive`` lies inside ``outputs/<notebook>``, a folder of runs): it gets a fresh
    temporary folder instead."""
    import tempfile

    env = os.environ.get("RLKIT_OUT_DIR")
    path = Path(env) if env else OUTPUTS_DIR / notebook / "interactive"
    if reading:
        read = Path(reading) if Path(reading).is_absolute() else REPO_ROOT / reading
        if path.resolve().is_relative_to(read.resolve()):
            return Path(tempfile.mkdtemp(prefix=f"rlkit-{notebook}-render-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


# What a run folder is, for every reader of a folder of runs (the notebooks' renders, the report): a completed
# run under a plain tag. Not a run: a hidden or partial folder, <tag>.failed/, a scratch folder the .gitignore
# names (interactive/: a notebook's own copy of what it rendered; tiny*/: CPU smoke runs), a folder without the
# metrics and the env.json that every run writes (a render writes no env.json).
SCRATCH_TAG = re.compile(r"interactive|tiny.*")
RUN_FILES = ("metrics.json", "env.json")


def is_run_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a completed run (the rule above)."""
    path = Path(path)
    name = path.name
    return (path.is_dir() and not name.startswith(".") and not name.endswith(".failed")
            and not SCRATCH_TAG.fullmatch(name) and all((path / f).is_file() for f in RUN_FILES))


def run_folders(folder: str | os.PathLike) -> list[Path]:
    """The completed runs directly under ``folder`` (:func:`is_run_folder`), sorted by name; relative paths are the
    repository's."""
    folder = Path(folder) if Path(folder).is_absolute() else REPO_ROOT / folder
    return sorted(p for p in folder.iterdir() if is_run_folder(p)) if folder.is_dir() else []


def fmt(value, spec: str = ".1f") -> str:
    """A results-table cell: ``value`` in ``spec``, or ``-`` where there is none."""
    return "-" if value is None else format(value, spec)


def pct(value) -> str:
    """A fraction as a percentage cell: two digits from 10 %, one decimal below; ``-`` where there is none."""
    return "-" if value is None else f"{value:.0%}" if value >= 0.1 else f"{value:.1%}"

# ----------------------------------------------------------------------------------------------
# committed results: what git tracks under outputs/, never what a local run (`make demo`'s tiny/) left there

class NotACheckout(RuntimeError):
    """Committed results cannot be told from local runs: the folder is not inside a git checkout."""


def tracked_files(folder: str | os.PathLike) -> list[Path]:
    """The files under ``folder`` that git tracks (``git ls-files``), as absolute paths, sorted.

    Raises :class:`NotACheckout` when ``folder`` is not inside a git work tree or git is not installed: then
    nothing says which results were committed, and guessing from what is on disk would mix in local runs.
    """
    import subprocess

    folder = Path(folder).resolve()
    where = next((p for p in (folder, *folder.parents) if p.is_dir()), None)
    try:
        out = subprocess.run(["git", "-C", str(where), "ls-files", "-z", "--full-name", "--", str(folder)],
                             capture_output=True, text=True, check=False)
        top = subprocess.run(["git", "-C", str(where), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, check=False)
    except OSError as err:
        raise NotACheckout(f"cannot run git ({err}): committed results under {folder} cannot be told from "
                           "local runs. Fix: work in a git clone of rlkit") from err
    if out.returncode or top.returncode:
        raise NotACheckout(f"{folder} is not inside a git checkout ({(out.stderr or top.stderr).strip()}): "
                           "committed results cannot be told from local runs. Fix: work in a git clone of rlkit")
    root = Path(top.stdout.strip())
    return sorted(root / name for name in out.stdout.split("\0") if name)


def committed_runs(folder: str | os.PathLike) -> list[Path]:
    """The run folders directly under ``folder`` (``outputs/<notebook>/``, :func:`run_folders`' rule) whose
    ``metrics.json`` git tracks, sorted by name. A folder only on disk (a ``make demo`` run, an interactive
    session) is not one of them."""
    folder = Path(folder).resolve()
    tracked = {f.parent for f in tracked_files(folder) if f.name == "metrics.json" and f.parent.parent == folder}
    return sorted(p for p in tracked if is_run_folder(p))


# Executed notebooks' figures: the plotly JSON and the static images that survive outside a live kernel
PLOTLY_MIME = "application/vnd.plotly.v1+json"
IMAGE_MIMES = ("image/png", "image/svg+xml")


def figure_outputs(nb: dict[str, Any]) -> list[tuple[int, int, dict[str, Any]]]:
    """(cell index, output index, output) for every output of ``nb`` (a notebook as JSON) holding a plotly figure."""
    return [(ci, oi, out) for ci, cell in enumerate(nb.get("cells", []))
            for oi, out in enumerate(cell.get("outputs", []) or [])
            if PLOTLY_MIME in (out.get("data") or {})]


def missing_images(nb: dict[str, Any]) -> list[tuple[int, int, dict[str, Any]]]:
    """The figure outputs of ``nb`` with no static image beside the plotly JSON."""
    return [(ci, oi, out) for ci, oi, out in figure_outputs(nb) if not any(m in out["data"] for m in IMAGE_MIMES)]


def where_measured(results_dir: str | os.PathLike) -> str:
    """Where saved results were measured, from their ``env.json``: the one run's, or one line per run folder in it
    (notebooks print this beside their own environment, which is only where they were rendered)."""
    folder = Path(results_dir)
    folder = folder if folder.is_absolute() else REPO_ROOT / folder  # notebooks run in nbs/; paths are the repo's
    own = read_saved(folder)
    if own is not None:
        return summary(own)
    runs = run_folders(folder)
    if not runs:
        return f"{folder} has no env.json: where these results were measured is not recorded"
    return "\n".join(f"{p.name}: commit {env.get('git_sha')}, {gpu_name(env) or 'no GPU'}, "
                     f"torch {env.get('versions', {}).get('torch')}, verl {env.get('versions', {}).get('verl')}, "
                     f"vllm {env.get('versions', {}).get('vllm')}" for p in runs for env in [read_saved(p)])


def where_run(results_dir: str | os.PathLike, env: dict) -> str:
    """What a notebook prints about where its results come from: where the saved results it renders were measured
    (:func:`where_measured`; the rendering kernel is only where they were drawn), else this kernel (``env``)."""
    return where_measured(results_dir) if results_dir else f"measured in this kernel:\n{summary(env)}"
