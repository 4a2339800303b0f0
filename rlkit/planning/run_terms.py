"""What committed runs measured of three things the planner would otherwise assume (issue 41, old_log_prob's rest).

* The actor's process outside torch's allocator (CUDA context, NCCL): verl's "After FSDP" line gives the device's used
  memory (``torch.cuda.mem_get_info``: the card's own reservation, the idle baseline, is not in it; the "Before FSDP"
  line reads the actor's CUDA context alone) and the process's torch reserved memory; used - reserved is the rest
  of that process, alone on its card at that moment. Every one-GPU run logged 1.15 GiB, both models; the planner
  assumed 0.5 (:attr:`rlkit.planning.budget.PlanSpec.non_torch_gib`).
* vLLM's worker while asleep (old_log_prob, the update): its context, CUDA graphs and whatever sleep mode does not
  free, the worker's own per-process samples during old_log_prob (verl sleeps the engine after the rollout and wakes
  it for the weight sync). The planner assumed graphs + non_torch_gib.
* The longest prompt of the data (verl's ``prompt_length/max``). verl 0.9.1's engine pads a micro-batch to its longest
  sequence without the prompts' left padding (``prepare_model_inputs``: ``to_padded_tensor`` at the nested
  lengths' max), so a micro-batch of N sequences holds N x (longest prompt + response) positions, not
  N x (max_prompt_length + max_response_length).

Each term comes from git-tracked runs only, as :mod:`rlkit.planning.vllm_terms` does, and says where it comes from.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

SOURCES = ("05_grpo_qwen3_4b", "06_util_sweep")


def committed(outputs: Path, notebooks: tuple[str, ...] = SOURCES) -> list[tuple[str, dict[str, Any], Path]]:
    """(``<notebook>/<run>``, metrics, folder) for every committed run of ``notebooks`` under ``outputs``; none
    outside a checkout."""
    from rlkit.core.results import NotACheckout, committed_runs

    found = []
    for notebook in notebooks:
        try:
            runs = committed_runs(outputs / notebook)
        except NotACheckout:
            return []
        found += [(f"{notebook}/{run.name}", json.loads((run / "metrics.json").read_text()), run) for run in runs]
    return found


@lru_cache(maxsize=4)
def _runs(outputs: Path) -> tuple[tuple[str, dict[str, Any], Path], ...]:
    return tuple(committed(outputs))


def _outputs(outputs: Path | None) -> Path:
    from rlkit.core.results import OUTPUTS_DIR

    return Path(outputs or OUTPUTS_DIR).resolve()


def _term(values: list[tuple[float, str]], what: str, unit: str = "GiB") -> dict[str, Any]:
    """The largest of ``values`` ((value, run) pairs), with the runs it comes from and a reason that names them."""
    if not values:
        return {"value": None, "runs": 0, "reason": f"no committed run measured {what}: the planner's default is assumed"}
    sizes = sorted({v for v, _ in values})
    spread = f"{sizes[0]:g}-{sizes[-1]:g} {unit}, the largest taken" if len(sizes) > 1 else f"{sizes[0]:g} {unit}"
    runs = sorted({r for _, r in values})
    return {"value": sizes[-1], "runs": len(runs),
            "reason": f"{spread} for {what} in {len(runs)} committed runs (outputs/{runs[0]} and others)"}


def after_fsdp_non_torch(metrics: dict[str, Any], folder: Path) -> float | None:
    """Device used - torch reserved in the run's first verl "After FSDP" line (GiB, 2 decimals as logged); None
    where the run logged none."""
    from rlkit.verl.logs import parse_verl_memory

    rows = (metrics.get("measured") or {}).get("verl_memory_log")
    if rows is None:
        log = folder / "verl.log"
        rows = parse_verl_memory(log.read_text(errors="replace")) if log.exists() else []
    row = next((r for r in rows if r["label"] == "After FSDP"), None)
    return None if row is None else round(row["device_used_gib"] - row["reserved_gib"], 2)


def actor_non_torch_term(n_gpus: int = 1, outputs: Path | None = None) -> dict[str, Any]:
    """The actor's memory outside torch's allocator on a card of ``n_gpus``-GPU runs (``gib``: None where no run
    logged it). Runs of several GPUs hold more (NCCL between ranks), so only runs of the same count are taken."""
    values = []
    for name, metrics, folder in _runs(_outputs(outputs)):
        if (metrics.get("recipe") or {}).get("n_gpus") == n_gpus:
            gib = after_fsdp_non_torch(metrics, folder)
            values += [(gib, name)] if gib is not None else []
    term = _term(values, f"the actor's non-torch memory of {n_gpus}-GPU runs (verl's 'After FSDP': used - reserved)")
    return {"gib": term.pop("value"), **term}


def vllm_asleep_term(model: str, outputs: Path | None = None) -> dict[str, Any]:
    """What vLLM's worker held while asleep for ``model`` (a preset): its largest per-process sample during old_log_prob
    in the committed runs that sampled per process (``gib``: None where none did)."""
    values = []
    for name, metrics, _ in _runs(_outputs(outputs)):
        if (metrics.get("model") or {}).get("preset") != model or (metrics.get("recipe") or {}).get("enforce_eager"):
            continue
        held = ((metrics.get("measured") or {}).get("process_phase_peaks") or {}).get("old_log_prob") or {}
        values += [(round(gib, 2), name) for process, gib in held.items() if "vllm" in process.lower()]
    term = _term(values, f"vLLM's sleeping worker of {model} (per-process samples during old_log_prob)")
    return {"gib": term.pop("value"), **term}


def longest_prompt_term(model: str, data: str, data_rows: int, outputs: Path | None = None) -> dict[str, Any]:
    """The longest prompt (tokens) verl logged (``prompt_length/max``) for ``model``'s tokenizer on the data set
    ``data`` of ``data_rows`` rows in the committed runs (``tokens``: None where no run logged it)."""
    values = []
    for name, metrics, _ in _runs(_outputs(outputs)):
        recipe = metrics.get("recipe") or {}
        if ((metrics.get("model") or {}).get("preset"), recipe.get("data"), recipe.get("data_rows")) != (model, data, data_rows):
            continue
        steps = (metrics.get("measured") or {}).get("steps") or []
        values += [(int(s["prompt_length/max"]), name) for s in steps if "prompt_length/max" in s]
    term = _term(values, f"the longest prompt of {model} on {data} x {data_rows} (verl's prompt_length/max)", "tokens")
    return {"tokens": term.pop("value"), **term}
