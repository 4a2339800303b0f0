"""Issue 47: the notebooks' explorers and summaries as a reader meets them over the committed GPU results.

Each test drives what the reader did (a control moved, a cell run twice, a folder of runs read) and checks what the
reader would see: the layout the browser holds after the widget's messages, the folder left behind, the text
printed. The browser tier (tests/test_browser.py) drives the same explorers in Chromium.
"""
from __future__ import annotations

import copy
import json
import re
import shutil
from dataclasses import replace

import nbformat
import pytest

from rlkit.core import params as P
from rlkit.core import results as R
from rlkit.core.colours import COMPONENT_COLOURS, component_colour, phase_colour
from rlkit.core.env import REPO_ROOT
from rlkit.core.results import load_profile
from rlkit.experiments import grpo_runs, phase_budget, util_sweep
from rlkit.planning import budget, verdict

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from rlkit.viz import arms as VA
from rlkit.viz import budget as VB
from rlkit.viz import sweep as VS

ARMS_DIR = REPO_ROOT / "outputs" / "05_grpo_qwen3_4b"
SWEEP_DIR = REPO_ROOT / "outputs" / "06_util_sweep"
NBS = REPO_ROOT / "nbs"


def cell_source(notebook: str, needle: str) -> str:
    """The one code cell of ``nbs/<notebook>.ipynb`` whose source holds ``needle``."""
    nb = nbformat.read(NBS / f"{notebook}.ipynb", as_version=4)
    found = [c.source for c in nb.cells if c.cell_type == "code" and needle in c.source]
    assert len(found) == 1, f"{notebook}: {len(found)} cells hold {needle!r}"
    return found[0]


def last_value(source: str, ns: dict):
    """Run a cell's ``source`` in ``ns`` and return the value of its last line, as Jupyter shows it."""
    *body, last = source.strip().splitlines()
    exec("\n".join(body), ns)
    return eval(last, ns)


def run_folder(path, metrics, env=None):
    """A completed run folder as every run leaves one: metrics.json and env.json."""
    path.mkdir(parents=True)
    (path / "metrics.json").write_text(json.dumps(metrics))
    (path / "env.json").write_text(json.dumps(env if env is not None else {"gpus": []}))
    return path


# --- what a run folder is: one rule for every reader -------------------------------------------------------------

def test_a_folder_of_runs_is_its_completed_runs_only(tmp_path):
    for name in ("a", "b", "interactive", "tiny", "tiny-u0.6", "c.failed", ".c.partial-12"):
        run_folder(tmp_path / name, {"x": 1})
    (tmp_path / "no-env").mkdir()
    (tmp_path / "no-env" / "metrics.json").write_text("{}")
    assert list(grpo_runs.arm_folders(tmp_path)) == ["a", "b"]
    assert [p.name for p in R.run_folders(tmp_path)] == ["a", "b"]


# --- bug 2: a render writes nothing inside the folder it reads; two renders read the same arms ----------------

def test_rendering_05_over_its_arms_folder_twice_leaves_the_folder_unchanged(tmp_path, monkeypatch):
    """Notebook 05's reading cell, run as JupyterLab runs it (no RLKIT_OUT_DIR), over a folder of two committed
    arms: before the fix its copy of the first arm landed in <folder>/interactive and became a third arm."""
    outputs = tmp_path / "outputs"
    folder = outputs / "05_grpo_qwen3_4b"
    for arm in ("0-stock", "1-fixes-hostadamw"):
        if not (ARMS_DIR / arm / "metrics.json").exists():
            pytest.skip(f"no committed arm {arm}")
        folder.mkdir(parents=True, exist_ok=True)
        for f in ("metrics.json", "env.json"):
            (folder / arm).mkdir(exist_ok=True)
            shutil.copy(ARMS_DIR / arm / f, folder / arm / f)
    monkeypatch.setattr(R, "OUTPUTS_DIR", outputs)
    monkeypatch.delenv("RLKIT_OUT_DIR", raising=False)
    import rlkit.core.results
    import rlkit.experiments.grpo
    import rlkit.measure.samplers

    reading = cell_source("05_grpo_qwen3_4b", "read_results(results_dir)")
    listing = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    seen = []
    for _ in range(2):
        ns = {"rlkit": rlkit, "results_dir": str(folder), "cfg": None}
        exec(reading, ns)
        assert not ns["metrics_path"].resolve().is_relative_to(folder.resolve())
        seen.append(list(VA.load(str(folder))))
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) == listing
    assert seen[0] == seen[1] == ["0-stock", "1-fixes-hostadamw"]


