"""The rlkit verl plugin: found through verl's entry-point group, applies exactly the chosen patches in
a fresh ``import verl`` process, records it, and fails loudly (verl itself only debug-logs plugin errors)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from rlkit.verl_job import check_plugin_records, read_plugin_records

PROBE = "import json, verl; from rlkit import patches; print('ACTIVE=' + json.dumps(patches.active()))"


def _import_verl(tmp_path, selection: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLKIT_", "VERL_USE_EXTERNAL"))}
    env.update(RLKIT_PATCHES=selection, RLKIT_RECORD_DIR=str(tmp_path))
    return subprocess.run([sys.executable, "-c", PROBE], check=False, env=env, capture_output=True, text=True, timeout=300)


def test_entry_point_is_declared_in_verl_group():
    found = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert found.get("rlkit") == "rlkit.verl_plugin"


@pytest.mark.verl
def test_import_verl_applies_exactly_the_selected_patches(tmp_path):
    # offload_views is selected, no_shard (also importable here) is not: only the selection is active.
    proc = _import_verl(tmp_path, "offload_views")
    assert proc.returncode == 0, proc.stderr[-3000:]
    active = json.loads(proc.stdout.split("ACTIVE=", 1)[1].splitlines()[0])
    assert active == ["offload_views"]
    records = check_plugin_records(tmp_path, ["offload_views"])
    assert len(records) == 1
    assert records[0]["applied"] == ["offload_views"] and records[0]["versions"]["verl"] == "0.9.1"
    with pytest.raises(RuntimeError, match="the run asked for"):
        check_plugin_records(tmp_path, ["offload_views", "no_shard"])


@pytest.mark.verl
def test_unknown_patch_fails_import_verl_loudly(tmp_path):
    proc = _import_verl(tmp_path, "offload_views,no_such_patch")
    assert proc.returncode != 0
    assert "ACTIVE=" not in proc.stdout
    assert "rlkit verl plugin FAILED" in proc.stderr and "no_such_patch" in proc.stderr
    assert "PluginLoadError" in proc.stderr
    (record,) = read_plugin_records(tmp_path)
    assert "no_such_patch" in record["error"]
    with pytest.raises(RuntimeError, match="no_such_patch"):
        check_plugin_records(tmp_path, ["offload_views", "no_such_patch"])


@pytest.mark.verl
def test_master_on_host_in_verl_also_wires_verls_engine(tmp_path):
    proc = _import_verl(tmp_path, "offload_views,master_on_host,cast_once")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = check_plugin_records(tmp_path, ["offload_views", "master_on_host", "cast_once"])
    assert record["wiring"] == ["master_on_host_verl"]


def test_missing_records_are_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="never loaded"):
        check_plugin_records(tmp_path, [])
