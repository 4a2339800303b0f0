"""The host side of a torch.profiler Chrome trace: its events by category, and the host stack each event was
launched under (the operators and annotations open on its thread at that moment).

The trace's vocabulary (Kineto, torch 2.11-2.13): every event has ``ph`` ("X" = a complete event with ``ts`` and
``dur`` in microseconds), ``cat``, ``name``, ``pid``, ``tid``. Device work is ``cat`` ``kernel``, ``gpu_memcpy``
(named ``Memcpy DtoH (Device -> Pinned)`` etc., ``args.bytes``) and ``gpu_memset``; the host side is ``cpu_op``
(aten operators, autograd nodes, custom autograd Functions by class name), ``user_annotation``
(``torch.profiler.record_function`` ranges), and ``cuda_runtime`` / ``cuda_driver`` calls (``cudaLaunchKernel``,
``cudaMemcpyAsync``, ``cudaStreamSynchronize``, ...). A device event and the runtime call that launched it share
``args.correlation``; the host events of one thread nest by time, so every kernel has a host *stack*: the operators
and annotations that were open on the launching thread when it was launched. No torch import
(:mod:`rlkit.measure.trace_summary` reads committed traces anywhere).
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CALL_CATS = ("cuda_runtime", "cuda_driver")
HOST_CATS = ("cpu_op", "user_annotation", *CALL_CATS)  # the nesting that makes a stack
EPS_US = 1e-6


def complete(events: Iterable[Mapping[str, Any]], cats: tuple[str, ...]) -> list[Mapping[str, Any]]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in cats and "dur" in e]


def event_end(e: Mapping[str, Any]) -> float:
    return float(e["ts"]) + float(e["dur"])


class Thread:
    """The host events of one thread nested by time: each event's parent (the innermost event enclosing it)."""

    def __init__(self, events: list[Mapping[str, Any]]) -> None:
        self.events = sorted(events, key=lambda e: (float(e["ts"]), -float(e["dur"])))
        self.starts = [float(e["ts"]) for e in self.events]
        self.parent = [-1] * len(self.events)
        self.has_child = [False] * len(self.events)
        stack: list[int] = []
        for i, e in enumerate(self.events):
            start = float(e["ts"])
            while stack and event_end(self.events[stack[-1]]) <= start + EPS_US:
                stack.pop()
            if stack:
                self.parent[i] = stack[-1]
                self.has_child[stack[-1]] = True
            stack.append(i)

    def innermost(self, t: float) -> int:
        """Index of the innermost event open at time ``t`` (-1: none)."""
        i = bisect.bisect_right(self.starts, t) - 1
        while i >= 0 and event_end(self.events[i]) < t:
            i = self.parent[i]
        return i

    def chain(self, i: int) -> list[Mapping[str, Any]]:
        """Event ``i`` and its ancestors, innermost first."""
        out = []
        while i >= 0:
            out.append(self.events[i])
            i = self.parent[i]
        return out


def chain_names(chain: list[Mapping[str, Any]], cat: str | None = None) -> list[str]:
    return [e["name"] for e in chain if cat is None or e.get("cat") == cat]


def host_threads(events: list[Mapping[str, Any]]) -> dict[Any, Thread]:
    """The host events of each (pid, tid), nested by time."""
    by_tid: dict[Any, list] = defaultdict(list)
    for e in complete(events, HOST_CATS):
        by_tid[(e.get("pid"), e.get("tid"))].append(e)
    return {tid: Thread(evs) for tid, evs in by_tid.items()}


def host_chain(threads: dict[Any, Thread], e: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The host stack open at ``e``'s start on ``e``'s thread (``e`` itself excluded)."""
    thread = threads.get((e.get("pid"), e.get("tid")))
    if thread is None:
        return []
    chain = thread.chain(thread.innermost(float(e["ts"]) + EPS_US))
    return [c for c in chain if c is not e]
