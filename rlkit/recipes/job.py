"""One verl job: its environment, the pre-flight before it, the launch, and what its processes recorded.

rlkit launches ``python -m verl.trainer.main_ppo`` with the rendered Hydra overrides (:mod:`rlkit.recipes.grpo`),
the rlkit plugin named in the environment (every verl process applies the run's patches and writes a record),
verl's file logger pointed into the run folder, and the job in a process session of its own so that Ray's
daemons and vLLM's workers go with it. :func:`launch_job` is the one launch every experiment uses; callers
add what they measure beside it through ``on_line`` and by starting their samplers around the call.
verl's own check of the rendered config, before the launch, is :mod:`rlkit.recipes.check`.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rlkit.core.env import REPO_ROOT
from rlkit.verl import logs as verl_logs

PLUGIN_MODULE = "rlkit.patches.verl_plugin"


# The offline node's environment (notes/gpu-node.md); Ray actors inherit it from the driver.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "WANDB_MODE": "disabled",
    "PYTHONUNBUFFERED": "1",
}


def command(overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]


def launch_env(recipe, record_dir: str | os.PathLike, base: dict | None = None) -> dict[str, str]:
    """Environment of the verl driver (Ray workers inherit it) for ``recipe`` (a :class:`rlkit.recipes.grpo.GRPORecipe`).

    The plugin is named in ``VERL_USE_EXTERNAL_MODULES`` as well as through the entry point, so it
    also loads where rlkit is on PYTHONPATH but not pip-installed (the offline node).
    """
    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    env["VERL_USE_EXTERNAL_MODULES"] = ",".join(dict.fromkeys([*modules, PLUGIN_MODULE]))
    # vLLM reports its KV cache, concurrency and CUDA-graph memory at INFO; verl's runtime env sets WARN
    # unless the launching environment sets the level (found in the first 2 x H200 run: no KV lines).
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    env.update(recipe_env(recipe))
    env["RLKIT_RECORD_DIR"] = str(record_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def recipe_env(recipe) -> dict[str, str]:
    """The RLKIT_* variables ``recipe`` sets for verl's processes; "" where its feature is off (clearing an inherited
    value)."""
    return {"RLKIT_PATCHES": ",".join(recipe.active_patches),
            "RLKIT_REPLAY_POLL_S": f"{recipe.replay_poll_s:g}" if "replay_poll" in recipe.active_patches else "",
            # 0 (pre-flight's choice) is resolved before a launch (rlkit.experiments.grpo.run); unresolved, the patch refuses
            "RLKIT_SELECTIVE_LAYERS": str(recipe.selective_layers or "") if "selective_checkpoint" in recipe.active_patches else "",
            "RLKIT_EMULATE_GPU_GIB": f"{recipe.emulate_gpu_gib:g}" if recipe.emulate_gpu_gib else "",
            "RLKIT_CHECK_RANK_IDENTITY": "1" if recipe.check_rank_identity and recipe.n_gpus > 1 else "",
            # measurement only (rlkit.patches.instruments.old_log_prob_memory); a no-op where no old_log_prob pass runs
            "RLKIT_OLD_LOG_PROB_MEMORY": "1" if recipe.record_old_log_prob_memory else ""}


def shell_command(recipe, overrides: list[str]) -> str:
    """The launch as one copy-pasteable shell line (env vars the recipe sets + the command; the measurement-only rank
    check and the record folder are left to the launcher)."""
    settings = recipe_env(recipe)
    env = {"RLKIT_PATCHES": settings["RLKIT_PATCHES"], "VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE, **OFFLINE_ENV,
           **{k: settings[k] for k in ("RLKIT_EMULATE_GPU_GIB", "RLKIT_REPLAY_POLL_S", "RLKIT_SELECTIVE_LAYERS")
              if settings[k]}}
    env_part = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return " \\\n  ".join([env_part, "python -m verl.trainer.main_ppo", *(shlex.quote(o) for o in overrides)])


# ----------------------------------------------------------------------------------------------
# what the plugin recorded in each verl process


def clear_plugin_records(record_dir: Path) -> None:
    """Empty ``record_dir`` of the records a previous launch's processes wrote (the plugin's *.json, the
    rank-identity checker's *.jsonl), creating it if needed."""
    from rlkit.patches.instruments import rank_identity

    record_dir.mkdir(parents=True, exist_ok=True)
    for old in [*record_dir.glob("*.json"), *record_dir.glob(f"{rank_identity.RECORD_PREFIX}*.jsonl")]:
        old.unlink()


