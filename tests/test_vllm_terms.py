"""rlkit.planning.vllm_terms: the planner's CUDA-graph term is what vLLM logged for the model in committed runs (issue 41), its
default only where no run measured it, and none with enforce_eager."""
from __future__ import annotations

import json
import shutil
import subprocess

from rlkit.core.results import OUTPUTS_DIR
from rlkit.planning import preflight, vllm_terms
from rlkit.verl.logs import parse_vllm_log

RUN = "h200-seed-1-fixes-hostadamw.session19"


def _repo(tmp_path, runs: dict[str, str]):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for new, old in runs.items():
        shutil.copytree(OUTPUTS_DIR / "05_grpo_qwen3_4b" / old, tmp_path / "outputs" / "05_grpo_qwen3_4b" / new)
    subprocess.run(["git", "-C", str(tmp_path), "add", "outputs"], check=True)
    return tmp_path / "outputs"


def test_the_term_is_what_vllm_logged_and_the_largest_of_several(tmp_path):
    outputs = _repo(tmp_path, {"a": RUN, "b": RUN})
    logged = parse_vllm_log((OUTPUTS_DIR / "05_grpo_qwen3_4b" / RUN / "verl.log").read_text())["cuda_graphs"]
    term = vllm_terms.cuda_graphs_term("qwen3-4b", outputs)
    assert term["gib"] == logged[0]["gib"] and term["runs"] == 2 and term["versions"] == ["0.24.0"]
    log = outputs / "05_grpo_qwen3_4b" / "b" / "verl.log"
    log.write_text(log.read_text().replace(f"took {logged[0]['gib']:.2f} GiB", "took 0.90 GiB"))
    vllm_terms._measurements.cache_clear()
    term = vllm_terms.cuda_graphs_term("qwen3-4b", outputs)
    assert term["gib"] == 0.90 and f"{logged[0]['gib']:g}-0.9 GiB, the largest taken" in term["reason"]


def test_an_unmeasured_model_or_an_untracked_run_keeps_the_default(tmp_path):
    outputs = _repo(tmp_path, {"a": RUN})
    assert vllm_terms.cuda_graphs_term("qwen2.5-0.5b", outputs)["gib"] is None
    shutil.copytree(outputs / "05_grpo_qwen3_4b" / "a", outputs / "05_grpo_qwen3_4b" / "local")  # not committed
    log = outputs / "05_grpo_qwen3_4b" / "local" / "verl.log"
    log.write_text(log.read_text().replace("took 0.61 GiB", "took 5.00 GiB"))
    vllm_terms._measurements.cache_clear()
    assert vllm_terms.cuda_graphs_term("qwen3-4b", outputs)["gib"] == 0.61


def test_the_planner_takes_the_term_unless_eager():
    metrics = json.loads((OUTPUTS_DIR / "05_grpo_qwen3_4b" / RUN / "metrics.json").read_text())
    overrides = metrics["overrides"]  # the run's model path is the node's; the last override names the preset
    spec = preflight.planner_spec_for_overrides(
        [*overrides, "actor_rollout_ref.model.path=qwen3-4b"], gpu_gib=47.4)
    assert spec.cudagraph_gib == vllm_terms.cuda_graphs_term("qwen3-4b")["gib"] == 0.61
    eager = preflight.planner_spec_for_overrides(
        [*overrides, "actor_rollout_ref.model.path=qwen3-4b", "actor_rollout_ref.rollout.enforce_eager=True"], gpu_gib=47.4)
    assert eager.cudagraph_gib == 0.0
