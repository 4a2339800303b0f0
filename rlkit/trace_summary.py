"""What a torch.profiler Chrome trace says about one update: top kernels, GPU idle gaps, host-device syncs.

A plain function over the trace's events (the ``traceEvents`` list of ``prof.export_chrome_trace``), no torch
import, so a committed ``trace.json.gz`` can be analysed again anywhere (:func:`load_events`, :func:`summarize`).

The trace's vocabulary (Kineto, torch 2.11-2.13): every event has ``ph`` ("X" = a complete event with ``ts`` and
``dur`` in microseconds), ``cat``, ``name``, ``pid``, ``tid``. Device work is ``cat`` ``kernel``, ``gpu_memcpy``
(named ``Memcpy DtoH (Device -> Pinned)`` etc., ``args.bytes``) and ``gpu_memset``; the host side is ``cpu_op``
(aten operators, autograd nodes, custom autograd Functions by class name), ``user_annotation``
(``torch.profiler.record_function`` ranges), and ``cuda_runtime`` / ``cuda_driver`` calls (``cudaLaunchKernel``,
``cudaMemcpyAsync``, ``cudaStreamSynchronize``, ...). A device event and the runtime call that launched it share
``args.correlation``; the host events of one thread nest by time, so every kernel has a host *stack*: the operators
and annotations that were open on the launching thread when it was launched.

- **Timeline.** The device events (``timeline`` ``gpu_kernels``). A trace without any (a CPU run) uses the
  ``cpu_op`` events instead (``cpu_ops_self_time``: each operator counts its self time, its duration less the
  events inside it, as the CPU's "kernel"; busy is the time inside any operator), so the same analysis runs in a
  CPU test.
- **Window.** The ``user_annotation`` named ``window`` (the experiment wraps the update in one, with a device
  synchronize inside it, so its device work ends inside it), else the extent of the timeline events.
- **Busy / idle.** Busy: the union of the timeline events' intervals inside the window (kernels on several streams
  that overlap count once); idle = window - busy, and the gaps between busy intervals (the leading and trailing
  ones included), each with the event before and after it, the innermost host events open at its middle (the
  window's thread first, up to three threads: what the host was doing, a sync, a launch, an operator's Python-side
  work) and the outermost annotation inside the window (which micro-batch or phase); ``by_region`` adds the gaps
  up per phase (``micro_batch*``, ``optimizer_step``, ``(none)``: between them).
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
- **Host syncs.** Runtime/driver calls that block the host until the device catches up (:data:`SYNC_CALLS`),
  synchronous ``cudaMemcpy``, and device-to-host copies (``DtoH`` device events: a copy to pageable memory blocks
  the host, and a copy whose value the host reads is followed by a sync), with where they came from: the innermost
  operators on the calling thread (``aten::item > aten::_local_scalar_dense``) and the outermost annotation inside
  the window.
"""
from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CALL_CATS = ("cuda_runtime", "cuda_driver")
HOST_CATS = ("cpu_op", "user_annotation", *CALL_CATS)  # the nesting that makes a stack
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
              "cuCtxSynchronize", "cuEventSynchronize")
BLOCKING_COPIES = ("cudaMemcpy", "cudaMemcpy2D", "cuMemcpyDtoH", "cuMemcpyDtoH_v2")  # synchronous by contract
# Host-stack markers of a category (substring match on operator / annotation names). ChunkedLinearLogProbs: the
# autograd Function of rlkit.patches.chunked_logprobs (its forward is a cpu_op of that name, its backward
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
GAP_BUCKETS_US = ((0.0, 10.0, "<10us"), (10.0, 100.0, "10-100us"), (100.0, 1000.0, "0.1-1ms"),
                  (1000.0, 10000.0, "1-10ms"), (10000.0, float("inf"), ">=10ms"))
EPS_US = 1e-6


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


def _complete(events: Iterable[Mapping[str, Any]], cats: tuple[str, ...]) -> list[Mapping[str, Any]]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in cats and "dur" in e]


def _end(e: Mapping[str, Any]) -> float:
    return float(e["ts"]) + float(e["dur"])


