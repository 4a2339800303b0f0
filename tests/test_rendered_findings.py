"""Every committed executed notebook ends with its findings, and they are describe() of its folder's metrics.json.

The executed copies in outputs/ were run on a GPU node; ``rlkit render`` writes their closing cells from the committed
metrics.json. A describe() that changes, or a metrics.json that changes, without rendering again fails here."""
import json
from pathlib import Path

import pytest

from rlkit.core.env import REPO_ROOT
from rlkit.experiments import findings
from rlkit.tools import render as R

from conftest import committed_params

# git-tracked copies only: `make demo` writes tiny/ runs beside them that are not rendered
EXECUTED = committed_params(REPO_ROOT / "outputs", "executed.ipynb",
                            lambda p: str(p.parent.relative_to(REPO_ROOT / "outputs")))


def test_there_are_executed_notebooks():
    assert EXECUTED


@pytest.mark.parametrize("executed", EXECUTED)
def test_executed_notebook_ends_with_the_findings_of_its_metrics(executed):
    folder = executed.parent
    notebook = R.notebook_of(folder)
    cells = json.loads(executed.read_text(encoding="utf-8"))["cells"]
    heading, code = cells[-2:]
    source = R.findings_cells(notebook)  # the notebook's own last two cells
    assert "".join(heading["source"]) == findings.HEADING
    assert "".join(code["source"]) == "".join(source[1]["source"])
    expected = findings.describe(notebook, findings.read_folder(notebook, folder)) + "\n"
    assert [o["output_type"] for o in code["outputs"]] == ["stream"]
    assert "".join(code["outputs"][0]["text"]) == expected, f"stale findings: rlkit render {folder.relative_to(REPO_ROOT)}"


@pytest.mark.parametrize("executed", EXECUTED)
def test_rendering_again_changes_nothing(executed):
    assert R.render_text(executed.parent) == executed.read_text(encoding="utf-8")


@pytest.mark.parametrize("executed", EXECUTED)
def test_rendered_notebook_is_valid_with_unique_cell_ids(executed):
    import nbformat

    nb = nbformat.read(executed, as_version=4)
    nbformat.validate(nb)
    ids = [c.get("id") for c in nb.cells]
    assert len(ids) == len(set(ids))


def _copy_of(tmp_path, source: Path, with_metrics=True) -> Path:
    folder = tmp_path / "outputs" / "01_offload_bug" / "h200"
    folder.mkdir(parents=True)
    (folder / "executed.ipynb").write_text((source / "executed.ipynb").read_text(encoding="utf-8"), encoding="utf-8")
    if with_metrics:
        (folder / "metrics.json").write_text((source / "metrics.json").read_text())
    return folder


def test_render_keeps_every_other_cell_and_is_idempotent(tmp_path):
    source = REPO_ROOT / "outputs" / "01_offload_bug" / "h200"
    folder = _copy_of(tmp_path, source)
    nb = json.loads((folder / "executed.ipynb").read_text(encoding="utf-8"))
    nb["cells"] = nb["cells"][:-2]  # as before rendering
    (folder / "executed.ipynb").write_text(json.dumps(nb, indent=1, ensure_ascii=False), encoding="utf-8")
    assert R.render(folder) is True
    once = (folder / "executed.ipynb").read_text(encoding="utf-8")
    assert json.loads(once)["cells"][:-2] == nb["cells"]
    assert R.render(folder) is False and (folder / "executed.ipynb").read_text(encoding="utf-8") == once
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics["model_gib"] *= 2  # another metric: other prose
    (folder / "metrics.json").write_text(json.dumps(metrics))
    assert R.render(folder) is True and (folder / "executed.ipynb").read_text(encoding="utf-8") != once
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_render_refuses_a_folder_without_metrics_and_names_it(tmp_path, capsys):
    folder = _copy_of(tmp_path, REPO_ROOT / "outputs" / "01_offload_bug" / "h200", with_metrics=False)
    before = (folder / "executed.ipynb").read_text(encoding="utf-8")
    with pytest.raises(R.RenderError, match=r"h200: no metrics.json.*Fix:"):
        R.render(folder)
    assert R.main([str(folder)]) == 1 and str(folder) in capsys.readouterr().err
    assert (folder / "executed.ipynb").read_text(encoding="utf-8") == before
    assert sorted(p.name for p in folder.iterdir()) == ["executed.ipynb"]


def test_a_failed_write_leaves_the_file_whole(tmp_path, monkeypatch):
    target = tmp_path / "executed.ipynb"
    target.write_text("old")

    def fail(*_):
        raise OSError("disk full")

    monkeypatch.setattr(R.os, "replace", fail)
    with pytest.raises(OSError):
        R.write_atomic(target, "new")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["executed.ipynb"]