def read_plugin_records(record_dir: str | os.PathLike) -> list[dict]:
    """All per-process records the rlkit verl plugin wrote into ``record_dir``."""
    path = Path(record_dir)
    return [json.loads(p.read_text()) for p in sorted(path.glob("*.json"))] if path.exists() else []


def _unapplied(record: dict) -> list[str]:
    """What a record's process had not applied when it last wrote: selected patches, the master_on_host wiring
    and the instruments, each applied when the process imports its targets."""
    state = record.get("state") or {}
    return list(dict.fromkeys([*(record.get("pending") or []), *(n for n, s in state.items() if s != "applied")]))


def check_plugin_records(record_dir: str | os.PathLike, expected, *, require_worker: bool = False) -> list[dict]:
    """Every recorded verl process took exactly ``expected``, each patch applied or still waiting for its
    target modules (the plugin applies a patch when its process imports them: a vLLM worker or the driver
    never imports verl's FSDP engine); raise naming each offender otherwise.

    ``require_worker``: after a real launch at least one Ray worker must have applied all of them (the actor
    worker imports verl's FSDP engine and workers, so its record has nothing pending; a run in which no
    worker got there trained without some patch, or the plugin never loaded in the workers).
    """
    records = read_plugin_records(record_dir)
    expected = list(expected)
    problems = []
    if not records:
        problems.append(f"no plugin records in {record_dir}: the rlkit plugin never loaded in a verl process")
    for r in records:
        who = f"pid {r.get('pid')} ({r.get('role')})"
        applied, pending = list(r.get("applied") or []), list(r.get("pending") or [])
        if r.get("error"):
            problems.append(f"{who}: {r['error']}")
        elif set(applied) & set(pending) or sorted(applied + pending) != sorted(expected):
            problems.append(f"{who} applied {applied} with {pending} pending, the run asked for {expected}")
    if require_worker and records:
        workers = [r for r in records if r.get("role") == "ray_worker"]
        if not workers:
            problems.append("no Ray worker recorded: the plugin did not load in the worker processes")
        elif not any(not r.get("error") and not _unapplied(r) for r in workers):
            waiting = "; ".join(f"pid {r.get('pid')} still pending {_unapplied(r)}" for r in workers if not r.get("error"))
            problems.append(f"no Ray worker applied all of {expected} (the actor worker imports verl's FSDP engine, "
                            f"which applies them): {waiting or 'every worker failed'}")
    if problems:
        raise RuntimeError("rlkit plugin check failed:\n  " + "\n  ".join(problems))
    return records


# ----------------------------------------------------------------------------------------------
# before the launch: pre-flight findings, whether to launch


def preflight_findings(recipe, overrides: list[str]) -> dict[str, Any]:
    """``rlkit.planning.preflight.check_overrides`` on the rendered overrides of ``recipe``.

    The preflight runs the phase-budget planner (rlkit.planning.budget) for ``planner_gpu_gib``; its finding
    (check ``planner``) is the planner's verdict, reported separately. HostAdamW's host state is held against
    this machine's available memory (check ``host_memory``): the launch runs here.
    """
    from rlkit.planning import preflight

    findings = [_plain(f) for f in preflight.check_overrides(overrides, active_patches=list(recipe.active_patches),
                                                             gpu_gib=recipe.planner_gpu_gib,
                                                             env={**os.environ, **recipe_env(recipe)},
                                                             host_available_gib=preflight.available_host_gib())]
    return {"available": True, "findings": [f for f in findings if f.get("check") != "planner"],
            "planner": [f for f in findings if f.get("check") == "planner"],
            "errors": sum(f.get("severity") == "error" for f in findings)}