class _Thread:
    """The host events of one thread nested by time: each event's parent (the innermost event enclosing it)."""

    def __init__(self, events: list[Mapping[str, Any]]) -> None:
        self.events = sorted(events, key=lambda e: (float(e["ts"]), -float(e["dur"])))
        self.starts = [float(e["ts"]) for e in self.events]
        self.parent = [-1] * len(self.events)
        self.has_child = [False] * len(self.events)
        stack: list[int] = []
        for i, e in enumerate(self.events):
            start = float(e["ts"])
            while stack and _end(self.events[stack[-1]]) <= start + EPS_US:
                stack.pop()
            if stack:
                self.parent[i] = stack[-1]
                self.has_child[stack[-1]] = True
            stack.append(i)

    def innermost(self, t: float) -> int:
        """Index of the innermost event open at time ``t`` (-1: none)."""
        i = bisect.bisect_right(self.starts, t) - 1
        while i >= 0 and _end(self.events[i]) < t:
            i = self.parent[i]
        return i

    def chain(self, i: int) -> list[Mapping[str, Any]]:
        """Event ``i`` and its ancestors, innermost first."""
        out = []
        while i >= 0:
            out.append(self.events[i])
            i = self.parent[i]
        return out


def _names(chain: list[Mapping[str, Any]], cat: str | None = None) -> list[str]:
    return [e["name"] for e in chain if cat is None or e.get("cat") == cat]


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
    names = _names(chain)
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
        marks = [e for e in _complete(events, ("user_annotation",)) if e["name"] == name]
        if marks:
            mark = max(marks, key=lambda e: float(e["dur"]))
            return float(mark["ts"]), _end(mark), mark
    if not timeline:
        return 0.0, 0.0, None
    return min(float(e["ts"]) for e in timeline), max(_end(e) for e in timeline), None


def _region(chain: list[Mapping[str, Any]], window_name: str | None) -> str | None:
    """The outermost annotation of a host chain inside the window (``micro_batch3``, ``optimizer_step``)."""
    names = [e["name"] for e in chain if e.get("cat") == "user_annotation"]
    if window_name in names:
        names = names[:names.index(window_name)]
    return names[-1] if names else None


def _ops(chain: list[Mapping[str, Any]], depth: int = 2) -> str | None:
    """The innermost ``depth`` operators of a chain, outer first: ``aten::item > aten::_local_scalar_dense``."""
    ops = _names(chain, "cpu_op")[:depth]
    return " > ".join(reversed(ops)) if ops else None


def _generic(region: str | None) -> str | None:
    """``micro_batch3`` -> ``micro_batch*``: sources are grouped over the repeated phases."""
    return re.sub(r"\d+$", "*", region) if region else None


