"""Plotly figures that survive outside a live kernel: a PNG beside every interactive figure, made offline.

Executed notebooks under ``outputs/`` keep plotly figures as ``application/vnd.plotly.v1+json``, which only a
live JupyterLab (with plotly's extension) draws; GitHub and nbviewer show nothing. :func:`show` displays one
output that carries both the plotly JSON (JupyterLab draws it, interactive) and an ``image/png`` (everything
else shows the image).

How the PNG is made, offline: kaleido 1.x (``pip install kaleido``, a dependency of rlkit) drives a local
Chromium through the DevTools protocol (choreographer). It loads the plotly.js that the plotly package ships
(``plotly/package_data/plotly.min.js``), never the CDN, and MathJax is turned off here (kaleido would fetch it
from a CDN). The browser is the system one: Debian's ``chromium`` package (``/usr/bin/chromium``,
``scripts/ci_browser_setup.sh``), or any Chrome/Chromium kaleido finds (``BROWSER_PATH`` names one
explicitly); nothing is downloaded. Without a browser :func:`show` still displays the interactive figure,
says once that it made no image, and ``rlkit figures`` adds the images later from the saved plotly JSON.

``rlkit figures [NOTEBOOK ...]`` (:func:`main`) adds a PNG to every plotly output of executed notebooks that
lacks one (default: every ``outputs/**/executed.ipynb`` tracked by git); ``--check`` only lists them.
Set ``RLKIT_STATIC_FIGURES=0`` to display figures without an image (a faster interactive session).

:func:`write_html` saves a figure as one self-contained HTML file (plotly.js embedded, no CDN).
"""
from __future__ import annotations

import argparse
import atexit
import base64
import copy
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlkit.core.results import PLOTLY_MIME, missing_images

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
DEFAULT_WIDTH, DEFAULT_HEIGHT = 1000, 500
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")

_lock = threading.Lock()
_server_started = False
_warned = False


def find_browser() -> str | None:
    """The Chrome/Chromium kaleido will drive: ``BROWSER_PATH`` if set, else the first of
    :data:`BROWSER_NAMES` on PATH; None when there is none (no image is then made)."""
    named = os.environ.get("BROWSER_PATH")
    if named:
        return named if os.access(named, os.X_OK) else None
    for name in BROWSER_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def images_enabled() -> bool:
    """Whether :func:`show` makes images: a browser is there and ``RLKIT_STATIC_FIGURES`` is not ``0``."""
    return os.environ.get("RLKIT_STATIC_FIGURES", "1") != "0" and find_browser() is not None


def _start_server() -> None:
    """One kaleido browser for this process (the first image costs its start, ~10 s; later ones ~1 s)."""
    global _server_started
    import kaleido

    if _server_started:
        return
    browser = find_browser()
    if browser and not os.environ.get("BROWSER_PATH"):
        os.environ["BROWSER_PATH"] = browser  # choreographer reads it; keeps it off any download path
    kaleido.start_sync_server(mathjax=False, silence_warnings=True)
    _server_started = True
    atexit.register(stop_server)


def stop_server() -> None:
    """Close the kaleido browser (registered at exit; call it to free the browser early)."""
    global _server_started
    if _server_started:
        import kaleido

        kaleido.stop_sync_server(silence_warnings=True)
        _server_started = False


def _size(fig_dict: dict[str, Any]) -> tuple[int, int]:
    layout = fig_dict.get("layout") or {}
    return int(layout.get("width") or DEFAULT_WIDTH), int(layout.get("height") or DEFAULT_HEIGHT)


def png_bytes(fig, *, scale: float = 1.0) -> bytes:
    """PNG of a plotly figure (a Figure, FigureWidget or its dict), rendered offline by kaleido + local Chromium.

    Raises RuntimeError when there is no browser."""
    import kaleido

    if find_browser() is None:
        raise RuntimeError("no Chrome/Chromium found for kaleido: install Debian's chromium "
                           "(scripts/ci_browser_setup.sh) or set BROWSER_PATH")
    fig_dict = fig if isinstance(fig, dict) else fig.to_dict()
    fig_dict = {k: v for k, v in fig_dict.items() if k in ("data", "layout", "frames")}
    width, height = _size(fig_dict)
    with _lock:
        _start_server()
        return kaleido.calc_fig_sync(fig_dict, opts={"format": "png", "width": width, "height": height,
                                                     "scale": scale})


def _plotly_json(fig) -> dict[str, Any]:
    """The plotly mimetype payload exactly as plotly's own notebook renderer writes it."""
    import plotly.io as pio

    return pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict())[PLOTLY_MIME]


