"""Installed and unselected means inert: with rlkit installed beside verl (its ``verl.plugins`` entry point loaded at
``import verl``) and ``RLKIT_PATCHES`` unset, no attribute of verl, torch or transformers is rlkit's.

The modules to import and scan come from the patches' own registry (``rlkit.patches.shipped()``: every patch's
``targets``), so a new patch is covered without touching this test; and the scan is shown to see every shipped
patch: each one, applied on its own in the same process, is found, and reverted, is gone."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

# Runs in a fresh interpreter: import verl (the plugin loads), import every target of every shipped patch, then
# scan every loaded module of the targets' packages for objects rlkit made (functions, classes, instances of rlkit
# classes), also inside dicts (registries such as verl's policy losses or transformers' attention functions).
PROBE = r'''
import functools, importlib, json, os, sys, types
import verl  # the plugin: verl imports every verl.plugins entry point here
import rlkit
from rlkit import patches

RLKIT_DIR = os.path.dirname(rlkit.__file__)
shipped = patches.shipped()
targets = sorted({t for p in shipped for t in p.targets})
for target in targets:
    importlib.import_module(target)
roots = sorted({t.split(".")[0] for t in targets})


def made_by_rlkit(obj):
    if type(obj).__module__.split(".")[0] == "rlkit":
        return True
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    elif isinstance(obj, property):
        obj = obj.fget
    elif isinstance(obj, functools.partial):
        obj = obj.func
    if isinstance(obj, type):
        return obj.__module__.split(".")[0] == "rlkit"
    if isinstance(obj, types.FunctionType):
        return (str(obj.__module__).split(".")[0] == "rlkit" or obj.__code__.co_filename.startswith(RLKIT_DIR)
                or "__rlkit_patch__" in obj.__dict__)
    return False


def found_in(owner_name, namespace):
    for name, value in list(namespace.items()):
        where = f"{owner_name}.{name}"
        if made_by_rlkit(value):
            yield where
        if type(value) is dict:  # a plain registry (lazy mappings such as transformers' auto classes import on read)
            yield from (f"{where}[{key!r}]" for key, item in list(value.items()) if made_by_rlkit(item))


def scan():
    hits = []
    for module_name, module in list(sys.modules.items()):
        if module is None or module_name.split(".")[0] not in roots:
            continue
        namespace = vars(module)
        hits += found_in(module_name, namespace)
        for value in list(namespace.values()):
            if isinstance(value, type) and value.__module__ == module_name:
                hits += found_in(f"{module_name}.{value.__qualname__}", vars(value))
    return sorted(set(hits))


out = {"roots": roots, "targets": targets, "unselected": scan(), "active": patches.active(),
       "pending": [p.name for p in patches.pending()],
       "hook": [type(f).__name__ for f in sys.meta_path if type(f).__module__.startswith("rlkit")]}
if os.environ.get("PROBE_EACH_PATCH"):
    out["each"] = {}
    for patch in shipped:  # the scan must see every shipped patch, or this test could not fail for it
        patch.apply()
        seen = scan()
        patch.revert()
        out["each"][patch.name] = {"applied": seen, "reverted": scan()}
print("RESULT=" + json.dumps(out))
'''


def _probe(**env) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RLKIT_", "VERL_USE_EXTERNAL"))}
    clean.update(env)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(PROBE)], env=clean, capture_output=True, text=True,
                          timeout=1200, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULT=", 1)[1].splitlines()[0])


@pytest.mark.verl
def test_import_verl_with_rlkit_installed_and_nothing_selected_replaces_nothing():
    out = _probe()
    assert {"verl", "torch", "transformers"} <= set(out["roots"])
    assert out["unselected"] == [], "rlkit objects in verl/torch/transformers with RLKIT_PATCHES unset"
    assert out["active"] == [] and out["pending"] == [] and out["hook"] == []


@pytest.mark.verl
def test_the_scan_sees_every_shipped_patch_and_its_revert():
    """The control: each shipped patch, applied alone after the same imports, shows up in the scan (so the inertness
    test fails if a patch is applied at import time), and its revert leaves nothing behind."""
    # replay_poll's and selective_checkpoint's applies read their settings
    out = _probe(PROBE_EACH_PATCH="1", RLKIT_REPLAY_POLL_S="0.2", RLKIT_SELECTIVE_LAYERS="1")
    from rlkit import patches

    assert set(out["each"]) == {*patches.KNOWN_PATCHES, *patches.PLUGIN_PATCHES}
    for name, seen in out["each"].items():
        assert seen["applied"], f"the scan does not see patch {name!r}: extend made_by_rlkit for what it replaces"
        assert seen["reverted"] == [], f"{name!r} left {seen['reverted']} after revert()"
