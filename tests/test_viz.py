"""rlkit.viz explorers without a browser: the draw callbacks are plain functions, every control changes what is
drawn, figures are redrawn in place, and notebook 00's export is a recipe that round-trips to the same plan."""
from __future__ import annotations

import json
import shlex
from dataclasses import asdict

import pytest

from rlkit.core import params as P
from rlkit.core.env import REPO_ROOT
from rlkit.core.results import load_profile
from rlkit.experiments import phase_budget
from rlkit.planning import budget, verdict
from rlkit.viz import arms as VA
from rlkit.viz import budget as VB
from rlkit.viz import pick as VP
from rlkit.viz import sweep as VS
from rlkit.viz.explorer import View

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")


@pytest.fixture(scope="module")
def cfg():
    return P.build(phase_budget.Config, load_profile("00_phase_budget", "tiny"), where="test")


@pytest.fixture(scope="module")
def budget_explorer(cfg):
    return VB.budget_explorer(cfg)


def changed(explorer, name, value, before=None):
    """Set control ``name`` to ``value`` (as a browser would: the widget's value) and return what changed."""
    before = before if before is not None else explorer.drawn()
    assert explorer.controls[name].value != value, f"{name}: already {value!r}"
    explorer.controls[name].value = value
    after = explorer.drawn()
    return [k for k in after if after[k] != before[k]]


def reset(explorer, state):
    for name, value in state.items():
        explorer.controls[name].value = value


# --- notebook 00: the phase-budget explorer ------------------------------------------------------------------

# For each control: (other controls set first so that this one matters, the new value). The switches start from
# the notebook's largest option set; the host step's modes need the host step, verl's optimizer offload only
# matters without it, the host step itself is switched with its modes off, and param offload without the host master.
BUDGET_MOVES = {
    "model": ({}, "qwen2.5-7b"),
    "gpu_gib": ({}, 80.0),
    "n_gpus": ({}, 4),
    "gpu_memory_utilization": ({}, 0.6),
    "max_prompt_length": ({}, 1024),
    "max_response_length": ({}, 4096),
    "train_batch_size": ({}, 16),
    "group_size": ({}, 4),
    "micro_batch_tokens": ({}, 8192),
    "lora_rank": ({}, 16),
    "logits_path": ({}, "torch_fp32"),
    "gradient_checkpointing": ({}, False),
    "param_offload": ({"master_on_host": False}, False),  # the host master stays on the host either way
    "optimizer_offload": ({"rank0_owner": False, "master_on_host": False, "cpu_optimizer_step": False}, False),
    "offload_views": ({}, False),
    "cpu_optimizer_step": ({"rank0_owner": False, "master_on_host": False}, False),
    "rank0_owner": ({}, False),
    "master_on_host": ({}, False),
    "cast_once": ({}, False),
    "skip_old_logprob": ({}, False),
    "compiled_pointwise": ({}, True),
}


def test_budget_moves_cover_every_control(budget_explorer):
    assert set(BUDGET_MOVES) == set(budget_explorer.controls)


@pytest.mark.parametrize("name", list(BUDGET_MOVES))
def test_every_budget_control_changes_the_drawing(budget_explorer, name):
    start = budget_explorer.state()
    first, value = BUDGET_MOVES[name]
    try:
        reset(budget_explorer, first)
        bars = budget_explorer.figures["bars"]
        what = changed(budget_explorer, name, value)
        assert what, f"moving {name} to {value!r} changed nothing drawn"
        assert "not a valid setting" not in budget_explorer.texts["verdict"].value, budget_explorer.texts["verdict"].value
        assert budget_explorer.figures["bars"] is bars, "the figure widget must be redrawn in place, not replaced"
        if name != "rank0_owner":  # rank-0 ownership moves host memory only: the verdict's host line
            assert "figure:bars" in what, f"{name}: the bars did not change ({what})"
        assert {"text:verdict", "text:export"} & set(what), f"{name}: neither the verdict nor the export changed"
    finally:
        reset(budget_explorer, start)


