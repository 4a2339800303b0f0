"""``rlkit bundle``: carry the GPU stack (vLLM, verl, Ray, ...) to a compute node without internet.

On a machine with PyPI access::

    rlkit bundle build --have node-freeze.txt --out .bundle --split-mib 58 --compress [--with-notebooks]

resolves vLLM + verl for the node's Python and platform, leaves out what the node already has (and
the heavy optional wheels a dense model does not need), downloads the rest, packs them into one
archive (optionally xz-compressed), splits it into parts of at most N MiB and writes
``manifest.json`` with a SHA-256 for every part and for the whole. On the node (stdlib + pip only;
run from a checkout, rlkit need not be installed)::

    python -m rlkit.tools.bundle freeze > node-freeze.txt        # once, to tell `build` what the node has
    python -m rlkit.tools.bundle install --from .bundle --target /opt/rlkit-site
    export PYTHONPATH=/opt/rlkit-site:$PYTHONPATH

``resplit --split-mib N`` re-cuts built parts (when what a transfer carries changes) without a new build.
``install`` verifies every part, joins them, verifies the whole, and installs all wheels in ONE
``pip install --no-index --no-deps --target``. This module decides what goes to the node and downloads it; the
archive, its parts and the install are :mod:`rlkit.tools.bundle_archive`.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlkit.tools.bundle_archive import BundleError, install, pack, resplit

DEFAULT_SPECS = ("vllm==0.24.0", "verl[vllm,verl-core]==0.9.1")
# The optional notebook part (``build --with-notebooks``): what ``rlkit run`` needs to execute notebooks with
# papermill on the node (pyproject's own pins), resolved together with the GPU stack so that one install holds both.
# anywidget: plotly's FigureWidget, which the explorers draw, is one (the bundle carried to the node on 2026-12-01
# predates it). kaleido stays out: it draws PNGs through a local Chromium, which the node does not have.
NOTEBOOK_SPECS = ("papermill>=2.6", "nbformat>=5.9", "nbclient>=0.10", "ipykernel>=6.29", "ipywidgets>=8",
                  "anywidget>=0.9", "plotly>=5.20", "pyyaml>=6")
# The optional kernel part (``build --with-kernels``): liger-kernel's Triton kernels, which
# rlkit.experiments.elementwise_kernels holds against rlkit's compiled ones. A pure-Python wheel needing torch >= 2.1.2
# and triton >= 2.3.1, which the node's own torch 2.11 and triton 3.6 satisfy (`build --plan-only` brings that one wheel).
KERNEL_SPECS = ("liger-kernel==0.8.5",)
# Never carried when the node has any version: the node's CUDA build of torch and the libraries
# built against it must stay (vLLM 0.24 matches the node's torch 2.11.0).
KEEP_NODE_PREFIXES = ("torch", "torchvision", "torchaudio", "triton", "numpy", "numba", "llvmlite", "nvidia-", "cuda-")
# Optional heavy wheels a dense Qwen3 on Hopper ran without (gpu-node notes): 921 MB saved.
SKIPPABLE_DENSE = ("flashinfer-cubin", "tokenspeed-triton", "tokenspeed-mla", "nvidia-cutlass-dsl",
                   "nvidia-cutlass-dsl-libs-cu13", "nvidia-cutlass-dsl-libs-base", "nvidia-nvvm",
                   "nvidia-cuda-nvcc", "nvidia-cuda-tileiras", "nvidia-cuda-crt", "nvidia-cuda-cccl",
                   "tilelang", "z3-solver",
                   # media and logging extras a text-only GRPO run with the console logger never imports
                   "av", "torchcodec", "wandb")
# sdist-only requirements whose wheels are built locally (pure Python, any platform).
BUILD_LOCALLY = ("antlr4-python3-runtime==4.9.3",)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_freeze(text: str) -> dict[str, str]:
    """``name==version`` lines (pip freeze / ``bundle freeze``) -> {canonical name: version}."""
    have = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "==" not in line:
            continue
        name, version = line.split("==", 1)
        have[canonical(name)] = version.strip()
    return have


@dataclass
class Decision:
    name: str
    version: str
    bring: bool
    reason: str
    url: str = ""


@dataclass
class Plan:
    python: str
    platforms: list[str]
    specs: list[str]
    decisions: list[Decision] = field(default_factory=list)

    @property
    def to_bring(self) -> list[Decision]:
        return [d for d in self.decisions if d.bring]


def requirement_specs(requires: list[str], python: str) -> dict[str, list]:
    """Every version specifier the resolved set puts on each distribution, for a Linux x86-64 CPython node.

    A requirement behind an extra counts if any extra it names would enable it: stricter than needed,
    so at worst one wheel too many is carried, never one too few.
    """
    from packaging.requirements import Requirement

    env = {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    specs: dict[str, list] = defaultdict(list)
    for raw in requires:
        req = Requirement(raw)
        if req.marker is not None:
            extras = re.findall(r"extra\s*==\s*['\"]([^'\"]+)", str(req.marker)) or [""]
            if not any(req.marker.evaluate({**env, "extra": e}) for e in extras):
                continue
        specs[canonical(req.name)].append(req.specifier)
    return specs


def decide(resolved: list[tuple[str, str, str]], have: dict[str, str], skip: tuple[str, ...],
           specs: dict[str, list] | None = None) -> list[Decision]:
    """Which resolved (name, version, url) the node needs: missing there, or there in a version that
    does not satisfy what the resolved set requires of it (``specs``, from :func:`requirement_specs`)."""
    from packaging.version import InvalidVersion, Version

    def node_suffices(key: str, node_version: str) -> bool:
        try:
            version = Version(node_version)
        except InvalidVersion:
            return False
        return specs is not None and all(version in spec for spec in specs.get(key, []))

    skip_set = {canonical(s) for s in skip}
    out = []
    for name, version, url in resolved:
        key = canonical(name)
        node_version = have.get(key)
        if key in skip_set:
            out.append(Decision(key, version, False, "optional for a dense model (skipped)", url))
        elif node_version is not None and key.startswith(KEEP_NODE_PREFIXES):
            out.append(Decision(key, version, False, f"node keeps its own {node_version}", url))
        elif node_version == version:
            out.append(Decision(key, version, False, "node has this version", url))
        elif node_version is not None and node_suffices(key, node_version):
            out.append(Decision(key, version, False, f"node's {node_version} satisfies every requirement", url))
        elif node_version is not None:
            out.append(Decision(key, version, True, f"node has {node_version}, needs {version}", url))
        else:
            out.append(Decision(key, version, True, "missing on the node", url))
    return out


def platform_args(python: str, glibc_max: int) -> list[str]:
    args = ["--python-version", python, "--implementation", "cp", "--only-binary=:all:"]
    for minor in range(17, glibc_max + 1):
        args += ["--platform", f"manylinux_2_{minor}_x86_64"]
    return args + ["--platform", "manylinux2014_x86_64", "--platform", "linux_x86_64", "--platform", "any"]


def resolve(specs: list[str], python: str, glibc_max: int, local_wheels: Path) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Resolve ``specs`` for the node with pip's dry-run report (metadata only, no full downloads).

    Returns the resolved (name, version, url) and every ``Requires-Dist`` line of the resolved set."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--report", str(report), "--find-links", str(local_wheels), "--target", str(Path(tmp) / "t"),
               *platform_args(python, glibc_max), *specs]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BundleError(f"pip could not resolve {specs} for Python {python}:\n{proc.stderr[-2000:]}")
        data = json.loads(report.read_text())
    resolved = [(i["metadata"]["name"], i["metadata"]["version"], i["download_info"]["url"]) for i in data["install"]]
    requires = [r for i in data["install"] for r in i["metadata"].get("requires_dist") or []]
    return resolved, list(specs) + requires


def build_local_wheels(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for spec in BUILD_LOCALLY:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", spec, "-w", str(dest)], check=True)


def _wheels_of(wheel_dir: Path, name: str, version: str) -> list[Path]:
    return [p for p in wheel_dir.glob("*.whl")
            if canonical(p.name.split("-")[0]) == name and p.name.split("-")[1] == version]


def download(plan: Plan, glibc_max: int, wheel_dir: Path, local_wheels: Path) -> list[Path]:
    """The plan's wheels in ``wheel_dir`` (downloaded unless already there); other files there are ignored."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheels = []
    for d in plan.to_bring:
        local = [p for p in local_wheels.glob("*.whl") if canonical(p.name.split("-")[0]) == d.name]
        if local:
            shutil.copy2(local[0], wheel_dir / local[0].name)
        elif not _wheels_of(wheel_dir, d.name, d.version):
            cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(wheel_dir),
                   *platform_args(plan.python, glibc_max), f"{d.name}=={d.version}"]
            if subprocess.run(cmd).returncode != 0:
                raise BundleError(f"could not download {d.name}=={d.version} for the node")
        found = _wheels_of(wheel_dir, d.name, d.version) or local[:1]
        if not found:
            raise BundleError(f"{d.name}=={d.version} is not in {wheel_dir} after the download")
        wheels.append(found[0])
    return wheels


