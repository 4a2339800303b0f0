"""Instrument (not an optimization): torch's peak allocated and reserved memory of the actor's old_log_prob pass
alone, reported in the same step's verl metrics.

Why: verl reports ``actor/perf/max_memory_allocated_gb`` / ``max_memory_reserved_gb``, read after each update
mini-batch, and torch's peak counters are never reset in verl 0.9.1's training path, so they are the actor process's
peaks since it started. Which part of them old_log_prob reached is not recorded anywhere (lab notes, "old_log_prob's
rest named (session 29)").

How (verl 0.9.1, ``verl/workers/engine_workers.py``): wraps ``ActorRolloutRefWorker.compute_log_prob``, the actor's
old-log-prob call that the V1 trainer's ``_compute_old_log_prob`` makes once per step (the reference model's
``compute_ref_log_prob`` is not wrapped). At its entry the wrapper reads ``torch.cuda.memory_allocated()`` and
``memory_reserved()``, keeps the process's peaks so far, and calls ``torch.cuda.reset_peak_memory_stats()``; at its exit
it reads ``max_memory_allocated()`` and ``max_memory_reserved()``: the peaks of the whole call (verl's ``eval_mode``
loading offloaded parameters, every forward micro-batch, and the offload on exit). It then wraps
``ActorRolloutRefWorker.update_actor``, whose metrics the trainer logs as ``actor/<key>``, and adds :data:`KEYS`
(so verl.log shows ``actor/rlkit/old_log_prob/max_allocated_gib`` and the others; "max" keys are reduced by max over
ranks and mini-batches, the others by mean, as verl's ``reduce_metrics`` does by name).

verl's own peak metrics keep their meaning. The reset would otherwise make verl's ``perf/max_memory_*_gb`` the peaks
since this step's old_log_prob, where committed analyses (notebook 06's ``actor_peak_allocated_gib`` row, "process
peak since start", its update breakdown, the reruns table's "actor peak alloc.") read them as the process's peaks
since start. So the wrapper folds the peaks it saw before each reset back into them: each value becomes
``max(value, peak before the last reset)``, which is exactly torch's unreset peak since start (the peak over a
time span is the larger of the peaks of its two parts; dividing by 1024**3 keeps the order). Nothing in the
computation changes: the instrument reads allocator counters and resets two of them.

Without CUDA (:func:`cuda_stats` gives None) both wrappers call verl's method and return its result untouched. Tests
inject a provider of :class:`MemoryStats` through :data:`STATS_PROVIDER`. Not yet run on a GPU.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

from rlkit.patches import Patch, replace_attrs, supported

ENV = "RLKIT_OLD_LOG_PROB_MEMORY"
PREFIX = "rlkit/old_log_prob/"
# The worker-side keys; the trainer prefixes them with "actor/".
KEYS = (f"{PREFIX}max_allocated_gib", f"{PREFIX}max_reserved_gib", f"{PREFIX}allocated_at_entry_gib",
        f"{PREFIX}reserved_at_entry_gib")
LOGGED_KEYS = tuple(f"actor/{k}" for k in KEYS)  # as they land in verl's metrics / verl.log
# verl's peak metrics (worker side) -> which saved peak restores their meaning after a reset.
VERL_PEAK_KEYS = {"perf/max_memory_allocated_gb": "allocated", "perf/max_memory_reserved_gb": "reserved"}
GIB = 1024**3
_STATE_ATTR = "_rlkit_old_log_prob_memory"


def requested(environ) -> bool:
    """Whether this run asked for the instrument (``RLKIT_OLD_LOG_PROB_MEMORY=1``)."""
    return environ.get(ENV, "").strip() in ("1", "true", "True")


class MemoryStats(Protocol):
    """The allocator counters the instrument reads, in bytes."""

    def allocated(self) -> int: ...
    def reserved(self) -> int: ...
    def max_allocated(self) -> int: ...
    def max_reserved(self) -> int: ...
    def reset_peak(self) -> None: ...


class CudaStats:
    """:class:`MemoryStats` of torch's CUDA caching allocator on the current device."""

    def __init__(self, torch_cuda):
        self.cuda = torch_cuda

    def allocated(self) -> int:
        return self.cuda.memory_allocated()

    def reserved(self) -> int:
        return self.cuda.memory_reserved()

    def max_allocated(self) -> int:
        return self.cuda.max_memory_allocated()

    def max_reserved(self) -> int:
        return self.cuda.max_memory_reserved()

    def reset_peak(self) -> None:
        self.cuda.reset_peak_memory_stats()


def cuda_stats() -> CudaStats | None:
    """The CUDA allocator's counters, or None where there is no CUDA device (the instrument is then a no-op)."""
    import torch

    return CudaStats(torch.cuda) if torch.cuda.is_available() else None


