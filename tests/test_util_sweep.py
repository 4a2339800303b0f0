"""rlkit.experiments.util_sweep: parameters, the emulation rule, log parsers, phase alignment, and the
planner-vs-measured table on saved results (all CPU)."""
import math
from pathlib import Path

import nbformat
import pytest

from rlkit.core import params as P
from rlkit.core.jsonio import write_json_atomic
from rlkit.core.results import NBS_DIR, load_profile, read_metrics
from rlkit.experiments import grpo, grpo_runs
from rlkit.experiments import util_sweep as U
from rlkit.planning import budget, verdict, vllm_terms
from rlkit.recipes import grpo as recipe_module
from rlkit.recipes import job as verl_job
from rlkit.verl import logs as verl_logs

FIXTURE = Path(__file__).parent / "fixtures" / "util_sweep_logs.txt"


def sections() -> dict[str, str]:
    """The fixture's ``=== name ===`` sections (comment lines dropped)."""
    out, name = {}, None
    for line in FIXTURE.read_text().splitlines():
        if line.startswith("=== ") and line.endswith(" ==="):
            name = line[4:-4]
            out[name] = []
        elif name and not line.startswith("#"):
            out[name].append(line)
    return {k: "\n".join(v) + "\n" for k, v in out.items()}


def config(**changes) -> U.Config:
    values = load_profile(U.NOTEBOOK, "tiny")
    values.pop("results_dir", None)
    values.update(changes)
    return P.build(U.Config, values)


# ------------------------------------------------------------------------------------------- parameters

@pytest.mark.parametrize("changes, key", [
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
    ({"sweep_utils": []}, "sweep_utils"),
    ({"sweep_utils": [0.4, 1.2]}, "sweep_utils"),
    ({"steps": 0}, "steps"),
    ({"price_per_gpu_hour": -1.0}, "price_per_gpu_hour"),
    ({"sample_interval_s": 0.0}, "sample_interval_s"),
    ({"case": "qwen2.5-7b"}, "case"),
    ({"launch": "sometimes"}, "launch"),
])
def test_bad_parameter_names_the_key(changes, key):
    with pytest.raises(P.ParamError, match=key):
        config(**changes)


def test_unknown_and_missing_keys_are_named():
    with pytest.raises(P.ParamError, match="gpu_memory_utilisation"):
        config(gpu_memory_utilisation=0.5)
    values = load_profile(U.NOTEBOOK, "tiny")
    values.pop("results_dir", None)
    values.pop("steps")
    with pytest.raises(P.ParamError, match="steps"):
        P.build(U.Config, values)


def test_both_profiles_validate():
    for profile in ("tiny", "h200"):
        values = load_profile(U.NOTEBOOK, profile)
        values.pop("results_dir", None)
        assert P.build(U.Config, values).case in U.CASES


def test_every_case_patch_is_modelled_by_the_planner():
    for case in U.CASES.values():
        assert set(case.patches) <= set(U.PATCH_PLANNER_OPTION)


# ------------------------------------------------------------------------------------------- emulation

def test_vllm_asks_for_its_share_of_the_emulated_card():
    from rlkit.patches.instruments import emulate_card

    # What vLLM 0.24's request_memory computes, ceil(total * util), on the total the emulation reports.
    _, total = emulate_card.emulated_mem_info(100 * budget.GIB, int(139.8 * budget.GIB), int(47.4 * budget.GIB))
    for util in (0.4, 0.5, 0.6, 0.7):
        info = U.emulation_info(config(case="qwen3_4b_48g", gpu_memory_utilization=util))
        assert math.ceil(total * util) / budget.GIB == pytest.approx(info["vllm_requested_gib"], abs=1e-6)


def test_recipe_launches_the_utilization_unchanged_on_the_emulated_card():
    cfg = config(case="qwen3_4b_48g", gpu_memory_utilization=0.5)
    recipe = U.build_recipe(cfg)
    assert recipe.gpu_memory_utilization == 0.5 and recipe.emulate_gpu_gib == recipe.planner_gpu_gib == 47.4
    assert recipe.optimizer == "HostAdamW" and not recipe.optimizer_offload  # the first working arm of notebook 05
    assert "actor_rollout_ref.rollout.disable_log_stats=False" in recipe.extra_overrides
    assert "actor_rollout_ref.rollout.max_model_len=512" in recipe.extra_overrides  # prompt 256 + response 256
    assert "cpu_optimizer_step" in U.planner_spec(cfg).options


def test_planner_spec_is_the_emulated_card_with_the_cases_settings():
    cfg = config(case="doc_small", gpu_memory_utilization=0.4)
    spec = U.planner_spec(cfg)
    assert (spec.gpu_gib, spec.gpu_memory_utilization, spec.max_prompt_length, spec.max_response_length) == (80.0, 0.4, 256, 256)
    # 4 sequences x (the longest prompt verl logged for the data, 93 tokens, + 256): verl pads to the longest sequence
    assert spec.micro_batch_tokens == 4 * (93 + 256)
    assert U.planner_spec(config(case="qwen3_4b_48g")).offload_views  # the case's offload_views patch
    assert U.planner_spec(config(enforce_eager=True)).cudagraph_gib == 0.0
    rows = U.planner_sweep(cfg)
    assert [r["gpu_memory_utilization"] for r in rows] == list(cfg.sweep_utils)
    assert rows == sorted(rows, key=lambda r: r["kv_pool_gib"])  # more utilization, more KV pool


