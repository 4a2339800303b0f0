"""Figures that survive outside a live kernel: every plotly figure of a committed executed notebook has a static
image beside it, the images are made offline (kaleido + the local Chromium), and saved HTML embeds plotly.js."""
from __future__ import annotations

import base64
import copy
import json
import re

import pytest

from rlkit.core.env import REPO_ROOT
from rlkit.core.results import NBS_DIR
from rlkit.viz import static

needs_browser = pytest.mark.skipif(static.find_browser() is None,
                                   reason="no Chrome/Chromium for kaleido (scripts/ci_browser_setup.sh installs chromium)")


def _figure():
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(x=["a", "b"], y=[1, 3], name="bars"))
    fig.update_layout(title="a test figure", height=300, width=400)
    return fig


@pytest.mark.parametrize("path", static.committed_executed_notebooks(),
                         ids=lambda p: str(p.relative_to(REPO_ROOT / "outputs")))
def test_committed_executed_notebook_figures_have_a_static_image(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    missing = static.missing_images(nb)
    assert not missing, (f"{path.relative_to(REPO_ROOT)}: {len(missing)} plotly figure(s) without image/png (cells "
                         f"{sorted({c for c, _, _ in missing})}). Fix: rlkit figures {path.relative_to(REPO_ROOT)}")


def test_notebooks_show_figures_with_an_image_and_save_html_offline():
    """No notebook calls fig.show() (plotly JSON only) or writes HTML that loads plotly.js from a CDN."""
    for path in sorted(NBS_DIR.glob("[0-9]*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        for i, cell in enumerate(nb["cells"]):
            src = "".join(cell["source"])
            if cell["cell_type"] != "code":
                continue
            assert not re.search(r"\)\.show\(\)", src), f"{path.name} cell {i}: use rlkit.viz.show(fig)"
            assert "include_plotlyjs=\"cdn\"" not in src and "write_html(" not in src.replace("rlkit.viz.write_html(", ""), \
                f"{path.name} cell {i}: use rlkit.viz.write_html (plotly.js embedded)"


def test_write_html_embeds_plotlyjs(tmp_path):
    out = static.write_html(_figure(), tmp_path / "fig.html")
    text = out.read_text(encoding="utf-8")
    assert not re.findall(r"<script[^>]*\bsrc=", text)  # nothing loaded from elsewhere (a CDN)
    assert len(text) > 1_000_000  # plotly.js itself is inside


def test_bundle_without_image_is_the_plotly_json():
    bundle = static.figure_bundle(_figure(), image=False)
    assert set(bundle) == {static.PLOTLY_MIME, "text/plain"}
    assert bundle[static.PLOTLY_MIME]["data"][0]["y"] == [1, 3]


@needs_browser
def test_bundle_has_a_png_made_offline():
    bundle = static.figure_bundle(_figure(), image=True)
    png = base64.b64decode(bundle["image/png"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (400, 300)  # the figure's own size


@needs_browser
def test_add_images_adds_only_images_and_is_idempotent(tmp_path):
    fig = _figure()
    output = {"output_type": "display_data", "metadata": {},
              "data": {static.PLOTLY_MIME: fig.to_plotly_json(), "text/plain": ["Figure"]}}
    nb = {"cells": [{"cell_type": "code", "execution_count": 1, "id": "a", "metadata": {}, "source": ["fig"],
                     "outputs": [output, {"output_type": "stream", "name": "stdout", "text": ["x\n"]}]}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "executed.ipynb"
    path.write_text(static._dump(nb, newline=False), encoding="utf-8")
    assert static.main(["--check", str(path)]) == 1
    assert static.add_images(path) == 1
    after = json.loads(path.read_text(encoding="utf-8"))
    expected = copy.deepcopy(nb)
    expected["cells"][0]["outputs"][0]["data"]["image/png"] = after["cells"][0]["outputs"][0]["data"]["image/png"]
    assert after == expected  # nothing but the image changed
    assert base64.b64decode(expected["cells"][0]["outputs"][0]["data"]["image/png"])[:4] == b"\x89PNG"
    text = path.read_text(encoding="utf-8")
    assert static.add_images(path) == 0 and path.read_text(encoding="utf-8") == text
    assert static.main(["--check", str(path)]) == 0
