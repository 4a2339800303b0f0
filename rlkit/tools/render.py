"""``rlkit render <folder>...``: write a committed executed notebook's closing findings from its folder's metrics.json.

A notebook ends with the findings cells (:data:`rlkit.experiments.findings.HEADING` and ``print(<module>.describe(..))``).
Executed copies made on a GPU node before those cells existed (or before ``describe`` changed) cannot be executed
again here; this appends the two cells as the notebook in ``nbs/`` has them, or replaces the findings cells the copy
ends with, and gives the code cell the stream output ``print`` would: ``describe`` of the folder's committed
``metrics.json``. Nothing is executed and no other cell changes. Rendering twice gives the same file; the file is
written to a temporary file beside it and renamed over it, so a failure leaves the old file whole.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from rlkit.core.env import REPO_ROOT
from rlkit.experiments import findings

EXECUTED = "executed.ipynb"
MARK = {"rlkit": {"rendered_by": "rlkit render", "from": "metrics.json"}}  # the rendered cells' metadata


class RenderError(RuntimeError):
    """A folder that cannot be rendered; the message names it and the fix."""


def notebook_of(folder: Path) -> str:
    """The notebook a results folder belongs to: the first folder above it (or itself) named like one in nbs/."""
    for part in (folder, *folder.parents):
        if part.name in findings.MODULES:
            return part.name
    raise RenderError(f"{folder}: not inside outputs/<notebook>/ for a notebook with findings "
                      f"({', '.join(findings.MODULES)}). Fix: name a results folder such as outputs/01_offload_bug/h200.")


def findings_cells(notebook: str) -> list[dict[str, Any]]:
    """The last two cells of ``nbs/<notebook>.ipynb``: the findings heading and the cell that prints them."""
    cells = json.loads((REPO_ROOT / "nbs" / f"{notebook}.ipynb").read_text())["cells"][-2:]
    heading, code = ("".join(c["source"]) for c in cells)
    if heading != findings.HEADING or "describe(" not in code or cells[1]["cell_type"] != "code":
        raise RenderError(f"nbs/{notebook}.ipynb does not end with the findings cells ({findings.HEADING!r} and "
                          "print(<module>.describe(...))). Fix: add them to the notebook first.")
    return cells


def _ends_with_findings(cells: list[dict[str, Any]]) -> bool:
    if len(cells) < 2:
        return False
    heading, code = cells[-2], cells[-1]
    return (heading["cell_type"] == "markdown" and "".join(heading["source"]).startswith("## What this")
            and code["cell_type"] == "code" and "describe(" in "".join(code["source"]))


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def rendered_cells(notebook: str, text: str) -> list[dict[str, Any]]:
    """The two findings cells with ``text`` as the printed output (ids fixed per notebook: rendering is repeatable)."""
    heading, code = findings_cells(notebook)
    return [
        {"cell_type": "markdown", "id": heading.get("id", "findings-heading"), "metadata": MARK,
         "source": _lines("".join(heading["source"]))},
        {"cell_type": "code", "execution_count": None, "id": code.get("id", "findings-describe"), "metadata": MARK,
         "outputs": [{"name": "stdout", "output_type": "stream", "text": _lines(text + "\n")}],
         "source": _lines("".join(code["source"]))},
    ]


def render_text(folder: Path) -> str:
    """The executed notebook of ``folder`` with its findings cells written from the folder's metrics.json."""
    executed = folder / EXECUTED
    if not executed.exists():
        raise RenderError(f"{folder}: no {EXECUTED} to render. Fix: name a folder holding an executed notebook.")
    notebook = notebook_of(folder.resolve())
    try:
        metrics = findings.read_folder(notebook, folder)
    except findings.MissingMetrics as err:
        raise RenderError(str(err)) from None
    raw = executed.read_text(encoding="utf-8")
    nb = json.loads(raw)
    cells = nb["cells"][:-2] if _ends_with_findings(nb["cells"]) else nb["cells"]
    new = rendered_cells(notebook, findings.describe(notebook, metrics))
    taken = {c.get("id") for c in cells}
    for cell in new:  # an executed copy may hold these cells earlier (06 moved them to its end): ids stay unique
        if cell["id"] in taken:
            cell["id"] = f"{cell['id']}-findings"
    nb["cells"] = cells + new
    return json.dumps(nb, indent=1, ensure_ascii=False) + ("\n" if raw.endswith("\n") else "")


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file in the same folder and a rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def render(folder: str | os.PathLike) -> bool:
    """Render ``folder``'s executed notebook; True when the file changed."""
    path = Path(folder)
    path = path if path.is_absolute() else Path.cwd() / path
    text = render_text(path)
    executed = path / EXECUTED
    if executed.read_text(encoding="utf-8") == text:
        return False
    write_atomic(executed, text)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkit render", description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="results folders holding executed.ipynb and metrics.json")
    ns = parser.parse_args(argv)
    status = 0
    for folder in ns.folders:
        try:
            changed = render(folder)
        except RenderError as err:
            print(f"rlkit render: {err}", file=sys.stderr)
            status = 1
            continue
        print(f"{folder}: {'findings rendered' if changed else 'unchanged'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