# ------------------------------------------------------------------------------------------- parsers

def test_vllm_startup_lines():
    v = verl_logs.parse_vllm_log(sections()["run_ok"])
    assert v["model_loading_gib"] == [1.38]
    assert v["kv_cache_gib"] == [28.91]
    assert v["kv_cache_tokens"] == [200064]
    assert v["max_concurrency"] == [{"max_model_len": 512, "concurrency": 390.75}]
    assert v["cuda_graphs"] == [{"seconds": 9.0, "gib": 0.87}]
    assert [s["generation_tok_s"] for s in v["stats"]] == [5230.9, 11840.2, 12010.7]
    assert v["stats"][0] == {"prompt_tok_s": 2170.4, "generation_tok_s": 5230.9, "running_reqs": 256,
                             "waiting_reqs": 0, "kv_cache_usage_pct": 37.5}
    assert v["sleeps"] == [{"pool_freed_gib": 30.74, "device_freed_gib": 31.41, "still_in_use_gib": 4.27},
                           {"pool_freed_gib": 30.74, "device_freed_gib": 35.11, "still_in_use_gib": 4.52}]
    v2 = verl_logs.parse_vllm_log(sections()["run_ok_model_runner_v2"])
    assert v2["model_loading_gib"] == [7.55] and v2["cuda_graphs"][0]["gib"] == 1.12
    assert v2["sleeps"] == []
    assert v2["max_concurrency"] == [{"max_model_len": 768, "concurrency": 76.04}]


def test_verl_memory_lines():
    rows = verl_logs.parse_verl_memory(sections()["run_ok"])
    assert rows == [{"label": "After FSDP", "allocated_gib": 3.06, "reserved_gib": 3.12, "device_used_gib": 4.21,
                     "device_total_gib": 139.8}]


@pytest.mark.parametrize("section, kind, phase", [
    ("update_oom", "torch_oom", "update_actor"),
    ("log_prob_oom", "torch_oom", "old_log_prob"),
    ("vllm_refuses", "vllm_startup", "init"),
])
def test_failures_are_found_and_placed(section, kind, phase):
    failure = verl_logs.find_failure(sections()[section])
    assert (failure["kind"], failure["phase"]) == (kind, phase)


def test_failure_details_and_clean_run():
    assert verl_logs.find_failure(sections()["update_oom"])["tried_to_allocate"] == "2.32 GiB"
    refused = verl_logs.find_failure(sections()["vllm_refuses"])
    assert (refused["free_gib"], refused["total_gib"], refused["requested_gib"]) == (123.08, 139.8, 125.82)
    assert verl_logs.find_failure(sections()["run_ok"]) is None


# ------------------------------------------------------------------------------------------- phase alignment

def test_phase_intervals_follow_verls_step_order():
    steps = [{"step": 2, "timing_s/gen": 10.0, "timing_s/reward": 1.0, "timing_s/old_log_prob": 4.0,
              "timing_s/adv": 1.0, "timing_s/update_actor": 8.0, "timing_s/update_weights": 2.0, "timing_s/step": 32.0}]
    got = {(iv["phase"]): (iv["start"], iv["end"]) for iv in U.phase_intervals(steps, {2: 100.0})}
    # laid backward from the logged end; gen takes the step's start and its untimed 6 s
    assert got == {"gen": (68.0, 84.0), "reward": (84.0, 85.0), "old_log_prob": (85.0, 89.0), "adv": (89.0, 90.0),
                   "update_actor": (90.0, 98.0), "update_weights": (98.0, 100.0), "step": (68.0, 100.0)}
    samples = [(t, [float(t)]) for t in (1, 10, 70, 83, 86, 95, 99, 120)]
    labels = [(r["phase"], r["step"]) for r in U.label_samples(samples, U.phase_intervals(steps, {2: 100.0}), 5.0)]
    assert labels == [("idle", None), ("init", None), ("gen", 2), ("gen", 2), ("old_log_prob", 2),
                      ("update_actor", 2), ("update_weights", 2), ("shutdown", None)]


def test_phase_intervals_with_a_missing_phase_timer_leave_no_gap_before_it():
    steps = [{"step": 1, "timing_s/gen": 5.0, "timing_s/update_actor": 8.0, "timing_s/step": 20.0}]
    got = {(iv["phase"]): (iv["start"], iv["end"]) for iv in U.phase_intervals(steps, {1: 50.0})}
    assert got == {"gen": (30.0, 42.0), "update_actor": (42.0, 50.0), "step": (30.0, 50.0)}


