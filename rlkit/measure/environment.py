"""What is this process running on: library versions, GPUs, git revision, active rlkit patches.

Written into every run's ``env.json`` (:meth:`rlkit.core.results.ResultsFolder.write_env`) and shown by
``rlkit doctor``. Imports torch lazily and never initialises CUDA in a way that would pin memory in a notebook
kernel beyond NVML-style queries.
"""
from __future__ import annotations

import os
import platform
import sys

from rlkit import patches
from rlkit.core.env import TRACKED, dist_version, git_sha
from rlkit.measure.samplers import SamplerUnavailable, gpu_memory_reader


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