def summarize(events: list[Mapping[str, Any]], *, window: str | None = "rlkit_update", top_kernels: int = 15,
              top_gaps: int = 10, markers: Mapping[str, tuple[str, ...]] = REGION_MARKERS) -> dict[str, Any]:
    """The summary of the module docstring for the trace ``events`` (times in ms unless a key says otherwise)."""
    host = _complete(events, HOST_CATS)
    by_tid: dict[Any, list] = defaultdict(list)
    for e in host:
        by_tid[(e.get("pid"), e.get("tid"))].append(e)
    threads = {tid: _Thread(evs) for tid, evs in by_tid.items()}

    device = _complete(events, DEVICE_CATS)
    timeline_kind = "gpu_kernels" if device else "cpu_ops_self_time"
    calls = _complete(events, CALL_CATS)
    launch_by_corr = {}
    for c in calls:
        corr = (c.get("args") or {}).get("correlation")
        if corr is not None:
            launch_by_corr[corr] = c

    def host_chain(e) -> list[Mapping[str, Any]]:
        """The host stack open at ``e``'s start on ``e``'s thread (``e`` itself excluded)."""
        thread = threads.get((e.get("pid"), e.get("tid")))
        if thread is None:
            return []
        i = thread.innermost(float(e["ts"]) + EPS_US)
        chain = thread.chain(i)
        return [c for c in chain if c is not e]

    # the timeline: (event, host stack names, time it counts: the device duration, or a CPU operator's self time,
    # the pass that launched it)
    timeline: list[tuple[Mapping[str, Any], list[str], float, str]] = []
    if device:
        for e in device:
            launch = launch_by_corr.get((e.get("args") or {}).get("correlation"))
            chain = host_chain(launch) if launch is not None else []
            timeline.append((e, _names(chain), float(e["dur"]), pass_of(chain, markers)))
    else:
        for thread in threads.values():
            nested = [0.0] * len(thread.events)  # time of the events directly inside each one
            for j, p in enumerate(thread.parent):
                if p >= 0:
                    nested[p] += min(_end(thread.events[j]), _end(thread.events[p])) - float(thread.events[j]["ts"])
            for i, e in enumerate(thread.events):
                if e.get("cat") == "cpu_op":
                    own = max(float(e["dur"]) - nested[i], 0.0)
                    chain = thread.chain(thread.parent[i])
                    timeline.append((e, _names(chain), own, pass_of([e, *chain], markers)))

    start, end, mark = _window(events, window, [e for e, *_ in timeline])
    span = max(end - start, 0.0)
    inside = [row for row in timeline if _end(row[0]) > start and float(row[0]["ts"]) < end]

    # kernels by name and category (device durations clipped to the window)
    per_name: dict[str, dict[str, Any]] = {}
    categories = {c: {"ms": 0.0, "count": 0} for c in CATEGORIES}
    total_us = 0.0
    intervals = []
    seen: dict[tuple, str] = {}  # classify's answers (stacks repeat: every layer, every micro-batch)
    passes = {p: {"ms": 0.0, "count": 0, "ms_by_category": Counter()} for p in PASSES}
    for e, stack, counted, pass_name in inside:
        a, b = max(float(e["ts"]), start), min(_end(e), end)
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
        categories[category]["ms"] += dur / 1000
        categories[category]["count"] += 1
        passes[pass_name]["ms"] += dur / 1000
        passes[pass_name]["count"] += 1
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

    # busy intervals and the gaps between them
    busy = _union(intervals)
    busy_us = sum(b - a for a, b in busy)
    gaps = []
    cursor = start
    for a, b in busy + [(end, end)]:
        if a - cursor > EPS_US:
            gaps.append((cursor, a))
        cursor = max(cursor, b)
    by_start = sorted((max(float(e["ts"]), start), e["name"]) for e, *_ in inside)
    by_end = sorted((min(_end(e), end), e["name"]) for e, *_ in inside)
    start_keys, end_keys = [t for t, _ in by_start], [t for t, _ in by_end]
    main_key = (mark.get("pid"), mark.get("tid")) if mark is not None else None
    if main_key not in threads and threads:
        main_key = max(threads, key=lambda k: len(threads[k].events))
    order = ([main_key] if main_key in threads else []) + [k for k in threads if k != main_key]

    def describe(gap):
        a, b = gap
        i = bisect.bisect_right(end_keys, a + EPS_US) - 1
        j = bisect.bisect_left(start_keys, b - EPS_US)
        mid = 0.5 * (a + b)
        host_now, region = [], None
        for key in order:  # the window's thread first
            chain = threads[key].chain(threads[key].innermost(mid))
            if chain and not (len(chain) == 1 and chain[0] is mark):
                host_now.append(chain[0]["name"])
                region = region or _region(chain, window)
        return {"start_ms": (a - start) / 1000, "ms": (b - a) / 1000, "before": by_end[i][1] if i >= 0 else None,
                "after": by_start[j][1] if j < len(by_start) else None, "host": host_now[:3], "region": region}

    idle_us = max(span - busy_us, 0.0)
    histogram = {label: {"count": 0, "ms": 0.0} for _, _, label in GAP_BUCKETS_US}
    for a, b in gaps:
        length = b - a
        for lo, hi, label in GAP_BUCKETS_US:
            if lo <= length < hi:
                histogram[label]["count"] += 1
                histogram[label]["ms"] += length / 1000
                break
    largest = sorted(gaps, key=lambda g: g[0] - g[1])[:top_gaps]
    by_region: dict[str, dict[str, Any]] = {}
    for a, b in gaps:  # which phase each gap falls in, on the window's thread
        chain = threads[main_key].chain(threads[main_key].innermost(0.5 * (a + b))) if main_key in threads else []
        row = by_region.setdefault(_generic(_region(chain, window)) or "(none)", {"count": 0, "ms": 0.0})
        row["count"] += 1
        row["ms"] += (b - a) / 1000

    return {
        "timeline": timeline_kind,
        "window": {"name": mark["name"] if mark is not None else None, "ms": span / 1000},
        "device": {"events": len(inside), "kernel_time_ms": total_us / 1000, "busy_ms": busy_us / 1000,
                   "idle_ms": idle_us / 1000, "busy_fraction": busy_us / span if span else 0.0,
                   "idle_fraction": idle_us / span if span else 0.0},
        "top_kernels": top,
        "top_kernels_share": sum(r["share"] for r in top),
        "kernel_names": len(per_name),
        "categories": categories,
        "passes": passes,
        "idle_gaps": {"count": len(gaps), "total_ms": sum(b - a for a, b in gaps) / 1000, "histogram": histogram,
                      "by_region": dict(sorted(by_region.items(), key=lambda kv: -kv[1]["ms"])),
                      "largest": [describe(g) for g in largest]},
        "host_syncs": _syncs(calls, device, threads, start, end, window),
    }