def synthetic_samples_and_marks():
    """A SYNTHETIC 1 Hz trace (not a measurement) placed on the fixture's run_ok steps:
    step 1 logged at t=60 (40 s long), step 2 at t=100 (32 s): idle 2 GiB, then a level per phase."""
    level = {"idle": 2.0, "init": 20.0, "gen": 40.0, "reward": 12.0, "old_log_prob": 14.0, "adv": 12.0,
             "update_actor": 17.0, "update_weights": 13.0, "other": 12.0, "shutdown": 2.0}
    marks = [(3.0, "launch"), (60.0, "logged:step1"), (100.0, "logged:step2")]
    text = sections()["run_ok"]
    intervals = U.phase_intervals(verl_logs.parse_console_metrics(text), {1: 60.0, 2: 100.0})
    rows = U.label_samples([(float(t), [0.0]) for t in range(110)], intervals, 3.0)
    samples = [(r["t"], [level[r["phase"]]]) for r in rows]
    return text, samples, marks


def test_measure_from_logs_on_the_fixture():
    text, samples, marks = synthetic_samples_and_marks()
    case = U.CASES["doc_small"]
    m = U.measure_from_logs(verl_logs.parse_console_metrics(text), text, samples, marks, case, wall_s=107.0, returncode=0)
    assert m["steps_logged"] == 2 and m["baseline_used_gib"] == 2.0
    assert m["step_s"] == 32.0  # steps 2.. averaged
    assert m["rollout_samples_per_s"] == case.samples_per_step / 10.0
    assert m["vllm_generation_tok_s_peak"] == 12010.7
    assert m["verl_memory"] == {"max_memory_allocated_gb": 9.75, "max_memory_reserved_gb": 10.5}
    assert m["phase_peaks"]["gen"]["peak_job_gib"] == 38.0
    assert m["phase_peaks"]["update_actor"]["peak_job_gib"] == 15.0
    assert m["phase_peaks"]["update_actor"]["by_step"] == {"1": 17.0, "2": 17.0}
    assert m["failure"] is None and m["update_oom"] is False


# ------------------------------------------------------------------------------------------- planner vs measured

def saved_sweep(tmp_path: Path) -> Path:
    """A results folder of two measured points built from the fixture log and the synthetic trace."""
    text, samples, marks = synthetic_samples_and_marks()
    for util in (0.4, 0.6):
        cfg = config(case="doc_small", gpu_memory_utilization=util)
        measured = U.measure_from_logs(verl_logs.parse_console_metrics(text), text, samples, marks, cfg.case_spec, wall_s=107.0, returncode=0)
        metrics = U.point_metrics(cfg, U.emulation_info(cfg), measured, "test fixture")
        write_json_atomic(tmp_path / f"doc_small-u{util}" / "metrics.json", metrics)
        write_json_atomic(tmp_path / f"doc_small-u{util}" / "env.json", {})  # every run records where it ran
    return tmp_path


def test_planner_vs_measured_table_on_saved_results(tmp_path):
    runs = U.runs_of(U.read_results(saved_sweep(tmp_path)))
    assert [(r["case"]["name"], r["config"]["gpu_memory_utilization"], r["tag"]) for r in runs] == [
        ("doc_small", 0.4, "doc_small-u0.4"), ("doc_small", 0.6, "doc_small-u0.6")]
    table = U.comparison_table(runs)
    for run in runs:
        plan = verdict.plan(U.planner_spec(P.build(U.Config, run["config"]))).as_dict()
        rows = {r["quantity"]: r for r in table if r["util"] == run["config"]["gpu_memory_utilization"]}
        assert rows["kv_pool_gib"]["planner"] == pytest.approx(plan["kv_pool_gib"])
        assert rows["kv_pool_gib"]["ratio"] == pytest.approx(28.91 / plan["kv_pool_gib"])
        assert rows["max_concurrent_seqs"]["ratio"] == pytest.approx(390.75 / plan["max_concurrent_seqs"])
        graphs = vllm_terms.cuda_graphs_term(run["case"]["model"])["gib"]  # vLLM's own measurement, committed
        assert rows["cuda_graphs_gib"]["planner"] == graphs and rows["cuda_graphs_gib"]["ratio"] == pytest.approx(0.87 / graphs)
        expected_update = max(plan["device_total_gib"]["update_fwd_bwd"], plan["device_total_gib"]["optimizer_step"])
        assert rows["peak_update_actor_gib"]["ratio"] == pytest.approx(15.0 / expected_update)
        for row in rows.values():
            assert row["off_by_more_than_10pct"] == (abs(row["ratio"] - 1) > 0.10)
    kv_ratios = [r["ratio"] for r in table if r["quantity"] == "kv_pool_gib"]
    assert kv_ratios[0] > kv_ratios[1]  # same measured pool, larger planned pool at 0.6


def test_sweep_rows_cost_and_oom_summary(tmp_path):
    runs = U.runs_of(U.read_results(saved_sweep(tmp_path)))
    row = U.sweep_rows(runs)[0]
    assert (row["kv_pool_gib"], row["max_concurrency"], row["step_s"]) == (28.91, 390.75, 32.0)
    assert row["peak_gen_gib"] == 38.0 and row["failure"] is None
    # the fixture's rollout took 10 s by verl's clock, which polls every 2 s: it may have ended at 8 s
    assert (row["gen_s"], row["rollout_samples_per_s"]) == (10.0, 25.6)
    assert row["rollout_samples_per_s_upper"] == pytest.approx(256 / 8.0)
    cost = runs[0]["cost"]
    assert cost["steady_state_usd_per_million_samples"] == pytest.approx(2.5 * (32.0 / 3600) / (256 / 1e6))
    assert cost["whole_job_usd_per_million_samples"] == pytest.approx(2.5 * (107.0 / 3600) / (512 / 1e6))
    assert U.first_update_oom(runs) == {"doc_small": {"observed": None, "inferred": None, "measured_runs": 2}}
    assert runs[0]["emulated_verdict"]["verdict"] == "fits the emulated card"
    text = U.describe(runs)
    assert "doc_small at util 0.4 of an emulated 80.0 GiB card" in text and "rollout samples/s" in text