def figure_bundle(fig, *, image: bool | None = None) -> dict[str, Any]:
    """A raw display bundle: the plotly JSON, a PNG (when ``image``; default :func:`images_enabled`) and a
    text line. JupyterLab draws the plotly JSON; GitHub, nbviewer and a closed notebook show the PNG."""
    global _warned
    title = ((fig.layout.title.text if fig.layout.title else None) or "figure")
    bundle: dict[str, Any] = {PLOTLY_MIME: _plotly_json(fig), "text/plain": f"<plotly figure: {title}>"}
    if image is None:
        image = images_enabled()
        if not image and not _warned and os.environ.get("RLKIT_STATIC_FIGURES", "1") != "0":
            print("rlkit.viz.show: no Chrome/Chromium for kaleido, so no static PNG beside the figure "
                  "(install chromium, or run `rlkit figures` on the executed notebook later)", file=sys.stderr)
            _warned = True
    if image:
        bundle["image/png"] = base64.b64encode(png_bytes(fig)).decode("ascii")
    return bundle


def show(fig, *, image: bool | None = None) -> None:
    """Display ``fig`` as one output holding the interactive plotly figure and a static PNG of it.

    Use it instead of ``fig.show()`` in notebooks."""
    from IPython.display import display

    display(figure_bundle(fig, image=image), raw=True)


def widget_bundle(widget, *, static: dict[str, Any] | None = None) -> dict[str, Any]:
    """A live widget's display bundle with a static stand-in beside it (``static``: more mimetypes, e.g. a
    :func:`figure_bundle` or ``{"text/html": ...}``). JupyterLab with a kernel draws the widget; a saved
    notebook viewed elsewhere shows the stand-in."""
    bundle = dict(static or {})
    bundle.update({k: v for k, v in widget._repr_mimebundle_().items() if k == WIDGET_MIME})
    bundle.setdefault("text/plain", repr(widget)[:110])
    return bundle


def markdown(text: str):
    """``text`` as a notebook's Markdown output with its dollar signs escaped: JupyterLab's MathJax reads
    ``$113-135 ... at $2.5`` as mathematics and prints the words between as run-together italics."""
    from IPython.display import Markdown

    return Markdown(text.replace("\\$", "$").replace("$", "\\$"))


def write_html(fig, path: str | os.PathLike) -> Path:
    """Save ``fig`` as a self-contained HTML file (plotly.js embedded: opens offline, no CDN)."""
    path = Path(path)
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    return path


# ---------------------------------------------------------------------------------------------------
# Executed notebooks: find plotly outputs without an image, add one from the saved JSON

def _dump(nb: dict[str, Any], newline: bool = True) -> str:
    """A notebook as nbformat writes it (sorted keys, one-space indent, UTF-8; papermill leaves out the final
    newline), so re-writing an unchanged notebook is byte-identical."""
    return json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + ("\n" if newline else "")


def add_images(path: str | os.PathLike) -> int:
    """Add a PNG beside every plotly output of the notebook at ``path`` that has none; returns how many.

    Only those outputs change (a new ``image/png`` key); the file is re-written only when one was added."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    nb = json.loads(text)
    todo = missing_images(nb)
    for _, _, out in todo:
        fig = copy.deepcopy(out["data"][PLOTLY_MIME])
        out["data"]["image/png"] = base64.b64encode(png_bytes(fig)).decode("ascii")
    if todo:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(_dump(nb, newline=text.endswith("\n")), encoding="utf-8")
        tmp.replace(path)
    return len(todo)


def committed_executed_notebooks(root: str | os.PathLike | None = None) -> list[Path]:
    """Every ``outputs/**/executed.ipynb`` tracked by git (the results that are committed)."""
    from rlkit.core.env import REPO_ROOT

    root = Path(root) if root else REPO_ROOT
    listed = subprocess.run(["git", "ls-files", "-z", "--", "outputs"], cwd=root, capture_output=True,
                            text=True, check=True).stdout.split("\0")
    return sorted(root / p for p in listed if p.endswith("/executed.ipynb") or p == "executed.ipynb")


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rlkit figures",
        description="Add a static PNG (kaleido + local Chromium, offline) beside every plotly figure of executed "
                    "notebooks that has none.")
    parser.add_argument("notebooks", nargs="*", help="executed .ipynb files (default: outputs/**/executed.ipynb "
                                                     "tracked by git)")
    parser.add_argument("--check", action="store_true", help="only list figures without an image; exit 1 if any")
    ns = parser.parse_args(list(argv) if argv is not None else None)
    paths = [Path(p) for p in ns.notebooks] or committed_executed_notebooks()
    if ns.check:
        missing = {p: len(missing_images(json.loads(p.read_text(encoding="utf-8")))) for p in paths}
        for p, n in missing.items():
            if n:
                print(f"{p}: {n} figure(s) without a static image")
        return 1 if any(missing.values()) else 0
    if find_browser() is None:
        print("rlkit figures: no Chrome/Chromium found (install Debian's chromium: scripts/ci_browser_setup.sh, "
              "or set BROWSER_PATH)", file=sys.stderr)
        return 2
    total = 0
    try:
        for p in paths:
            n = add_images(p)
            total += n
            if n:
                print(f"{p}: added {n} image(s)")
    finally:
        stop_server()
    print(f"rlkit figures: {total} image(s) added to {len(paths)} notebook(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
