"""Planner vs measured for one point: the compared quantities, the update's breakdown, the emulated-card
verdict, the cost metric, and where the two part (vLLM outside its pool, the phases by process)."""
from __future__ import annotations

from typing import Any

from rlkit.experiments.util_sweep.config import Case
from rlkit.planning import budget
from rlkit.planning.cost import cost_per_million_samples

# verl phase (sampled) -> planner phases it covers.
PHASE_MAP = {"gen": ("rollout",), "old_log_prob": ("log_prob",), "update_actor": ("update_fwd_bwd", "optimizer_step"),
             "update_weights": ("weight_sync",)}


TOLERANCE = 0.10  # the bar: planner within 10% of the measurement


# A phase's peak is compared only when the sampler saw it this many times: update_weights lasts about 1 s, and
# at 1 Hz its one or two samples fall on either side of vLLM waking up (29.1 vs 42.2 GiB in two runs of one case).
MIN_PHASE_SAMPLES = 3


def _first(values: list) -> Any:
    return values[0] if values else None


def comparison_rows(plan: dict[str, Any], measured: dict[str, Any] | None, case: Case) -> list[dict[str, Any]]:
    """Planner | measured | ratio (measured / planner) for every quantity both sides have.

    ``measured`` None (no GPU): the rows carry the planner's numbers and ``measured`` None.
    """
    m = measured or {}
    vllm = m.get("vllm") or {}
    peaks = m.get("phase_peaks") or {}
    concurrency = _first(vllm.get("max_concurrency", []))
    graphs = _first(vllm.get("cuda_graphs", []))
    rollout = plan["device_gib"]["rollout"]
    actor_peak = max(sum(v for c, v in comps.items() if c in budget.ACTOR_ALLOCATED_COMPONENTS)
                     for comps in plan["device_gib"].values())
    rows = [
        ("vllm_weights_gib", rollout.get("vllm_weights_bf16", 0.0), _first(vllm.get("model_loading_gib", [])),
         "vLLM 'Model loading took'"),
        ("cuda_graphs_gib", rollout.get("cuda_graphs", 0.0), graphs["gib"] if graphs else None,
         "vLLM 'Graph capturing finished ... took'"),
        ("kv_pool_gib", plan["kv_pool_gib"], _first(vllm.get("kv_cache_gib", [])), "vLLM 'Available KV cache memory'"),
        ("max_concurrent_seqs", plan["max_concurrent_seqs"],
         concurrency["concurrency"] if concurrency and concurrency["max_model_len"] == case.seq_len else None,
         f"vLLM 'Maximum concurrency for {case.seq_len:,} tokens per request'"),
        ("actor_peak_allocated_gib", actor_peak, (m.get("verl_memory") or {}).get("max_memory_allocated_gb"),
         "verl actor/perf/max_memory_allocated_gb (process peak since start)"),
    ]
    too_short = set()
    for verl_phase, planner_phases in PHASE_MAP.items():
        estimate = max((plan["device_total_gib"].get(p, 0.0) for p in planner_phases), default=0.0)
        entry = peaks.get(verl_phase, {})
        source = f"device used during {verl_phase} minus idle baseline ({'+'.join(planner_phases)})"
        if entry and entry["samples"] < MIN_PHASE_SAMPLES:
            too_short.add(f"peak_{verl_phase}_gib")
            source += f"; {entry['samples']} samples: too short to compare at this sampling rate"
        rows.append((f"peak_{verl_phase}_gib", estimate, entry.get("peak_job_gib"), source))
    rows += old_log_prob_rows(plan, m.get("old_log_prob_memory"))
    out = []
    for quantity, estimate, value, source in rows:
        ratio = value / estimate if value is not None and estimate and quantity not in too_short else None
        out.append({"quantity": quantity, "planner": estimate, "measured": value, "ratio": ratio,
                    "off_by_more_than_10pct": None if ratio is None else abs(ratio - 1.0) > TOLERANCE,
                    "measured_source": source})
    return out


def _actor_allocated(plan: dict[str, Any], phase: str) -> float:
    """The planner's actor allocated bytes (GiB) in ``phase``."""
    return sum(v for c, v in plan["device_gib"].get(phase, {}).items() if c in budget.ACTOR_ALLOCATED_COMPONENTS)


def old_log_prob_rows(plan: dict[str, Any], olp: dict[str, float] | None) -> list[tuple]:
    """The actor's torch peak allocated in its old_log_prob pass alone (:mod:`rlkit.patches.instruments.old_log_prob_memory`)
    against the planner's actor allocated share of log_prob; none for runs recorded before the instrument. Its
    reserved peak is not compared here (the planner models allocated bytes): :func:`old_log_prob_split` shows it."""
    if not olp or olp.get("max_allocated_gib") is None:
        return []
    source = "rlkit actor/rlkit/old_log_prob/max_allocated_gib (torch peak of the actor's compute_log_prob, reset at its entry)"
    return [("old_log_prob_actor_allocated_gib", _actor_allocated(plan, "log_prob"), olp["max_allocated_gib"], source)]