def test_unmeasured_point_has_planner_numbers_and_no_measurement():
    cfg = config(case="qwen3_4b_48g")
    m = U.point_metrics(cfg, U.emulation_info(cfg), None, "no GPU: not measured")
    assert m["measured"] is None and m["cost"] is None and m["emulated_verdict"] is None
    assert all(r["measured"] is None and r["ratio"] is None and r["planner"] is not None for r in m["comparison"])
    assert U.sweep_rows([m])[0]["measured"] is False


def test_a_real_oom_is_the_first_update_oom(tmp_path):
    cfg = config(case="qwen3_4b_48g", gpu_memory_utilization=0.5)
    measured = U.measure_from_logs(verl_logs.parse_console_metrics(sections()["update_oom"]), sections()["update_oom"], [], [(0.0, "launch")], cfg.case_spec, 200.0, 1)
    assert measured["update_oom"] is True
    run = U.point_metrics(cfg, U.emulation_info(cfg), measured, "test fixture")
    assert U.first_update_oom([run])["qwen3_4b_48g"]["observed"] == 0.5


# ------------------------------------------------------------------------------------------- notebook

def test_notebook_parameters_are_the_config_fields():
    from rlkit.tools import run as R

    path = NBS_DIR / f"{U.NOTEBOOK}.ipynb"
    declared = R.declared_parameters(path)
    assert set(declared) == set(P.field_names(U.Config)) | {"results_dir"}
    nb = nbformat.read(path, as_version=4)
    assert not [c for c in nb.cells if c.cell_type == "code" and (c.outputs or c.execution_count)]
    source = "\n".join(c.source for c in nb.cells)
    assert "notebook_out_dir(\"06_util_sweep\", reading=results_dir)" in source and "metrics.json" in source


@pytest.mark.verl
def test_run_on_cpu_validates_the_launch_and_measures_nothing(tmp_path):
    """The tiny point end to end on CPU: verl 0.9.1's own config accepts the sweep's overrides; no GPU,
    so nothing is measured and the reason says so."""
    metrics = U.run(config(), out_dir=tmp_path)
    assert set(U.METRICS_KEYS) <= set(metrics)
    assert metrics["launched"] is False and metrics["measured"] is None
    assert metrics["launch_reason"].startswith("verl launch skipped: 0 CUDA GPU(s) visible")
    assert "actor_rollout_ref.rollout.disable_log_stats=False" in metrics["overrides"]
    assert f"actor_rollout_ref.rollout.gpu_memory_utilization={metrics['emulation']['gpu_memory_utilization']}" \
        in metrics["overrides"]  # launched unchanged: the emulated card gives it its meaning
    assert "actor_rollout_ref.rollout" in metrics["verify"]["validated_sections"]


# ------------------------------------------------------------------------------------------- launch plumbing

REPLAY = r"""
import json, os, sys, time
from rlkit.verl.logs import parse_console_metrics
lines = open(sys.argv[1]).read().splitlines()
metrics = open(os.environ["VERL_FILE_LOGGER_PATH"], "w")  # as verl's FileLogger: one record per logged step
for line in lines:
    print(line, flush=True)
    for record in parse_console_metrics(line):
        step = record.pop("step")
        metrics.write(json.dumps({"step": step, "data": {**record, "replayed": True}}) + "\n")
        metrics.flush()
    if "step:" in line:
        time.sleep(0.3)
record_dir = os.environ["RLKIT_RECORD_DIR"]
with open(os.path.join(record_dir, f"{os.getpid()}.json"), "w") as f:
    json.dump({"pid": os.getpid(), "role": "ray_worker", "applied": [], "error": None}, f)
time.sleep(float(sys.argv[2]))
sys.exit(int(sys.argv[3]))
"""


def replay_instead_of_verl(tmp_path, monkeypatch, section: str, sleep_s: float = 0.0, exit_code: int = 0) -> None:
    """The verl command becomes a child replaying a fixture section; the GPU reader a constant 2 GiB."""
    import sys

    from rlkit.measure import samplers as measure

    log = tmp_path / "section.log"
    log.write_text(sections()[section])
    monkeypatch.setattr(verl_job, "command", lambda overrides: [sys.executable, "-c", REPLAY, str(log), str(sleep_s),
                                                            str(exit_code)])
    monkeypatch.setattr(measure, "gpu_memory_reader", lambda: ((lambda: [2.0]), "constant"))


