"""Where the device waited in a torch.profiler Chrome trace's window: its idle gaps and the host's syncs, each with
where it came from (the parts ``idle_gaps`` and ``host_syncs`` of :func:`rlkit.measure.trace_summary.summarize`).

- **Idle gaps.** The gaps between the busy intervals of the timeline inside the window (the leading and trailing ones
  included), each with the event before and after it, the innermost host events open at its middle (the window's
  thread first, up to three threads: what the host was doing, a sync, a launch, an operator's Python-side work) and
  the outermost annotation inside the window (which micro-batch or phase); ``by_region`` adds the gaps up per phase
  (``micro_batch*``, ``optimizer_step``, ``(none)``: between them).
- **Host syncs.** Runtime/driver calls that block the host until the device catches up (:data:`SYNC_CALLS`),
  synchronous ``cudaMemcpy``, and device-to-host copies (``DtoH`` device events: a copy to pageable memory blocks
  the host, and a copy whose value the host reads is followed by a sync), with where they came from: the innermost
  operators on the calling thread (``aten::item > aten::_local_scalar_dense``) and the outermost annotation inside
  the window.

Host stacks are :mod:`rlkit.measure.trace_stacks`'s. No torch import.
"""
from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from rlkit.measure.trace_stacks import EPS_US, chain_names, event_end

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
              "cuCtxSynchronize", "cuEventSynchronize")
BLOCKING_COPIES = ("cudaMemcpy", "cudaMemcpy2D", "cuMemcpyDtoH", "cuMemcpyDtoH_v2")  # synchronous by contract
GAP_BUCKETS_US = ((0.0, 10.0, "<10us"), (10.0, 100.0, "10-100us"), (100.0, 1000.0, "0.1-1ms"),
                  (1000.0, 10000.0, "1-10ms"), (10000.0, float("inf"), ">=10ms"))


def _region(chain: list[Mapping[str, Any]], window_name: str | None) -> str | None:
    """The outermost annotation of a host chain inside the window (``micro_batch3``, ``optimizer_step``)."""
    names = [e["name"] for e in chain if e.get("cat") == "user_annotation"]
    if window_name in names:
        names = names[:names.index(window_name)]
    return names[-1] if names else None


def _ops(chain: list[Mapping[str, Any]], depth: int = 2) -> str | None:
    """The innermost ``depth`` operators of a chain, outer first: ``aten::item > aten::_local_scalar_dense``."""
    ops = chain_names(chain, "cpu_op")[:depth]
    return " > ".join(reversed(ops)) if ops else None


def _generic(region: str | None) -> str | None:
    """``micro_batch3`` -> ``micro_batch*``: sources are grouped over the repeated phases."""
    return re.sub(r"\d+$", "*", region) if region else None


def idle_gaps(busy, inside, threads, mark, window: str | None, start: float, end: float,
              top_gaps: int) -> dict[str, Any]:
    """The gaps between the busy intervals: a histogram, the time per region, the largest ones described."""
    gaps = []
    cursor = start
    for a, b in busy + [(end, end)]:
        if a - cursor > EPS_US:
            gaps.append((cursor, a))
        cursor = max(cursor, b)
    main_key = (mark.get("pid"), mark.get("tid")) if mark is not None else None
    if main_key not in threads and threads:
        main_key = max(threads, key=lambda k: len(threads[k].events))
    histogram = {label: {"count": 0, "ms": 0.0} for _, _, label in GAP_BUCKETS_US}
    for a, b in gaps:
        bucket = next((label for lo, hi, label in GAP_BUCKETS_US if lo <= b - a < hi), None)
        if bucket is not None:
            histogram[bucket]["count"] += 1
            histogram[bucket]["ms"] += (b - a) / 1000
    by_region: dict[str, dict[str, Any]] = {}
    for a, b in gaps:  # which phase each gap falls in, on the window's thread
        chain = threads[main_key].chain(threads[main_key].innermost(0.5 * (a + b))) if main_key in threads else []
        row = by_region.setdefault(_generic(_region(chain, window)) or "(none)", {"count": 0, "ms": 0.0})
        row["count"] += 1
        row["ms"] += (b - a) / 1000
    largest = sorted(gaps, key=lambda g: g[0] - g[1])[:top_gaps]
    describe = _gap_describer(inside, threads, main_key, mark, window, start, end)
    return {"count": len(gaps), "total_ms": sum(b - a for a, b in gaps) / 1000, "histogram": histogram,
            "by_region": dict(sorted(by_region.items(), key=lambda kv: -kv[1]["ms"])),
            "largest": [describe(g) for g in largest]}


def _gap_describer(inside, threads, main_key, mark, window: str | None, start: float, end: float):
    """A function from a gap to where it falls: the events before and after it, the host events open at its middle
    (the window's thread first) and its region."""
    by_start = sorted((max(float(e["ts"]), start), e["name"]) for e, *_ in inside)
    by_end = sorted((min(event_end(e), end), e["name"]) for e, *_ in inside)
    start_keys, end_keys = [t for t, _ in by_start], [t for t, _ in by_end]
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

    return describe


def host_syncs(calls, device, threads, start: float, end: float, window: str | None) -> dict[str, Any]:
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
