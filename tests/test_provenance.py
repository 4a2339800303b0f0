"""env.json records the patches active in every process a run launched, not the driver's alone (issue 46).

The driver of a verl run selects no patch itself: the plugin applies them in verl's workers and records each
process (``metrics["launch"]["plugin_records"]``). A committed GPU run's records are the evidence."""
from __future__ import annotations

import json

from rlkit.core.results import OUTPUTS_DIR, ResultsFolder, with_processes

RUN = OUTPUTS_DIR / "05_grpo_qwen3_4b" / "h200-seed-5-master-on-host-cast-once.session21"


def _committed() -> tuple[dict, dict]:
    return json.loads((RUN / "env.json").read_text()), json.loads((RUN / "metrics.json").read_text())


def test_the_union_over_every_launched_process_is_recorded():
    env, metrics = _committed()
    records = metrics["launch"]["plugin_records"] + ((metrics.get("verify") or {}).get("plugin_records") or [])
    assert env["active_patches"] == []  # what the driver alone saw: the defect this fixes
    out = with_processes(env, metrics)
    every = {name for r in records for name in r["active"]}
    assert {"varlen_attention", "offload_views"} <= every  # the committed run's workers really patched
    assert set(out["active_patches"]) == every and out["driver_active_patches"] == []
    assert [p["pid"] for p in out["processes"]] == [r["pid"] for r in records]
    assert with_processes(out, metrics) == out  # applying it again changes nothing


def test_a_run_without_launched_processes_keeps_its_env():
    env, _ = _committed()
    assert with_processes(env, {"launch": {"plugin_records": []}}) is env
    assert with_processes(env, {}) is env


def test_the_results_folder_writes_it_beside_the_metrics(tmp_path):
    env, metrics = _committed()
    folder = ResultsFolder("05_grpo_qwen3_4b", "t", root=tmp_path)
    with folder.writing():
        folder.write_env(env)
        folder.write_metrics(metrics)
    saved = json.loads((folder.path / "env.json").read_text())
    assert saved["active_patches"] == with_processes(env, metrics)["active_patches"] != []