def host_memory_shortfall(preflight: dict[str, Any]) -> dict[str, Any] | None:
    """The pre-flight's error finding of check ``host_memory`` (HostAdamW's host state larger than this machine's
    available memory), or None. Launched anyway, such a run ends minutes in: a Ray worker SIGKILLed mid-update."""
    return next((f for f in preflight.get("findings", [])
                 if f.get("check") == "host_memory" and f.get("severity") == "error"), None)


def format_findings(findings: list[dict[str, Any]]) -> str:
    """Findings as text lines: SEVERITY key: message / fix."""
    if not findings:
        return "no findings"
    return "\n".join(f"{f.get('severity', '').upper():8}{f.get('key')}: {f.get('message')}\n{'':8}fix: {f.get('fix')}"
                     for f in findings)


def _plain(obj):
    """JSON-able form of a finding/verdict object (dataclass, mapping or anything with str())."""
    import dataclasses

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def gpu_count() -> int:
    """CUDA devices visible (no CUDA context is created)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def launch_decision(mode: str, n_gpus: int, how_to_run: str) -> tuple[bool, str]:
    """Whether to launch verl (``mode``: auto, always or never) for a job needing ``n_gpus`` CUDA GPUs, and
    why; ``how_to_run`` tells a reader without them where to run it."""
    have = gpu_count()
    if mode == "never":
        return False, "launch: never (set launch: auto or always to run verl)"
    if mode == "always":
        return True, f"launch: always ({have} CUDA GPU(s) visible)"
    if have >= n_gpus:
        return True, f"{have} CUDA GPU(s) visible, the job needs {n_gpus}"
    return False, (f"verl launch skipped: {have} CUDA GPU(s) visible, the job needs n_gpus={n_gpus}. "
                   f"Everything before the launch ran for real; {how_to_run}")


# ----------------------------------------------------------------------------------------------
# the launch


def session_members(sid: int) -> list[int]:
    """PIDs of the processes in session ``sid`` (Linux /proc; [] elsewhere)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:  # after the command name: state, ppid, pgrp, session
            members.append(int(stat.parent.name))
    return members


def stop_session(proc: subprocess.Popen) -> None:
    """Stop verl and everything it started in its session (Ray's daemons and workers, vLLM workers): the
    next launch must find the GPUs idle. SIGTERM to the group first, then SIGKILL to whatever is left."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for pid in session_members(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.wait(timeout=10)


# The sessions run_in_own_session has in flight in this process, whichever thread waits on each.
_RUNNING: set[subprocess.Popen] = set()


def stop_running_sessions() -> None:
    """Stop every verl session this process has in flight: for a caller whose runs wait in other threads (an
    interrupt reaches only the main thread, so their own ``finally`` would not stop them); each waiting call then
    returns with the session's exit code."""
    for proc in list(_RUNNING):
        stop_session(proc)


def run_in_own_session(argv: list[str], *, env: dict[str, str] | None, cwd: Path, log_path: Path, timeout_s: float,
                       on_line=None) -> tuple[int | str, float]:
    """Run ``argv`` (verl's trainer) in a process session of its own with its console written straight to
    ``log_path`` (``on_line`` gets each line as it lands there), and stop the whole session afterwards: on a
    timeout, and after a clean exit too, since Ray's daemons and vLLM workers must not hold the GPUs into the
    next launch. Returns the exit code (``"timeout"`` when ``timeout_s`` ran out) and the wall seconds."""
    import threading

    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    _RUNNING.add(proc)
    follower = None
    if on_line is not None:
        follower = threading.Thread(target=_follow, args=(log_path, proc, on_line), daemon=True)
        follower.start()
    try:
        returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        returncode = "timeout"
    finally:
        stop_session(proc)
        _RUNNING.discard(proc)
    if follower is not None:
        follower.join()
    return returncode, time.time() - start