def old_log_prob_split(measured: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    """old_log_prob's actor process split by its torch peaks: allocated, the allocator's cache (reserved -
    allocated) and what the process held outside torch (its per-process peak - reserved); empty without the
    instrument's record."""
    olp = measured.get("old_log_prob_memory")
    if not olp:
        return {}
    allocated, reserved = olp.get("max_allocated_gib"), olp.get("max_reserved_gib")
    process = process_phase_peak(measured, "old_log_prob", "actor")
    return {"log_prob_actor_allocated_gib": allocated, "log_prob_actor_reserved_gib": reserved,
            "log_prob_actor_allocated_at_entry_gib": olp.get("allocated_at_entry_gib"),
            "log_prob_allocator_cache_gib": reserved - allocated if None not in (allocated, reserved) else None,
            "log_prob_actor_non_torch_gib": process - reserved if None not in (process, reserved) else None,
            "planner_log_prob_actor_allocated_gib": _actor_allocated(plan, "log_prob")}


def update_breakdown(measured: dict[str, Any] | None, plan: dict[str, Any]) -> dict[str, Any] | None:
    """The update phase's device peak split by what verl reports for the actor process, next to the planner.

    verl's ``max_memory_allocated_gb`` / ``max_memory_reserved_gb`` are the actor process's peaks since start
    (the update holds both in these runs). ``allocator_cache_gib`` = reserved - allocated: blocks torch's
    caching allocator keeps after freeing them, which the device sees and the planner (a model of allocated
    bytes) does not. ``rest_gib`` = device peak - actor reserved: what the other holders kept meanwhile (the
    actor's CUDA context, the sleeping vLLM engine with its CUDA graphs), against the planner's
    non-allocated parts.
    """
    if not measured:
        return None
    peak = (measured.get("phase_peaks") or {}).get("update_actor", {}).get("peak_job_gib")
    verl = measured.get("verl_memory") or {}
    allocated, reserved = verl.get("max_memory_allocated_gb"), verl.get("max_memory_reserved_gb")
    if peak is None or allocated is None or reserved is None:
        return None
    phase = max(PHASE_MAP["update_actor"], key=lambda p: plan["device_total_gib"].get(p, 0.0))
    comps = plan["device_gib"][phase]
    planner_actor = sum(v for c, v in comps.items() if c in budget.ACTOR_ALLOCATED_COMPONENTS)
    planner_rest = sum(v for c, v in comps.items() if c not in budget.ACTOR_ALLOCATED_COMPONENTS)
    return {"device_peak_gib": peak, "actor_allocated_gib": allocated, "actor_reserved_gib": reserved,
            "allocator_cache_gib": reserved - allocated, "rest_gib": peak - reserved,
            "needed_without_cache_gib": allocated + peak - reserved,
            "planner_phase": phase, "planner_actor_allocated_gib": planner_actor, "planner_rest_gib": planner_rest,
            "planner_device_gib": planner_actor + planner_rest}


def emulated_verdict(measured: dict[str, Any] | None, emulated_total_gib: float,
                     plan: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Whether the run would fit the emulated card (inferred, not an observed OOM).

    The cap is per process, so the device-wide samples can exceed the card: the actor's allocator may fill
    its own cap with cache while the sleeping vLLM engine holds more beside it. The update is judged on what
    it needs without that cache (``needed_without_cache_gib`` of :func:`update_breakdown`; torch frees
    cached blocks and retries before it raises an OOM); other phases on their device peaks.
    """
    if not measured or not measured.get("phase_peaks"):
        return None
    over = {ph: e["peak_job_gib"] for ph, e in measured["phase_peaks"].items()
            if ph in PHASE_MAP and e["peak_job_gib"] > emulated_total_gib}
    breakdown = update_breakdown(measured, plan) if plan else None
    update_fits = None if breakdown is None else breakdown["needed_without_cache_gib"] <= emulated_total_gib
    failing = [ph for ph in over if ph != "update_actor" or update_fits is not True]
    if not over:
        verdict = "fits the emulated card"
    elif failing:
        verdict = "exceeds the emulated card in " + ", ".join(failing)
    else:
        verdict = (f"fits the emulated card without the actor's allocator cache (update needs "
                   f"{breakdown['needed_without_cache_gib']:.2f} GiB; device-wide peak {over['update_actor']:.2f} GiB "
                   f"with {breakdown['allocator_cache_gib']:.2f} GiB cached)")
    return {"emulated_total_gib": emulated_total_gib, "phases_over": over, "update_fits": update_fits,
            "update_breakdown": breakdown, "verdict": verdict}


def cost_summary(measured: dict[str, Any] | None, case: Case, price_per_gpu_hour: float,
                 n_gpus: int = 1) -> dict[str, Any] | None:
    """The document's metric, cost per million rollout samples = n_gpus x price x hours / samples_millions:
    at steady state (one step's time for one step's samples) and for the whole job (launch to exit,
    start-up included, for every logged step's samples)."""
    if not measured or not measured.get("step_s"):
        return None
    samples = case.samples_per_step
    steady = cost_per_million_samples(n_gpus, price_per_gpu_hour, measured["step_s"] / 3600, samples)
    whole = cost_per_million_samples(n_gpus, price_per_gpu_hour, measured["wall_s"] / 3600,
                                            samples * measured["steps_logged"])
    return {"price_per_gpu_hour": price_per_gpu_hour, "n_gpus": n_gpus, "samples_per_step": samples,
            "steady_state_usd_per_million_samples": steady, "whole_job_usd_per_million_samples": whole,
            "formula": "n_gpus x price_per_gpu_hour x wallclock_hours / samples_millions"}


def vllm_outside_pool_by_step(measured: dict[str, Any]) -> dict[str, float]:
    """Per step (``"1"``, ``"2"``, ...): GiB the device freed across vLLM's sleep after that step's rollout
    beyond the sleep-mode pool (``Sleep mode freed`` - ``CuMemAllocator: sleep freed``, :func:`parse_vllm_log`).

    That pool is what ``gpu_memory_utilization`` sizes (weights and KV cache); the rest is what vLLM's
    PyTorch allocator held beside it, which the allocator's sleep empties, plus anything another process
    freed in the same instant (none does in verl's sequence: the actor waits for the rollout). The first
    sleep follows start-up, so step k's rollout is sleep k.
    """
    sleeps = (measured.get("vllm") or {}).get("sleeps") or []
    return {str(k): s["device_freed_gib"] - s["pool_freed_gib"] for k, s in enumerate(sleeps) if k >= 1}


def _holder(process: str) -> str:
    """Which side of the card a per-process key (``"<title> [pid]"``) is: verl's actor worker or vLLM's."""
    if "WorkerDict" in process:
        return "actor"
    return "vllm" if "vllm" in process.lower() else "other"


def process_phase_peak(measured: dict[str, Any], phase: str, holder: str) -> float | None:
    """The largest per-process peak of ``holder`` (see :func:`_holder`) in a verl phase; None without
    per-process samples."""
    held = ((measured.get("process_phase_peaks") or {}).get(phase) or {})
    values = [gib for process, gib in held.items() if _holder(process) == holder]
    return max(values) if values else None


def gap_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where the planner's per-phase device estimate and the samples part, with what explains it (numbers
    only, from each run): the update split by verl's actor numbers (:func:`update_breakdown`) and by process,
    the rollout peak step by step with vLLM's memory outside its sleep-mode pool
    (:func:`vllm_outside_pool_by_step`), and old_log_prob by process against the planner's actor share."""
    rows = []
    for r in runs:
        m = r.get("measured")
        if not m:
            continue
        b = (r.get("emulated_verdict") or {}).get("update_breakdown") or {}
        gen = (m["phase_peaks"].get("gen") or {}).get("by_step", {})
        base = m["baseline_used_gib"]
        rollout = r["planner"]["device_total_gib"]["rollout"]
        outside = vllm_outside_pool_by_step(m)
        log_prob = r["planner"]["device_gib"].get("log_prob", {})
        actor_update = process_phase_peak(m, "update_actor", "actor")
        rows.append({"case": r["case"]["name"], "util": r["config"]["gpu_memory_utilization"],
                     "update_device_peak_gib": b.get("device_peak_gib"), "planner_update_gib": b.get("planner_device_gib"),
                     "actor_allocated_gib": b.get("actor_allocated_gib"),
                     "planner_actor_allocated_gib": b.get("planner_actor_allocated_gib"),
                     "allocator_cache_gib": b.get("allocator_cache_gib"), "rest_gib": b.get("rest_gib"),
                     "planner_rest_gib": b.get("planner_rest_gib"),
                     "planner_update_plus_cache_gib": (b["planner_device_gib"] + b["allocator_cache_gib"]) if b else None,
                     "update_ratio_with_cache": (b["device_peak_gib"] / (b["planner_device_gib"] + b["allocator_cache_gib"]))
                     if b else None,
                     "update_actor_process_gib": actor_update,
                     "actor_non_torch_gib": actor_update - b["actor_reserved_gib"] if actor_update and b else None,
                     "update_vllm_process_gib": process_phase_peak(m, "update_actor", "vllm"),
                     **{f"rollout_step{k}_gib": v - base for k, v in sorted(gen.items())},
                     "planner_rollout_gib": rollout,
                     **{f"rollout_step{k}_ratio": (v - base) / rollout for k, v in sorted(gen.items())},
                     **{f"vllm_outside_pool_step{k}_gib": v for k, v in sorted(outside.items())},
                     **{f"rollout_step{k}_ratio_without_outside_pool": (v - base - outside[k]) / rollout
                        for k, v in sorted(gen.items()) if k in outside},
                     "log_prob_actor_process_gib": process_phase_peak(m, "old_log_prob", "actor"),
                     "planner_log_prob_actor_gib": sum(log_prob.get(c, 0.0) for c in
                                                       (*budget.ACTOR_ALLOCATED_COMPONENTS, "actor_non_torch")),
                     "log_prob_vllm_process_gib": process_phase_peak(m, "old_log_prob", "vllm"),
                     **old_log_prob_split(m, r["planner"])})
    return rows