def test_budget_widget_shows_what_draw_returns(budget_explorer, cfg):
    from rlkit.viz.explorer import figure_state

    budget_explorer.controls["gpu_memory_utilization"].value = 0.7
    try:
        view = VB.draw(budget_explorer.state(), cfg.spec(max(cfg.option_sets, key=len)))
        assert isinstance(view, View)
        assert budget_explorer.drawn()["text:verdict"] == view.texts["verdict"]
        assert figure_state(budget_explorer.figures["bars"]) == figure_state(view.figures["bars"])
    finally:
        budget_explorer.controls["gpu_memory_utilization"].value = cfg.gpu_memory_utilization


def test_budget_draw_is_plain_and_says_what_is_wrong(cfg):
    state = VB.state_from_spec(cfg.spec(""))
    view = VB.draw(state, cfg.spec(""))
    assert set(view.figures) == {"bars"} and set(view.texts) == {"verdict", "kv", "preflight", "export"}
    p = verdict.plan(VB.spec_from_state(state, cfg.spec("")))
    assert p.verdict in view.texts["verdict"] and str(p.max_concurrent_seqs) in view.texts["kv"]
    bad = VB.draw({**state, "rank0_owner": True}, cfg.spec(""))  # a mode of the host step, without it
    assert "not a valid setting" in bad.texts["verdict"] and "rank0_owner" in bad.texts["verdict"]
    assert set(bad.figures) == {"bars"}


def test_budget_bars_are_the_plan(cfg):
    spec = cfg.spec("offload_views")
    state = VB.state_from_spec(spec)
    fig = VB.draw(state, spec).figures["bars"]
    p = verdict.plan(VB.spec_from_state(state, spec))
    stacked = {t.name: list(t.y) for t in fig.data if t.name in budget.DEVICE_COMPONENTS}
    for i, ph in enumerate(p.device_gib):
        assert sum(ys[i] for ys in stacked.values()) == pytest.approx(p.device_total_gib[ph])
    kv = next(t for t in fig.data if t.name == "concurrency")
    assert list(kv.y) == [p.max_concurrent_seqs, p.seqs_per_gpu]


@pytest.mark.parametrize("options", ["", ("offload_views,cpu_optimizer_step,rank0_owner,master_on_host,cast_once,"
                                          "skip_old_logprob")])
def test_budget_export_round_trips_to_the_same_plan(cfg, options, capsys):
    """The exported `-p` lines build the same GRPORecipe, `rlkit grpo render` accepts them, and the planner read
    back from the recipe's verl overrides (rlkit.planning.preflight) is the explorer's plan, but for what overrides do not
    carry (the logits path: how verl is installed; the non-torch and CUDA-graph estimates; host size)."""
    from rlkit.core.results import parse_overrides
    from rlkit.experiments import grpo
    from rlkit.planning import preflight
    from rlkit.recipes.grpo import NOTEBOOK, GRPORecipe

    spec = cfg.spec(options)
    state = {**VB.state_from_spec(spec), "lora_rank": 0}
    lines = VB.export_lines(state, spec)
    assert all(line.startswith("-p ") for line in lines)
    values = {**load_profile(NOTEBOOK, VB.GRPO_PROFILE), **parse_overrides([line[3:] for line in lines])}
    values.pop("results_dir", None)
    assert P.build(GRPORecipe, values, where="export") == VB.recipe_from_state(state, spec)
    args = shlex.split(VB.export_command(state, spec).replace("\\\n", " "))
    assert args[:3] == ["rlkit", "grpo", "render"]
    assert grpo.main(args[2:]) == 0
    assert "verl.trainer.main_ppo" in capsys.readouterr().out
    recipe = VB.recipe_from_state(state, spec)
    read_back = preflight.planner_spec_for_overrides(VB.overrides_for_state(state, spec), recipe.patches,
                                                     gpu_gib=state["gpu_gib"])
    mine = VB.spec_from_state(state, spec)
    skip = {"logits_path", "non_torch_gib", "cudagraph_gib", "host_gib"}
    assert {k: v for k, v in asdict(read_back).items() if k not in skip} == \
        {k: v for k, v in asdict(mine).items() if k not in skip}


