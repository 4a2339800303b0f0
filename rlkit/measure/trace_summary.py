"""What a torch.profiler Chrome trace says about one update: top kernels, GPU idle gaps, host-device syncs.

A plain function over the trace's events (the ``traceEvents`` list of ``prof.export_chrome_trace``), no torch
import, so a committed ``trace.json.gz`` can be analysed again anywhere (:func:`load_events`, :func:`summarize`).

The trace's vocabulary and each event's host stack: :mod:`rlkit.measure.trace_stacks`.

- **Timeline.** The device events (``timeline`` ``gpu_kernels``). A trace without any (a CPU run) uses the
  ``cpu_op`` events instead (``cpu_ops_self_time``: each operator counts its self time, its duration less the
  events inside it, as the CPU's "kernel"; busy is the time inside any operator), so the same analysis runs in a
  CPU test.
- **Window.** The ``user_annotation`` named ``window`` (the experiment wraps the update in one, with a device
  synchronize inside it, so its device work ends inside it), else the extent of the timeline events.
- **Busy / idle.** Busy: the union of the timeline events' intervals inside the window (kernels on several streams
  that overlap count once); idle = window - busy. The idle gaps between the busy intervals, and where each falls:
  :mod:`rlkit.measure.trace_waits`.
- **Kernels.** Grouped by name: count, total time, share of the timeline's summed durations (``kernel_time_ms``;
  shares sum to 1 over all names), its time per category and the category with the most of it. Categories: ``memcpy_memset``; ``chunked_logprob`` and ``optimizer`` by a
  marker on the host stack (:data:`REGION_MARKERS`); ``attention`` by the kernel name or a stack entry
  (flash / fmha / attention / attn: the varlen kernel, SDPA, rlkit's annotated attention call); ``gemm`` and
  ``elementwise`` by name (:data:`GEMM`, :data:`ELEMENTWISE`); else ``other`` (reductions, norms, softmax, copies
  of other shapes). Categories are tested in that order.
- **Passes.** The same kernel time by the pass of the update that launched it (``passes``, each with its time per
  category): ``optimizer`` (an optimizer marker on the stack), ``backward`` (an autograd engine node on the stack,
  ``autograd::engine::evaluate_function: ...``), ``recompute`` (inside such a node, an operator nested in the node's
  own operator records an autograd ``Sequence number``: the profiler records one for operators run with grad mode
  on, which the backward runs with off and a checkpoint's recompute turns back on to rebuild its layer's graph),
  else ``forward``. A CPU trace's operator counts itself in that test, its self time being the kernel.
- **Host syncs.** Calls that block the host until the device catches up, and device-to-host copies, with where
  they came from: :mod:`rlkit.measure.trace_waits`.
"""
from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rlkit.measure.trace_stacks import (
    CALL_CATS,
    DEVICE_CATS,
    chain_names,
    complete,
    event_end,
    host_chain,
    host_threads,
)
from rlkit.measure.trace_waits import host_syncs, idle_gaps

# Host-stack markers of a category (substring match on operator / annotation names). ChunkedLinearLogProbs: the
# autograd Function of rlkit.patches.kernels.chunked_logprobs (its forward is a cpu_op of that name, its backward
# "autograd::engine::evaluate_function: _ChunkedLinearLogProbsBackward").
REGION_MARKERS: dict[str, tuple[str, ...]] = {
    "chunked_logprob": ("ChunkedLinearLogProbs", "rlkit_chunked_logprobs"),
    "optimizer": ("optimizer_step", "Optimizer.step"),
}
ATTENTION = re.compile(r"flash|fmha|attention|attn", re.IGNORECASE)
# cuBLAS / cuBLASLt / CUTLASS GEMM kernels (Hopper: nvjet_*, sm90_xmma_*, cutlass3x_*), and the CPU's GEMM operators.
GEMM = re.compile(r"gemm|xmma|cutlass|nvjet|cublas|wgmma|splitKreduce|^aten::(?:mm|addmm|bmm|baddbmm|addbmm|"
                  r"_addmm_activation|addmv|mv|dot)$", re.IGNORECASE)
# Inductor's generated Triton kernels say their kind: triton_poi_* pointwise, triton_red_* / triton_per_* reductions
# (a fused norm is one of those: "other", with the reductions).
ELEMENTWISE = re.compile(r"elementwise|vectorized|foreach|multi_tensor_apply|^triton_poi_|^aten::(?:add|sub|mul|div|neg|exp|log|"
                         r"silu|sigmoid|pow|rsqrt|sqrt|copy|_to_copy|fill|zero|clamp|where|masked_fill|lerp|addcmul|"
                         r"addcdiv|sign|abs|reciprocal|maximum|minimum)_?$", re.IGNORECASE)
CATEGORIES = ("attention", "gemm", "chunked_logprob", "elementwise", "optimizer", "memcpy_memset", "other")
PASSES = ("forward", "recompute", "backward", "optimizer")
AUTOGRAD_NODE = "autograd::engine::evaluate_function"


