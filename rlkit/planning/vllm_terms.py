"""vLLM's own measurement of a memory term the planner would otherwise assume (issue 41): the captured CUDA graphs.

vLLM logs what its graph capture took ("Graph capturing finished in N secs, took X GiB"). The planner's default
(:attr:`rlkit.planning.budget.PlanSpec.cudagraph_gib`, 1.0 GiB) was an assumption, 1.6x what vLLM 0.24 took for Qwen3-4B and
3.6x for Qwen2.5-0.5B. :func:`cuda_graphs_term` finds what vLLM took for the same model in the committed runs of
notebooks 05 and 06 (git-tracked folders only), so the planner uses a measured term where one exists and says it
assumed one where none does. The capture depends on the model, vLLM's version and its capture sizes (verl 0.9.1 leaves
those at vLLM's defaults), not on the card or the utilization: every committed run of one model logged the same size.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

# The notebooks whose committed runs log vLLM's start-up (05: the console in verl.log; 06: parsed into metrics.json).
SOURCES = ("05_grpo_qwen3_4b", "06_util_sweep")


def _logged_graphs(run: Path) -> list[float]:
    """What vLLM's graph capture took in one run, as it logged it (GiB, one per engine start)."""
    from rlkit.verl.logs import parse_vllm_log

    metrics = json.loads((run / "metrics.json").read_text())
    measured = (metrics.get("measured") or {}).get("vllm")
    if measured is not None:
        return [g["gib"] for g in measured.get("cuda_graphs", [])]
    log = run / "verl.log"
    return [g["gib"] for g in parse_vllm_log(log.read_text(errors="replace"))["cuda_graphs"]] if log.exists() else []


@lru_cache(maxsize=4)
def _measurements(outputs: Path) -> tuple[tuple[str, str, float, str], ...]:
    """(model preset, vLLM version, GiB, run folder relative to outputs/) for every committed run that logged it."""
    from rlkit.planning.run_terms import committed

    found = []
    for name, metrics, run in committed(outputs, SOURCES):
        env = json.loads((run / "env.json").read_text()) if (run / "env.json").exists() else {}
        preset = (metrics.get("model") or {}).get("preset")
        if preset is None or (metrics.get("recipe") or {}).get("enforce_eager"):
            continue
        version = (env.get("versions") or {}).get("vllm") or "unrecorded"
        found += [(preset, version, gib, name) for gib in _logged_graphs(run)]
    return tuple(found)


def cuda_graphs_term(model: str, outputs: Path | None = None) -> dict[str, Any]:
    """What vLLM's CUDA graphs took for ``model`` (a preset name) in the committed runs: ``gib`` (None where no run
    measured it), the vLLM versions and runs it comes from, and ``reason``. Runs that logged different sizes give
    the largest, and the reason names the range."""
    from rlkit.core.results import OUTPUTS_DIR

    rows = [r for r in _measurements(Path(outputs or OUTPUTS_DIR).resolve()) if r[0] == model]
    if not rows:
        return {"gib": None, "versions": [], "runs": 0,
                "reason": f"no committed run of {model} logged vLLM's graph capture: the planner's default is assumed"}
    sizes = sorted({gib for _, _, gib, _ in rows})
    versions = sorted({v for _, v, _, _ in rows})
    spread = f"{sizes[0]:g}-{sizes[-1]:g} GiB, the largest taken" if len(sizes) > 1 else f"{sizes[0]:g} GiB"
    return {"gib": sizes[-1], "versions": versions, "runs": len({r for _, _, _, r in rows}),
            "reason": f"vLLM {', '.join(versions)} logged {spread} for {model}'s CUDA graphs in "
                      f"{len({r for _, _, _, r in rows})} committed runs (outputs/{rows[0][3]} and others)"}
