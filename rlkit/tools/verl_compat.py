"""The compatibility tier: verl's own CPU tests, run stock, with rlkit installed and nothing selected, and with every
patch that applies in verl selected. ``python -m rlkit.tools.verl_compat`` (``make verl-compat``).

Where verl's tests come from: verl's source distribution on PyPI (``pip download --no-binary :all: verl==<installed>``),
downloaded at run time into ``.verl-compat/`` (git-ignored), so nothing of verl is committed here; its ``verl/`` is
not extracted (a link to the installed verl stands there: a few tests read verl's source files). The sdist carries
the test folders that are Python packages (``tests/checkpoint_engine``, ``tests/trainer``, ``tests/single_controller``,
``tests/experimental``, ``tests/tools`` and the top level); ``tests/workers`` and ``tests/utils`` (the FSDP engine,
workers and rollout config tests) are not in it, and a machine that reaches only PyPI has no other lawful source for
them. Every ``*_on_cpu.py`` file the sdist carries runs, in a fresh pytest process per mode.

A test that fails is run once more in a fresh pytest process, and its second outcome counts (``retried`` keeps the
first). A test that passes stock and does not pass in another mode is a regression: the tier writes every outcome to
``outputs/verl_compat/<tag>/`` (``metrics.json``, one ``<mode>.log`` per mode, ``params.yaml``, ``env.json``,
``COMMAND.txt``) and exits 1. It also names the tests whose stock outcome differs from the committed baseline
(``--baseline``, the stock outcomes of an earlier run): those moved with verl's dependencies, not with rlkit.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from rlkit.core.env import REPO_ROOT, dist_version
from rlkit.core.results import ResultsFolder, read_metrics
from rlkit.measure.environment import environment_report

CACHE = REPO_ROOT / ".verl-compat"
EXPERIMENT = "verl_compat"
# What a selected run gives the patches that read a setting: replay_poll its poll (verl's own is 2 s), selective_checkpoint
# its layer count (the recipe's fields).
SELECTED_ENV = {"RLKIT_REPLAY_POLL_S": "0.2", "RLKIT_CHECK_RANK_IDENTITY": "1", "RLKIT_SELECTIVE_LAYERS": "1"}
# verl's CI runs `pytest --asyncio-mode=auto`; a hung test (a Ray cluster that never comes up) fails after 15 min.
PYTEST_INI = "[pytest]\nasyncio_mode = auto\ntimeout = 900\n"


def applicable_patches() -> list[str]:
    """Every shipped patch whose versions fit the installed stack (what 'everything selected' means here)."""
    from rlkit import patches

    fit = []
    for name in patches.KNOWN_PATCHES:
        try:
            patches.get(name).check_versions()
        except patches.PatchError:
            continue
        fit.append(name)
    return fit


def modes() -> dict[str, dict[str, str]]:
    """Each mode's environment on top of one without any RLKIT_ variable."""
    return {
        "stock": {"VERL_USE_EXTERNAL_PLUGINS": "none"},  # verl loads no plugin: rlkit's never runs
        "unselected": {},
        "selected": {"RLKIT_PATCHES": ",".join(applicable_patches()), **SELECTED_ENV},
    }


def fetch_tests(version: str, cache: Path = CACHE) -> Path:
    """verl ``version``'s sdist from PyPI, its ``tests/`` extracted (not its ``verl/``: the installed verl is tested).
    Returns the folder that holds ``tests/``."""
    root = cache / f"verl-{version}"
    if (root / "tests").is_dir():
        return root
    sdist_dir = cache / "sdist"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                    f"verl=={version}", "-d", str(sdist_dir)], check=True)
    (archive,) = sdist_dir.glob(f"verl-{version}.tar.gz")
    staging = cache / f".verl-{version}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    prefix = f"verl-{version}/tests/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        for member in members:
            member.name = member.name[len(f"verl-{version}/"):]
        tar.extractall(staging, members=members, filter="data")
    (staging / "pytest.ini").write_text(PYTEST_INI)
    # A few tests read verl's source files beside tests/ (../verl/...): the installed verl, the same release.
    (staging / "verl").symlink_to(Path(importlib.util.find_spec("verl").submodule_search_locations[0]))
    staging.rename(root)
    return root


def cpu_test_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "tests").rglob("*_on_cpu.py"))


def _node_id(root: Path, classname: str, name: str) -> str:
    """pytest's node id of a JUnit test case: the longest dotted prefix of ``classname`` that is a file, then the
    class (if any) and the test."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (root / path).is_file():
            return "::".join([path, *parts[cut:], name])
    return f"{classname}::{name}"


def outcomes(junit: Path, root: Path) -> dict[str, str]:
    """``{node id: passed | failed | error | skipped}`` from pytest's JUnit XML."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test_id = _node_id(root, case.get("classname"), case.get("name"))
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        found[test_id] = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(kinds[0] if kinds else "",
                                                                                          "passed")
    return found