def test_budget_preflight_runs_on_the_exported_overrides(cfg):
    spec = cfg.spec("")
    state = VB.state_from_spec(spec)
    findings = VB.preflight_for_state(state, spec)
    checks = {f["check"] for f in findings}
    assert "fsdp1_offload_frees_nothing" in checks  # param offload under NO_SHARD without the offload_views patch
    assert "planner" in checks  # the model path is the preset's name, so the pre-flight's planner runs


@pytest.mark.parametrize("path", sorted(VB.LOGITS_RECIPE))
def test_budget_preflight_takes_the_logits_path_chosen_here(cfg, path):
    """A logits path the recipe can choose reaches the overrides: the pre-flight names the explorer's path, and the
    page carries no note; a path no override chooses gets the note naming both."""
    state = {**VB.state_from_spec(cfg.spec("")), "logits_path": path}
    findings = VB.preflight_for_state(state, cfg.spec(""))
    lines = [f["message"] for f in findings if f["message"].startswith("logits path: ")]
    assert len(lines) == 1 and lines[0].startswith(f"logits path: {path} "), lines
    assert not [f for f in findings if f["severity"] == "error" and "fused_kernel" in f["key"]], findings
    assert "no override chooses" not in VB.draw(state, cfg.spec("")).texts["preflight"]


def test_budget_notes_a_logits_path_no_override_chooses(cfg):
    state = {**VB.state_from_spec(cfg.spec("")), "logits_path": "torch_fp32"}
    assert "torch_fp32" not in VB.LOGITS_RECIPE
    assert "logits path torch_fp32 (peak" in VB.draw(state, cfg.spec("")).texts["preflight"]


def test_flow_dict_override_is_read():
    """Hydra's {a:b,c:d} (what the recipe renders for HostAdamW) is a dict to the pre-flight."""
    from rlkit.verl.config import parse_overrides

    tree = parse_overrides(["x.cfg={pin_memory:true,rank0_owner:true}", "y={url:http://h:1}"])
    assert tree["x"]["cfg"] == {"pin_memory": True, "rank0_owner": True}
    assert tree["y"] == {"url": "http://h:1"}


def test_host_step_greys_out_optimizer_offload(budget_explorer):
    w = budget_explorer.controls["cpu_optimizer_step"]
    start = budget_explorer.state()
    try:
        assert budget_explorer.controls["optimizer_offload"].disabled is w.value
        reset(budget_explorer, {"rank0_owner": False, "master_on_host": False, "cpu_optimizer_step": False})
        assert budget_explorer.controls["optimizer_offload"].disabled is False
    finally:
        reset(budget_explorer, start)


# --- notebook 05: the arms explorer (committed arms) ---------------------------------------------------------

ARMS_DIR = REPO_ROOT / "outputs" / "05_grpo_qwen3_4b"


@pytest.fixture(scope="module")
def arms_explorer():
    if not any(ARMS_DIR.glob("*/metrics.json")):
        pytest.skip("no committed arms under outputs/05_grpo_qwen3_4b")
    return VA.arms_explorer(str(ARMS_DIR))


@pytest.mark.parametrize("name,value,expect", [
    ("arms", ("0-stock", "2-skip-old-logprob"), {"figure:timeline", "figure:limits", "figure:memory", "text:table"}),
    ("steps", "steady", {"figure:timeline"}),
    ("memory", "device", {"figure:memory"}),
])
def test_every_arms_control_changes_the_drawing(arms_explorer, name, value, expect):
    start = arms_explorer.state()
    try:
        assert expect <= set(changed(arms_explorer, name, value))
    finally:
        reset(arms_explorer, start)