def freeze() -> str:
    from importlib import metadata

    lines = sorted({f"{canonical(d.metadata['Name'])}=={d.version}" for d in metadata.distributions() if d.metadata["Name"]})
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlkit bundle", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="resolve, download, pack and split a wheelhouse for the node")
    build.add_argument("--have", required=True, help="the node's `python -m rlkit.tools.bundle freeze` output")
    build.add_argument("--spec", action="append", default=None, help=f"requirement (default: {' '.join(DEFAULT_SPECS)})")
    build.add_argument("--python", default="3.12", help="the node's Python version")
    build.add_argument("--glibc-max", type=int, default=39, help="highest manylinux_2_N the node's glibc accepts")
    build.add_argument("--keep-optional", action="store_true", help="also carry the optional heavy wheels")
    build.add_argument("--with-notebooks", action="store_true",
                       help=f"also carry what `rlkit run` needs to execute notebooks: {' '.join(NOTEBOOK_SPECS)}")
    build.add_argument("--with-kernels", action="store_true",
                       help=f"also carry the kernel library the elementwise comparison needs: {' '.join(KERNEL_SPECS)}")
    build.add_argument("--out", default=".bundle", help="output folder (keep it git-ignored)")
    build.add_argument("--split-mib", type=int, default=58, help="largest part in MiB")
    build.add_argument("--compress", action="store_true", help="xz-compress the archive")
    build.add_argument("--plan-only", action="store_true", help="print the plan, download nothing")
    cut = sub.add_parser("resplit", help="re-cut a built bundle's parts to another size (no download, no re-compression)")
    cut.add_argument("--parts", default=".bundle/parts", help="the parts folder of a built bundle")
    cut.add_argument("--split-mib", type=int, required=True, help="largest part in MiB")
    inst = sub.add_parser("install", help="on the node: verify, join and install a bundle")
    inst.add_argument("--from", dest="source", default=".bundle")
    inst.add_argument("--target", required=True, help="folder to put first on PYTHONPATH")
    sub.add_parser("freeze", help="on the node: list installed distributions as name==version")
    return parser