# --- bug 3: notebook 06 reads the sweep's points, as the report does ---------------------------------------------

def test_the_sweep_reader_takes_only_the_points(tmp_path):
    point = json.loads((SWEEP_DIR / "doc_small-u0.4" / "metrics.json").read_text())
    for name in ("doc_small-u0.4", "h200-papermill-doc_small-u0.4", "tiny", "interactive"):
        run_folder(tmp_path / name, point)
    runs = util_sweep.runs_of(util_sweep.read_results(tmp_path))
    assert [r["tag"] for r in runs] == ["doc_small-u0.4"]


def test_notebook_06_over_the_committed_sweep_says_what_docs_results_says():
    """The answer cell's case lines (update peak ranges, highest util, cost) are the lines of docs/results.md."""
    runs = util_sweep.runs_of(util_sweep.read_results(SWEEP_DIR))
    assert all(r.get("measured") for r in runs)  # no CPU tiny point, no 'observed None'
    docs = (REPO_ROOT / "docs" / "results.md").read_text()
    cases = [line for line in util_sweep.answer_lines(runs) if line.startswith("- ")]
    assert cases and all(line in docs for line in cases), [line for line in cases if line not in docs]
    # doc_small's update peak, as each point's metrics.json measured it (not as the docs say it)
    peaks = [json.loads((SWEEP_DIR / f"doc_small-u{u}" / "metrics.json").read_text())["measured"]["phase_peaks"]
             ["update_actor"]["peak_job_gib"] for u in ("0.4", "0.5", "0.6", "0.7")]
    (doc_small,) = [line for line in cases if line.startswith("- doc_small ")]
    assert f"the update's device peak stays at {min(peaks):.2f}-{max(peaks):.2f} GiB" in doc_small


# --- bug 1: a redraw leaves nothing of the previous view in the browser -----------------------------------------

class FrontEnd:
    """The layout a browser holds for a FigureWidget: the first one it got, then each relayout message merged as
    plotly.js's Plotly.relayout merges it (a key, dotted or not, sets that path wholesale; None unsets it)."""

    def __init__(self, widget):
        self.layout = copy.deepcopy(widget.layout.to_plotly_json())
        widget.observe(self._message, names="_py2js_relayout")

    def _message(self, change):
        for path, value in ((change["new"] or {}).get("relayout_data") or {}).items():
            *parents, leaf = path.split(".")
            node = self.layout
            for key in parents:
                node = node.setdefault(key, {})
            if value is None:
                node.pop(leaf, None)
            else:
                node[leaf] = copy.deepcopy(value)

    def annotations(self) -> list[str]:
        return [a.get("text", "") for a in self.layout.get("annotations") or []]


def test_arms_picked_after_an_empty_selection_lose_the_placeholder():
    """05: deselect every arm, then pick two: no figure keeps 'pick at least one arm' or its hidden x-axis."""
    if not (ARMS_DIR / "0-stock").exists():
        pytest.skip("no committed arms")
    explorer = VA.arms_explorer(str(ARMS_DIR))
    browser = {name: FrontEnd(w) for name, w in explorer.figures.items()}
    explorer.controls["arms"].value = ()
    assert all("pick at least one arm" in fe.annotations() for fe in browser.values())
    explorer.controls["arms"].value = ("1-fixes-hostadamw", "5-master-on-host-cast-once")
    for name, fe in browser.items():
        assert "pick at least one arm" not in fe.annotations(), name
        assert fe.layout.get("xaxis", {}).get("visible", True) is not False, name
        assert fe.layout == explorer.figures[name].layout.to_plotly_json(), name


