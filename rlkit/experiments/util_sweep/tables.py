"""A sweep's saved points read back and put in rows, and the answer seed 003 was missing, in words."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from rlkit.core.results import fmt
from rlkit.experiments.util_sweep.comparison import PHASE_MAP, _first, gap_rows, vllm_outside_pool_by_step
from rlkit.experiments.util_sweep.config import CASES, VERL_ROLLOUT_POLL_S

SWEEP_POINT = re.compile(r"[a-z0-9_]+-u[0-9.]+")  # a point's run folder: <case>-u<util>


def point_folders(folder: str | os.PathLike) -> list[Path]:
    """The sweep's points under ``folder``: its completed runs (:func:`rlkit.core.results.run_folders`) named
    ``<case>-u<util>``. Another run of a point under another name (``h200-papermill-doc_small-u0.5``, a CPU
    ``tiny`` run) is not another point; the report reads the same folders."""
    from rlkit.core.results import run_folders

    return [p for p in run_folders(folder) if SWEEP_POINT.fullmatch(p.name)]


def read_results(results_dir: str | os.PathLike) -> dict[str, Any]:
    """Saved results: one run's folder (its ``metrics.json``) or a folder of the sweep's points
    (:func:`point_folders`).

    Returns ``{"units", "runs": [metrics, ...]}`` sorted by case then utilization; a run folder gets its
    folder name as ``tag``.
    """
    from rlkit.core.env import REPO_ROOT
    from rlkit.core.results import read_metrics

    path = Path(results_dir)
    path = path if path.is_absolute() else REPO_ROOT / path
    if (path / "metrics.json").exists():
        metrics = read_metrics(path)
        # a notebook's rendering of saved runs holds them; else the folder is one point
        return metrics if "runs" in metrics else {"units": "GiB", "runs": [{**metrics, "tag": path.name}]}
    folders = point_folders(path)
    if not folders:
        raise FileNotFoundError(f"{path} holds no metrics.json, directly or in a point folder <case>-u<util>/; "
                                "fix results_dir")
    runs = sorted(({**read_metrics(f), "tag": f.name} for f in folders),
                  key=lambda m: (m["case"]["name"], m["config"]["gpu_memory_utilization"]))
    return {"units": "GiB", "runs": runs}


def runs_of(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs in ``metrics``: a rendering of saved results, or one fresh run."""
    return metrics.get("runs", [metrics])


def sweep_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run: the issue's columns (KV pool, concurrency, peaks, samples/s, step time, OOM, cost).

    ``rollout_samples_per_s`` divides by verl's rollout time, which moves in polls of
    :data:`VERL_ROLLOUT_POLL_S`; the rollout may have ended up to one poll earlier, so
    ``rollout_samples_per_s_upper`` is the rate if it ended right after the previous poll."""
    rows = []
    for r in runs:
        m = r.get("measured") or {}
        vllm = m.get("vllm") or {}
        peaks = m.get("phase_peaks") or {}
        conc = _first(vllm.get("max_concurrency", []))
        failure = m.get("failure") or {}
        cost = r.get("cost") or {}
        gen_s = (m.get("summary") or {}).get("gen_s")
        rows.append({
            "case": r["case"]["name"], "util": r["config"]["gpu_memory_utilization"],
            "emulated_gib": r["emulation"]["emulated_total_gib"], "measured": bool(m),
            "kv_pool_gib": _first(vllm.get("kv_cache_gib", [])), "kv_tokens": _first(vllm.get("kv_cache_tokens", [])),
            "max_concurrency": conc["concurrency"] if conc else None,
            **{f"peak_{ph}_gib": peaks.get(ph, {}).get("peak_job_gib") for ph in PHASE_MAP},
            "kv_use_peak_pct": max((s["kv_cache_usage_pct"] for s in vllm.get("stats", [])
                                    if s["kv_cache_usage_pct"] is not None), default=None),
            "waiting_reqs_max": max((s["waiting_reqs"] for s in vllm.get("stats", [])), default=None),
            "rollout_samples_per_s": m.get("rollout_samples_per_s"), "gen_s": gen_s,
            "rollout_samples_per_s_upper": (m["rollout_samples_per_s"] * gen_s / (gen_s - VERL_ROLLOUT_POLL_S)
                                            if m.get("rollout_samples_per_s") and gen_s and gen_s > VERL_ROLLOUT_POLL_S else None),
            "step_s": m.get("step_s"),
            "failure": f"{failure['kind']} in {failure['phase']}" if failure else None,
            "update_oom": m.get("update_oom"),
            "emulated": (r.get("emulated_verdict") or {}).get("verdict"),
            "actor_allocated_gib": (m.get("verl_memory") or {}).get("max_memory_allocated_gb"),
            "update_needed_without_cache_gib": ((r.get("emulated_verdict") or {}).get("update_breakdown") or {}).get(
                "needed_without_cache_gib"),
            "usd_per_M_samples": cost.get("steady_state_usd_per_million_samples"),
            "planner_kv_pool_gib": r["planner"]["kv_pool_gib"], "planner_verdict": r["planner"]["verdict"],
        })
    return rows


def comparison_table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every run's planner-vs-measured rows, labelled by case and utilization."""
    return [{"case": r["case"]["name"], "util": r["config"]["gpu_memory_utilization"], **row}
            for r in runs for row in r["comparison"]]