def _build(ns: argparse.Namespace) -> None:
    """``build``: resolve for the node, write the plan, and unless ``--plan-only`` download, pack and split."""
    have = read_freeze(Path(ns.have).read_text())
    out = Path(ns.out)
    local = out / "local-wheels"
    build_local_wheels(local)
    specs = [*(ns.spec or DEFAULT_SPECS), *(NOTEBOOK_SPECS if ns.with_notebooks else ()),
             *(KERNEL_SPECS if ns.with_kernels else ())]
    resolved, requires = resolve(specs, ns.python, ns.glibc_max, local)
    plan = Plan(ns.python, [f"manylinux_2_{ns.glibc_max}_x86_64"], specs,
                decide(resolved, have, () if ns.keep_optional else SKIPPABLE_DENSE,
                       requirement_specs(requires, ns.python)))
    (out / "plan.json").write_text(json.dumps([asdict(d) for d in plan.decisions], indent=2))
    print(f"{len(plan.to_bring)} of {len(plan.decisions)} resolved distributions go to the node")
    for d in plan.to_bring:
        print(f"  {d.name}=={d.version}  ({d.reason})")
    if not ns.plan_only:
        wheel_dir = out / "wheels"
        wheels = download(plan, ns.glibc_max, wheel_dir, local)
        manifest = pack(wheels, out / "parts", ns.split_mib, ns.compress)
        print(f"{len(manifest['parts'])} parts, {manifest['bytes'] / 2**20:.0f} MiB in {out / 'parts'}")


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        if ns.command == "freeze":
            sys.stdout.write(freeze())
        elif ns.command == "resplit":
            if ns.split_mib < 1:
                raise BundleError(f"--split-mib {ns.split_mib}: expected a positive number of MiB")
            manifest = resplit(Path(ns.parts), ns.split_mib)
            print(f"{len(manifest['parts'])} parts of at most {ns.split_mib} MiB in {ns.parts}")
        elif ns.command == "install":
            names = install(Path(ns.source), Path(ns.target))
            print(f"installed {len(names)} wheels into {ns.target}\nexport PYTHONPATH={Path(ns.target).resolve()}:$PYTHONPATH")
        else:
            _build(ns)
    except BundleError as err:
        print(f"rlkit bundle: {err}", file=sys.stderr)
        return 1
    return 0

if __name__ == "__main__":
    sys.exit(main())