def unmeasured(run, case):
    """``run`` as a point that was not measured (a CPU run of another case)."""
    return {**{k: v for k, v in run.items() if k != "measured"}, "case": {**run["case"], "name": case},
            "launch_reason": "no GPU: not measured", "tag": case}


def test_a_measured_point_after_an_unmeasured_one_loses_the_message():
    """06: from an unmeasured case to qwen3_4b_48g: the KV chart no longer says 'no vLLM statistics logged'."""
    runs = util_sweep.runs_of(util_sweep.read_results(SWEEP_DIR))
    runs = [unmeasured(runs[0], "tiny"), *runs]
    explorer = VS.sweep_explorer(runs, "tiny", 0.4)
    explorer.controls["case"].value = "tiny"
    kv = FrontEnd(explorer.figures["kv"])
    assert any("no vLLM statistics" in t for t in kv.annotations())
    explorer.controls["case"].value = "qwen3_4b_48g"
    assert not any("no vLLM statistics" in t for t in kv.annotations())
    assert kv.layout == explorer.figures["kv"].layout.to_plotly_json()


# --- bug 5: the explorer opens on a measured point ----------------------------------------------------------------

def test_the_sweep_explorer_opens_on_a_measured_point():
    runs = util_sweep.runs_of(util_sweep.read_results(SWEEP_DIR))
    runs = [unmeasured(runs[0], "tiny"), *runs]
    explorer = VS.sweep_explorer(runs, "tiny", 0.6)  # notebook 06's tiny profile, committed results loaded
    state = explorer.state()
    assert VS.find_run(runs, state["case"], state["util"]).get("measured"), state
    assert VS.sweep_explorer(runs, "doc_small", 0.6).state()["util"] == 0.6  # a measured point asked for is kept


# --- bug 4: dollars stay dollars ------------------------------------------------------------------------------------

def test_the_sweep_answer_cell_escapes_its_dollars():
    import rlkit.viz

    runs = util_sweep.runs_of(util_sweep.read_results(SWEEP_DIR))
    shown = last_value(cell_source("06_util_sweep", "answer_lines(runs)"),
                       {"rlkit": rlkit, "util_sweep": util_sweep, "runs": runs})
    text = shown.data
    assert "per million samples at \\$2.5/GPU-hour" in text
    assert not re.search(r"(?<!\\)\$", text), "an unescaped $ is MathJax's"


# --- bug 6: one number per question, or both named -----------------------------------------------------------------

def test_a_logits_path_the_preflight_cannot_read_is_explained_in_view():
    cfg = P.build(phase_budget.Config, load_profile("00_phase_budget", "tiny"), where="test")
    base = cfg.spec("offload_views,cpu_optimizer_step")
    state = {**VB.state_from_spec(base), "logits_path": "flash_ce"}
    shown = VB.draw(state, base).texts["preflight"]
    spec = VB.spec_from_state(state, base)
    read = verdict.plan(replace(spec, logits_path="torch_rowwise"))
    folded = shown.index("<details>")
    assert -1 < shown.find("flash_ce") < folded and -1 < shown.find("torch_rowwise") < folded
    assert f"{verdict.plan(spec).peak_gib:.2f} GiB" in shown[:folded] and f"{read.peak_gib:.2f} GiB" in shown[:folded]
    errors = [f["message"] for f in VB.preflight_for_state(state, base) if f["severity"] == "error"]
    # the error is the torch_rowwise plan's: its peak phase and that phase's total
    said = f"{read.peak_phase} needs {read.device_total_gib[read.peak_phase]:.2f} GiB"
    assert any(said in e for e in errors), (said, errors)


# --- bug 7: one colour per phase and per component, in every figure ------------------------------------------------

