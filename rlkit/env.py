"""What is this process running on: library versions, GPUs, git revision, active rlkit patches.

Written into every run's ``env.json`` and shown by ``rlkit doctor``. Imports torch lazily and never
initialises CUDA in a way that would pin memory in a notebook kernel beyond NVML-style queries.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

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


def gpus() -> list[dict]:
    """Name and memory of each visible CUDA device ([] without CUDA).

    Creates no CUDA context: free memory comes from NVML / nvidia-smi (device-wide), because a context
    made here (~0.5 GiB per GPU) would stay for the life of a launcher that measures a job beside it.
    """
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    from rlkit.measure import SamplerUnavailable, gpu_memory_reader

    try:
        used = gpu_memory_reader()[0]()  # in CUDA's order (CUDA_VISIBLE_DEVICES), as torch numbers them
    except SamplerUnavailable:
        used = None
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        total = props.total_memory / 2**30
        free = total - used[i] if used is not None and i < len(used) else None
        out.append({
            "index": i,
            "name": props.name,
            "total_gib": round(total, 3),
            "free_gib": round(free, 3) if free is not None else None,
            "capability": f"{props.major}.{props.minor}",
        })
    return out


def environment_report() -> dict:
    from rlkit import patches

    try:
        import torch

        torch_cuda = torch.version.cuda
    except ImportError:
        torch_cuda = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "versions": {name: dist_version(name) for name in TRACKED},
        "torch_cuda": torch_cuda,
        "gpus": gpus(),
        "git_sha": git_sha(),
        "active_patches": patches.active(),
    }


def gpu_name(env: dict | None) -> str | None:
    """The first GPU's name in an :func:`environment_report` (a run's ``env.json``), None without one."""
    return next((g["name"] for g in (env or {}).get("gpus", [])), None)


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


def where_measured(results_dir: str | os.PathLike) -> str:
    """Where saved results were measured, from their ``env.json``: the one run's, or one line per run folder in it
    (notebooks print this beside their own environment, which is only where they were rendered)."""
    folder = Path(results_dir)
    folder = folder if folder.is_absolute() else REPO_ROOT / folder  # notebooks run in nbs/; paths are the repo's
    from rlkit.results import run_folders  # results imports this module

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
