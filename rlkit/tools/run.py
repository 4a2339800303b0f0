"""``rlkit run``: execute notebooks with papermill from parameter files, strictly.

    rlkit run nbs/01_offload_bug.ipynb --profile h200 -p steps=3
    rlkit run nbs/06_util_sweep.ipynb --profile h200 --grid gpu_memory_utilization=[0.4,0.5,0.6,0.7]
    rlkit run --all --profile tiny

Parameters come from ``nbs/params/<notebook>.<profile>.yaml`` plus ``-p key=value`` overrides; a key
the notebook's ``parameters`` cell does not declare, or a declared key the parameter file leaves out,
is an error (papermill itself only warns). Each run writes ``outputs/<notebook>/<tag>/`` with
``params.yaml``, ``env.json``, ``executed.ipynb``, the ``metrics.json`` the notebook wrote and its
figures; a failed run leaves ``<tag>.failed/`` and no folder that looks complete.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rlkit.core.params import ParamError, check_keys
from rlkit.core.results import NBS_DIR, ProfileError, ResultsFolder, load_profile, parse_overrides
from rlkit.measure.environment import environment_report

# Parameters every notebook declares that a parameter file need not set.
NOTEBOOK_ONLY = {"results_dir"}


class RunError(ParamError):
    """A run cannot start: bad parameters, unknown notebook, bad grid."""


@dataclass
class RunResult:
    notebook: str
    tag: str
    ok: bool
    seconds: float
    folder: Path
    error: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    warning: str = ""  # a run that succeeded but left something to do (e.g. figures without a static image)


def notebook_path(name: str) -> Path:
    path = Path(name)
    if path.suffix != ".ipynb":
        path = NBS_DIR / f"{name}.ipynb"
    if not path.exists():
        known = sorted(p.stem for p in NBS_DIR.glob("*.ipynb"))
        raise RunError(f"no notebook {name!r}; notebooks in nbs/: {known}")
    return path


def declared_parameters(path: Path) -> dict[str, Any]:
    """Names and defaults of the notebook's ``parameters`` cell (via papermill's inspector)."""
    import papermill

    declared = papermill.inspect_notebook(str(path))
    if not declared:
        raise RunError(f"{path.name} has no cell tagged 'parameters'; every rlkit notebook needs one")
    return {name: info.get("default") for name, info in declared.items()}


def check_parameters(path: Path, values: dict[str, Any], source: str) -> None:
    """The parameters of a run against the notebook's ``parameters`` cell: none it does not declare, none it
    declares left out (papermill itself only warns)."""
    declared = declared_parameters(path)
    check_keys(values, sorted(declared), sorted(set(declared) - NOTEBOOK_ONLY), where=f"parameters (from {source})",
               owner=f"notebook {path.stem}", missing_fix="add them to the parameter file so every run states its inputs")


def expand_grid(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """``{"a": [1, 2], "b": ["x"]}`` -> ``[{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]``."""
    for key, options in grid.items():
        if not isinstance(options, list) or not options:
            raise RunError(f"grid key {key!r} needs a non-empty list of values, got {options!r}")
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def grid_tag(base: str, point: dict[str, Any]) -> str:
    parts = [base] + [f"{k}={v}" for k, v in point.items()]
    return re.sub(r"[^A-Za-z0-9_.=-]", "_", "-".join(parts))


# What the kernel inherits besides RLKIT_OUT_DIR. debugpy (imported by ipykernel) prints four lines of
# "Debugger warning: It seems that frozen modules are being used" at kernel start when the kernelspec lacks
# -Xfrozen_modules=off (a kernelspec not made by `make setup`); only the debugger's breakpoints care.
KERNEL_ENV = {"PYDEVD_DISABLE_FILE_VALIDATION": "1"}
# Where the kernel process's own output goes, in the run's folder (execute).
KERNEL_LOG = "kernel.log"


def kernel_manager_class(kernel_log: IO[bytes]):
    """The kernel manager papermill starts each notebook's kernel with: jupyter_client's own, with two changes.

    - The kernel process's own stdout and stderr go to ``kernel_log``, not to the terminal. A cell's output still
      reaches the notebook (ipykernel forwards it over IOPub). What the kernel prints outside a cell goes to the
      log: its start-up warnings, and a traceback pyzmq can log while the kernel closes its sockets.
    - The kernel's sockets are encrypted with CurveZMQ (``transport_encryption="auto"``) where pyzmq has CurveZMQ
      and the kernelspec declares it, as ipykernel 7 does. Otherwise ipykernel warns "Kernel is running over TCP
      without encryption ..." at every start, and that warning goes to the log."""
    import zmq
    from jupyter_client import AsyncKernelManager
    from traitlets import default

    class RlkitKernelManager(AsyncKernelManager):
        @default("transport_encryption")
        def _default_transport_encryption(self) -> str:
            return "auto" if zmq.has("curve") else "disabled"

        async def start_kernel(self, **kw: Any) -> None:
            # start_kernel passes Popen's keywords on to the launch (jupyter_client's documented **kw)
            await super().start_kernel(**{"stdout": kernel_log, "stderr": kernel_log, **kw})

    return RlkitKernelManager


def execute(path: Path, output: Path, parameters: dict[str, Any], out_dir: str | os.PathLike, *,
            progress: bool, cell_timeout_s: float | None = None) -> None:
    """papermill-execute ``path`` into ``output`` with ``RLKIT_OUT_DIR`` (where the notebook writes
    metrics.json and figures) and :data:`KERNEL_ENV` set for the kernel, and restored afterwards.
    ``cell_timeout_s``: a cell (or the kernel's reply to it) taking longer fails the run instead of waiting
    forever. What the kernel process prints outside its cells is kept in ``out_dir/kernel.log`` when there
    is any (:func:`kernel_manager_class`)."""
    import papermill

    env = {**{k: os.environ.get(k, v) for k, v in KERNEL_ENV.items()}, "RLKIT_OUT_DIR": str(out_dir)}
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    kernel_log = Path(out_dir) / KERNEL_LOG
    try:
        with kernel_log.open("ab") as log:
            papermill.execute_notebook(str(path), str(output), parameters=parameters, progress_bar=progress,
                                       cwd=str(path.parent), kernel_name="python3", execution_timeout=cell_timeout_s,
                                       kernel_manager_class=kernel_manager_class(log),
                                       # widget state holds each FigureWidget's JavaScript (MBs per figure); the saved
                                       # copy shows the PNG that rlkit.viz.static puts beside every figure instead
                                       store_widget_state=False)
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if kernel_log.exists() and not kernel_log.stat().st_size:
            kernel_log.unlink()
    if output.exists():
        drop_widget_views(output)


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def drop_widget_views(path: Path) -> int:
    """Remove the widget views of a saved notebook whose widget state is not stored (papermill runs with
    ``store_widget_state=False``): without their models JupyterLab would show an error where each widget was, so an
    output keeps its other representations (the figure's plotly JSON, its PNG, the text), and an output that had
    only the view keeps a line saying what was there. Returns how many views were dropped."""
    nb = json.loads(path.read_text())
    nb.get("metadata", {}).pop("widgets", None)
    dropped = 0
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            data = out.get("data") or {}
            if WIDGET_VIEW in data:
                data.pop(WIDGET_VIEW)
                dropped += 1
                if not set(data) - {"text/plain"}:
                    data["text/plain"] = "(an interactive control: run the notebook to use it)"
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return dropped


def run_one(path: Path, values: dict[str, Any], tag: str, *, progress: bool = True,
            root: Path | None = None, cell_timeout_s: float | None = None) -> RunResult:
    """Execute one notebook into its results folder; never raises for a failing notebook."""
    folder = ResultsFolder(path.stem, tag, root=root)
    start = time.perf_counter()
    try:
        with folder.writing() as work:
            folder.write_params(values)
            folder.write_env(environment_report())
            execute(path, work / "executed.ipynb", values, work.resolve(), progress=progress,
                    cell_timeout_s=cell_timeout_s)
            metrics_file = work / "metrics.json"
            if not metrics_file.exists():
                raise RunError(f"{path.name} ran but wrote no metrics.json into RLKIT_OUT_DIR")
            metrics = json.loads(metrics_file.read_text())
            folder.record_processes(metrics)
    except Exception as err:  # papermill's execution error carries the failing cell
        return RunResult(path.stem, tag, False, time.perf_counter() - start, folder.failed,
                         error=_short(err) + _kernel_said(folder.failed / KERNEL_LOG))
    return RunResult(path.stem, tag, True, time.perf_counter() - start, folder.path, metrics=metrics)


def render(path: Path, values: dict[str, Any], results_dir: Path, *, progress: bool = True) -> RunResult:
    """Execute ``path`` over saved results (``results_dir`` parameter) into ``results_dir/executed.ipynb``.

    For results measured elsewhere (a GPU node without Jupyter): the folder keeps the params, env and
    metrics written where the work ran; only the executed notebook is added. ``results_dir`` is one run's
    folder or, for a notebook that reads several (the sweep of notebook 06), a folder of run folders.
    """
    import tempfile

    results_dir = Path(results_dir)
    saved = (results_dir / "metrics.json").exists() or (
        results_dir.is_dir() and any((p / "metrics.json").exists() for p in results_dir.iterdir()))
    if not saved:
        raise RunError(f"{results_dir} has no metrics.json to render, directly or in its sub-folders; "
                       "run the experiment first")
    values = saved_parameters(path, values, results_dir, progress=progress)
    start = time.perf_counter()
    target = results_dir / "executed.ipynb"
    partial = results_dir / ".executed.partial.ipynb"
    with tempfile.TemporaryDirectory(prefix="rlkit-render-") as scratch:
        try:  # the notebook's own copy of metrics.json goes to the scratch folder
            execute(path, partial, {**values, "results_dir": str(results_dir)}, scratch, progress=progress)
        except Exception as err:
            partial.unlink(missing_ok=True)
            return RunResult(path.stem, results_dir.name, False, time.perf_counter() - start, results_dir,
                             error=_short(err) + _kernel_said(Path(scratch) / KERNEL_LOG))
    partial.replace(target)
    return RunResult(path.stem, results_dir.name, True, time.perf_counter() - start, results_dir,
                     warning=_images_missing(target))


def _images_missing(executed: Path) -> str:
    """For a rendered (committed) notebook: how many plotly figures have no static image, and the fix."""
    from rlkit.core.results import missing_images

    n = len(missing_images(json.loads(executed.read_text(encoding="utf-8"))))
    return (f"{n} figure(s) without a static image (no Chromium here): install it (make browser-deps), then "
            f"`rlkit figures {executed}`; committed executed notebooks need them (tests/test_figures_static.py)"
            if n else "")


def saved_parameters(path: Path, values: dict[str, Any], results_dir: Path, *, progress: bool = True) -> dict[str, Any]:
    """The parameters a rendered notebook shows: the run's own ``params.yaml`` where the folder is one run, over
    ``values`` (the profile), so the parameters cell states what ran; fields the run predates keep the profile's
    value, and are named. A folder of runs keeps ``values``."""
    import yaml

    saved_file = results_dir / "params.yaml"
    if not saved_file.exists():
        return values
    saved = yaml.safe_load(saved_file.read_text()) or {}
    merged = {**values, **saved}
    check_parameters(path, merged, f"{saved_file} over the profile")
    predates = sorted(set(values) - set(saved) - NOTEBOOK_ONLY)
    if predates and progress:
        print(f"{saved_file} predates {predates}: the profile's values stand in for them")
    return merged


def _short(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: " + (" | ".join(line for line in text[-6:] if line.strip()))[:600]


def _kernel_said(kernel_log: Path) -> str:
    """For a failed run: the last lines the kernel process printed outside its cells (a dead kernel's reason)."""
    if not kernel_log.exists():
        return ""
    lines = [line for line in kernel_log.read_text(errors="replace").splitlines() if line.strip()]
    return f" | the kernel printed ({kernel_log.name}): " + " | ".join(lines[-3:])[:400] if lines else ""


def plan_runs(notebook: str, profile: str, overrides: list[str], grid: list[str], tag: str | None):
    path = notebook_path(notebook)
    values = load_profile(path.stem, profile)
    values.update(parse_overrides(overrides))
    grid_spec = parse_overrides(grid)
    source = f"nbs/params/{path.stem}.{profile}.yaml" + (" and -p/--grid" if overrides or grid else "")
    check_parameters(path, {**values, **grid_spec}, source)
    base = tag or Path(profile).stem
    points = expand_grid(grid_spec) if grid_spec else [{}]
    return [(path, {**values, **point}, grid_tag(base, point) if point else base) for point in points]


def summary(results: list[RunResult]) -> str:
    def rel(path: Path) -> str:
        return os.path.relpath(path, Path.cwd())

    lines = [f"{'notebook':24} {'tag':28} {'status':7} {'secs':>7}  results"]
    for r in results:
        status = "ok" if r.ok else "FAILED"
        lines.append(f"{r.notebook:24} {r.tag:28} {status:7} {r.seconds:7.1f}  {rel(r.folder)}")
        if r.ok:
            lines.append(f"{'':62}  {rel(r.folder / 'executed.ipynb')}, {rel(r.folder / 'metrics.json')}")
            if r.warning:
                lines.append(f"{'':62}  WARNING: {r.warning}")
        else:
            lines.append(f"{'':62}  {r.error}")
    ok = sum(r.ok for r in results)
    lines.append(f"{ok} of {len(results)} runs succeeded")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkit run", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="notebook path or name (e.g. 01_offload_bug)")
    parser.add_argument("--all", action="store_true", help="every notebook in nbs/, in order")
    parser.add_argument("--profile", "-P", default="tiny", help="parameter file profile (default: tiny)")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=[V1,V2]",
                        help="run once per value (several --grid give the cartesian product)")
    parser.add_argument("--tag", default=None, help="results folder name (default: the profile)")
    parser.add_argument("--quiet", action="store_true", help="no per-cell progress bar")
    parser.add_argument("--cell-timeout", type=float, default=None, metavar="SECONDS",
                        help="fail a run whose cell takes longer (default: no limit)")
    parser.add_argument("--render", default=None, metavar="RESULTS_DIR",
                        help="execute the notebook over saved results in RESULTS_DIR (adds executed.ipynb there)")
    ns = parser.parse_args(argv)
    names = [p.stem for p in sorted(NBS_DIR.glob("[0-9]*.ipynb"))] if ns.all else ns.notebooks
    if not names:
        parser.error("name a notebook or pass --all")
    try:
        planned = [run for name in names for run in plan_runs(name, ns.profile, ns.param, ns.grid, ns.tag)]
    except (ParamError, ProfileError) as err:
        print(f"rlkit run: {err}", file=sys.stderr)
        return 2
    if ns.render:
        if len(planned) != 1:
            print("rlkit run: --render takes exactly one notebook and no grid", file=sys.stderr)
            return 2
        path, values, _ = planned[0]
        try:
            result = render(path, values, Path(ns.render), progress=not ns.quiet)
        except RunError as err:
            print(f"rlkit run: {err}", file=sys.stderr)
            return 2
        print(summary([result]))
        return 0 if result.ok else 1
    results = []
    for i, (path, values, tag) in enumerate(planned, 1):
        print(f"[{i}/{len(planned)}] {path.name} -> outputs/{path.stem}/{tag}", flush=True)
        result = run_one(path, values, tag, progress=not ns.quiet, cell_timeout_s=ns.cell_timeout)
        print(f"[{i}/{len(planned)}] {'ok' if result.ok else 'FAILED'} in {result.seconds:.1f} s", flush=True)
        results.append(result)
    print()
    print(summary(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
