"""The rlkit verl plugin: found through verl's entry-point group; in a fresh ``import verl`` process it checks
the chosen patches and applies each when the modules it changes are imported (torch's at once, verl's FSDP
engine's when the process imports the engine), records what is applied and what is pending, and fails
loudly (verl itself only debug-logs plugin errors): at ``import verl`` for a bad name or version, in the
triggering ``import`` statement for a deferred apply."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

from rlkit.recipes.job import check_plugin_records, read_plugin_records

ENGINE = "verl.workers.engine.fsdp.transformer_impl"


# Prepended to every probe: record() reads the one record this process wrote.
PRELUDE = """
import glob, json, os, sys
def record():
    (path,) = glob.glob(os.path.join(os.environ["RLKIT_RECORD_DIR"], "*.json"))
    return json.load(open(path))
"""


def _run(tmp_path, code: str, selection: str, **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter with ``RLKIT_PATCHES=selection`` and records into ``tmp_path``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RLKIT_", "VERL_USE_EXTERNAL"))}
    clean.update(RLKIT_PATCHES=selection, RLKIT_RECORD_DIR=str(tmp_path), **env)
    return subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], check=False, env=clean,
                          capture_output=True, text=True, timeout=600)


def _results(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULT=", 1)[1].splitlines()[0])


def test_entry_point_is_declared_in_verl_group():
    found = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert found.get("rlkit") == "rlkit.patches.verl_plugin"


@pytest.mark.verl
def test_import_verl_defers_verl_patches_until_the_engine_is_imported(tmp_path):
    """``import verl`` applies the torch-level patches and leaves verl's FSDP engine un-imported, with
    no_shard, the master_on_host wiring and the rank-identity instrument pending; importing the engine
    applies them (their replacements are visible) and rewrites the record."""
    proc = _run(tmp_path, f"""
        import verl
        from rlkit import patches
        from torch.distributed.fsdp._flat_param import FlatParamHandle
        out = {{"engine_imported_by_verl": {ENGINE!r} in sys.modules, "at_import_verl": record(),
               "flat_param_to": getattr(FlatParamHandle.flat_param_to, "__rlkit_patch__", None)}}
        import {ENGINE} as engine
        out.update(after_engine=record(), pending_after=[p.name for p in patches.pending()],
                   hook_left=[type(f).__name__ for f in sys.meta_path if type(f).__name__ == "_PostImportFinder"],
                   sharding=getattr(engine.get_sharding_strategy, "__rlkit_patch__", None),
                   optimizer_step=getattr(engine.FSDPEngine.optimizer_step, "__rlkit_patch__", None))
        print("RESULT=" + json.dumps(out))
        """, "offload_views,no_shard,master_on_host,cast_once", RLKIT_CHECK_RANK_IDENTITY="1")
    out = _results(proc)
    first, after = out["at_import_verl"], out["after_engine"]
    assert out["engine_imported_by_verl"] is False
    assert first["applied"] == ["offload_views", "master_on_host", "cast_once"] and first["pending"] == ["no_shard"]
    assert first["state"]["master_on_host_verl"] == "pending" and first["state"]["rank_identity"] == "pending"
    assert first["wiring"] == ["master_on_host_verl"] and first["targets"]["no_shard"] == [ENGINE]
    assert first["guards"] == ["checkpoint_fingerprint"] and first["state"]["checkpoint_fingerprint"] == "pending"
    assert out["flat_param_to"] == "offload_views"  # torch was imported: applied at once
    assert after["applied"] == ["offload_views", "no_shard", "master_on_host", "cast_once"] and after["pending"] == []
    assert set(after["state"].values()) == {"applied"} and after["error"] is None
    assert after["applied_on"]["offload_views"] == "import verl" and after["applied_on"]["no_shard"].startswith("verl.")
    assert out["sharding"] == "no_shard" and out["optimizer_step"] == "rank_identity"  # outermost, as before
    assert out["pending_after"] == [] and out["hook_left"] == []  # nothing waits: the hook is gone
    (record,) = check_plugin_records(tmp_path, ["no_shard", "offload_views", "master_on_host", "cast_once"])
    assert record["versions"]["verl"] == "0.9.1"
    with pytest.raises(RuntimeError, match="the run asked for"):
        check_plugin_records(tmp_path, ["offload_views", "no_shard"])


@pytest.mark.verl
def test_nothing_selected_applies_nothing_not_even_the_checkpoint_guard(tmp_path):
    """With no selection the plugin records and changes nothing, the checkpoint guard included (an unpatched run
    resuming a patched checkpoint is refused by the checkpoint's own trip-wire: tests/test_checkpoint_guard.py)."""
    proc = _run(tmp_path, f"""
        import verl
        from rlkit import patches
        import {ENGINE}
        from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager as M
        out = {{"record": record(), "active": patches.active(),
               "load": getattr(M.load_checkpoint, "__rlkit_patch__", None)}}
        print("RESULT=" + json.dumps(out))
        """, "")
    out = _results(proc)
    record = out["record"]
    assert record["requested"] == [] and record["applied"] == [] and out["active"] == []
    assert record["guards"] == [] and record["state"] == {} and out["load"] is None
    check_plugin_records(tmp_path, [], require_worker=False)


@pytest.mark.verl
def test_a_version_mismatch_still_fails_import_verl(tmp_path):
    """A patch whose version range excludes the installed verl fails ``import verl`` itself (PluginLoadError,
    a BaseException verl's loader cannot swallow), before any patch waits for its target."""
    proc = _run(tmp_path, f"""
        import sys
        from rlkit.patches.fsdp import no_shard
        no_shard.PATCH.requires = {{**no_shard.PATCH.requires, "verl": "==0.0.1"}}  # written for another verl
        try:
            import verl
        except BaseException as err:
            print("RAISED=" + type(err).__name__, {ENGINE!r} in sys.modules)
        """, "offload_views,no_shard")
    assert "RAISED=PluginLoadError False" in proc.stdout, proc.stderr[-3000:]
    assert "rlkit verl plugin FAILED" in proc.stderr and "written for verl ==0.0.1" in proc.stderr
    (record,) = read_plugin_records(tmp_path)
    assert "no_shard" in record["error"] and record["applied"] == []
    with pytest.raises(RuntimeError, match="was written for verl ==0.0.1"):
        check_plugin_records(tmp_path, ["offload_views", "no_shard"])


@pytest.mark.verl
def test_unknown_patch_fails_import_verl_loudly(tmp_path):
    proc = _run(tmp_path, "import json, verl; print('IMPORTED')", "offload_views,no_such_patch")
    assert proc.returncode != 0
    assert "IMPORTED" not in proc.stdout
    assert "rlkit verl plugin FAILED" in proc.stderr and "no_such_patch" in proc.stderr
    assert "PluginLoadError" in proc.stderr
    (record,) = read_plugin_records(tmp_path)
    assert "no_such_patch" in record["error"]
    with pytest.raises(RuntimeError, match="no_such_patch"):
        check_plugin_records(tmp_path, ["offload_views", "no_such_patch"])


@pytest.mark.verl
def test_a_failing_deferred_apply_raises_from_the_import_that_triggered_it(tmp_path):
    """``import verl`` succeeds with no_shard pending; the engine import raises PluginLoadError naming the
    patch and writes the error record. The patch is not dropped: the next import retries it and fails again,
    so the process cannot carry on importing verl as if it were patched."""
    proc = _run(tmp_path, f"""
        from rlkit.patches.fsdp import no_shard
        def apply_fn():  # what a verl whose engine lost the patched function would do
            raise AttributeError("module has no attribute 'get_sharding_strategy'")
        no_shard.PATCH.apply_fn = apply_fn
        import verl
        out = {{"pending_at_import_verl": record()["pending"]}}
        for attempt, module in (("engine", {ENGINE!r}), ("next_import", "verl.workers.engine_workers")):
            try:
                __import__(module)
                out[attempt] = "imported"
            except BaseException as err:
                out[attempt] = [type(err).__name__, str(err)]
        print("RESULT=" + json.dumps(out))
        """, "offload_views,no_shard")
    out = _results(proc)
    assert out["pending_at_import_verl"] == ["no_shard"]
    for attempt in ("engine", "next_import"):
        kind, message = out[attempt]
        assert kind == "PluginLoadError" and "patch 'no_shard' failed to apply after `import verl." in message
        assert "has no attribute 'get_sharding_strategy'" in message
    assert "rlkit verl plugin FAILED" in proc.stderr and "no_shard" in proc.stderr
    (record,) = read_plugin_records(tmp_path)
    assert "patch 'no_shard' failed to apply" in record["error"] and record["pending"] == ["no_shard"]
    with pytest.raises(RuntimeError, match="no_shard"):
        check_plugin_records(tmp_path, ["offload_views", "no_shard"])


@pytest.mark.verl
def test_import_verl_with_verls_device_platform_stubbed_as_its_cpu_tests_do(tmp_path):
    """verl's CPU tests that load ``vllm_rollout/utils.py`` with stand-ins (they do not ship with the wheel) put
    a ``verl.plugin.platform`` whose ``get_platform()`` returns None in ``sys.modules`` and then import verl.
    The eager plugin imported the FSDP engine there, whose module body calls ``get_device_name()``
    (``PluginLoadError: 'NoneType' object has no attribute 'device_name'``). Now ``import verl`` succeeds
    with every shipped patch selected, the engine-level ones pending; the stub still breaks the engine's own
    import, which is what the eager plugin ran into."""
    proc = _run(tmp_path, f"""
        import importlib, types
        fake_platform = types.ModuleType("verl.plugin.platform")
        fake_platform.get_platform = lambda: None
        sys.modules["verl.plugin.platform"] = fake_platform
        import verl
        out = {{"record": record(), "engine_imported": {ENGINE!r} in sys.modules}}
        try:
            importlib.import_module({ENGINE!r})
        except AttributeError as err:
            out["engine_import_error"] = str(err)
        print("RESULT=" + json.dumps(out))
        """, "offload_views,no_shard,skip_old_logprob,master_on_host,cast_once,metric_entropy,chunked_logprobs,"
             "varlen_attention")
    out = _results(proc)
    record = out["record"]
    assert record["error"] is None and out["engine_imported"] is False
    assert {"no_shard", "chunked_logprobs", "skip_old_logprob"} <= set(record["pending"])
    assert out["engine_import_error"] == "'NoneType' object has no attribute 'device_name'"


# ------------------------------------------------------------------------------------------------------------
# check_plugin_records over the records of a launch (written here as the plugin writes them)


def _write_record(record_dir, pid: int, role: str, applied, pending, state=None, error=None):
    state = state if state is not None else {**{n: "applied" for n in applied}, **{n: "pending" for n in pending}}
    record = {"pid": pid, "role": role, "requested": [*applied, *pending], "applied": list(applied),
              "pending": list(pending), "state": state, "error": error}
    (record_dir / f"host-{pid}.json").write_text(json.dumps(record))


def test_check_plugin_records_accepts_patches_pending_where_the_engine_is_never_imported(tmp_path):
    run = ["offload_views", "no_shard"]
    _write_record(tmp_path, 1, "driver", ["offload_views"], ["no_shard"])
    _write_record(tmp_path, 2, "ray_worker", ["offload_views"], ["no_shard"])  # the vLLM server
    _write_record(tmp_path, 3, "ray_worker", ["no_shard", "offload_views"], [])  # the actor, any order
    assert len(check_plugin_records(tmp_path, run, require_worker=True)) == 3


def test_check_plugin_records_rejects_a_run_where_no_worker_applied_everything(tmp_path):
    run = ["offload_views", "master_on_host"]
    _write_record(tmp_path, 1, "driver", run, [])
    _write_record(tmp_path, 2, "ray_worker", ["offload_views"], ["master_on_host"])
    # the selection applied but the master_on_host wiring into verl's engine still pending: not complete either
    _write_record(tmp_path, 3, "ray_worker", run, [],
                  state={"offload_views": "applied", "master_on_host": "applied", "master_on_host_verl": "pending"})
    assert len(check_plugin_records(tmp_path, run)) == 3  # each process on its own is consistent
    with pytest.raises(RuntimeError, match=r"no Ray worker applied all of \['offload_views', 'master_on_host'\].*"
                                           r"pid 2 still pending \['master_on_host'\]; "
                                           r"pid 3 still pending \['master_on_host_verl'\]"):
        check_plugin_records(tmp_path, run, require_worker=True)


def test_check_plugin_records_names_a_process_with_another_selection_or_an_error(tmp_path):
    _write_record(tmp_path, 1, "ray_worker", ["offload_views"], [])
    _write_record(tmp_path, 2, "ray_worker", ["offload_views"], ["no_shard"], error="PatchError: boom")
    with pytest.raises(RuntimeError) as caught:
        check_plugin_records(tmp_path, ["offload_views", "no_shard"], require_worker=True)
    message = str(caught.value)
    assert "pid 1 (ray_worker) applied ['offload_views'] with [] pending, the run asked for" in message
    assert "pid 2 (ray_worker): PatchError: boom" in message


def test_check_plugin_records_requires_a_worker_record(tmp_path):
    _write_record(tmp_path, 1, "driver", ["offload_views"], [])
    with pytest.raises(RuntimeError, match="no Ray worker recorded"):
        check_plugin_records(tmp_path, ["offload_views"], require_worker=True)


def test_missing_records_are_an_error(tmp_path):
    with pytest.raises(RuntimeError, match="never loaded"):
        check_plugin_records(tmp_path, [])
