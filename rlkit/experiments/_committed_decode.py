"""A committed notebook-05 run's decode, read for the experiments that do arithmetic over it
(:mod:`.speculative_bound`, :mod:`.engine_settings`): its recipe, the means of its steps 2.., its GPU's limits and
what one vLLM replica decodes (:func:`rlkit.planning.roofline.decode_inputs`)."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rlkit.core import params as P
from rlkit.core.results import OUTPUTS_DIR

RUNS_OF = "05_grpo_qwen3_4b"


def run_folder(run: str) -> Path:
    """``outputs/05_grpo_qwen3_4b/<run>/``; a :class:`rlkit.core.params.ParamError` naming the fix where it holds no
    launched run (a Config's check of its ``run``)."""
    folder = OUTPUTS_DIR / RUNS_OF / run
    if not (folder / "metrics.json").exists() or not (folder / "env.json").exists():
        raise P.ParamError(f"run={run!r}: {folder} has no metrics.json and env.json. Fix: name a launched "
                           f"run folder of outputs/{RUNS_OF}/ (ls outputs/{RUNS_OF}).")
    return folder


def decode_workload(run: str) -> dict[str, Any]:
    """The run's decode work, GPU, limits and measured gen (means over steps 2..), for one wave of sequences."""
    from rlkit.core.env import git_sha, gpu_name, read_saved
    from rlkit.core.results import read_metrics
    from rlkit.models import shape as model_shape
    from rlkit.planning import roofline
    from rlkit.verl.logs import averaged_steps

    folder = run_folder(run)
    metrics, env = read_metrics(folder), read_saved(folder)
    gpu, window = gpu_name(env), averaged_steps(metrics.get("steps", []))
    hbm, peak = roofline.hbm_bytes_per_s(gpu or ""), roofline.peak_bf16_flops(gpu or "")
    if not window or hbm is None or peak is None:
        raise P.ParamError(f"run={run!r}: needs trained steps and a GPU rlkit.planning.roofline knows (env.json "
                           f"names {gpu!r}). Fix: name a launched GPU run.")
    mean = {k: statistics.fmean(s[k] for s in window) for k in ("prompt_length/mean", "response_length/mean",
                                                                 "timing_s/gen")}
    recipe = metrics["recipe"]
    shape = model_shape.resolve_model(recipe["model"] if metrics["model"].get("preset") else metrics["model"]["path"])
    inputs = roofline.decode_inputs(recipe, {k: mean[k] for k in ("prompt_length/mean", "response_length/mean")})
    if inputs["sequences"] > inputs["max_num_seqs"]:
        raise P.ParamError(f"run={run!r}: {inputs['sequences']} sequences per replica exceed max_num_seqs "
                           f"{inputs['max_num_seqs']}; the decode roofline models one wave. Fix: name another run.")
    return {"folder": folder, "commit": (env or {}).get("git_sha"), "analysed_at": git_sha(), "gpu": gpu,
            "hbm": hbm, "peak": peak, "shape": shape, "inputs": inputs, "mean": mean, "recipe": recipe,
            "synthetic_lengths": bool(recipe.get("response_length_mean"))}


def lengths_basis(work: dict[str, Any]) -> str:
    """Where the response lengths come from, as the results say it."""
    return ("synthetic length model (the run's random-init model)" if work["synthetic_lengths"]
            else "every response at the run's measured mean")
