"""Notebook UI: ipywidgets explorers over plotly figures, and figures that survive outside a live kernel.

* :mod:`rlkit.viz.static`: :func:`markdown` (Markdown output whose dollars stay dollars), :func:`show` (a plotly figure with a static PNG beside it, made offline by kaleido and
  a local Chromium), :func:`write_html` (self-contained HTML), ``rlkit figures`` (PNGs for executed notebooks);
* :mod:`rlkit.viz.explorer`: the shared shape (controls -> plain ``draw(state) -> View`` -> FigureWidgets
  redrawn in place);
* the explorers: :mod:`rlkit.viz.budget` (notebook 00), :mod:`rlkit.viz.arms` (05), :mod:`rlkit.viz.sweep` (06),
  :mod:`rlkit.viz.learning` (07),
  :mod:`rlkit.viz.pick` (the row/arm selectors of 01 and 03).

This is the top layer: it imports the planner, the experiments and the recipe; nothing below imports it.
"""
from rlkit.viz.static import figure_bundle, markdown, show, write_html

__all__ = ["figure_bundle", "markdown", "show", "write_html"]
