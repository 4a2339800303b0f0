"""rlkit's supported versions: one range (``rlkit.patches.SUPPORTED``), the same in pyproject.toml, in ``rlkit doctor``
and in every patch's version guard, and the guards checked at both ends of it and just outside, on version strings
(the installed stack is only one point: torch 2.13 + transformers 5.10 here, torch 2.11 + transformers 5.17 on the
GPU node, torch 2.15 + transformers 5.23 on PyPI)."""
from __future__ import annotations

from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from rlkit import patches
from rlkit.patches import SUPPORTED
from rlkit.tools import doctor

# dist -> (versions every patch that requires it accepts, versions every such patch refuses): both ends of the range
# and just outside, the node's / CI's / PyPI's versions, local tags, a pre-release of the next minor.
ENDS = {
    "torch": (["2.11.0", "2.11.0+cu130", "2.13.0+cpu", "2.14.0", "2.14.9"],
              ["2.10.2", "2.15.0", "2.15.0.dev20261201", "2.15.0+cpu", "3.0.0"]),
    "transformers": (["5.5.3", "5.10.4", "5.17.0", "5.17.9"], ["5.5.2", "5.18.0", "5.18.0rc0", "5.23.0"]),
    "verl": (["0.9.1"], ["0.9.0", "0.9.2", "0.10.0.dev0", "0.9.1rc1"]),
}


def test_pyproject_states_the_supported_range():
    declared = {r.name: str(r.specifier) for r in map(Requirement, metadata.requires("rlkit")) if r.marker is None}
    for dist in ("torch", "transformers"):
        assert Requirement(f"{dist}{SUPPORTED[dist]}").specifier == Requirement(f"{dist}{declared[dist]}").specifier
    extras = [Requirement(r) for r in metadata.requires("rlkit") if r.startswith("verl")]
    assert extras and all(str(r.specifier) == SUPPORTED["verl"] for r in extras)


def test_every_patch_guards_with_the_supported_range():
    for patch in patches.shipped():
        assert patch.requires, patch.name
        for dist, spec in patch.requires.items():
            assert spec == SUPPORTED[dist], f"{patch.name}: {dist} {spec} is not rlkit's range {SUPPORTED[dist]}"


@pytest.mark.parametrize("dist", sorted(ENDS))
def test_each_guard_accepts_both_ends_and_refuses_just_outside(dist):
    accepted, refused = ENDS[dist]
    guarded = [p for p in patches.shipped() if dist in p.requires]
    assert guarded, f"no patch requires {dist}"
    for patch in guarded:
        for version in accepted:
            assert patch.version_problem(dist, Version(version)) is None, (patch.name, version)
        for version in refused:
            problem = patch.version_problem(dist, Version(version))
            assert problem and f"patch {patch.name!r} was written for {dist} {SUPPORTED[dist]}" in problem
            assert f"{dist} {version} is installed" in problem and "Fix: pip install" in problem
        missing = patch.version_problem(dist, None)
        assert missing and "which is not installed" in missing


def test_the_installed_stack_passes_every_guard():
    for patch in patches.shipped():
        patch.check_versions()


@pytest.mark.parametrize("torch_v,tf_v,torch_ok,tf_ok", [
    ("2.11.0+cu130", "5.17.0", True, True), ("2.13.0+cpu", "5.10.4", True, True), ("2.14.9", "5.5.3", True, True),
    ("2.15.0", "5.17.0", False, True), ("2.10.2", "5.10.4", False, True), ("2.13.0", "5.23.0", True, False),
    ("2.13.0", "5.18.0", True, False),
])
def test_doctor_states_the_range_and_refuses_outside_it(torch_v, tf_v, torch_ok, tf_ok):
    checks = doctor.check_stack({"torch": torch_v, "transformers": tf_v}, "3.11.7", None, 0)
    (supported,) = [c for c in checks if c.what == "supported"]
    assert all(f"{d} {spec}" in supported.detail for d, spec in SUPPORTED.items())
    errors = {c.what: c.detail for c in checks if c.level == "error"}
    assert ("torch" not in errors) == torch_ok and ("transformers" not in errors) == tf_ok, errors
    for dist, detail in errors.items():
        assert f"outside rlkit's supported range {SUPPORTED[dist]}" in detail and "Fix: pip install" in detail