def replayed_launch(tmp_path, monkeypatch, section: str, sleep_s: float = 0.0, exit_code: int = 0, timeout_s: int = 30):
    """The launch with the verl job replaced by a child replaying a fixture section and the GPU reader by a
    constant 2 GiB. Checks the plumbing (log capture, step marks on the sampler's clock, idle baseline,
    release wait, success/failure handling), not any measurement."""
    replay_instead_of_verl(tmp_path, monkeypatch, section, sleep_s, exit_code)
    cfg = config(case="doc_small", sample_interval_s=0.05, timeout_s=timeout_s)
    recipe = U.build_recipe(cfg)
    return U.launch_measured(recipe, ["x=1"], tmp_path, cfg)


def test_launch_plumbing_marks_steps_and_reads_the_log(tmp_path, monkeypatch):
    m = replayed_launch(tmp_path, monkeypatch, "run_ok")
    assert m["returncode"] == 0 and m["steps_logged"] == 2 and m["failure"] is None
    assert m["baseline_used_gib"] == 2.0 and m["device_released_after_s"] is not None
    steps = [iv for iv in m["phase_intervals"] if iv["phase"] == "step"]
    assert [iv["step"] for iv in steps] == [1, 2] and steps[0]["end"] < steps[1]["end"]
    assert m["vllm"]["kv_cache_gib"] == [28.91]
    assert Path(m["log_path"]).read_text() == sections()["run_ok"]
    assert m["sampler"]["source"] == "constant" and len(m["plugin_records"]) == 1


def test_launch_plumbing_returns_an_oom_as_a_result(tmp_path, monkeypatch):
    m = replayed_launch(tmp_path, monkeypatch, "update_oom", exit_code=1)
    assert m["returncode"] == 1 and m["update_oom"] is True


def test_launch_plumbing_timeout_raises(tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match="timeout"):
        replayed_launch(tmp_path, monkeypatch, "run_ok_model_runner_v2", sleep_s=60, timeout_s=1)


def test_isolated_input_preparation_matches_in_process():
    recipe = U.build_recipe(config())
    assert recipe_module.prepare_inputs_isolated(recipe) == recipe_module.prepare_inputs(recipe)


def _replayed_recipe_launch(tmp_path, monkeypatch, section: str, exit_code: int, **changes):
    """rlkit.experiments.grpo.launch_verl with the verl job replaced by the fixture replay (plumbing only)."""
    replay_instead_of_verl(tmp_path, monkeypatch, section, exit_code=exit_code)
    monkeypatch.setattr(verl_job, "gpu_count", lambda: 1)
    recipe = recipe_module.GRPORecipe(model="tiny", n_gpus=1, steps=2, timeout_s=30, **changes)
    return grpo.launch_verl(recipe, ["x=1"], tmp_path)


def test_recipe_launch_records_the_expected_stock_failure(tmp_path, monkeypatch):
    result = _replayed_recipe_launch(tmp_path, monkeypatch, "vllm_refuses", exit_code=1, expect_failure=True)
    assert result["failure"]["kind"] == "vllm_startup" and result["returncode"] == 1
    assert result["gpu_memory"]["peak_used_gib"] == [2.0] and result["gpu_memory"]["timeline"]


def test_recipe_launch_returns_an_unexpected_oom_as_the_arms_result(tmp_path, monkeypatch):
    result = _replayed_recipe_launch(tmp_path, monkeypatch, "update_oom", exit_code=1)
    assert result["failure"]["kind"] == "torch_oom"
    metrics = {"launched": True, "recipe": {"steps": 2, "expect_failure": False}, "launch": result, "steps": []}
    assert grpo_runs.outcome(metrics).startswith("torch_oom in ") and "expected" not in grpo_runs.outcome(metrics)


def test_recipe_launch_raises_on_a_crash_that_is_not_a_memory_failure(tmp_path, monkeypatch):
    with pytest.raises(RuntimeError, match="verl exited with 1"):
        _replayed_recipe_launch(tmp_path, monkeypatch, "run_ok", exit_code=1)


def test_recipe_launch_success_reads_steps_and_records(tmp_path, monkeypatch):
    result = _replayed_recipe_launch(tmp_path, monkeypatch, "run_ok", exit_code=0)
    assert len(result["steps"]) >= 2 and result["failure"] is None and result["rank_identity"] == []
    # the steps come from the file logger the launch pointed into the run folder, not from the console
    assert result["metrics_source"] == "verl_metrics.jsonl" and all(s.get("replayed") for s in result["steps"])
    assert len(result["plugin_records"]) == 1


