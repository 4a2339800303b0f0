"""The shared shape of a notebook explorer: ipywidgets controls -> a plain draw function -> figures redrawn in place.

An explorer is three things:

* ``controls``: named ipywidgets value widgets; their values are the explorer's *state* (a plain dict);
* ``draw(state) -> View``: a plain function (no widgets) returning the figures (plotly ``go.Figure``) and the
  HTML texts to show for that state. It is what the unit tests call; it never raises for a bad state but
  returns a View that says what is wrong;
* the widgets that show the View: one ``go.FigureWidget`` per figure, redrawn in place on every change (its
  traces and layout replaced), and one ``W.HTML`` per text.

:meth:`Explorer.display` puts it in a notebook as separate outputs, each a live widget with a static stand-in
beside it (the controls with the texts as HTML, each figure with its plotly JSON and a PNG,
:mod:`rlkit.viz.static`): JupyterLab with a kernel draws the widgets; papermill's executed copy, GitHub and
nbviewer show the default state as static figures and text.
"""
from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlkit.viz import static


@dataclass
class View:
    """What an explorer draws for one state: figures by name and HTML texts by name (same names every state)."""

    figures: dict[str, Any] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)


def message_figure(text: str, title: str = "", height: int = 300):
    """An empty plotly figure that says ``text`` (what a View draws where there is nothing to plot)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_annotation(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 14})
    fig.update_layout(title=title, height=height, xaxis={"visible": False}, yaxis={"visible": False})
    return fig


def esc(value: Any) -> str:
    return html.escape(str(value))


def html_table(rows: list[Mapping[str, Any]], columns: list[str] | None = None, fmt: Callable[[Any], str] | None = None) -> str:
    """A small HTML table of dict rows (values through ``fmt``, default: numbers to 3 significant digits)."""
    if not rows:
        return "<p><i>nothing to show</i></p>"
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))

    def default(v):
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
        return "" if v is None else str(v)

    fmt = fmt or default
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{esc(fmt(r.get(c)))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table class='rlkit-table'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def stale_layout(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> dict[str, None]:
    """The layout paths (``"xaxis.visible"``, ``"annotations"``) that ``old`` sets and ``new`` does not, each to
    ``None``: a relayout unsets them."""
    out: dict[str, None] = {}
    for key, value in old.items():
        path = f"{prefix}{key}"
        if key not in new:
            out[path] = None
        elif isinstance(value, Mapping) and isinstance(new[key], Mapping):
            out.update(stale_layout(value, new[key], f"{path}."))
    return out


def redraw(widget, fig) -> None:
    """Replace a FigureWidget's traces and layout with ``fig``'s, in place (the widget stays where it is).

    Assigning a layout sends the browser a relayout, which it merges into the layout it holds: what the last
    view set and this one does not (a message figure's annotation, its hidden axes) would stay drawn over the new
    figure. Those paths are unset first."""
    stale = stale_layout(widget.layout.to_plotly_json(), fig.layout.to_plotly_json())
    widget.data = []
    widget.add_traces(list(fig.data))
    if stale:
        widget.plotly_relayout(stale)
    widget.layout = fig.layout


def figure_state(fig) -> str:
    """A figure's traces and layout as canonical JSON (trace uids dropped): what it draws."""
    d = fig.to_plotly_json()
    data = [{k: v for k, v in t.items() if k != "uid"} for t in d.get("data", [])]
    return json.dumps({"data": data, "layout": d.get("layout", {})}, sort_keys=True, default=str)


class Explorer:
    """Controls + a plain ``draw(state) -> View`` + the widgets that show the View (see the module docstring).

    ``links``: functions ``(explorer, changed_name) -> None`` run before the redraw when a control changes (to
    update another control's options, e.g. the utilizations a case has); redraws they cause are folded into one.
    ``css``: a CSS class prefix; the figure widgets get ``<css>-<name>`` and the texts ``<css>-<name>`` too, so a
    browser test can find them. ``below``: names of texts shown under the figures (long detail), the others sit
    with the controls above them.
    """

    def __init__(self, controls: Mapping[str, Any], draw: Callable[[dict[str, Any]], View], *, css: str = "rlkit",
                 links: tuple[Callable[[Explorer, str], None], ...] = (), columns: int = 2, title: str = "",
                 below: tuple[str, ...] = ()) -> None:
        import ipywidgets as W
        import plotly.graph_objects as go

        self.controls = dict(controls)
        self.draw = draw
        self.links = links
        self.css = css
        self.title = title
        self._holding = False
        self.view = draw(self.state())
        self.figures = {name: go.FigureWidget(fig) for name, fig in self.view.figures.items()}
        self.texts = {name: W.HTML(value=text) for name, text in self.view.texts.items()}
        for name, w in self.figures.items():
            w.add_class(f"{css}-{name}")
        for name, w in self.texts.items():
            w.add_class(f"{css}-{name}")
        for name, w in self.controls.items():
            w.observe(lambda change, name=name: self._changed(name), names="value")
        rows = [W.HBox(list(self.controls.values())[i:i + columns]) for i in range(0, len(self.controls), columns)]
        self.below = tuple(n for n in below if n in self.texts)
        above = [w for n, w in self.texts.items() if n not in self.below]
        self.panel = W.VBox([*([W.HTML(f"<b>{esc(title)}</b>")] if title else []), *rows, *above])
        self.panel.add_class(f"{css}-panel")
        self.details = W.VBox([self.texts[n] for n in self.below])
        self.details.add_class(f"{css}-details")

    def state(self) -> dict[str, Any]:
        """The controls' values: the draw function's input."""
        return {name: w.value for name, w in self.controls.items()}

    def _changed(self, name: str) -> None:
        if self._holding:
            return
        self._holding = True
        try:
            for link in self.links:
                link(self, name)
        finally:
            self._holding = False
        self.update()

    def update(self) -> View:
        """Draw the current state and show it in the existing widgets."""
        self.view = self.draw(self.state())
        for name, fig in self.view.figures.items():
            redraw(self.figures[name], fig)
        for name, text in self.view.texts.items():
            self.texts[name].value = text
        return self.view

    def drawn(self) -> dict[str, str]:
        """What the widgets show now, figure by figure and text by text (for tests: did a control change it?)."""
        out = {f"figure:{name}": figure_state(w) for name, w in self.figures.items()}
        out.update({f"text:{name}": w.value for name, w in self.texts.items()})
        return out

    def static_html(self, below: bool = False) -> str:
        """The texts of the current view as HTML: the panel's stand-in outside a live kernel (``below``: the
        details' stand-in)."""
        texts = "".join(t for n, t in self.view.texts.items() if (n in self.below) == below)
        if below:
            return texts
        settings = ", ".join(f"{name}={value}" for name, value in self.state().items())
        head = f"<p><b>{esc(self.title)}</b></p>" if self.title else ""
        return f"{head}<p><i>Explorer (needs a live kernel to move its controls); shown at: {esc(settings)}</i></p>{texts}"

    def display(self, image: bool | None = None) -> None:
        """Show the explorer: the controls and texts, then each figure, each a live widget with a static stand-in."""
        from IPython.display import display

        display(static.widget_bundle(self.panel, static={"text/html": self.static_html()}), raw=True)
        for name, w in self.figures.items():
            display(static.widget_bundle(w, static=static.figure_bundle(self.view.figures[name], image=image)), raw=True)
        if self.below:
            display(static.widget_bundle(self.details, static={"text/html": self.static_html(below=True)}), raw=True)

    def _ipython_display_(self) -> None:
        self.display()