def _follow(path: Path, proc: subprocess.Popen, on_line, poll_s: float = 0.2) -> None:
    """Hand every complete line of the growing file ``path`` to ``on_line`` until ``proc`` has exited and
    the file is read to its end."""
    pending = ""
    with open(path, errors="replace") as f:
        while True:
            exited = proc.poll() is not None
            chunk = f.read()
            pending += chunk
            *lines, pending = pending.split("\n")
            for line in lines:
                on_line(line + "\n")
            if exited and not chunk:
                if pending:
                    on_line(pending)
                return
            if not chunk:
                time.sleep(poll_s)


def read_run_files(run_dir: Path, record_dir: Path) -> dict[str, Any]:
    """What a verl run left in ``run_dir``, read back: per-step metrics (:func:`rlkit.verl.logs.read_steps`),
    the first memory failure in its console log, and the rank-identity rows its processes recorded."""
    from rlkit.patches.instruments import rank_identity

    steps, source = verl_logs.read_steps(run_dir)
    text = (run_dir / verl_logs.CONSOLE_LOG).read_text(errors="replace")
    return {"steps": steps, "metrics_source": source, "failure": verl_logs.find_failure(text),
            "rank_identity": rank_identity.read_records(record_dir)}


def crash_reason(returncode: int | str, text: str) -> str:
    """Why verl ended early, for the error a user reads ("" when the log and exit code do not say): a Ray worker
    that died (:func:`rlkit.verl.logs.find_crash`), else the signal that killed the driver, each with the fix."""
    import signal

    crash = verl_logs.find_crash(text)
    if crash is not None:
        return f"; {crash['cause']} Fix: {crash['fix']}"
    if isinstance(returncode, int) and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        who = " (the kernel's OOM killer, a scheduler or a person)" if name == "SIGKILL" else ""
        return (f"; verl's driver was killed by {name}{who}. Fix: look for the kill in `dmesg`; if host memory ran "
                f"out, check it with `rlkit preflight --host-gib auto` on the node; then launch again (an rlkit "
                f"results folder is left as <tag>.failed/, never as a complete one)")
    return ""


def launch_job(recipe, overrides: list[str], out_dir: Path, *, extra_env: dict[str, str] | None = None,
               on_line=None) -> dict[str, Any]:
    """Run verl's trainer for ``recipe`` (a :class:`rlkit.recipes.grpo.GRPORecipe`) to its end in ``out_dir``: console
    in ``verl.log`` (each line also to ``on_line``), per-step metrics in verl's file logger, every process's
    plugin record. A memory failure (an OOM, vLLM refusing to start: how an arm fails on an emulated card) is a
    result, in ``failure``; any other early end (a crash, fewer steps than asked, the time limit) raises."""
    out_dir = Path(out_dir).resolve()
    record_dir = out_dir / "plugin_records"
    clear_plugin_records(record_dir)
    metrics_file = out_dir / verl_logs.METRICS_FILE
    metrics_file.unlink(missing_ok=True)
    log_path = out_dir / verl_logs.CONSOLE_LOG
    env = {**launch_env(recipe, record_dir), verl_logs.FILE_LOGGER_ENV: str(metrics_file), **(extra_env or {})}
    returncode, wall = run_in_own_session(command(overrides), env=env, cwd=out_dir, log_path=log_path,
                                          timeout_s=recipe.timeout_s, on_line=on_line)
    result = {**read_run_files(out_dir, record_dir), "wall_s": wall, "returncode": returncode, "log_path": str(log_path)}
    trained = len(verl_logs.training_steps(result["steps"]))
    if result["failure"] is not None:
        result["plugin_records"] = read_plugin_records(record_dir)
        return result
    if returncode != 0 or trained < recipe.steps:
        text = log_path.read_text(errors="replace")
        tail = "\n".join(text.splitlines()[-40:])
        raise RuntimeError(f"verl exited with {returncode} after {wall:.0f} s having logged {trained}/{recipe.steps} "
                           f"steps and no device-memory failure{crash_reason(returncode, text)}; full log {log_path}; "
                           f"last lines:\n{tail}")
    result["plugin_records"] = check_plugin_records(record_dir, recipe.active_patches, require_worker=True)
    return result