def first_update_oom(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per case: the smallest utilization whose update phase OOMed (observed) and whose update would not fit
    the emulated card (inferred by :func:`emulated_verdict`); None where no run did."""
    out: dict[str, dict[str, Any]] = {}
    for r in sorted(runs, key=lambda r: r["config"]["gpu_memory_utilization"]):
        entry = out.setdefault(r["case"]["name"], {"observed": None, "inferred": None, "measured_runs": 0})
        m = r.get("measured")
        if not m:
            continue
        entry["measured_runs"] += 1
        util = r["config"]["gpu_memory_utilization"]
        if m.get("update_oom") and entry["observed"] is None:
            entry["observed"] = util
        verdict = r.get("emulated_verdict") or {}
        update_fits = verdict.get("update_fits")
        over_card = update_fits is False or (update_fits is None and "update_actor" in verdict.get("phases_over", {}))
        if over_card and entry["inferred"] is None:
            entry["inferred"] = util
    return out


def describe(runs: list[dict[str, Any]]) -> str:
    """Findings in words; every number comes from ``runs``."""
    measured = [r for r in runs if r.get("measured")]
    lines = [f"{len(runs)} point(s) of the gpu_memory_utilization sweep, planner vs measured (GiB per GPU, the ratio "
             f"measured / planner); {len(measured)} measured on a GPU, "
             + (f"{len(runs) - len(measured)} planner only (not launched: the tiny CPU profile or no GPU)."
                if len(measured) < len(runs) else "none planner only.")]
    for r in runs:
        e, p = r["emulation"], r["planner"]
        lines.append(
            f"{r['case']['name']} at util {e['gpu_memory_utilization']} of an emulated {e['emulated_total_gib']} GiB "
            f"card (vLLM asks for {e['vllm_requested_gib']:.2f} GiB): planner KV pool {p['kv_pool_gib']:.2f} GiB, {p['max_concurrent_seqs']} "
            f"concurrent sequences, peak {p['peak_phase']} {p['peak_gib']:.2f} GiB -> {p['verdict']}.")
        m = r.get("measured")
        if not m:
            lines.append(f"  measured: {r['launch_reason']}")
            continue
        off = [c for c in r["comparison"] if c["off_by_more_than_10pct"]]
        off_text = ", ".join(f"{c['quantity']} x{c['ratio']:.2f}" for c in off) or "none"
        lines.append(
            f"  measured: step {m['step_s'] or float('nan'):.1f} s, {m['rollout_samples_per_s'] or float('nan'):.1f} "
            f"rollout samples/s, failure: {m['failure']['kind'] + ' in ' + m['failure']['phase'] if m['failure'] else 'none'}; "
            f"{len(off)} of {sum(c['ratio'] is not None for c in r['comparison'])} compared quantities off by >10% "
            f"({off_text}).")
        if r.get("cost"):
            lines.append(f"  cost: ${r['cost']['steady_state_usd_per_million_samples']:,.2f} per million rollout "
                         f"samples at ${r['cost']['price_per_gpu_hour']}/GPU-hour (steady state).")
    for case, first in first_update_oom(runs).items():
        if first["measured_runs"]:
            lines.append(f"{case}: first utilization with an update-phase OOM: observed {first['observed']}, "
                         f"inferred on the emulated card {first['inferred']} ({first['measured_runs']} measured runs).")
    return "\n".join(lines)


def process_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run, verl phase and process: the peak GiB that process held (runs with per-process samples only)."""
    rows = []
    for r in runs:
        peaks = (r.get("measured") or {}).get("process_phase_peaks") or {}
        for phase in PHASE_MAP:
            for process, gib in sorted(peaks.get(phase, {}).items(), key=lambda kv: -kv[1]):
                rows.append({"case": r["case"]["name"], "util": r["config"]["gpu_memory_utilization"], "phase": phase,
                             "process": process, "peak_gib": gib})
    return rows


def answer_lines(runs: list[dict[str, Any]], source: str = "outputs/06_util_sweep/<case>-u<util>/metrics.json") -> list[str]:
    """The answer seed 003 was missing, in Markdown: a table of the measured sweep and one sentence per case.
    Every number comes from ``runs``."""
    measured = [r for r in runs if r.get("measured")]
    if not measured:
        return ["*No measured runs (no GPU): nothing to answer from.*"]
    header = ("case", "util", "KV pool GiB", "concurrent 512-token seqs", "peak KV use %", "max waiting reqs",
              "rollout samples/s", "step s", "rollout peak GiB", "update peak GiB", "actor allocated GiB", "update OOM",
              "$ per M samples")
    lines = [(f"**gpu_memory_utilization sweep** (notebook 06; one fresh verl + vLLM job per point on one H200, every "
              f"process capped at the case's emulated card; `{source}`). Steps 2.. for times; peaks are device-wide "
              "minus the idle baseline:"), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = sweep_rows(measured)
    for row in rows:
        cells = (row["case"], f"{row['util']:g}", fmt(row["kv_pool_gib"], ".2f"), fmt(row["max_concurrency"], ",.0f"),
                 fmt(row["kv_use_peak_pct"]), fmt(row["waiting_reqs_max"], "d"), fmt(row["rollout_samples_per_s"]),
                 fmt(row["step_s"]), fmt(row["peak_gen_gib"], ".2f"), fmt(row["peak_update_actor_gib"], ".2f"),
                 fmt(row["actor_allocated_gib"], ".2f"), "yes" if row["update_oom"] else "no",
                 fmt(row["usd_per_M_samples"], ".0f"))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    oom = first_update_oom(runs)
    for case in dict.fromkeys(r["case"]["name"] for r in measured):
        lines.append(_case_answer(case, [row for row in rows if row["case"] == case],
                                  next(r for r in measured if r["case"]["name"] == case), oom[case]))
    lines.append(_rollout_answer(measured))
    within = sum(1 for r in measured for c in r["comparison"] if c["ratio"] is not None and not c["off_by_more_than_10pct"])
    compared = sum(1 for r in measured for c in r["comparison"] if c["ratio"] is not None)
    lines.append(f"- Planner vs measured: {within} of {compared} compared quantities within 10%; notebook 06 shows the "
                 "others and what they are missing.")
    return lines


UPDATE_FLAT_GIB = 0.5  # an update peak that moves less than this across the sweep "does not move" (1 Hz samples)


def _span(values: list[float], spec: str) -> str:
    """``lo-hi`` in ``spec``, or one value where both print the same."""
    lo, hi = f"{min(values):{spec}}", f"{max(values):{spec}}"
    return lo if lo == hi else f"{lo}-{hi}"


def _case_answer(case: str, pts: list[dict[str, Any]], run: dict[str, Any], oom: dict[str, Any]) -> str:
    """One case's sentence of :func:`answer_lines` (its measured rows ``pts``, one of its runs, its OOM entry)."""
    def span(key: str, spec: str = ".1f") -> str:
        return _span([p[key] for p in pts], spec)

    def moves(key: str) -> bool:
        values = [p[key] for p in pts if p[key] is not None]
        return bool(values) and max(values) - min(values) > UPDATE_FLAT_GIB

    utils = [p["util"] for p in pts]
    missing = [u for u in run["config"]["sweep_utils"] if u not in utils]
    if not moves("peak_update_actor_gib"):
        update_text = (f"the update's device peak stays at {span('peak_update_actor_gib', '.2f')} GiB: it does not move "
                       "with util (vLLM's sleep frees its KV pool before the update)")
    elif not moves("actor_allocated_gib"):
        top, low = max(pts, key=lambda p: p["peak_update_actor_gib"]), min(pts, key=lambda p: p["peak_update_actor_gib"])
        update_text = (f"the actor's update does not move with util (allocated peak {span('actor_allocated_gib', '.2f')} GiB "
                       f"at every point; vLLM's sleep frees its KV pool before the update); the device-wide update peak is "
                       f"{span('peak_update_actor_gib', '.2f')} GiB, highest at {top['util']:g} and lowest at {low['util']:g}, "
                       "the difference held by the other processes on the card")
    else:
        lo, hi = min(pts, key=lambda p: p["util"]), max(pts, key=lambda p: p["util"])
        update_text = (f"the update's device peak goes from {lo['peak_update_actor_gib']:.2f} GiB at {lo['util']:g} to "
                       f"{hi['peak_update_actor_gib']:.2f} GiB at {hi['util']:g}")
    oom_text = ("no update OOM at any measured util" if oom["observed"] is None
                else f"the update first OOMs at {oom['observed']:g}")
    needed = [p["update_needed_without_cache_gib"] for p in pts if p["update_needed_without_cache_gib"] is not None]
    if needed:
        oom_text += (f"; without the actor's allocator cache the update needs {span('update_needed_without_cache_gib', '.2f')} "
                     f"GiB of the {run['emulation']['emulated_total_gib']:g} GiB card")
    waiting = max(p["waiting_reqs_max"] for p in pts)
    queue_text = ("never queued a request (Waiting: 0 in every statistics line)" if waiting == 0
                  else f"queued up to {waiting} requests")
    return (f"- {case} (util {', '.join(f'{u:g}' for u in utils)}"
            + (f"; {', '.join(f'{u:g}' for u in missing)} not measured" if missing else "")
            + f"): {update_text}; {oom_text}. What util buys is the KV pool ({span('kv_pool_gib', '.2f')} GiB, "
            f"{span('max_concurrency', ',.0f')} concurrent 512-token sequences for a batch of {CASES[case].samples_per_step}) "
            f"at a higher rollout peak ({span('peak_gen_gib', '.2f')} GiB); vLLM used at most {span('kv_use_peak_pct')}% "
            f"of its pool and {queue_text}. Rollout samples/s {span('rollout_samples_per_s')} (rollout {span('gen_s', '.2f')} s, "
            f"which verl counts in {VERL_ROLLOUT_POLL_S:g}-s polls: a difference of one poll is not engine speed), "
            f"step {span('step_s')} s, ${span('usd_per_M_samples', '.0f')} per million samples at "
            f"${run['cost']['price_per_gpu_hour']:g}/GPU-hour.")


def _rollout_answer(measured: list[dict[str, Any]]) -> str:
    """The rollout's device peak against util x card, from vLLM's own sleep lines (:func:`gap_rows`)."""
    gaps = gap_rows(measured)
    per_case = []
    for case in dict.fromkeys(r["case"]["name"] for r in measured):
        by_step: dict[str, list[float]] = {}
        for r in measured:
            if r["case"]["name"] == case:
                for step, gib in vllm_outside_pool_by_step(r["measured"]).items():
                    by_step.setdefault(step, []).append(gib)
        if not by_step:
            continue
        held = "; ".join(f"after step {k}'s rollout {_span(by_step[k], '.2f')} GiB" for k in sorted(by_step, key=int))
        ratios = [v for g in gaps if g["case"] == case for k, v in g.items() if k.endswith("_ratio_without_outside_pool")]
        per_case.append(f"{case}: {held} (the rollout peak without it is x{_span(ratios, '.2f')} the planner's)")
    if not per_case:
        return "- Rollout: vLLM's sleep lines are absent from these logs, so its memory outside the pool is not split."
    return ("- Rollout: util does not cap vLLM's process. Beside the sleep-mode pool that util sizes, vLLM's PyTorch "
            "allocator held memory that its sleep gave back (vLLM's `Sleep mode freed` minus `CuMemAllocator: sleep "
            "freed`, per rollout): " + "; ".join(per_case) + ". It is gone before old_log_prob and the update, so it "
            "raises the rollout's peak only; leave it as headroom above util x card.")
