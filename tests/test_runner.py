"""The papermill runner: strict keys, grids, complete-or-failed results folders."""
import json
import re

import nbformat
import pytest
import yaml

from rlkit.core.params import ParamError
from rlkit.tools import run as R

PARAMS = 'x = 1  # an int\nlabel = "a"  # a string\nresults_dir = ""  # render saved results\n'
BODY = (
    "import json, os\n"
    "assert x >= 0, 'x must be non-negative'\n"
    "out = os.environ['RLKIT_OUT_DIR']\n"
    "json.dump({'x': x, 'label': label}, open(os.path.join(out, 'metrics.json'), 'w'))\n"
)


def _write_notebook(path, body: str):
    """A notebook at ``path``: a title, the ``parameters`` cell (PARAMS), then ``body``."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(PARAMS)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# demo"), params, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@pytest.fixture
def notebook(tmp_path):
    path = _write_notebook(tmp_path / "nbs" / "demo.ipynb", BODY)
    profile = tmp_path / "demo.tiny.yaml"
    profile.write_text(yaml.safe_dump({"x": 2, "label": "b"}))
    return path, profile


@pytest.fixture
def outputs(tmp_path, monkeypatch):
    """rlkit's outputs/ moved under tmp_path for the test: where `rlkit run` writes its results folders."""
    from rlkit.core import results

    monkeypatch.setattr(results, "OUTPUTS_DIR", tmp_path / "outputs")
    return tmp_path / "outputs"


def test_unknown_parameter_is_rejected_with_the_declared_names(notebook):
    path, profile = notebook
    with pytest.raises(ParamError, match=r"unknown parameters \(from .*\) \['y'\].*known keys: \['label', 'results_dir', 'x'\]"):
        R.plan_runs(str(path), str(profile), ["y=3"], [], None)


def test_parameter_file_must_set_every_declared_key(notebook, tmp_path):
    path, _ = notebook
    partial = tmp_path / "partial.yaml"
    partial.write_text(yaml.safe_dump({"x": 1}))
    with pytest.raises(ParamError, match=r"missing parameters \(from .*\) \['label'\].*add them to the parameter file"):
        R.plan_runs(str(path), str(partial), [], [], None)


def test_cli_reports_unknown_parameter_and_exits_2(notebook, capsys):
    path, profile = notebook
    assert R.main([str(path), "--profile", str(profile), "-p", "lable=c"]) == 2
    assert "['lable'] for notebook" in capsys.readouterr().err


def test_grid_expands_to_the_cartesian_product(notebook):
    path, profile = notebook
    runs = R.plan_runs(str(path), str(profile), [], ["x=[1,2]", "label=[p,q]"], "sweep")
    assert [(v["x"], v["label"]) for _, v, _ in runs] == [(1, "p"), (1, "q"), (2, "p"), (2, "q")]
    assert [t for _, _, t in runs][0] == "sweep-x=1-label=p"
    with pytest.raises(R.RunError, match="non-empty list"):
        R.expand_grid({"x": []})


def test_successful_run_writes_a_complete_folder(notebook, tmp_path):
    path, profile = notebook
    (_, values, tag), = R.plan_runs(str(path), str(profile), ["x=5"], [], None)
    result = R.run_one(path, values, tag, progress=False, root=tmp_path / "outputs")
    assert result.ok, result.error
    folder = tmp_path / "outputs" / "demo" / "demo.tiny"
    assert result.folder == folder
    assert {p.name for p in folder.iterdir()} >= {"params.yaml", "env.json", "executed.ipynb", "metrics.json"}
    assert json.loads((folder / "metrics.json").read_text()) == {"x": 5, "label": "b"}
    assert yaml.safe_load((folder / "params.yaml").read_text()) == {"x": 5, "label": "b"}
    assert "versions" in json.loads((folder / "env.json").read_text())


def test_failed_run_leaves_no_complete_looking_folder(notebook, tmp_path):
    path, profile = notebook
    root = tmp_path / "outputs"
    result = R.run_one(path, {"x": -1, "label": "b"}, "bad", progress=False, root=root)
    assert not result.ok and "x must be non-negative" in result.error
    assert not (root / "demo" / "bad").exists()
    failed = root / "demo" / "bad.failed"
    assert (failed / "FAILED.txt").exists() and not (failed / "metrics.json").exists()
    assert "FAILED" in R.summary([result])


