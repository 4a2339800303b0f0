"""Everything rlkit reads from verl's and vLLM's output: per-step metrics, memory lines, failures.

verl's per-step metrics come from its file logger (``trainer.logger=[console,file]`` writes one JSON record
per step to ``VERL_FILE_LOGGER_PATH``; verl/utils/tracking.py ``FileLogger``): :func:`read_steps` takes them
from there when a run folder has that file. Runs saved before it (every run committed until then) have
only the console log, read by :func:`parse_console_metrics`. vLLM's start-up, statistics and sleep lines and
the failures (OOMs, vLLM refusing to start, a Ray worker that died) exist only as console text; their formats
are quoted from the sources beside each pattern (fixtures: tests/fixtures/util_sweep_logs.txt,
tests/fixtures/verl_console.log, and the committed real runs tests/test_faults.py reads).
"""
from __future__ import annotations

import ast
import json
import math
import os
import re
from pathlib import Path
from typing import Any

# verl's file logger writes its JSONL here (read from the environment in every verl process).
FILE_LOGGER_ENV = "VERL_FILE_LOGGER_PATH"
METRICS_FILE = "verl_metrics.jsonl"  # its name inside a run folder
CONSOLE_LOG = "verl.log"
# verl's console logger line (verl/utils/logger/aggregate_logger.py concat_dict_to_str):
# "step:<n> - key:value - key:value", numbers formatted with pprint.pformat (numpy scalars appear as
# np.float64(x)); printed inside the TaskRunner Ray actor, so the driver shows a Ray prefix.
_STEP_LINE = re.compile(r"(?:^|[\s)])step:(\d+) - (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUMBER = re.compile(r"^(?:np\.\w+\()?\s*([^()]*?)\s*\)?$")
# Phases of one V1-trainer step (marked_timer names in verl/trainer/ppo/v1), in execution order.
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")
SUMMARY_KEYS = {
    "step_s": "timing_s/step",
    **{f"{p}_s": f"timing_s/{p}" for p in PHASES},
    "grad_norm": "actor/grad_norm",
    "pg_loss": "actor/pg_loss",
    "entropy": "actor/entropy",
    "score_mean": "critic/score/mean",
    "response_length_mean": "response_length/mean",
    "throughput_tok_s_per_gpu": "perf/throughput",
    "actor_max_allocated_gib": "actor/perf/max_memory_allocated_gb",
    "actor_max_reserved_gib": "actor/perf/max_memory_reserved_gb",
    "host_memory_used_gib": "actor/perf/cpu_memory_used_gb",
}
# Extremes over the same steps, not means: the shortest and the longest response any averaged step sampled
# (verl's compute_data_metrics logs each step's batch min and max; a mean of per-step extremes would describe
# no response). With the synthetic length model (rlkit.models.lengths) they show that lengths vary; the plain
# random model's sit at max_response_length (its min dips when it samples its EOS id, ~1 in vocab_size tokens).
EXTREME_KEYS = {
    "response_length_min": ("response_length/min", min),
    "response_length_max": ("response_length/max", max),
}


def _number(raw: str):
    match = _NUMBER.match(raw.strip())
    text = match.group(1) if match else raw.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_console_metrics(text: str) -> list[dict[str, Any]]:
    """Per-step metric dicts from verl's console logger output, ordered by step.

    Lines of the same step (verl logs validation and training metrics separately) are merged.
    """
    steps: dict[int, dict[str, Any]] = {}
    for line in _ANSI.sub("", text).splitlines():
        match = _STEP_LINE.search(line)
        if not match:
            continue
        row = steps.setdefault(int(match.group(1)), {})
        for item in match.group(2).split(" - "):
            key, sep, raw = item.partition(":")
            if sep:
                row[key.strip()] = _number(raw)
    return [{"step": step, **steps[step]} for step in sorted(steps)]


def logged_training_step(line: str) -> int | None:
    """The step number of a console line that carries a trained step's metrics (its ``timing_s/step``);
    None for any other line."""
    match = _STEP_LINE.search(_ANSI.sub("", line))
    return int(match.group(1)) if match and "timing_s/step:" in match.group(2) else None


def read_file_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Per-step metric dicts from verl's file logger (``{"step": n, "data": {...}}`` a line), ordered by
    step; records of the same step (training and validation) are merged, as on the console."""
    steps: dict[int, dict[str, Any]] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            steps.setdefault(int(record["step"]), {}).update(record["data"])
    return [{"step": step, **steps[step]} for step in sorted(steps)]


def read_steps(run_dir: str | os.PathLike) -> tuple[list[dict[str, Any]], str]:
    """A run folder's per-step metrics and where they came from: verl's file logger when the folder has its
    JSONL, else the console log (runs saved before rlkit asked verl for the file)."""
    run_dir = Path(run_dir)
    jsonl = run_dir / METRICS_FILE
    if jsonl.exists() and jsonl.stat().st_size:
        return read_file_metrics(jsonl), METRICS_FILE
    return parse_console_metrics((run_dir / CONSOLE_LOG).read_text(errors="replace")), CONSOLE_LOG


def training_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps that trained (a step timing is logged); drops validation-only lines such as step 0."""
    return [s for s in steps if "timing_s/step" in s]


def averaged_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trained steps a run's summary averages: 2.. (step 1 carries one-off start-up), or step 1 alone."""
    trained = training_steps(steps)
    return trained[1:] if len(trained) > 1 else trained


def summarize(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Means of the headline metrics (:data:`SUMMARY_KEYS`) over training steps 2.. (step 1 carries one-off
    start-up), step 1 alone when it is the only one; :data:`EXTREME_KEYS` are the min / max over those steps."""
    window = averaged_steps(steps)
    if not window:
        return {}
    out: dict[str, Any] = {"steps_averaged": [s["step"] for s in window]}
    for name, key in SUMMARY_KEYS.items():
        values = [s[key] for s in window if isinstance(s.get(key), (int, float))]
        out[name] = sum(values) / len(values) if values else None
    for name, (key, pick) in EXTREME_KEYS.items():
        values = [s[key] for s in window if isinstance(s.get(key), (int, float))]
        out[name] = pick(values) if values else None
    return out


# vLLM's and verl's memory lines (formats verified against the sources named; fixture: tests/fixtures/util_sweep_logs.txt)
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
# vLLM 0.24.0, vllm/v1/worker/gpu_model_runner.py load_model ("... GiB memory and %.6f seconds") and
# vllm/v1/worker/gpu/model_runner.py load_model ("... GiB and %.6f seconds"); format_gib rounds to 0.01.
_MODEL_LOADING = re.compile(r"Model loading took " + _NUM + r" GiB(?: memory)? and " + _NUM + " seconds")
# vllm/v1/worker/gpu_worker.py determine_available_memory: "Available KV cache memory: %s GiB".
_KV_MEMORY = re.compile(r"Available KV cache memory: " + _NUM + " GiB")
# vllm/v1/core/kv_cache_utils.py get_kv_cache_configs: "GPU KV cache size: %s tokens" (f"{n:,}") and
# "Maximum concurrency for %s tokens per request: %.2fx" (max_model_len as f"{n:,}").
_KV_TOKENS = re.compile(r"GPU KV cache size: " + _NUM + " tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + "x")


# gpu_model_runner.py capture_model / gpu/model_runner.py: "Graph capturing finished in %.0f secs, took %.2f GiB".
_GRAPHS = re.compile(r"Graph capturing finished in " + _NUM + r" secs, took " + _NUM + " GiB")
# vllm/v1/metrics/loggers.py LoggingStatLogger.log: "Engine 000: Avg prompt throughput: %.1f tokens/s,
# Avg generation throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs[, ...], GPU KV cache
# usage: %.1f%%, Prefix cache hit rate: %.1f%%".
_STATS = re.compile(r"Avg prompt throughput: " + _NUM + r" tokens/s, Avg generation throughput: " + _NUM
                    + r" tokens/s, Running: (\d+) reqs, Waiting: (\d+) reqs")
_KV_USAGE = re.compile(r"GPU KV cache usage: " + _NUM + "%")


# Sleep mode, one pair per sleep: vllm/device_allocator/cumem.py CuMemAllocator.sleep "CuMemAllocator: sleep
# freed %.2f GiB memory in total, ..." (the pool gpu_memory_utilization sizes: weights, KV cache), then
# vllm/v1/worker/gpu_worker.py Worker.sleep "Sleep mode freed %.2f GiB memory, %.2f GiB memory is still in
# use." (torch.cuda.mem_get_info before and after: the whole device, after the allocator's sleep has emptied
# PyTorch's cache). verl sleeps the engine once after start-up and once after every rollout.
_SLEEP_POOL = re.compile(r"CuMemAllocator: sleep freed " + _NUM + " GiB")
_SLEEP_DEVICE = re.compile(r"Sleep mode freed " + _NUM + " GiB memory, " + _NUM + " GiB memory is still in use")


# verl 0.9.1 verl/utils/profiler/performance.py log_gpu_memory_usage: "{head}, memory allocated (GB): {a},
# memory reserved (GB): {r}, device memory used/total (GB): {u}/{t}" (GB there = 2**30 bytes).
_VERL_MEMORY = re.compile(r"^(?:\([^)]*pid=\d+[^)]*\)\s*)?(.*?), memory allocated \(GB\): " + _NUM
                          + r", memory reserved \(GB\): " + _NUM + r", device memory used/total \(GB\): "
                          + _NUM + "/" + _NUM)
# torch c10/cuda/CUDACachingAllocator.cpp: "CUDA out of memory. Tried to allocate <size>. GPU <n> has a
# total capacity of ..." raised as torch.OutOfMemoryError.
_TORCH_OOM = re.compile(r"CUDA out of memory\. Tried to allocate ([0-9.]+ [KMGT]?i?B)")
_TORCH_OOM_TYPE = re.compile(r"torch\.(?:cuda\.)?OutOfMemoryError")


# vLLM 0.24.0 vllm/v1/worker/utils.py request_memory: "Free memory on device <d> (<free>/<total> GiB) on
# startup is less than desired GPU memory utilization (<u>, <r> GiB)".
_VLLM_STARTUP = re.compile(r"Free memory on device \S+ \(" + _NUM + "/" + _NUM + r" GiB\) on startup is less "
                           r"than desired GPU memory utilization \(" + _NUM + ", " + _NUM + r" GiB\)")
# vllm/v1/core/kv_cache_utils.py _check_enough_kv_cache_memory: "No available memory for the cache blocks."
_NO_KV = re.compile(r"No available memory for the cache blocks")


def _f(text: str) -> float:
    return float(text.replace(",", ""))


def parse_vllm_log(text: str) -> dict[str, Any]:
    """What vLLM reported at start-up (one entry per engine, in log order), its throughput statistics and
    what each sleep freed (in log order: after start-up, then after each rollout)."""
    text = _ANSI.sub("", text)
    stats = []
    for line in text.splitlines():
        m = _STATS.search(line)
        if m:
            usage = _KV_USAGE.search(line)
            stats.append({"prompt_tok_s": _f(m.group(1)), "generation_tok_s": _f(m.group(2)),
                          "running_reqs": int(m.group(3)), "waiting_reqs": int(m.group(4)),
                          "kv_cache_usage_pct": _f(usage.group(1)) if usage else None})
    return {
        "model_loading_gib": [_f(m.group(1)) for m in _MODEL_LOADING.finditer(text)],
        "kv_cache_gib": [_f(m.group(1)) for m in _KV_MEMORY.finditer(text)],
        "kv_cache_tokens": [int(_f(m.group(1))) for m in _KV_TOKENS.finditer(text)],
        "max_concurrency": [{"max_model_len": int(_f(m.group(1))), "concurrency": _f(m.group(2))}
                            for m in _CONCURRENCY.finditer(text)],
        "cuda_graphs": [{"seconds": _f(m.group(1)), "gib": _f(m.group(2))} for m in _GRAPHS.finditer(text)],
        "stats": stats,
        "sleeps": [{"pool_freed_gib": _f(pool.group(1)), "device_freed_gib": _f(dev.group(1)),
                    "still_in_use_gib": _f(dev.group(2))}
                   for pool, dev in zip(_SLEEP_POOL.finditer(text), _SLEEP_DEVICE.finditer(text))],
    }


_RAY_PREFIX_AND_BODY = re.compile(r"^(\([^)]*pid=\d+[^)]*\))?\s*(.*?)\s*$")


def parse_vllm_serve_args(text: str) -> list[dict[str, Any]]:
    """The ``vllm serve`` options verl started each printed engine with, in log order (verl 0.9.1's vLLMHttpServer
    pprints them on replica 0, a string a line: verl/workers/rollout/vllm_rollout/vllm_async_server.py): {option:
    value}, option names with underscores, numbers as numbers, a bare ``--flag`` True, ``--no-flag`` False, several
    values a list, the model path under ``model``. An option verl did not pass is absent (vLLM's default applies)."""
    engines, prefix, lines = [], None, []
    for line in _ANSI.sub("", text).splitlines():
        line_prefix, body = _RAY_PREFIX_AND_BODY.match(line).groups("")
        if prefix is None and body.startswith("['serve',"):
            prefix, lines = line_prefix, []
        if prefix is None or line_prefix != prefix:
            continue  # another process's line, interleaved
        lines.append(body)
        if body.endswith("]"):
            try:
                argv = ast.literal_eval(" ".join(lines))
            except (SyntaxError, ValueError):
                continue  # a "]" inside a value: the list goes on
            engines.append(_serve_options(argv))
            prefix = None
    return engines


def _serve_options(argv: list[str]) -> dict[str, Any]:
    given: dict[str, list] = {}  # each --option and the values after it
    for item in argv[2:]:
        if item.startswith("--"):
            key = item[2:].replace("-", "_")
            given[key] = []
        else:
            given[key].append(_number(item))
    flags = {k.removeprefix("no_"): not k.startswith("no_") for k, values in given.items() if not values}
    return {"model": argv[1], **flags, **{k: v[0] if len(v) == 1 else v for k, v in given.items() if v}}


def parse_verl_memory(text: str) -> list[dict[str, Any]]:
    """verl's ``log_gpu_memory_usage`` lines: label, allocated / reserved GiB of the process, device used/total."""
    rows = []
    for line in _ANSI.sub("", text).splitlines():
        m = _VERL_MEMORY.search(line.strip())
        if m:
            rows.append({"label": m.group(1).strip(), "allocated_gib": _f(m.group(2)), "reserved_gib": _f(m.group(3)),
                         "device_used_gib": _f(m.group(4)), "device_total_gib": _f(m.group(5))})
    return rows


# Which verl phase a failure belongs to, from names in the traceback (Ray task-error lines name the remote
# method, e.g. ``ray::WorkerDict.actor_rollout_update_actor()``). Checked in this order.
_FAILURE_PHASES = (
    ("update_actor", ("update_actor", "train_batch", "train_mini_batch", "optimizer_step")),
    ("ref", ("compute_ref_log_prob",)),
    ("old_log_prob", ("compute_log_prob", "infer_batch")),
    ("update_weights", ("update_weights", "checkpoint_engine", "wake_up")),
    ("gen", ("generate", "execute_model", "EngineCore")),
    ("init", ("init_model", "profile_run", "determine_available_memory", "initialize_kv_cache", "load_model")),
)


def _failure_phase(window: list[str]) -> str:
    ray_lines = [line for line in window if "ray::" in line or "RayTaskError" in line]
    for lines in (ray_lines, window):
        for phase, keys in _FAILURE_PHASES:
            if any(k in line for line in lines for k in keys):
                return phase
    return "unknown"


def find_failure(text: str, context: int = 80) -> dict[str, Any] | None:
    """The first memory failure in a verl/vLLM log: kind, phase, the message line and the ``fix``; None when
    there is none.

    Kinds: ``vllm_startup`` (vLLM refused: not enough free memory for its reservation), ``no_kv_cache``
    (reservation smaller than weights + profile peak), ``torch_oom`` (a CUDA allocation failed).
    """
    lines = _ANSI.sub("", text).splitlines()
    for i, line in enumerate(lines):
        m = _VLLM_STARTUP.search(line)
        if m:
            free, total, util = _f(m.group(1)), _f(m.group(2)), _f(m.group(3))
            fits = math.floor(100 * free / total) / 100 if total else 0.0
            return {"kind": "vllm_startup", "phase": "init", "line": line.strip(),
                    "free_gib": free, "total_gib": total, "requested_gib": _f(m.group(4)),
                    "fix": (f"vLLM reserves gpu_memory_utilization x the card ({util:g} x {total:g} GiB) and found "
                            f"{free:g} GiB free: lower {ROLLOUT_KEY}.gpu_memory_utilization to at most {fits:.2f}, "
                            f"or free what the actor leaves on the device during rollout (the offload_views patch, "
                            f"param/optimizer offload, HostAdamW; `rlkit preflight --gpu-gib {total:g}` shows the "
                            f"planner's rollout residue)")}
        if _NO_KV.search(line):
            return {"kind": "no_kv_cache", "phase": "init", "line": line.strip(),
                    "fix": (f"vLLM's reservation does not cover its weights and profiling peak: raise "
                            f"{ROLLOUT_KEY}.gpu_memory_utilization, or shrink max_num_batched_tokens / the CUDA-graph "
                            f"capture sizes (`rlkit budget` shows the KV pool per setting)")}
        m = _TORCH_OOM.search(line)
        if m or _TORCH_OOM_TYPE.search(line):
            window = lines[max(0, i - context): i + context]
            phase = _failure_phase(window)
            return {"kind": "torch_oom", "phase": phase, "line": line.strip(),
                    "tried_to_allocate": m.group(1) if m else None, "fix": _OOM_FIXES.get(phase, _OOM_FIXES["unknown"])}
    return None


ROLLOUT_KEY = "actor_rollout_ref.rollout"
_OOM_FIXES = {
    "update_actor": "fewer tokens per update micro-batch (actor.ppo_max_token_len_per_gpu, or micro_batch_size_per_gpu "
                    "without dynamic batching), gradient checkpointing, remove-padding if the run pads (model."
                    "use_remove_padding=True, with attn_implementation rlkit_varlen where flash-attn is missing: a padded "
                    "micro-batch holds every sequence at its longest one's length), and the rlkit options that shrink "
                    "the update (HostAdamW, master_on_host + cast_once, chunked_logprobs); `rlkit preflight --gpu-gib` "
                    "shows the planner's update phase",
    "old_log_prob": "fewer tokens per log-prob micro-batch (rollout.log_prob_max_token_len_per_gpu), or skip the pass "
                    "when fully on-policy (the skip_old_logprob patch)",
    "ref": "fewer tokens per reference micro-batch (ref.log_prob_max_token_len_per_gpu), or offload the reference",
    "gen": f"lower {ROLLOUT_KEY}.gpu_memory_utilization or max_num_seqs; free what the actor leaves on the device "
           "during rollout (offload_views, param offload)",
    "update_weights": "free device memory before the weight sync (param offload, the offload_views patch, master_on_host)",
    "init": "a smaller model or card budget at start-up: check `rlkit preflight --gpu-gib` for the phase that does not fit",
    "unknown": "find the phase in the traceback and check it with `rlkit preflight --gpu-gib` (the phase-budget planner)",
}


# Ray 2.x: how the driver learns that a worker process died. ray/exceptions.py ActorDiedError.BASE_ERROR_MSG
# "The actor died unexpectedly before finishing this task." (then "\tpid: <n>" and the raylet's exit detail),
# WorkerCrashedError "The worker died unexpectedly while executing this task."; the raylet's own line
# "A worker died or was killed while executing a task by an unexpected system error. ... Worker PID: <n> Worker
# exit type: SYSTEM_ERROR ..." (src/ray/raylet, checked in the Ray 2.60 raylet binary); Ray's memory monitor:
# "<n> worker(s) were killed due to the node running low on memory" / "killed due to memory pressure (OOM)".
_RAY_DIED = re.compile(r"The actor died unexpectedly before finishing this task|The worker died unexpectedly while "
                       r"executing this task|A worker died or was killed while executing a task|ActorDiedError|"
                       r"WorkerCrashedError")
_RAY_MEMORY_MONITOR = re.compile(r"killed due to the node running low on memory|killed due to memory pressure \(OOM\)")
# rlkit.optim.staging.HostMemoryError: HostAdamW's staging buffer did not fit the host (raised in the actor worker).
_HOST_MEMORY = re.compile(r"HostMemoryError: (.*)$")
_RAY_PID = re.compile(r"(?:Worker PID: |^\s*pid: )(\d+)")
_RAY_EXIT_TYPE = re.compile(r"Worker exit type: (\w+)")


def find_crash(text: str, context: int = 80) -> dict[str, Any] | None:
    """Why a process of a verl job died, from its log (not a device OOM, which :func:`find_failure` reads): kind,
    phase, pid, the message line, ``cause`` and ``fix`` for the user; None when the log does not say.

    Kinds: ``host_memory`` (HostAdamW's staging buffer did not fit the host: rlkit.optim.staging's HostMemoryError,
    whose message carries its fix), ``ray_memory_monitor`` (Ray killed a worker because the node ran low on host
    memory), ``worker_died`` (killed by a signal, e.g. the kernel's OOM killer or a person's SIGKILL, or crashed).
    """
    lines = _ANSI.sub("", text).splitlines()
    for i, line in enumerate(lines):
        host = _HOST_MEMORY.search(line)
        if host:
            what, _, fix = host.group(1).partition(" Fix: ")
            return {"kind": "host_memory", "phase": _failure_phase(lines[max(0, i - context): i + context]),
                    "pid": None, "exit_type": None, "line": line.strip(), "cause": what.strip(),
                    "fix": fix.strip() or "see the message"}
        monitor = _RAY_MEMORY_MONITOR.search(line)
        if not (monitor or _RAY_DIED.search(line)):
            continue
        window = lines[max(0, i - context): i + context]
        after = lines[i: i + context]
        pid = next((int(m.group(1)) for m in map(_RAY_PID.search, after) if m), None)
        exit_type = next((m.group(1) for m in map(_RAY_EXIT_TYPE.search, after) if m), None)
        phase = _failure_phase(window)
        who = f"a Ray worker{f' (pid {pid})' if pid else ''}"
        if monitor:
            cause = f"{who} was killed by Ray's memory monitor in {phase}: the node ran low on host memory."
            fix = ("shrink the host state (`rlkit preflight --host-gib auto` on the node: HostAdamW's masters, Adam "
                   "moments and pinned staging; rank0_owner, master_on_host), or run on a node with more memory")
        else:
            cause = (f"{who} died in {phase}{f' (exit type {exit_type})' if exit_type else ''}: killed by a signal "
                     "(SIGKILL from the kernel's OOM killer, a scheduler or a person) or crashed.")
            fix = ("look for the kill in `dmesg` (an OOM kill names the process) and in the worker's own log above; if "
                   "host memory ran out, check it with `rlkit preflight --host-gib auto` on the node; then launch again "
                   "(an rlkit results folder is left as <tag>.failed/, never as a complete one)")
        return {"kind": "ray_memory_monitor" if monitor else "worker_died", "phase": phase, "pid": pid,
                "exit_type": exit_type, "line": line.strip(), "cause": cause, "fix": fix}
    return None