def load_doc(path: str | Path) -> dict[str, Any]:
    """A Chrome trace file (``.json`` or ``.json.gz``) as its document (a bare event list becomes ``traceEvents``)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The ``traceEvents`` of a Chrome trace file (``.json`` or ``.json.gz``)."""
    return load_doc(path)["traceEvents"]


def classify(name: str, cat: str, stack: Iterable[str], markers: Mapping[str, tuple[str, ...]] = REGION_MARKERS) -> str:
    """The category of one timeline event (module docstring, in this order)."""
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memcpy_memset"
    stack = list(stack)
    for category in ("chunked_logprob", "optimizer"):
        if any(m in s for s in stack for m in markers.get(category, ())):
            return category
    if ATTENTION.search(name) or any(ATTENTION.search(s) for s in stack):
        return "attention"
    if GEMM.search(name):
        return "gemm"
    if ELEMENTWISE.search(name):
        return "elementwise"
    return "other"


def pass_of(chain: list[Mapping[str, Any]], markers: Mapping[str, tuple[str, ...]] = REGION_MARKERS) -> str:
    """The pass (:data:`PASSES`) of an event launched under the host ``chain`` (innermost first; module docstring)."""
    names = chain_names(chain)
    if any(m in n for n in names for m in markers.get("optimizer", ())):
        return "optimizer"
    nodes = [i for i, n in enumerate(names) if n.startswith(AUTOGRAD_NODE)]
    if not nodes:
        return "forward"
    inside_node_op = chain[:max(nodes[0] - 1, 0)]  # below the engine's entry and the node's own operator
    if any("Sequence number" in (e.get("args") or {}) for e in inside_node_op if e.get("cat") == "cpu_op"):
        return "recompute"
    return "backward"


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _window(events, name: str | None, timeline) -> tuple[float, float, Mapping[str, Any] | None]:
    if name is not None:
        marks = [e for e in complete(events, ("user_annotation",)) if e["name"] == name]
        if marks:
            mark = max(marks, key=lambda e: float(e["dur"]))
            return float(mark["ts"]), event_end(mark), mark
    if not timeline:
        return 0.0, 0.0, None
    return min(float(e["ts"]) for e in timeline), max(event_end(e) for e in timeline), None


def summarize(events: list[Mapping[str, Any]], *, window: str | None = "rlkit_update", top_kernels: int = 15,
              top_gaps: int = 10, markers: Mapping[str, tuple[str, ...]] = REGION_MARKERS) -> dict[str, Any]:
    """The summary of the module docstring for the trace ``events`` (times in ms unless a key says otherwise)."""
    threads = host_threads(events)
    device = complete(events, DEVICE_CATS)
    calls = complete(events, CALL_CATS)
    timeline = _timeline(device, calls, threads, markers)
    start, end, mark = _window(events, window, [e for e, *_ in timeline])
    span = max(end - start, 0.0)
    inside = [row for row in timeline if event_end(row[0]) > start and float(row[0]["ts"]) < end]
    kernels = _kernel_time(inside, start, end, span, markers, top_kernels)
    busy = _union(kernels.pop("intervals"))
    busy_us = sum(b - a for a, b in busy)
    idle_us = max(span - busy_us, 0.0)
    total_us = kernels.pop("total_us")
    return {
        "timeline": "gpu_kernels" if device else "cpu_ops_self_time",
        "window": {"name": mark["name"] if mark is not None else None, "ms": span / 1000},
        "device": {"events": len(inside), "kernel_time_ms": total_us / 1000, "busy_ms": busy_us / 1000,
                   "idle_ms": idle_us / 1000, "busy_fraction": busy_us / span if span else 0.0,
                   "idle_fraction": idle_us / span if span else 0.0},
        **kernels,
        "idle_gaps": idle_gaps(busy, inside, threads, mark, window, start, end, top_gaps),
        "host_syncs": host_syncs(calls, device, threads, start, end, window),
    }


def _timeline(device, calls, threads, markers) -> list[tuple[Mapping[str, Any], list[str], float, str]]:
    """(event, host stack names, time it counts, the pass that launched it) for every device event, the device
    duration counting; without device events, for every CPU operator, its self time counting."""
    if device:
        launch_by_corr = {corr: c for c in calls if (corr := (c.get("args") or {}).get("correlation")) is not None}
        timeline = []
        for e in device:
            launch = launch_by_corr.get((e.get("args") or {}).get("correlation"))
            chain = host_chain(threads, launch) if launch is not None else []
            timeline.append((e, chain_names(chain), float(e["dur"]), pass_of(chain, markers)))
        return timeline
    timeline = []
    for thread in threads.values():
        nested = [0.0] * len(thread.events)  # time of the events directly inside each one
        for j, p in enumerate(thread.parent):
            if p >= 0:
                nested[p] += min(event_end(thread.events[j]), event_end(thread.events[p])) - float(thread.events[j]["ts"])
        for i, e in enumerate(thread.events):
            if e.get("cat") == "cpu_op":
                own = max(float(e["dur"]) - nested[i], 0.0)
                chain = thread.chain(thread.parent[i])
                timeline.append((e, chain_names(chain), own, pass_of([e, *chain], markers)))
    return timeline