def _syncs(calls, device, threads, start: float, end: float, window: str | None) -> dict[str, Any]:
    """Host-blocking calls (:data:`SYNC_CALLS`, :data:`BLOCKING_COPIES`) and device-to-host copy calls inside the
    window, and where they came from; ``count``/``ms`` are the blocking calls only (a ``.item()`` is one copy call
    and one sync: one sync)."""
    per_call: dict[str, dict[str, Any]] = {}
    sources: dict[str, dict[str, Any]] = {}
    copies_by_corr = {(e.get("args") or {}).get("correlation"): e for e in device if e.get("cat") == "gpu_memcpy"}
    blocking = {"count": 0, "ms": 0.0}
    for c in calls:
        if not (start <= float(c["ts"]) < end):
            continue
        name, ms = c["name"], float(c["dur"]) / 1000
        copy = copies_by_corr.get((c.get("args") or {}).get("correlation"))
        if name in SYNC_CALLS or name in BLOCKING_COPIES:
            kind = "sync" if name in SYNC_CALLS else "blocking_copy"
            blocking["count"] += 1
            blocking["ms"] += ms
        elif copy is not None and "DtoH" in copy["name"]:
            kind, name = "d2h_copy", f"{name} (DtoH)"
        else:
            continue
        row = per_call.setdefault(name, {"kind": kind, "count": 0, "ms": 0.0})
        row["count"] += 1
        row["ms"] += ms
        thread = threads.get((c.get("pid"), c.get("tid")))
        chain = thread.chain(thread.innermost(float(c["ts"]) + EPS_US)) if thread is not None else []
        key = _ops(chain) or "(no operator)"
        src = sources.setdefault(key, {"op": key, "count": 0, "ms": 0.0, "kinds": Counter(), "regions": Counter()})
        src["count"] += 1
        src["ms"] += ms
        src["kinds"][kind] += 1
        src["regions"][_generic(_region(chain, window)) or "(none)"] += 1
    kinds: dict[str, dict[str, Any]] = {}
    for e in device:
        if e.get("cat") != "gpu_memcpy" or not (start <= float(e["ts"]) < end):
            continue
        kind = next((k for k in ("DtoH", "HtoD", "DtoD", "HtoH", "PtoP") if k in e["name"]), "other")
        row = kinds.setdefault(kind, {"count": 0, "ms": 0.0, "bytes": 0})
        row["count"] += 1
        row["ms"] += float(e["dur"]) / 1000
        row["bytes"] += int((e.get("args") or {}).get("bytes", 0) or 0)
    ranked = sorted(sources.values(), key=lambda r: (-r["count"], -r["ms"]))
    return {
        **blocking,
        "calls": per_call,
        "copies": kinds,
        "d2h_copies": kinds.get("DtoH", {"count": 0, "ms": 0.0, "bytes": 0}),
        "by_source": [{**r, "kinds": dict(r["kinds"]), "regions": dict(r["regions"])} for r in ranked[:10]],
    }


# --------------------------------------------------------------------------------------- the exported file
def annotation_extent(events: list[Mapping[str, Any]], name: str) -> tuple[float, float] | None:
    """The time range of the annotation ``name``: its host range joined with its device range
    (``gpu_user_annotation``, where the device ran the kernels launched inside it); None when absent."""
    marks = [e for e in events if e.get("ph") == "X" and e.get("name") == name
             and e.get("cat") in ("user_annotation", "gpu_user_annotation")]
    if not marks:
        return None
    return min(float(e["ts"]) for e in marks), max(_end(e) for e in marks)


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
