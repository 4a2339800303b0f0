"""Where results come from: the repository, library versions, the git revision, and a run's saved ``env.json``.

What the running process reports about itself (GPUs, active patches) is :mod:`rlkit.measure.environment`, which
writes the ``env.json`` that :func:`read_saved` and :func:`summary` read here.
"""
from __future__ import annotations

import os
import subprocess
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# Distributions whose versions decide whether a run is reproducible.
TRACKED = ("torch", "transformers", "tokenizers", "verl", "vllm", "ray", "papermill", "numpy", "rlkit")


def dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_sha(root: Path = REPO_ROOT) -> str | None:
    """HEAD of the checkout (``-dirty`` with local changes outside ``outputs/``: results being written, e.g. by a
    reanalysis of several folders, do not make the code another revision); a copy without ``.git`` (e.g. a tree
    sent to a GPU node) can state its revision in ``RLKIT_GIT_SHA``."""
    if os.environ.get("RLKIT_GIT_SHA"):
        return os.environ["RLKIT_GIT_SHA"]
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", ".", ":!outputs"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if sha.returncode != 0:
        return None
    return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def gpu_name(env: dict | None) -> str | None:
    """The first GPU's name in an :func:`environment_report` (a run's ``env.json``), None without one."""
    return next((g["name"] for g in (env or {}).get("gpus", [])), None)


def short_gpu(name: str | None) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100': the model a table's GPU column names ('-' where none is recorded)."""
    return name.removeprefix("NVIDIA ").split()[0] if name else "-"


def read_saved(run_dir: str | os.PathLike) -> dict | None:
    """A run folder's ``env.json`` (where its results were measured), None when it has none."""
    import json

    path = Path(run_dir) / "env.json"
    return json.loads(path.read_text()) if path.exists() else None


def summary(env: dict) -> str:
    """Two lines a notebook prints about an :func:`environment_report`: Python, CUDA, commit and patches, then the
    versions that are installed and the GPUs."""
    head = {k: env.get(k) for k in ("python", "torch_cuda", "git_sha", "active_patches")}
    versions = {k: v for k, v in env.get("versions", {}).items() if v}
    return f"{head}\n{versions} | GPUs: {[g['name'] for g in env.get('gpus', [])] or 'none'}"