def test_a_cell_over_the_timeout_fails_the_run(notebook, tmp_path):
    path, _ = notebook
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(2, nbformat.v4.new_code_cell("import time\ntime.sleep(120)"))
    nbformat.write(nb, path)
    result = R.run_one(path, {"x": 1, "label": "b"}, "slow", progress=False, root=tmp_path / "outputs",
                       cell_timeout_s=3)
    assert not result.ok and "CellTimeoutError" in result.error
    assert (tmp_path / "outputs" / "demo" / "slow.failed" / "FAILED.txt").exists()


RENDER_BODY = (
    "import json, os\n"
    "metrics = json.load(open(os.path.join(results_dir, 'metrics.json')))\n"
    "print('rendered', metrics['x'])\n"
    "json.dump(metrics, open(os.path.join(os.environ['RLKIT_OUT_DIR'], 'metrics.json'), 'w'))\n"
)


def _render_saved(tmp_path, body: str):
    """Render a notebook of ``body`` over a saved run whose metrics hold x = 7: (notebook path, folder, result)."""
    path = _write_notebook(tmp_path / "demo.ipynb", body)
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "metrics.json").write_text(json.dumps({"x": 7}))
    return path, saved, R.render(path, {"x": 1, "label": "a"}, saved, progress=False)


def test_render_adds_an_executed_notebook_to_saved_results(tmp_path):
    path, saved, result = _render_saved(tmp_path, RENDER_BODY)
    assert result.ok, result.error
    executed = nbformat.read(saved / "executed.ipynb", as_version=4)
    assert "rendered 7" in executed.cells[-1].outputs[0]["text"]
    assert sorted(p.name for p in saved.iterdir()) == ["executed.ipynb", "metrics.json"]
    assert result.warning == ""  # no figure, nothing missing
    (tmp_path / "empty").mkdir()
    with pytest.raises(R.RunError, match="no metrics.json"):
        R.render(path, {"x": 1, "label": "a"}, tmp_path / "empty", progress=False)


def test_a_render_whose_figures_have_no_static_image_says_so(tmp_path, monkeypatch):
    """A rendered notebook is a committed result, and committed figures need a PNG: without one (here images are
    switched off, as on a machine without Chromium) the render succeeds and its summary says what to run."""
    monkeypatch.setenv("RLKIT_STATIC_FIGURES", "0")
    body = RENDER_BODY + "import plotly.graph_objects as go, rlkit.viz\nrlkit.viz.show(go.Figure(go.Bar(y=[1, 2])))\n"
    _, _, result = _render_saved(tmp_path, body)
    assert result.ok, result.error
    assert result.warning.startswith("1 figure(s) without a static image") and "rlkit figures" in result.warning
    assert "WARNING: 1 figure(s) without a static image" in R.summary([result])


def test_render_takes_a_folder_of_run_folders(tmp_path):
    body = "import glob, os\nprint('runs', len(glob.glob(os.path.join(results_dir, '*', 'metrics.json'))))\n"
    path = _write_notebook(tmp_path / "demo.ipynb", body)
    sweep = tmp_path / "sweep"
    for point in ("a-u0.4", "a-u0.6"):
        (sweep / point).mkdir(parents=True)
        (sweep / point / "metrics.json").write_text(json.dumps({"x": 7}))
    result = R.render(path, {"x": 1, "label": "a"}, sweep, progress=False)
    assert result.ok, result.error
    assert "runs 2" in nbformat.read(sweep / "executed.ipynb", as_version=4).cells[-1].outputs[0]["text"]


# Lines the kernel's start-up and Jupyter's transport print when left alone (ipykernel's unencrypted-TCP warning,
# debugpy's frozen-modules warning, nbclient's IOPub / heartbeat complaints, any logged WARNING).
NOISE = ("WARNING", "without encryption", "frozen modules", "Debugger warning", "IOPub", "didn't respond",
         "Warning:", "zmq")


def test_console_shows_progress_and_summary_only(notebook, outputs, capfd):
    """What a newcomer sees from `rlkit run` (and so from `make demo`): the runner's progress lines and its
    summary. The kernel is a subprocess writing to the same terminal, so this reads the file descriptors. A quiet
    kernel leaves no kernel.log."""
    path, profile = notebook
    assert R.main([str(path), "--profile", str(profile), "--quiet"]) == 0
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if line.strip()]
    noisy = [line for line in lines if any(word in line for word in NOISE)]
    assert not noisy, f"console noise from the kernel or Jupyter: {noisy}"
    ours = re.compile(r"^(\[1/1\] |notebook +tag +status|demo +demo\.tiny +ok |\s+\S*executed\.ipynb, |1 of 1 runs succeeded)")
    assert all(ours.match(line) for line in lines), [line for line in lines if not ours.match(line)]
    assert "1 of 1 runs succeeded" in out
    assert not (outputs / "demo" / "demo.tiny" / R.KERNEL_LOG).exists()