def run_mode(root: Path, files: list[str], env_extra: dict[str, str], junit: Path, log: Path) -> float:
    """One pytest process over ``files`` in ``root``; returns its wall time in seconds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLKIT_") and k != "VERL_USE_EXTERNAL_PLUGINS"}
    # verl's Ray tests call ray.init(num_cpus=...), which fails when another Ray cluster runs on the machine (a
    # shared CI host, a colleague's job): "local" starts this process's own.
    env.update(RAY_ADDRESS="local", **env_extra)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "pytest.ini", "--rootdir", ".",
           "--junitxml", str(junit), *files]
    start = time.monotonic()
    with open(log, "w") as out:  # root's verl/ is the installed verl: the installed verl is what runs
        subprocess.run(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    return time.monotonic() - start


def run_and_confirm(root: Path, files: list[str], env_extra: dict[str, str], stem: str, log: Path):
    """One mode: every file in one pytest process, then the tests that did not pass once more in a fresh one (verl's
    Ray tests crash now and then on a loaded host, and a crashed Ray leaves the rest of that process failing). A
    test's outcome is its second run's; returns (outcomes, {test: first outcome} of the re-run, seconds)."""
    seconds = run_mode(root, files, env_extra, root / f"{stem}.xml", log)
    found = outcomes(root / f"{stem}.xml", root)
    again = sorted(t for t, o in found.items() if o in ("failed", "error"))
    if not again:
        return found, {}, seconds
    seconds += run_mode(root, again, env_extra, root / f"{stem}-again.xml", log.with_suffix(".again.log"))
    second = outcomes(root / f"{stem}-again.xml", root)
    retried = {t: found[t] for t in again}
    found.update({t: second.get(t, "error") for t in again})
    return found, retried, seconds


def regressions(results: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """Per mode other than stock: the tests that pass stock and do not pass there (missing counts as not passing)."""
    stock = results["stock"]
    return {mode: sorted(t for t, o in stock.items() if o == "passed" and found.get(t) != "passed")
            for mode, found in results.items() if mode != "stock"}


def baseline_drift(baseline: dict[str, str], stock: dict[str, str]) -> list[str]:
    """Tests whose stock outcome here differs from the baseline's, as 'id: before -> now'."""
    return sorted(f"{t}: {baseline.get(t, 'absent')} -> {stock.get(t, 'absent')}"
                  for t in set(baseline) | set(stock) if baseline.get(t) != stock.get(t))


def summary(found: dict[str, str]) -> dict[str, int]:
    kinds = ("passed", "failed", "error", "skipped")
    return {k: sum(1 for o in found.values() if o == k) for k in kinds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlkit.tools.verl_compat", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", default="cpu", help="results folder outputs/verl_compat/<tag>/ (default: cpu)")
    parser.add_argument("--baseline", default=None,
                        help="a results folder whose stock outcomes are the baseline (default: the folder of --tag)")
    parser.add_argument("-k", dest="keyword", default=None, help="only the test files whose path contains this")
    ns = parser.parse_args(argv)
    version = dist_version("verl")
    if version is None:
        raise SystemExit("verl is not installed. Fix: pip install -e '.[verl]' (make setup)")
    folder = ResultsFolder.create(EXPERIMENT, ns.tag)
    baseline_dir = Path(ns.baseline) if ns.baseline else folder.path
    baseline = read_metrics(baseline_dir)["outcomes"]["stock"] if (baseline_dir / "metrics.json").exists() else None
    root = fetch_tests(version)
    files = [f for f in cpu_test_files(root) if ns.keyword is None or ns.keyword in f]
    env_by_mode = modes()
    with folder.writing() as out:
        results, retried, seconds = {}, {}, {}
        for mode, env_extra in env_by_mode.items():
            print(f"verl {version} CPU tests, {mode}: {len(files)} files", flush=True)
            # per tag: two tiers may share the cache
            results[mode], retried[mode], took = run_and_confirm(root, files, env_extra, f"{ns.tag}-{mode}",
                                                                 out / f"{mode}.log")
            seconds[mode] = round(took, 1)
        found = regressions(results)
        drift = baseline_drift(baseline, results["stock"]) if baseline is not None else None
        folder.write_params({"verl": version, "source": f"PyPI sdist verl=={version}", "files": files,
                             "modes": env_by_mode, "keyword": ns.keyword})
        folder.write_env(environment_report())
        folder.write_metrics({"ok": not any(found.values()), "regressions": found, "baseline_drift": drift,
                              "retried": retried,
                              "counts": {m: summary(r) for m, r in results.items()}, "seconds": seconds,
                              "outcomes": results})
        (out / "COMMAND.txt").write_text(f"python -m rlkit.tools.verl_compat {' '.join(argv or sys.argv[1:])}".strip()
                                         + "   # make verl-compat\n")
    for mode, counts in ((m, summary(r)) for m, r in results.items()):
        print(f"{mode:>10}: {counts} in {seconds[mode]} s; passes stock, not here: {len(found.get(mode, []))}")
    for mode, tests in found.items():
        for test in tests:
            print(f"REGRESSION ({mode}): {test}")
    for line in drift or []:
        print(f"stock outcome moved since the baseline (not rlkit's doing): {line}")
    print(f"results: {folder.path}")
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