def _kernel_time(inside, start: float, end: float, span: float, markers, top_kernels: int) -> dict[str, Any]:
    """Kernel time by name, category and pass (durations clipped to the window), with the busy intervals."""
    per_name: dict[str, dict[str, Any]] = {}
    categories = {c: {"ms": 0.0, "count": 0} for c in CATEGORIES}
    passes = {p: {"ms": 0.0, "count": 0, "ms_by_category": Counter()} for p in PASSES}
    total_us = 0.0
    intervals = []
    seen: dict[tuple, str] = {}  # classify's answers (stacks repeat: every layer, every micro-batch)
    for e, stack, counted, pass_name in inside:
        a, b = max(float(e["ts"]), start), min(event_end(e), end)
        dur = min(max(b - a, 0.0), counted)
        total_us += dur
        intervals.append((a, b))
        key = (e["name"], e.get("cat", ""), tuple(stack))
        category = seen.get(key)
        if category is None:
            category = seen[key] = classify(*key, markers)
        row = per_name.setdefault(e["name"], {"name": e["name"], "count": 0, "us": 0.0, "cats": Counter()})
        row["count"] += 1
        row["us"] += dur
        row["cats"][category] += dur
        for counted_in in (categories[category], passes[pass_name]):
            counted_in["ms"] += dur / 1000
            counted_in["count"] += 1
        passes[pass_name]["ms_by_category"][category] += dur / 1000
    ranked = sorted(per_name.values(), key=lambda r: -r["us"])
    # one kernel name can serve several categories (the same GEMM kernel in a layer and in the log-prob's chunks)
    top = [{"name": r["name"], "category": max(r["cats"], key=r["cats"].get), "count": r["count"],
            "total_ms": r["us"] / 1000, "mean_us": r["us"] / r["count"], "share": r["us"] / total_us if total_us else 0.0,
            "ms_by_category": {c: us / 1000 for c, us in sorted(r["cats"].items())}}
           for r in ranked[:top_kernels]]
    for row in categories.values():
        row["share"] = row["ms"] * 1000 / total_us if total_us else 0.0
        row["share_of_window"] = row["ms"] * 1000 / span if span else 0.0
    for row in passes.values():
        row["share"] = row["ms"] * 1000 / total_us if total_us else 0.0
        row["ms_by_category"] = {c: row["ms_by_category"][c] for c in CATEGORIES if row["ms_by_category"][c]}
    return {"top_kernels": top, "top_kernels_share": sum(r["share"] for r in top), "kernel_names": len(per_name),
            "categories": categories, "passes": passes, "total_us": total_us, "intervals": intervals}


# --------------------------------------------------------------------------------------- the exported file
def annotation_extent(events: list[Mapping[str, Any]], name: str) -> tuple[float, float] | None:
    """The time range of the annotation ``name``: its host range joined with its device range
    (``gpu_user_annotation``, where the device ran the kernels launched inside it); None when absent."""
    marks = [e for e in events if e.get("ph") == "X" and e.get("name") == name
             and e.get("cat") in ("user_annotation", "gpu_user_annotation")]
    if not marks:
        return None
    return min(float(e["ts"]) for e in marks), max(event_end(e) for e in marks)


def trimmed(doc: Mapping[str, Any], start: float, end: float) -> dict[str, Any]:
    """``doc`` (a Chrome trace) with only the events that overlap [start, end] (metadata events kept)."""
    def keep(e):
        if e.get("ph") == "M":
            return True
        ts = float(e.get("ts", start))
        return ts <= end and ts + float(e.get("dur", 0.0)) >= start
    return {**doc, "traceEvents": [e for e in doc["traceEvents"] if keep(e)]}


def gzip_json(doc: Any) -> bytes:
    return gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), compresslevel=6)


def write_capped(doc: Mapping[str, Any], path: str | Path, cap_bytes: int, *, fallback: str | None) -> dict[str, Any]:
    """Write ``doc`` gzipped to ``path`` if it fits in ``cap_bytes``; else only the part that overlaps the annotation
    ``fallback`` (:func:`annotation_extent`) if that fits; else nothing. Returns what was kept and the sizes."""
    path = Path(path)
    data = gzip_json(doc)
    info: dict[str, Any] = {"file": None, "bytes": 0, "kept": None, "events": len(doc["traceEvents"]),
                            "full_gz_bytes": len(data), "cap_bytes": cap_bytes}
    if len(data) <= cap_bytes:
        path.write_bytes(data)
        return {**info, "file": path.name, "bytes": len(data), "kept": "the whole trace"}
    extent = annotation_extent(doc["traceEvents"], fallback) if fallback else None
    if extent is not None:
        part = trimmed(doc, *extent)
        small = gzip_json(part)
        if len(small) <= cap_bytes:
            path.write_bytes(small)
            return {**info, "file": path.name, "bytes": len(small), "events_kept": len(part["traceEvents"]),
                    "kept": f"{fallback} only (the whole trace is {len(data) / 2**20:.1f} MiB gzipped, over the cap)"}
    return {**info, "kept": f"nothing: the trace is {len(data) / 2**20:.1f} MiB gzipped, over the cap"
                            + (f", and so is {fallback}'s part" if extent is not None else "")}