def test_arms_memory_is_planner_beside_measured():
    data = VA.load(str(ARMS_DIR)) if ARMS_DIR.exists() else pytest.skip("no arms")
    a = data["1-fixes-hostadamw"]
    fig = VA.memory_figure(data, ("1-fixes-hostadamw",), "actor")
    bars = {t.name: t.y[0] for t in fig.data}
    assert bars["measured: actor peak allocated (verl)"] == a["measured_actor_peak_gib"]
    assert bars["planner: update_fwd_bwd"] == pytest.approx(a["check"]["planner_actor_gib"]["update_fwd_bwd"])
    rows = {r["arm"]: r for r in VA.table_rows(data, tuple(data))}
    assert rows["0-stock"]["outcome"].startswith("vllm_startup")
    timeline = VA.timeline_figure(data, ("1-fixes-hostadamw",), "all")
    assert sum(len(t.y) for t in timeline.data) == len(a["phase_rows"])
    assert VA.draw({"arms": (), "steps": "all", "memory": "actor"}, data).texts["table"].count("pick") == 1


def test_arms_limits_are_each_phase_beside_its_limit():
    """Arm 5 of the seed's workload: its update_actor bar at the limit is rlkit.planning.roofline's limit (the dense bf16
    peak) and its measured bar verl's seconds, both from the committed run; the limit of a phase without one (gen,
    where no standalone vLLM of the shape is committed) is its measured time, hatched; a run without steps gets
    a message."""
    from rlkit.core.env import gpu_name, read_saved
    from rlkit.experiments import estimates, grpo_runs

    name = "h200-seed-5-master-on-host-cast-once"
    data = VA.load(str(ARMS_DIR)) if (ARMS_DIR / name).exists() else pytest.skip("no committed seed arm 5")
    want = estimates.phase_limits(grpo_runs.read_arms(str(ARMS_DIR))[name], gpu_name(read_saved(ARMS_DIR / name)))["phases"]
    bars = {t.name: t for t in VA.limits_figure(data, (name,)).data}
    assert tuple(bars["update_actor"].y) == (want["update_actor"]["seconds"], want["update_actor"]["limit_s"])
    assert want["gen"]["limit_s"] is None  # mean 1200: no ceiling of that shape is committed
    assert tuple(bars["gen"].y) == (want["gen"]["seconds"],) * 2
    assert tuple(bars["gen"].marker.pattern.shape) == ("", "/")
    assert "no phase limits" in VA.limits_figure(data, ("0-stock",)).layout.annotations[0].text


# --- notebook 06: the sweep point explorer (committed sweep) --------------------------------------------------

SWEEP_DIR = REPO_ROOT / "outputs" / "06_util_sweep"


@pytest.fixture(scope="module")
def runs():
    from rlkit.experiments import util_sweep

    if not any(SWEEP_DIR.glob("*/metrics.json")):
        pytest.skip("no committed sweep under outputs/06_util_sweep")
    return util_sweep.runs_of(util_sweep.read_results(str(SWEEP_DIR)))


@pytest.mark.parametrize("name,value,expect", [
    ("case", "doc_small", {"figure:timeline", "figure:kv", "figure:compare", "text:point"}),
    ("util", 0.4, {"figure:timeline", "figure:kv", "figure:compare", "text:point"}),
    ("kv", "running_reqs", {"figure:kv"}),
])
def test_every_sweep_control_changes_the_drawing(runs, name, value, expect):
    explorer = VS.sweep_explorer(runs, "qwen3_4b_48g", 0.6)
    assert expect <= set(changed(explorer, name, value))


def test_sweep_case_offers_its_utilizations(runs):
    explorer = VS.sweep_explorer(runs, "qwen3_4b_48g", 0.7)
    explorer.controls["case"].value = "doc_small"
    assert tuple(explorer.controls["util"].options) == tuple(VS.points(runs)["doc_small"])
    assert explorer.state()["case"] == "doc_small" and "doc_small" in explorer.texts["point"].value


