"""verl's step timings placed on the memory sampler's clock, and the samples cut into phases."""
from __future__ import annotations

import math
from typing import Any

from rlkit.verl.logs import PHASES


def phase_intervals(steps: list[dict[str, Any]], logged_at: dict[int, float]) -> list[dict[str, Any]]:
    """Where each phase of each trained step lay on the sampler's clock.

    verl prints a step's metrics when the step has ended; ``logged_at[step]`` is when that line reached us.
    The step is placed to end there and to last ``timing_s/step``. In the sync V1 trainer
    (verl/trainer/ppo/v1/trainer_base.py ``_step_once`` and trainer_sync.py ``on_step_end``) the phases run
    gen, reward, old_log_prob, ref, adv, update_actor and update_weights last. They are laid backward from
    the step's end, and gen runs from the step's start to the next phase: the part of a step no timer
    covers lies in the rollout. Measured: the first step of every run in outputs/06_util_sweep/ has 21-23 s
    outside its timed phases (0.12-0.14 s in step 2), and vLLM logged "wake up" that long before its first request while
    ``timing_s/gen`` counted only the generation (the agent loop's start-up; the device samples show the
    awake KV pool through it). Laid forward, that gap pushed every later phase of step 1 early by its
    length. Accuracy: Ray's log forwarding delay plus the small untimed parts between later phases
    (batch balancing, metrics).
    """
    out = []
    for s in steps:
        n, total = s.get("step"), s.get("timing_s/step")
        if n not in logged_at or not isinstance(total, (int, float)):
            continue
        end = logged_at[n]
        start = end - float(total)
        cursor = end
        laid = []
        for phase in reversed(PHASES[1:]):
            seconds = s.get(f"timing_s/{phase}")
            if isinstance(seconds, (int, float)):
                laid.append({"step": n, "phase": phase, "start": max(start, cursor - float(seconds)), "end": cursor})
                cursor = laid[-1]["start"]
        if isinstance(s.get(f"timing_s/{PHASES[0]}"), (int, float)):
            laid.append({"step": n, "phase": PHASES[0], "start": start, "end": cursor})
        out.extend(reversed(laid))
        out.append({"step": n, "phase": "step", "start": start, "end": end})
    return out


def label_samples(samples: list[tuple[float, list[float]]], intervals: list[dict[str, Any]],
                  launch_t: float) -> list[dict[str, Any]]:
    """Timeline rows: t, used GiB (the most loaded GPU), phase and step.

    Phase ``idle`` before the launch, ``init`` from the launch to the first step, the verl phase inside a
    step (``other`` in its untimed gaps), ``shutdown`` after the last step.
    """
    steps = [iv for iv in intervals if iv["phase"] == "step"]
    inner = [iv for iv in intervals if iv["phase"] != "step"]
    first = min((iv["start"] for iv in steps), default=math.inf)
    last = max((iv["end"] for iv in steps), default=math.inf)
    rows = []
    for t, used in samples:
        phase, step = "other", None
        if t < launch_t:
            phase = "idle"
        elif t < first:
            phase = "init"
        elif t > last:
            phase = "shutdown"
        else:
            for iv in steps:
                if iv["start"] <= t <= iv["end"]:
                    step = iv["step"]
            for iv in inner:
                if iv["start"] <= t <= iv["end"]:
                    phase, step = iv["phase"], iv["step"]
                    break
        rows.append({"t": round(t, 3), "used_gib": max(used) if used else None, "phase": phase, "step": step})
    return rows


def phase_peaks(timeline: list[dict[str, Any]], baseline_gib: float) -> dict[str, dict[str, Any]]:
    """Per phase: peak device GiB (all processes), the same minus the idle baseline, sample count, and the
    peak per step. A phase shorter than the sampling period may have no sample (then it is absent)."""
    out: dict[str, dict[str, Any]] = {}
    for row in timeline:
        if row["used_gib"] is None:
            continue
        entry = out.setdefault(row["phase"], {"peak_used_gib": -math.inf, "samples": 0, "by_step": {}})
        entry["samples"] += 1
        entry["peak_used_gib"] = max(entry["peak_used_gib"], row["used_gib"])
        if row["step"] is not None:
            key = str(row["step"])
            entry["by_step"][key] = max(entry["by_step"].get(key, -math.inf), row["used_gib"])
    for entry in out.values():
        entry["peak_job_gib"] = entry["peak_used_gib"] - baseline_gib
    return out


def process_peaks(process_samples: list[tuple[float, list[list]]], intervals: list[dict[str, Any]],
                  launch_t: float) -> dict[str, dict[str, float]]:
    """Per phase, the peak GiB each process held (``"<title> [pid]"``), from per-process samples
    (:func:`rlkit.measure.samplers.gpu_process_memory_reader`) on the device sampler's clock."""
    rows = label_samples([(t, [0.0]) for t, _ in process_samples], intervals, launch_t)
    out: dict[str, dict[str, float]] = {}
    for row, (_, held) in zip(rows, process_samples):
        entry = out.setdefault(row["phase"], {})
        for pid, gib, name in held:
            key = f"{name or 'process'} [{pid}]"
            entry[key] = max(entry.get(key, 0.0), gib)
    return out
