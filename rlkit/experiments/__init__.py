"""Experiments: ``python -m rlkit.experiments.<name>``, one per notebook that measures.

Each experiment module defines a frozen ``Config`` dataclass, ``NOTEBOOK`` (the stem of its notebook
in ``nbs/``) and ``run(cfg) -> metrics``, which launches the measured work in fresh processes, and
ends with ``if __name__ == "__main__": sys.exit(experiment_main(Config, run, NOTEBOOK))``.

The command line reads the notebook's parameter file (``nbs/params/<notebook>.<profile>.yaml``),
applies ``-p key=value`` overrides, validates strictly, runs, and writes the results folder
``outputs/<notebook>/<tag>/`` with ``params.yaml``, ``env.json`` and ``metrics.json``. A notebook
rendering those results later (parameter ``results_dir``) adds the executed notebook beside them.
"""
from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path
from typing import Any, Callable

from rlkit.core import params as P
from rlkit.core.results import ResultsFolder, load_profile, parse_overrides
from rlkit.measure.environment import environment_report


def experiment_main(config_cls, run_fn: Callable[..., dict], notebook: str, argv=None,
                    notebook_only: tuple[str, ...] = ("results_dir",),
                    default_tag: Callable[[Any], str] | None = None) -> int:
    """CLI of one experiment. ``run_fn(cfg)`` or, if it takes ``out_dir``, ``run_fn(cfg, out_dir=...)``
    (the results folder being written: for logs the run keeps); ``default_tag(cfg)`` names the folder
    when ``--tag`` is not given (default: the profile)."""
    parser = argparse.ArgumentParser(prog=f"python -m rlkit.experiments.{run_fn.__module__.rsplit('.', 1)[-1]}")
    parser.add_argument("--profile", default="tiny", help="parameter file nbs/params/<notebook>.<profile>.yaml")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE",
                        help="override one parameter (YAML value)")
    parser.add_argument("--tag", default=None, help="results folder name")
    parser.add_argument("--out", default=None, help="results root (default: outputs/)")
    ns = parser.parse_args(argv)
    values = load_profile(notebook, ns.profile)
    values.update(parse_overrides(ns.param))
    for key in notebook_only:  # notebook-only parameters (e.g. results_dir: render saved results)
        values.pop(key, None)
    try:
        cfg = P.build(config_cls, values, where=f"parameters of {notebook}")
    except P.ParamError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tag = ns.tag or (default_tag(cfg) if default_tag else ns.profile)
    folder = ResultsFolder.create(notebook, tag, root=ns.out)
    with folder.writing() as work_dir:
        folder.write_params(P.as_dict(cfg))
        folder.write_env(environment_report())
        wants_dir = "out_dir" in inspect.signature(run_fn).parameters
        folder.write_metrics(run_fn(cfg, out_dir=work_dir) if wants_dir else run_fn(cfg))
    print(f"results: {folder.path}")
    return 0


def built_in_parser(module: str, description: str, profiles: dict[str, dict], notebook: str) -> argparse.ArgumentParser:
    """The command line of an experiment whose parameter sets are built in (``profiles``, not a notebook's files):
    ``--profile`` (default h200), ``--tiny``, ``-p``, ``--tag``, ``--out``; the caller may add its own options."""
    parser = argparse.ArgumentParser(prog=f"python -m rlkit.experiments.{module}", description=description)
    parser.add_argument("--profile", default="h200", choices=sorted(profiles), help="built-in parameter set")
    parser.add_argument("--tiny", action="store_true", help="same as --profile tiny (CPU, seconds)")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="override one parameter")
    parser.add_argument("--tag", default=None, help="results folder name (default: the profile)")
    parser.add_argument("--out", default=None,
                        help=f"results root (default: outputs/); results go to <out>/{notebook}/<tag>/")
    return parser


def run_built_in(ns, config_cls, profiles: dict[str, dict], notebook: str,
                 produce: Callable[[Any, Path], dict]) -> dict | None:
    """Validate ``ns`` (from :func:`built_in_parser`) into ``config_cls`` and write ``<out>/<notebook>/<tag>/`` with
    ``produce(cfg, work_dir)``'s metrics (it may write more files into ``work_dir``); None, with the error printed,
    when the parameters are bad."""
    profile = "tiny" if ns.tiny else ns.profile
    try:
        cfg = P.build(config_cls, {**profiles[profile], **parse_overrides(ns.param)}, where=f"parameters of {notebook}")
    except P.ParamError as err:
        print(f"error: {err}", file=sys.stderr)
        return None
    folder = ResultsFolder.create(notebook, ns.tag or profile, root=ns.out)
    with folder.writing() as work_dir:
        folder.write_params(P.as_dict(cfg))
        folder.write_env(environment_report())
        metrics = produce(cfg, Path(work_dir))
        folder.write_metrics(metrics)
    print(f"results: {folder.path}")
    return metrics