STATS_PROVIDER = cuda_stats  # tests replace it with a provider of fake counters


@dataclass
class Window:
    """One process's state: the peaks seen before the latest reset (bytes) and the last pass's record (GiB)."""

    stats: MemoryStats
    allocated_before_reset: int = 0
    reserved_before_reset: int = 0
    last: dict[str, float] | None = None

    def enter(self) -> tuple[int, int]:
        """Read the entry counters, keep the peaks so far, reset the peaks; returns (allocated, reserved) at entry."""
        entry = (self.stats.allocated(), self.stats.reserved())
        self.allocated_before_reset = max(self.allocated_before_reset, self.stats.max_allocated())
        self.reserved_before_reset = max(self.reserved_before_reset, self.stats.max_reserved())
        self.stats.reset_peak()
        return entry

    def exit(self, entry: tuple[int, int]) -> None:
        """Record the pass's peaks since :meth:`enter` and the entry counters, in GiB."""
        self.last = dict(zip(KEYS, (self.stats.max_allocated() / GIB, self.stats.max_reserved() / GIB,
                                    entry[0] / GIB, entry[1] / GIB)))

    def fold(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """``metrics`` (an update's, worker side) with verl's peaks restored to "since start" and the last pass's
        record added (then cleared, so a step without the pass reports none)."""
        saved = {"allocated": self.allocated_before_reset / GIB, "reserved": self.reserved_before_reset / GIB}
        out = dict(metrics)
        for key, which in VERL_PEAK_KEYS.items():
            if key in out:
                value = out[key]
                out[key] = [max(v, saved[which]) for v in value] if isinstance(value, list) else max(value, saved[which])
        if self.last is not None:
            out.update(self.last)
            self.last = None
        return out


def _window(worker, create: bool) -> Window | None:
    """The worker's :class:`Window`; None without CUDA (or, with ``create`` false, before any pass)."""
    window = getattr(worker, _STATE_ATTR, None)
    if window is None and create:
        stats = STATS_PROVIDER()
        if stats is not None:
            window = Window(stats)
            setattr(worker, _STATE_ATTR, window)
    return window


def _with_folded_metrics(output, window: Window):
    """verl's update output (a TensorDict with a ``metrics`` dict), folded; as it is where it has no metrics (None, or
    the empty TensorDict verl's TransferQueue bridge returns on a rank that does not collect)."""
    if output is None:
        return output
    from verl.utils import tensordict_utils as tu

    metrics = tu.get(output, "metrics")
    if isinstance(metrics, dict):
        tu.assign_non_tensor(output, metrics=window.fold(metrics))
    return output


def _apply():
    from verl.workers import engine_workers

    cls = engine_workers.ActorRolloutRefWorker
    compute_log_prob, update_actor = cls.__dict__["compute_log_prob"], cls.__dict__["update_actor"]

    # functools.wraps copies verl's @register attributes (dispatch mode), which the worker group reads.
    @functools.wraps(compute_log_prob)
    def measured_compute_log_prob(self, *args, **kwargs):
        window = _window(self, create=True)
        if window is None:
            return compute_log_prob(self, *args, **kwargs)
        entry = window.enter()
        try:
            return compute_log_prob(self, *args, **kwargs)
        finally:
            window.exit(entry)

    @functools.wraps(update_actor)
    def reporting_update_actor(self, *args, **kwargs):
        output = update_actor(self, *args, **kwargs)
        window = _window(self, create=False)
        return output if window is None else _with_folded_metrics(output, window)

    measured_compute_log_prob.__rlkit_patch__ = reporting_update_actor.__rlkit_patch__ = "old_log_prob_memory"
    return replace_attrs((cls, "compute_log_prob", measured_compute_log_prob),
                         (cls, "update_actor", reporting_update_actor))


PATCH = Patch(
    name="old_log_prob_memory",
    summary="record torch's peak allocated/reserved memory of the actor's old_log_prob pass in the step's metrics "
            "(read-only; verl's own peak metrics keep their since-start meaning)",
    requires=supported("verl", "torch"),
    apply_fn=_apply,
    targets=("verl.workers.engine_workers",),
)


def peaks_from_steps(steps: list[dict[str, Any]]) -> dict[str, float] | None:
    """The largest of each logged key (:data:`LOGGED_KEYS`, without their prefixes) over ``steps`` (verl's per-step
    metrics); None when no step has them (every run before the instrument)."""
    out = {}
    for logged in LOGGED_KEYS:
        values = [s[logged] for s in steps if isinstance(s.get(logged), (int, float))]
        if values:
            out[logged.rsplit("/", 1)[-1]] = max(values)
    return out or None
