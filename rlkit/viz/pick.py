"""A small selector over a figure's rows or arms (notebooks 01 and 03): pick which to draw, the figure is redrawn.

:func:`subset` is the plain callback (the metrics with only the picked items); :func:`subset_explorer` puts a
multiple-choice list over any figure function of the experiment (``figure(metrics) -> go.Figure``).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from rlkit.viz.explorer import Explorer, View, message_figure


def _field(name: str, item: dict[str, Any]) -> str:
    return str(item[name])


def labels(metrics: dict[str, Any], key: str, label: Callable[[dict[str, Any]], str]) -> list[str]:
    return [label(item) for item in metrics[key]]


def subset(metrics: dict[str, Any], key: str, label: Callable[[dict[str, Any]], str], picked) -> dict[str, Any]:
    """``metrics`` with ``metrics[key]`` cut to the items whose label is in ``picked`` (order kept)."""
    return {**metrics, key: [item for item in metrics[key] if label(item) in set(picked)]}


def draw(state: dict[str, Any], metrics: dict[str, Any], key: str, label, figure) -> View:
    """The figure of the picked items (``state["picked"]``)."""
    if not state["picked"]:
        return View(figures={"figure": message_figure(f"pick at least one of the {key}", height=380)})
    return View(figures={"figure": figure(subset(metrics, key, label, state["picked"]))})


def subset_explorer(metrics: dict[str, Any], key: str, figure: Callable[[dict[str, Any]], Any],
                    label: Callable[[dict[str, Any]], str] | str = str, *, picked: tuple[str, ...] | None = None,
                    title: str = "") -> Explorer:
    """A list of ``metrics[key]``'s items (named by ``label``: a function of the item, or the item's key holding
    its name) over ``figure``; all are picked to start with."""
    import ipywidgets as W

    if isinstance(label, str):
        label = functools.partial(_field, label)
    names = labels(metrics, key, label)
    controls = {"picked": W.SelectMultiple(options=names, value=tuple(picked if picked is not None else names),
                                           rows=min(max(len(names), 2), 10), description=key,
                                           layout=W.Layout(width="520px"))}
    return Explorer(controls, functools.partial(draw, metrics=metrics, key=key, label=label, figure=figure),
                    css=f"rlkit-pick-{key}", columns=1,
                    title=title or f"pick the {key} to draw (ctrl/shift-click)")