def test_session_members_finds_every_process_of_a_launched_session():
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"],
                            start_new_session=True)
    try:
        deadline = time.time() + 10
        while len(verl_job.session_members(proc.pid)) < 2 and time.time() < deadline:
            time.sleep(0.1)
        members = verl_job.session_members(proc.pid)
        assert proc.pid in members and len(members) == 2
    finally:
        verl_job.stop_session(proc)
    deadline = time.time() + 10
    while verl_job.session_members(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    assert verl_job.session_members(proc.pid) == []  # the grandchild went too


def test_run_in_own_session_logs_every_line_and_stops_the_session_on_timeout(tmp_path):
    import os
    import sys
    import time

    script = ("import subprocess, sys, time; "
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "print(f'grandchild {child.pid}', flush=True); print('step:1 - a', flush=True); time.sleep(60)")
    seen = []
    returncode, wall = verl_job.run_in_own_session([sys.executable, "-c", script], env=None, cwd=tmp_path,
                                               log_path=tmp_path / "verl.log", timeout_s=3, on_line=seen.append)
    assert returncode == "timeout" and wall >= 3  # the 3-s limit ended it (no upper bound: a loaded machine is slow)
    assert seen[1:] == ["step:1 - a\n"] and (tmp_path / "verl.log").read_text() == "".join(seen)
    grandchild = int(seen[0].split()[1])
    deadline = time.time() + 10
    while os.path.exists(f"/proc/{grandchild}") and time.time() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{grandchild}")  # verl's own children (Ray, vLLM) go with the session


def test_stop_running_sessions_ends_the_sessions_waited_on_in_other_threads(tmp_path):
    """What an interrupted caller of side-by-side runs does (rlkit.experiments.learning_runs): every session in flight is
    stopped, and the thread waiting on it returns with the session's exit code, not at its time limit."""
    import sys
    import threading
    import time

    result = {}
    waiter = threading.Thread(target=lambda: result.update(rc=verl_job.run_in_own_session(
        [sys.executable, "-c", "import time; time.sleep(600)"], env=None, cwd=tmp_path, log_path=tmp_path / "verl.log",
        timeout_s=600)[0]))
    waiter.start()
    deadline = time.time() + 10
    while not verl_job._RUNNING and time.time() < deadline:
        time.sleep(0.05)
    assert len(verl_job._RUNNING) == 1
    verl_job.stop_running_sessions()
    waiter.join(timeout=60)
    assert not waiter.is_alive() and result["rc"] != "timeout" and result["rc"] != 0
    assert not verl_job._RUNNING


# ------------------------------------------------------------------------------------------- analysing saved runs again

def test_reanalyze_rebuilds_the_same_labels_from_a_run_saved_without_marks(tmp_path):
    folder = saved_sweep(tmp_path) / "doc_small-u0.4"
    (folder / "verl.log").write_text(sections()["run_ok"])
    saved = read_metrics(folder)
    before = [(r["t"], r["phase"], r["step"]) for r in saved["measured"]["timeline"]]
    del saved["measured"]["marks"]  # runs of the first sweep predate stored marks
    write_json_atomic(folder / "metrics.json", saved)
    again = U.reanalyze(folder)
    assert [(r["t"], r["phase"], r["step"]) for r in again["measured"]["timeline"]] == before
    assert again["measured"]["phase_peaks"] == saved["measured"]["phase_peaks"]
    assert read_metrics(folder)["analysis"]["history"][-1]["at"] == again["analysis"]["history"][-1]["at"]
    assert saved["comparison"] and again["analysis"]["history"][-1]["replaced_comparison"] == saved["comparison"]
    assert U.main(["reanalyze", str(folder)]) == 0 and len(read_metrics(folder)["analysis"]["history"]) == 2


def test_reanalyze_needs_a_measurement_and_its_log(tmp_path):
    folder = saved_sweep(tmp_path) / "doc_small-u0.6"
    with pytest.raises(FileNotFoundError, match="verl.log"):
        U.reanalyze(folder)
    cfg = config(case="doc_small")
    write_json_atomic(tmp_path / "cpu" / "metrics.json", U.point_metrics(cfg, U.emulation_info(cfg), None, "no GPU"))
    with pytest.raises(ValueError, match="no measurement"):
        U.reanalyze(tmp_path / "cpu")
    assert U.main(["reanalyze"]) == 2


def test_a_phase_seen_by_too_few_samples_is_shown_but_not_compared(tmp_path):
    runs = U.runs_of(U.read_results(saved_sweep(tmp_path)))
    measured = runs[0]["measured"]
    measured["phase_peaks"]["update_weights"] = {"peak_used_gib": 30.0, "peak_job_gib": 28.0, "samples": 2, "by_step": {}}
    rows = {r["quantity"]: r for r in U.comparison_rows(runs[0]["planner"], measured, U.CASES["doc_small"])}
    assert rows["peak_update_weights_gib"]["measured"] == 28.0 and rows["peak_update_weights_gib"]["ratio"] is None
    assert "too short" in rows["peak_update_weights_gib"]["measured_source"]
    actor = rows["peak_update_actor_gib"]
    assert actor["ratio"] == pytest.approx(actor["measured"] / actor["planner"], rel=1e-12)  # enough samples: compared


def _update_measured(device_peak: float, allocated: float, reserved: float) -> dict:
    return {"phase_peaks": {"update_actor": {"peak_job_gib": device_peak, "samples": 30, "by_step": {}}},
            "verl_memory": {"max_memory_allocated_gb": allocated, "max_memory_reserved_gb": reserved}}


def test_the_update_is_judged_without_the_actors_allocator_cache():
    plan = verdict.plan(U.planner_spec(config(case="qwen3_4b_48g"))).as_dict()
    cached = U.emulated_verdict(_update_measured(50.0, 40.0, 47.4), 47.4, plan)
    assert cached["update_fits"] is True and cached["phases_over"] == {"update_actor": 50.0}
    b = cached["update_breakdown"]
    assert b["allocator_cache_gib"] == pytest.approx(7.4) and b["rest_gib"] == pytest.approx(2.6)
    assert b["needed_without_cache_gib"] == pytest.approx(42.6) and cached["verdict"].startswith("fits the emulated card without")
    needs_more = U.emulated_verdict(_update_measured(50.0, 46.0, 47.4), 47.4, plan)
    assert needs_more["update_fits"] is False and needs_more["verdict"] == "exceeds the emulated card in update_actor"
    assert U.emulated_verdict(_update_measured(50.0, 40.0, 47.4), 47.4)["verdict"] == "exceeds the emulated card in update_actor"


def test_answer_lines_come_from_the_runs(tmp_path):
    runs = U.runs_of(U.read_results(saved_sweep(tmp_path)))
    lines = U.answer_lines(runs)
    rows = [line for line in lines if line.startswith("| doc_small |")]
    assert len(rows) == 2 and rows[0].startswith("| doc_small | 0.4 | 28.91 | 391 |")
    sentence = next(line for line in lines if line.startswith("- doc_small"))
    assert "0.5, 0.7 not measured" in sentence and "stays at 15.00 GiB" in sentence and "no update OOM" in sentence
    assert U.answer_lines([]) == ["*No measured runs (no GPU): nothing to answer from.*"]
    assert "rollout 10.00 s, which verl counts in 2-s polls" in sentence
    moved = [dict(r, measured=dict(r["measured"], phase_peaks=dict(r["measured"]["phase_peaks"]))) for r in runs]
    moved[1]["measured"]["phase_peaks"]["update_actor"] = {"peak_job_gib": 21.0, "samples": 30, "by_step": {}}
    others_sentence = next(line for line in U.answer_lines(moved) if line.startswith("- doc_small"))
    assert ("the actor's update does not move with util (allocated peak 9.75 GiB at every point" in others_sentence
            and "update peak is 15.00-21.00 GiB, highest at 0.6 and lowest at 0.4" in others_sentence)
    moved[1]["measured"]["verl_memory"] = {"max_memory_allocated_gb": 15.0, "max_memory_reserved_gb": 16.0}
    moved_sentence = next(line for line in U.answer_lines(moved) if line.startswith("- doc_small"))
    assert "goes from 15.00 GiB at 0.4 to 21.00 GiB at 0.6" in moved_sentence


def test_vllm_memory_outside_its_sleep_pool_is_split_from_the_rollout(tmp_path):
    runs = U.runs_of(U.read_results(saved_sweep(tmp_path)))
    m = runs[0]["measured"]
    # the fixture's second sleep follows step 1's rollout: 35.11 GiB freed on the device, 30.74 from the pool
    assert U.vllm_outside_pool_by_step(m) == {"1": pytest.approx(35.11 - 30.74)}
    gap = U.gap_rows(runs)[0]
    rollout1 = m["phase_peaks"]["gen"]["by_step"]["1"] - m["baseline_used_gib"]
    assert gap["vllm_outside_pool_step1_gib"] == pytest.approx(4.37)
    assert gap["rollout_step1_ratio_without_outside_pool"] == pytest.approx((rollout1 - 4.37) / gap["planner_rollout_gib"])
    assert "rollout_step2_ratio_without_outside_pool" not in gap  # no sleep line after step 2 in the fixture
    line = next(line for line in U.answer_lines(runs) if line.startswith("- Rollout:"))
    assert "doc_small: after step 1's rollout 4.37 GiB" in line
    assert U.vllm_outside_pool_by_step({"vllm": {"sleeps": []}}) == {}


def test_phases_are_split_by_holder_from_per_process_samples():
    measured = {"process_phase_peaks": {"old_log_prob": {"ray::WorkerDict.actor_rollout_init_model [7]": 37.0,
                                                         "VLLM::Worker [9]": 1.5, "python3 [3]": 0.4}}}
    assert U.process_phase_peak(measured, "old_log_prob", "actor") == 37.0
    assert U.process_phase_peak(measured, "old_log_prob", "vllm") == 1.5
    assert U.process_phase_peak(measured, "update_actor", "actor") is None
    assert U.process_phase_peak({}, "old_log_prob", "actor") is None


def test_per_process_samples_are_cut_by_phase_and_kept_for_reanalysis(tmp_path):
    text, samples, marks = synthetic_samples_and_marks()
    # SYNTHETIC per-process samples (not a measurement): vLLM's worker holds 30 GiB while the trace says gen, else 2
    phases = {r["t"]: r["phase"] for r in U.measure_from_logs(verl_logs.parse_console_metrics(text), text, samples, marks, U.CASES["doc_small"], 107.0, 0)["timeline"]}
    held = [(t, [[11, 30.0 if phases[t] == "gen" else 2.0, "VLLM::Worker"], [22, 9.0, "ray::WorkerDict"]]) for t, _ in samples]
    m = U.measure_from_logs(verl_logs.parse_console_metrics(text), text, samples, marks, U.CASES["doc_small"], 107.0, 0, held)
    assert m["process_phase_peaks"]["gen"] == {"VLLM::Worker [11]": 30.0, "ray::WorkerDict [22]": 9.0}
    assert m["process_phase_peaks"]["update_actor"]["VLLM::Worker [11]"] == 2.0
    cfg = config(case="doc_small", gpu_memory_utilization=0.4)
    folder = tmp_path / "doc_small-u0.4"
    write_json_atomic(folder / "metrics.json", U.point_metrics(cfg, U.emulation_info(cfg), m, "test fixture"))
    (folder / "verl.log").write_text(text)
    again = U.reanalyze(folder)
    assert again["measured"]["process_phase_peaks"] == m["process_phase_peaks"]
    rows = U.process_rows([again])
    assert {"phase": "gen", "process": "VLLM::Worker [11]", "peak_gib": 30.0}.items() <= rows[0].items()


# ------------------------------------------------------------------------------------------- old_log_prob's own peaks

COMMITTED = Path(__file__).resolve().parents[1] / "outputs" / U.NOTEBOOK


def _committed_points() -> list[Path]:
    return sorted(p.parent for p in COMMITTED.glob("*/metrics.json") if read_metrics(p.parent).get("measured"))


def test_committed_points_compare_exactly_as_before_without_the_instruments_record():
    """Every committed point predates rlkit.patches.instruments.old_log_prob_memory: its comparison rows, recomputed
    from its saved planner and measurement, are the committed ones, and its gap row has no old_log_prob split."""
    points = _committed_points()
    assert len(points) >= 8
    for folder in points:
        m = read_metrics(folder)
        assert "old_log_prob_memory" not in m["measured"]
        assert U.comparison_rows(m["planner"], m["measured"], P.build(U.Config, m["config"]).case_spec) == m["comparison"]
        (gap,) = U.gap_rows([m])
        assert not any(k.startswith("log_prob_actor_") and k != "log_prob_actor_process_gib" for k in gap)


def test_a_committed_point_analysed_again_reads_no_record_from_its_log(tmp_path):
    """The whole re-analysis, from verl.log, of the point the lab notes name (qwen3_4b_48g at util 0.5): the same
    comparison and the same measured keys."""
    import shutil

    src = COMMITTED / "qwen3_4b_48g-u0.5"
    folder = tmp_path / src.name
    shutil.copytree(src, folder)
    before = read_metrics(src)
    again = U.reanalyze(folder)
    assert again["comparison"] == before["comparison"] and again["measured"].keys() == before["measured"].keys()


def test_the_instruments_peaks_add_a_row_and_split_old_log_prob_when_present():
    """SYNTHETIC record (not a measurement) on the committed util-0.5 point: the compared rows gain the actor's
    old_log_prob allocated peak, the rest unchanged; the gap row splits the process peak into allocated, the
    allocator's cache and memory outside torch."""
    m = read_metrics(COMMITTED / "qwen3_4b_48g-u0.5")
    case = P.build(U.Config, m["config"]).case_spec
    record = {"max_allocated_gib": 30.0, "max_reserved_gib": 35.0, "allocated_at_entry_gib": 1.0,
              "reserved_at_entry_gib": 2.0}
    measured = {**m["measured"], "old_log_prob_memory": record}
    rows = U.comparison_rows(m["planner"], measured, case)
    assert rows[:-1] == m["comparison"]
    planner_actor = sum(v for c, v in m["planner"]["device_gib"]["log_prob"].items()
                        if c in budget.ACTOR_ALLOCATED_COMPONENTS)
    assert rows[-1]["quantity"] == "old_log_prob_actor_allocated_gib" and rows[-1]["measured"] == 30.0
    assert rows[-1]["planner"] == planner_actor and rows[-1]["ratio"] == pytest.approx(30.0 / planner_actor)
    (gap,) = U.gap_rows([{**m, "measured": measured}])
    process = U.process_phase_peak(measured, "old_log_prob", "actor")
    assert (gap["log_prob_actor_allocated_gib"], gap["log_prob_actor_reserved_gib"]) == (30.0, 35.0)
    assert gap["log_prob_allocator_cache_gib"] == 5.0
    assert gap["log_prob_actor_non_torch_gib"] == pytest.approx(process - 35.0)
    assert gap["planner_log_prob_actor_allocated_gib"] == planner_actor


def test_measure_from_logs_keeps_the_largest_record_of_the_steps():
    from rlkit.patches.instruments import old_log_prob_memory as olp

    text, samples, marks = synthetic_samples_and_marks()
    steps = verl_logs.parse_console_metrics(text)
    plain = U.measure_from_logs(steps, text, samples, marks, U.CASES["doc_small"], 107.0, 0)
    assert "old_log_prob_memory" not in plain
    for value, step in zip((4.0, 5.5), verl_logs.training_steps(steps)):
        step.update({key: value for key in olp.LOGGED_KEYS})
    m = U.measure_from_logs(steps, text, samples, marks, U.CASES["doc_small"], 107.0, 0)
    assert m["old_log_prob_memory"] == {"max_allocated_gib": 5.5, "max_reserved_gib": 5.5,
                                        "allocated_at_entry_gib": 5.5, "reserved_at_entry_gib": 5.5}