def test_every_component_has_its_own_colour_in_every_figure():
    assert len(set(COMPONENT_COLOURS.values())) == len(COMPONENT_COLOURS)
    assert set(budget.DEVICE_COMPONENTS) | set(budget.HOST_COMPONENTS) <= set(COMPONENT_COLOURS)
    cfg = P.build(phase_budget.Config, load_profile("00_phase_budget", "tiny"), where="test")
    plans = {o: verdict.plan(cfg.spec(o)).as_dict() for o in cfg.option_sets}
    static = phase_budget.phase_bar_figure(plans, cfg.gpu_gib)
    spec = cfg.spec(cfg.option_sets[0])
    explorer = VB.bars_figure(verdict.plan(spec), spec)
    for fig in (static, explorer):
        bars = {t.name: t.marker.color for t in fig.data if t.name in COMPONENT_COLOURS}
        assert bars and all(colour == component_colour(name) for name, colour in bars.items()), bars


def test_a_phase_is_one_colour_in_every_05_figure():
    if not (ARMS_DIR / "1-fixes-hostadamw").exists():
        pytest.skip("no committed arms")
    metrics = grpo_runs.read_results(ARMS_DIR / "1-fixes-hostadamw")
    data = VA.load(str(ARMS_DIR / "1-fixes-hostadamw"))
    figures = [grpo_runs.phase_figure(metrics["steps"]), VA.timeline_figure(data, tuple(data), "all"),
               VA.limits_figure(data, tuple(data))]
    for fig in figures:
        for t in fig.data:
            assert (t.marker.color if isinstance(t.marker.color, str) else None) == phase_colour(t.name), t.name
    assert phase_colour("update_fwd_bwd") == phase_colour("update_actor")  # the planner's phase, verl's colour


# --- bug 8: summaries that say what they describe, rounded, in order --------------------------------------------

def test_single_run_cells_over_a_folder_of_arms_name_the_arm_they_describe():
    metrics = grpo_runs.read_results(ARMS_DIR)
    first = next(iter(grpo_runs.read_arms(ARMS_DIR)))
    said = grpo_runs.describe(metrics).splitlines()[0]
    assert first in said and f"of the {len(metrics['arms'])} arms" in said
    for needle in ('metrics["command"]', "outcome(metrics)", 'metrics["preflight"]', "planner_check(metrics)",
                   "phase_figure(metrics"):
        assert "which_run(metrics)" in cell_source("05_grpo_qwen3_4b", needle), needle


def test_a_launched_run_without_steps_says_how_it_ended(capsys):
    """05's phase-breakdown cell over the stock arm (vLLM failed at start-up): it says so, not why it launched."""
    import rlkit.experiments.grpo
    import rlkit.verl.logs

    stock = grpo_runs.read_results(ARMS_DIR / "0-stock")
    exec(cell_source("05_grpo_qwen3_4b", "phase_figure(metrics"), {"rlkit": rlkit, "metrics": stock})
    said = capsys.readouterr().out
    assert "vllm_startup in init" in said and "GPU(s) visible" not in said, said


def test_summaries_print_rounded_numbers():
    long_float = re.compile(r"\d+\.\d{5,}")
    for name, metrics in grpo_runs.read_arms(ARMS_DIR).items():
        assert not long_float.findall(grpo_runs.describe(metrics)), name


@pytest.mark.parametrize("path", sorted(NBS.glob("[0-9]*.ipynb")), ids=lambda p: p.stem)
def test_a_notebook_prints_where_its_results_come_from_not_the_rendering_kernel_first(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    params = next(i for i, c in enumerate(code) if "parameters" in c.metadata.get("tags", []))
    for cell in code[:params]:
        last = cell.source.strip().splitlines()[-1]
        assert "print(" not in cell.source and not last.startswith("{"), f"shows the kernel before the run: {last}"
    # A notebook that launches nothing (08 reads committed runs) prints where those runs were measured.
    says_where = ("rlkit.core.results.where_run(results_dir, env)", "rlkit.core.results.where_measured(")
    assert any(needle in c.source for c in code[params:] for needle in says_where)
