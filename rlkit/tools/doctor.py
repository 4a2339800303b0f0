"""``rlkit doctor``: which torch / CUDA / vLLM / verl / Ray / transformers am I running, and do they fit?

The pins come from verl 0.9.1 and vLLM's own metadata (see the packaging notes in docs/offline-node.md):
vLLM pins torch exactly, verl 0.9.1 needs transformers >=5.5.3,<5.11 (not 5.6.0) and Python <3.13,
and transformers 5.9/5.10 refuse tokenizers newer than 0.23.0. Exit status 1 when the installed
stack is inconsistent; a CPU machine without the GPU path is not an error, just reported.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from rlkit.core.env import dist_version
from rlkit.patches import SUPPORTED

# vLLM release -> the torch it pins (vLLM requirements; packaging notes).
VLLM_TORCH = [
    (SpecifierSet(">=0.18,<0.20"), "2.10.0"),
    (SpecifierSet(">=0.20,<0.27"), "2.11.0"),
    (SpecifierSet(">=0.27,<0.33"), "2.13.0"),
    (SpecifierSet(">=0.33,<0.34"), "2.14.0"),
]
# rlkit's supported range, the one its patches' version guards use (rlkit.patches.SUPPORTED, pyproject.toml).
RLKIT_TORCH = SpecifierSet(SUPPORTED["torch"])
RLKIT_TRANSFORMERS = SpecifierSet(SUPPORTED["transformers"])
VERL_PIN = SUPPORTED["verl"].removeprefix("==")
VLLM_PIN = "0.24.0"
VERL_TRANSFORMERS = SpecifierSet(">=5.5.3,<5.11,!=5.6.0")
VERL_PYTHON = SpecifierSet(">=3.10,<3.13")
GPU_PATH = ("vllm", "verl", "ray", "nvidia-ml-py")


@dataclass
class Check:
    level: str  # "ok" | "warn" | "error"
    what: str
    detail: str


def _public(version: str) -> Version:
    return Version(Version(version).public)


def check_stack(versions: dict[str, str | None], python: str, cuda: str | None, n_gpus: int) -> list[Check]:
    """Consistency checks over a {distribution: version or None} mapping (pure; unit-tested)."""
    checks: list[Check] = [Check("ok", "supported", ", ".join(f"{d} {spec}" for d, spec in SUPPORTED.items())
                                 + " (every patch's version guard; pyproject.toml)")]
    torch_v = versions.get("torch")
    if torch_v is None:
        checks.append(Check("error", "torch", "not installed. Fix: pip install torch==2.13.0 (CPU) or use environment.yml (GPU)"))
    elif _public(torch_v) not in RLKIT_TORCH:
        checks.append(Check("error", "torch", f"{torch_v} is outside rlkit's supported range {SUPPORTED['torch']}: "
                            f"every patch refuses it. Fix: pip install 'torch{SUPPORTED['torch']}' (torch==2.13.0 on a CPU)"))
    else:
        checks.append(Check("ok", "torch", f"{torch_v} (CUDA {cuda or 'none'})"))

    vllm_v = versions.get("vllm")
    if vllm_v and torch_v:
        wanted = next((t for spec, t in VLLM_TORCH if _public(vllm_v) in spec), None)
        if wanted is None:
            checks.append(Check("warn", "vllm", f"{vllm_v}: no known torch pin; rlkit is tested with vllm {VLLM_PIN}"))
        elif _public(torch_v) != Version(wanted):
            checks.append(Check("error", "vllm", f"vllm {vllm_v} is built for torch {wanted}, but torch {torch_v} is installed. "
                                f"Fix: pip install torch=={wanted} or a vllm built for your torch"))
        else:
            checks.append(Check("ok", "vllm", f"{vllm_v} matches torch {torch_v}"))
        if _public(vllm_v) != Version(VLLM_PIN):
            checks.append(Check("warn", "vllm", f"{vllm_v}: verl {VERL_PIN} pins vllm {VLLM_PIN}"))

    verl_v = versions.get("verl")
    if verl_v:
        if _public(verl_v) != Version(VERL_PIN):
            checks.append(Check("warn", "verl", f"{verl_v}: rlkit's verl patches are written for {VERL_PIN} and refuse other versions"))
        else:
            checks.append(Check("ok", "verl", verl_v))
        if Version(python) not in VERL_PYTHON:
            checks.append(Check("error", "python", f"{python}: verl {VERL_PIN} needs Python {VERL_PYTHON}"))
        tf_v = versions.get("transformers")
        if tf_v and _public(tf_v) not in VERL_TRANSFORMERS:
            checks.append(Check("error", "transformers", f"{tf_v}: verl {VERL_PIN} needs transformers {VERL_TRANSFORMERS}. "
                                "Fix: pip install transformers==5.10.4 tokenizers==0.22.2"))
        if not versions.get("ray"):
            checks.append(Check("error", "ray", "not installed, but `import verl` imports ray. Fix: pip install 'rlkit[verl]'"))
    tf_v, tok_v = versions.get("transformers"), versions.get("tokenizers")
    if tf_v and _public(tf_v) not in RLKIT_TRANSFORMERS:
        checks.append(Check("error", "transformers", f"{tf_v} is outside rlkit's supported range "
                            f"{SUPPORTED['transformers']}: the patches on transformers refuse it. "
                            f"Fix: pip install 'transformers{SUPPORTED['transformers']}'"))
    if tf_v and tok_v and _public(tf_v) < Version("5.11") and _public(tok_v) > Version("0.23.0"):
        checks.append(Check("error", "tokenizers", f"{tok_v}: transformers {tf_v} refuses tokenizers > 0.23.0 at import. "
                            "Fix: pip install tokenizers==0.22.2"))

    if n_gpus and cuda is None:
        checks.append(Check("error", "torch", f"{n_gpus} GPU(s) visible but torch is a CPU build. Fix: install a CUDA torch"))
    missing = [name for name in GPU_PATH if not versions.get(name)]
    if n_gpus == 0:
        checks.append(Check("ok", "gpu path", "no CUDA GPU here: CPU profiles only (tiny notebooks, tests)"))
    elif missing:
        checks.append(Check("warn", "gpu path", f"missing for the GPU path: {', '.join(missing)}. "
                            "Fix: conda env create -f environment.yml, or `rlkit bundle` for an offline node"))
    else:
        checks.append(Check("ok", "gpu path", "vllm, verl, ray and NVML bindings present"))
    return checks


def gpu_table() -> list[dict]:
    """GPUs with total/free memory, from nvidia-smi (no CUDA context needed), else torch."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.free,driver_version", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=20, check=True,
            ).stdout
            rows = []
            for line in out.strip().splitlines():
                idx, name, total, free, driver = [x.strip() for x in line.split(",")]
                rows.append({"index": int(idx), "name": name, "total_gib": round(int(total) / 1024, 2),
                             "free_gib": round(int(free) / 1024, 2), "driver": driver})
            return rows
        except (subprocess.SubprocessError, ValueError):
            pass
    from rlkit.measure.environment import gpus

    return gpus()


def collect() -> dict:
    versions = {name: dist_version(name) for name in
                ("torch", "vllm", "verl", "ray", "transformers", "tokenizers", "nvidia-ml-py", "flash-attn", "papermill")}
    try:
        import torch

        cuda = torch.version.cuda
    except ImportError:
        cuda = None
    python = sys.version.split()[0]
    gpus = gpu_table()
    checks = check_stack(versions, python, cuda, len(gpus))
    return {"python": python, "versions": versions, "torch_cuda": cuda, "gpus": gpus,
            "checks": [asdict(c) for c in checks]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkit doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="machine-readable report")
    ns = parser.parse_args(argv)
    report = collect()
    if ns.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"python {report['python']}")
        for name, version in report["versions"].items():
            print(f"  {name:14s} {version or '-'}")
        print("GPUs:" if report["gpus"] else "GPUs: none")
        for g in report["gpus"]:
            print(f"  [{g['index']}] {g['name']}: {g['free_gib']:.1f} of {g['total_gib']:.1f} GiB free")
        for c in report["checks"]:
            print(f"{c['level'].upper():5s} {c['what']}: {c['detail']}")
    return 1 if any(c["level"] == "error" for c in report["checks"]) else 0