def test_sweep_timeline_draws_the_planner_per_phase(runs):
    run = VS.find_run(runs, "qwen3_4b_48g", 0.6)
    fig = VS.timeline_figure(run)
    planner = next(t for t in fig.data if (t.name or "").startswith("planner"))
    base = run["measured"]["baseline_used_gib"]
    update = max(run["planner"]["device_total_gib"][p] for p in ("update_fwd_bwd", "optimizer_step"))
    assert any(y is not None and y == pytest.approx(base + update) for y in planner.y)
    kv = VS.kv_figure(run, "kv_cache_usage_pct")
    assert list(kv.data[0].y) == [s["kv_cache_usage_pct"] for s in run["measured"]["vllm"]["stats"]]


# --- notebooks 01 and 03: row / arm selectors ----------------------------------------------------------------

@pytest.mark.parametrize("notebook,key,figure,label", [
    ("01_offload_bug", "rows", "offload_bug.memory_figure", "offload_bug.row_label"),
    ("03_cast_once", "arms", "cast_once.arms_figure", "label"),
])
def test_selectors_redraw(notebook, key, figure, label):
    import importlib

    path = REPO_ROOT / "outputs" / notebook / "h200" / "metrics.json"
    if not path.exists():
        pytest.skip(f"no committed {path}")
    metrics = json.loads(path.read_text())
    mod = importlib.import_module(f"rlkit.experiments.{figure.split('.')[0]}")
    fn = getattr(mod, figure.split(".")[1])
    lab = getattr(mod, label.split(".")[1]) if "." in label else label
    explorer = VP.subset_explorer(metrics, key, fn, lab)
    names = explorer.controls["picked"].options
    assert len(names) == len(metrics[key]) > 1
    assert changed(explorer, "picked", names[:1]) == ["figure:figure"]
    assert changed(explorer, "picked", ()) == ["figure:figure"]  # nothing picked: says so


# --- notebook 07: the learning explorer ----------------------------------------------------------------------

LEARNING = REPO_ROOT / "outputs" / "07_does_it_learn" / "h200" / "metrics.json"


@pytest.fixture(scope="module")
def learning_metrics():
    if not LEARNING.exists():
        pytest.skip("no committed GPU runs of notebook 07")
    return json.loads(LEARNING.read_text())


@pytest.mark.parametrize("name,value,expect", [
    ("curve", "entropy", {"figure:curve"}),
    ("last_step", 16, {"figure:curve", "text:verdict"}),
    ("window", 3, {"text:verdict"}),
    ("noise_factor", 1.0, {"figure:curve", "text:verdict"}),
    ("noise_floor", 0.0, {"figure:curve", "text:verdict"}),
])
def test_every_learning_control_changes_the_drawing(learning_metrics, name, value, expect):
    from rlkit.viz import learning as VL

    assert expect <= set(changed(VL.learning_explorer(learning_metrics), name, value))


def test_the_learning_explorer_reruns_the_experiments_analysis(learning_metrics):
    """At the experiment's own criteria and every step it gives the saved analysis back (every field the saved one,
    from before issue 46, holds); fewer steps give the saved before-the-collapse analysis; a window too long for the
    steps read is said, not drawn."""
    from rlkit.analysis import learning_curves as LC
    from rlkit.viz import learning as VL

    criteria = learning_metrics["analysis"]["criteria"]
    knobs = {k: criteria[k] for k in ("window", "noise_factor", "noise_floor")}
    steps = max(s["step"] for per_run in learning_metrics["steps"].values() for s in per_run)
    assert not LC.disagreements(learning_metrics["analysis"], VL.reanalyze(learning_metrics, **knobs, last_step=steps))
    before = learning_metrics["analysis_before_collapse"]
    again = VL.reanalyze(learning_metrics, **knobs, last_step=before["last_step"])
    assert not LC.disagreements(before, {"last_step": before["last_step"], **again})
    view = VL.draw({"curve": "reward", "last_step": 6, **knobs}, learning_metrics)
    assert "needs at least 10 steps" in view.texts["verdict"]
    band = VL.draw({"curve": "reward", "last_step": steps, **knobs}, learning_metrics).figures["curve"].data[-1]
    assert band.fill == "toself" and len(band.x) == 2 * steps
