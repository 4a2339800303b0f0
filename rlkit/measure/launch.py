"""Run measured work in a fresh process and get its metrics back.

Notebooks never measure in their own kernel (a kernel that touched CUDA keeps memory, and FSDP needs
one process per rank). ``run_module`` starts ``python -m <module>`` or, for several ranks, torchrun,
hands it a JSON config and reads back the JSON result that rank 0 wrote.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable


class LaunchError(RuntimeError):
    """The child process failed; the message carries the tail of its log."""


def run_module(
    module: str,
    config: dict[str, Any],
    *,
    nproc: int = 1,
    log_path: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run ``module``'s :func:`child_main` entry in a fresh process (``nproc`` ranks) and return its result."""
    with tempfile.TemporaryDirectory(prefix="rlkit-launch-") as tmp:
        cfg_path = Path(tmp) / "config.json"
        result_path = Path(tmp) / "result.json"
        cfg_path.write_text(json.dumps(config))
        args = ["-m", module, "--config", str(cfg_path), "--result", str(result_path)]
        if nproc > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={nproc}", *args]
        else:
            cmd = [sys.executable, *args]
        child_env = {**os.environ, **(env or {})}
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        log_file = Path(log_path) if log_path else Path(tmp) / "child.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "w") as log:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, timeout=timeout)
        if proc.returncode != 0 and _aborted(proc.returncode, log_file):
            # A process using gloo (any world size, a world of one too) can die of SIGABRT ("terminate called
            # without an active exception") on a loaded 2-core machine; what a run computes is deterministic,
            # so one retry cannot change a result.
            print(f"rlkit.measure.launch: a rank of {module} aborted (SIGABRT); running it once more", file=sys.stderr)
            result_path.unlink(missing_ok=True)
            with open(log_file, "a") as log:
                log.write("\n=== rlkit.measure.launch: retry after SIGABRT ===\n")
                log.flush()
                proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, timeout=timeout)
        if proc.returncode != 0 or not result_path.exists():
            tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-40:])
            raise LaunchError(f"{' '.join(cmd)} exited with {proc.returncode}; last lines of its log:\n{tail}")
        return json.loads(result_path.read_text())


def child_main(fn: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
    """Entry point for a launched module: ``fn(config) -> result``; rank 0's result is written back."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--result", required=True)
    ns = parser.parse_args()
    config = json.loads(Path(ns.config).read_text())
    result = fn(config)
    if int(os.environ.get("RANK", "0")) == 0:
        tmp = Path(ns.result).with_suffix(".partial")
        tmp.write_text(json.dumps(result if result is not None else {}, indent=2, default=float))
        tmp.replace(ns.result)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # The work and its result are complete. Skip the interpreter's teardown, where gloo's C++ threads
        # can abort the process (SIGABRT) after the process group was destroyed.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _aborted(returncode: int, log_file: Path) -> bool:
    """SIGABRT: the process's own exit status (one process), or torchrun's report of a rank (several)."""
    if returncode == -signal.SIGABRT:
        return True
    text = log_file.read_text(errors="replace")
    return "SIGABRT" in text or "terminate called" in text