def test_real_errors_stay_visible(notebook, outputs, capfd):
    path, profile = notebook
    assert R.main([str(path), "--profile", str(profile), "--quiet", "-p", "x=-1"]) == 1
    out, _ = capfd.readouterr()
    assert "FAILED" in out and "x must be non-negative" in out


def test_render_states_the_runs_own_parameters(tmp_path, capsys):
    """A run folder with params.yaml renders with those values in the injected parameters cell, over the profile;
    a field the run predates keeps the profile's value and is named."""
    path = _write_notebook(tmp_path / "demo.ipynb", "print('x is', x, 'label is', label)")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "metrics.json").write_text(json.dumps({"x": 7}))
    (saved / "params.yaml").write_text(yaml.safe_dump({"x": 7}))
    result = R.render(path, {"x": 1, "label": "a"}, saved, progress=True)
    assert result.ok, result.error
    executed = nbformat.read(saved / "executed.ipynb", as_version=4)
    injected = next(c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", []))
    assert "x = 7" in injected.source and 'label = "a"' in injected.source
    assert "x is 7 label is a" in executed.cells[-1].outputs[0]["text"]
    assert "predates ['label']" in capsys.readouterr().out
    (saved / "params.yaml").write_text(yaml.safe_dump({"x": 7, "nope": 1}))
    with pytest.raises(ParamError, match="nope"):
        R.render(path, {"x": 1, "label": "a"}, saved, progress=False)


def test_saved_copies_drop_widget_views_and_keep_the_other_representations(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("fig")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        R.WIDGET_VIEW: {"model_id": "abc", "version_major": 2, "version_minor": 0},
        "application/vnd.plotly.v1+json": {"data": []}, "image/png": "iVBOR", "text/plain": "FigureWidget"}),
        nbformat.v4.new_output("display_data", data={R.WIDGET_VIEW: {"model_id": "def"}, "text/plain": "IntSlider()"})]
    nb.cells = [cell]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"abc": {}}}}
    path = tmp_path / "saved.ipynb"
    nbformat.write(nb, path)
    assert R.drop_widget_views(path) == 2
    saved = nbformat.read(path, as_version=4)
    first, second = (o["data"] for o in saved.cells[0].outputs)
    assert set(first) == {"application/vnd.plotly.v1+json", "image/png", "text/plain"} and "widgets" not in saved.metadata
    assert set(second) == {"text/plain"} and "run the notebook" in second["text/plain"]
    nbformat.validate(saved)


def test_what_the_kernel_prints_outside_its_cells_goes_to_its_log(notebook, outputs, monkeypatch, capfd):
    """The kernel process's own output (here ipykernel's warning about an unencrypted transport, forced by
    reporting no CurveZMQ) lands in the run's kernel.log, not on the console; a cell's output stays in the notebook."""
    import zmq

    path, profile = notebook
    has = zmq.has
    monkeypatch.setattr(zmq, "has", lambda feature: False if feature == "curve" else has(feature))
    assert R.main([str(path), "--profile", str(profile), "--quiet"]) == 0
    out, err = capfd.readouterr()
    assert "without encryption" not in out + err
    log = outputs / "demo" / "demo.tiny" / R.KERNEL_LOG
    assert "Kernel is running over TCP without encryption" in log.read_text()


def test_a_dead_kernels_last_words_are_in_the_error(tmp_path, outputs):
    """A cell that writes to the kernel process's file descriptor 2 (not to ``sys.stderr``, which ipykernel sends to
    the notebook) and kills the kernel: the failure names what it printed, and the failed folder keeps kernel.log."""
    body = "import os\nos.write(2, b'the reason it died\\n')\nos._exit(1)\n"
    path = _write_notebook(tmp_path / "nbs" / "demo.ipynb", body)
    result = R.run_one(path, {"x": 1, "label": "a"}, "t", progress=False)
    assert not result.ok and "the kernel printed (kernel.log): the reason it died" in result.error, result.error
    assert "the reason it died" in (result.folder / R.KERNEL_LOG).read_text()
