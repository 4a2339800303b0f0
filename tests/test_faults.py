"""Faults and bad input (issue 25, item 4): each is produced for real, and each test checks what the user sees
(the error names the cause and the fix) and that nothing half-written lands in ``outputs/``.

docs/reliability.md has the table of them. verl cannot run on a CPU machine, so a launched verl stands in as a small
script put where ``python -m verl.trainer.main_ppo`` finds it (first on PYTHONPATH): it is only the process
:func:`rlkit.recipes.job.launch_job` launches; everything rlkit does around it (the session, the log, reading it, the
error, the results folder) is the real code. Real verl and vLLM failure text comes from committed GPU runs, named
where it is read. The bundle's faults are in tests/test_bundle.py, the patch-registry basics in
tests/test_patches_registry.py.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from conftest import committed_run

from rlkit.core.env import REPO_ROOT
from rlkit.core.params import ParamError
from rlkit.core.results import ResultsFolder
from rlkit.models import data
from rlkit.models import shape as model_shape
from rlkit.planning import preflight
from rlkit.planning.host_memory import host_adamw_bytes
from rlkit.recipes import job as verl_job
from rlkit.verl import logs as verl_logs

GIB = 2**30
NOTEBOOK = "05_grpo_qwen3_4b"
STOCK = REPO_ROOT / "outputs" / NOTEBOOK / "0-stock"  # the stock arm: vLLM refused to start (a real 2 x H200 run)


# ------------------------------------------------------------------------------------------------------------
# the launch: a stand-in verl driver, the real launch_job around it


def _standin(tmp_path: Path, source: str) -> dict[str, str]:
    """Put ``source`` where ``python -m verl.trainer.main_ppo`` finds it first; the extra environment of the launch,
    with a marker by which every process of the launch can be found afterwards."""
    root = tmp_path / "standin"
    (root / "verl" / "trainer").mkdir(parents=True)
    (root / "verl" / "__init__.py").write_text("")
    (root / "verl" / "trainer" / "__init__.py").write_text("")
    (root / "verl" / "trainer" / "main_ppo.py").write_text(textwrap.dedent(source))
    return {"PYTHONPATH": os.pathsep.join([str(root), str(REPO_ROOT)]), "RLKIT_FAULT_TEST": uuid.uuid4().hex}


def _processes_with(marker: str) -> list[int]:
    """PIDs of the processes whose environment carries ``marker`` (what a launch started, children included)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"RLKIT_FAULT_TEST={marker}".encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def _kill_when(pattern: str, marker: str, killed: list[int]):
    """An ``on_line`` for launch_job: on the first line matching ``pattern`` (group 1: a pid), SIGKILL that process,
    having checked that it is one the launch started."""
    regex, colour = re.compile(pattern), re.compile(r"\x1b\[[0-9;]*m")  # Ray colours its "(Class pid=N)" prefixes

    def on_line(line: str) -> None:
        match = regex.search(colour.sub("", line))
        if match and not killed:
            pid = int(match.group(1))
            assert pid in _processes_with(marker), f"pid {pid} is not a process of this launch"
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    return on_line


def _recipe(**fields):
    from rlkit.recipes.grpo import GRPORecipe

    return GRPORecipe(**{"steps": 3, "timeout_s": 180, **fields})


def _assert_failed_folder(root: Path, tag: str, *needles: str) -> str:
    """The run left ``<tag>.failed/`` with FAILED.txt (returned) and no metrics.json; no ``<tag>/``, no partial folder."""
    folder = root / NOTEBOOK
    assert not (folder / tag).exists(), "a folder named like a complete run was left"
    failed = folder / f"{tag}.failed"
    text = (failed / "FAILED.txt").read_text()
    assert not (failed / "metrics.json").exists()
    assert not list(folder.glob(f".{tag}.partial-*"))
    for needle in (*needles, f"full log {failed / verl_logs.CONSOLE_LOG};"):  # where the log is now, not was
        assert needle in text, f"{needle!r} not in FAILED.txt:\n{text[:3000]}"
    return text


RAY_STANDIN = '''
    """Stand-in for verl's trainer: a real Ray cluster and a real actor worker; step 2's update runs until the test
    kills the worker's process with SIGKILL."""
    import json, os, time

    import ray


    @ray.remote
    class WorkerDict:  # the name of verl's colocated actor / rollout worker class
        def pid(self):
            return os.getpid()

        def actor_rollout_update_actor(self, step):
            print(f"update_actor step {step} started", flush=True)
            if step == 2:
                time.sleep(600)  # mid-update: the SIGKILL lands here
            return {"actor/pg_loss": 0.0, "actor/grad_norm": 1.0}


    def main():
        ray.init(num_cpus=1, include_dashboard=False)
        worker = WorkerDict.remote()
        ray.get(worker.pid.remote())
        with open(os.environ["VERL_FILE_LOGGER_PATH"], "a") as logger:
            for step in (1, 2, 3):
                start = time.time()
                metrics = ray.get(worker.actor_rollout_update_actor.remote(step))
                metrics["timing_s/step"] = time.time() - start
                print(f"step:{step} - " + " - ".join(f"{k}:{v}" for k, v in metrics.items()), flush=True)
                logger.write(json.dumps({"step": step, "data": metrics}) + "\\n")
                logger.flush()


    if __name__ == "__main__":
        main()
'''


@pytest.mark.verl
def test_a_ray_worker_killed_mid_update_fails_the_run_naming_the_cause_and_the_fix(tmp_path):
    """A real Ray actor is SIGKILLed in the middle of step 2's update (what the kernel's OOM killer does): Ray reports
    the death, launch_job raises an error saying which worker died in which phase and what to do, the results folder
    is ``<tag>.failed/`` (FAILED.txt, step 1's partial metrics kept, no metrics.json) and no process of the launch
    (the driver, the Ray daemons, the workers) is left running."""
    pytest.importorskip("ray")
    env = _standin(tmp_path, RAY_STANDIN)
    root = tmp_path / "outputs"
    folder = ResultsFolder(NOTEBOOK, "killed-worker", root=root)
    for attempt in range(2):  # a loaded 2-core machine occasionally times Ray's own start-up out
        killed: list[int] = []
        on_line = _kill_when(r"\(WorkerDict pid=(\d+)\) update_actor step 2 started", env["RLKIT_FAULT_TEST"], killed)
        with pytest.raises(RuntimeError) as caught, folder.writing() as work:
            verl_job.launch_job(_recipe(), [], work, extra_env=env, on_line=on_line)
        message = str(caught.value)
        if killed or "timed out during startup" not in message:
            break
    else:
        pytest.skip(f"Ray did not start on this machine (twice): {message[-600:]}")
    assert killed, f"the worker's update never started:\n{message[-3000:]}"
    assert f"a Ray worker (pid {killed[0]}) died in update_actor" in message
    assert "killed by a signal (SIGKILL from the kernel's OOM killer" in message and "Fix: look for the kill in `dmesg`" in message
    assert "having logged 1/3 steps" in message
    _assert_failed_folder(root, "killed-worker", f"a Ray worker (pid {killed[0]}) died in update_actor", "Fix:")
    failed = root / NOTEBOOK / "killed-worker.failed"
    assert [s["step"] for s in verl_logs.read_steps(failed)[0]] == [1]  # what ran is kept, marked failed
    assert _processes_with(env["RLKIT_FAULT_TEST"]) == [], "processes of the launch survived it"


DRIVER_STANDIN = '''
    """Stand-in for verl's driver: a worker process in its session, step 1 logged, then step 2's update runs until
    the test kills this process (the driver) with SIGKILL."""
    import json, os, subprocess, sys, time

    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # stands where Ray's workers do
    with open(os.environ["VERL_FILE_LOGGER_PATH"], "a") as logger:
        print("step:1 - timing_s/step:0.1 - actor/pg_loss:0.0", flush=True)
        logger.write(json.dumps({"step": 1, "data": {"timing_s/step": 0.1, "actor/pg_loss": 0.0}}) + "\\n")
        logger.flush()
    print(f"(TaskRunner pid={os.getpid()}) update_actor step 2 started", flush=True)
    time.sleep(600)
'''


def test_a_driver_killed_mid_update_fails_the_run_and_leaves_no_process(tmp_path):
    """The launched driver itself is SIGKILLed mid-update: the error says it was killed by SIGKILL and what to do,
    the results folder is ``<tag>.failed/`` and the worker it had started (orphaned by the kill, in the launch's
    session) is stopped with it."""
    env = _standin(tmp_path, DRIVER_STANDIN)
    killed: list[int] = []
    on_line = _kill_when(r"\(TaskRunner pid=(\d+)\) update_actor step 2 started", env["RLKIT_FAULT_TEST"], killed)
    root = tmp_path / "outputs"
    folder = ResultsFolder(NOTEBOOK, "killed-driver", root=root)
    with pytest.raises(RuntimeError) as caught, folder.writing() as work:
        verl_job.launch_job(_recipe(), [], work, extra_env=env, on_line=on_line)
    message = str(caught.value)
    assert killed and "verl exited with -9" in message and "having logged 1/3 steps" in message
    assert "verl's driver was killed by SIGKILL" in message and "Fix: look for the kill in `dmesg`" in message
    _assert_failed_folder(root, "killed-driver", "verl's driver was killed by SIGKILL", "Fix:")
    assert _processes_with(env["RLKIT_FAULT_TEST"]) == [], "processes of the launch survived it"


# ------------------------------------------------------------------------------------------------------------
# vLLM failing at start-up


def test_vllm_refusing_to_start_is_found_in_the_stock_arms_real_log_with_the_fix():
    """outputs/05_grpo_qwen3_4b/0-stock/verl.log: the stock arm on 2 x H200 emulating 47.4 GiB cards, where vLLM
    found 30.17 GiB free for its 0.85 x 47.4 GiB reservation (the offload leak). The failure names the numbers and
    the fix: a utilization that fits, or freeing the actor's rollout residue."""
    run = committed_run(STOCK)
    failure = verl_logs.find_failure((run / verl_logs.CONSOLE_LOG).read_text(errors="replace"))
    assert (failure["kind"], failure["phase"]) == ("vllm_startup", "init")
    assert (failure["free_gib"], failure["total_gib"], failure["requested_gib"]) == (30.17, 47.4, 40.29)
    assert "Free memory on device cuda:0 (30.17/47.4 GiB) on startup is less than desired" in failure["line"]
    assert "gpu_memory_utilization to at most 0.63" in failure["fix"] and "offload_views" in failure["fix"]
    recorded = json.loads((run / "metrics.json").read_text())["launch"]["failure"]
    assert {k: recorded[k] for k in ("kind", "phase", "free_gib")} == {k: failure[k] for k in ("kind", "phase", "free_gib")}
    assert verl_logs.find_crash((run / verl_logs.CONSOLE_LOG).read_text(errors="replace")) is None


REPLAY_STANDIN = '''
    """Stand-in for verl's trainer: replays a real run's console (RLKIT_REPLAY_LOG) and exits as it did."""
    import os, sys

    sys.stdout.write(open(os.environ["RLKIT_REPLAY_LOG"], errors="replace").read())
    sys.stdout.flush()
    sys.exit(1)
'''


def test_a_launch_where_vllm_refuses_to_start_is_a_result_in_a_complete_folder(tmp_path):
    """The launch path on the stock arm's real console text (replayed by the stand-in, which exits 1 as verl did):
    a vLLM start-up failure is a measured result, not a crash. launch_job returns it (kind, phase, numbers, fix),
    the results folder is complete and says so in metrics.json, and no process of the launch is left."""
    run = committed_run(STOCK)
    env = {**_standin(tmp_path, REPLAY_STANDIN), "RLKIT_REPLAY_LOG": str(run / verl_logs.CONSOLE_LOG)}
    root = tmp_path / "outputs"
    folder = ResultsFolder(NOTEBOOK, "stock", root=root)
    with folder.writing() as work:
        result = verl_job.launch_job(_recipe(expect_failure=True), [], work, extra_env=env)
        folder.write_metrics({"launch": {k: result[k] for k in ("failure", "returncode")}})
    assert result["returncode"] == 1 and result["steps"] == []
    assert result["failure"]["kind"] == "vllm_startup" and "at most 0.63" in result["failure"]["fix"]
    saved = json.loads((root / NOTEBOOK / "stock" / "metrics.json").read_text())
    assert saved["launch"]["failure"]["kind"] == "vllm_startup" and "fix" in saved["launch"]["failure"]
    assert not (root / NOTEBOOK / "stock.failed").exists() and not list((root / NOTEBOOK).glob(".stock.partial-*"))
    assert _processes_with(env["RLKIT_FAULT_TEST"]) == []


# ------------------------------------------------------------------------------------------------------------
# a malformed data row


def _dapo_with(tmp_path: Path, row: int, mutate) -> tuple[Path, str]:
    """A parquet in DAPO-Math-17k's schema (20 rows) whose row ``row`` was changed by ``mutate`` before writing, and
    that row's DAPO index."""
    rows = data.synthetic_rows(20, seed=5)
    mutate(rows[row])
    return data.write_parquet(rows, tmp_path / "dapo-math-17k.parquet"), rows[row]["extra_info"]["index"]


def _truth(value):
    return lambda r: r["reward_model"].update(ground_truth=value)


@pytest.mark.parametrize("mutate, key, found", [
    (lambda r: r["reward_model"].pop("ground_truth"), "reward_model.ground_truth", "null"),  # a key missing
    (_truth(""), "reward_model.ground_truth", "''"),
    (lambda r: r["prompt"][0].pop("content"), "prompt[0].content", "null"),
    (lambda r: r.update(prompt=[]), "prompt", "[]"),
    (lambda r: r.update(ability=None), "ability", "null"),
])
def test_a_malformed_row_is_named_with_its_key_and_the_fix_before_anything_is_written(tmp_path, mutate, key, found):
    """The recipe's data step (rlkit.models.data.prepare, which runs before verl is launched) on a real parquet with one
    bad row: the error names the file, the row (position and DAPO index), the key, the value found and the fix,
    and no training parquet is written."""
    path, index = _dapo_with(tmp_path, 7, mutate)
    out = tmp_path / "generated"
    with pytest.raises(data.DataSchemaError) as caught:
        data.prepare(str(path), rows=0, out_dir=out)
    message = str(caught.value)
    assert f"data {str(path)!r} row 7 (extra_info.index={index!r}): {key} must be" in message
    assert f"found {found}" in message and "Fix: repair or drop that row" in message
    assert not out.exists() or not list(out.iterdir())


def test_a_column_of_the_wrong_type_fails_at_its_first_row(tmp_path):
    """A parquet whose ground truths are integers (another dataset's convention): every row is wrong, the first
    is named."""
    import pandas as pd

    rows = data.synthetic_rows(5, seed=1)
    frame = pd.DataFrame(rows, columns=list(data.COLUMNS))
    frame["reward_model"] = [{"ground_truth": int(r["reward_model"]["ground_truth"]), "style": "x"} for r in rows]
    path = tmp_path / "ints.parquet"
    frame.to_parquet(path, index=False)
    first = re.escape(repr(rows[0]["extra_info"]["index"]))
    with pytest.raises(data.DataSchemaError, match=rf"row 0 \(extra_info.index={first}\): reward_model.ground_truth "
                                                   r"must be a string .*found \d+\. Fix:"):
        data.load_dapo(str(path), tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


# ------------------------------------------------------------------------------------------------------------
# host RAM too small for HostAdamW's pinned buffers


def _hostadamw_overrides(rank0_owner: bool = False, overlap_copies: bool = False, prefetch_grads: bool = False) -> list[str]:
    """What the recipe renders for Qwen3-4B with HostAdamW on 2 GPUs (the keys the host check reads)."""
    arr = "actor_rollout_ref"
    return [f"{arr}.model.path=qwen3-4b", "trainer.n_gpus_per_node=2", f"{arr}.actor.fsdp_config.param_offload=True",
            f"{arr}.actor.fsdp_config.optimizer_offload=False", f"{arr}.actor.optim.optimizer_impl=rlkit.optim",
            f"{arr}.actor.optim.optimizer=HostAdamW",
            f"{arr}.actor.optim.override_optimizer_config={{pin_memory:true,rank0_owner:{str(rank0_owner).lower()},"
            f"overlap_copies:{str(overlap_copies).lower()},prefetch_grads:{str(prefetch_grads).lower()}}}"]


def _host_finding(overrides, patches=("offload_views", "no_shard"), **kwargs):
    (finding,) = [f for f in preflight.check_overrides(overrides, list(patches), **kwargs) if f.check == "host_memory"]
    return finding


def test_preflight_refuses_a_node_whose_host_memory_cannot_hold_hostadamw(tmp_path):
    """Before a launch (rlkit.recipes.job.preflight_findings passes this machine's MemAvailable): HostAdamW's host
    state for Qwen3-4B on 2 ranks (masters, Adam moments, pinned staging, verl's param_offload copy: 125.67 GiB)
    against a node with less available is an error naming both sizes, and the fixes with what each would need."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       67108864 kB\nMemFree:        60000000 kB\nMemAvailable:   62914560 kB\n")
    assert preflight.available_host_gib(meminfo) == 60.0
    finding = _host_finding(_hostadamw_overrides(), host_available_gib=preflight.available_host_gib(meminfo))
    assert finding.severity == "error" and finding.key.endswith("optim.optimizer_impl")
    assert "HostAdamW holds 125.67 GiB of host memory per node" in finding.message
    assert "staging_pinned 5.80" in finding.message and "but the node has 60.00 GiB available" in finding.message
    assert "rank0_owner=true (79.27 GiB" in finding.fix and "master_on_host patch" in finding.fix
    fits = _host_finding(_hostadamw_overrides(rank0_owner=True), host_available_gib=100.0)
    assert fits.severity == "info" and "79.27 GiB" in fits.message and "fits" in fits.message
    unknown = _host_finding(_hostadamw_overrides())
    assert unknown.severity == "info" and "--host-gib" in unknown.fix
    assert not [f for f in preflight.check_overrides(["actor_rollout_ref.model.path=qwen3-4b"], []) if f.check == "host_memory"]


def test_overlapped_copies_double_the_pinned_staging_the_host_check_counts():
    """HostAdamW(overlap_copies=True) keeps two staging buffers per direction (one parameter's copies run beside the
    next one's host step): the check counts twice the pinned staging of the serial step, and nothing else more."""
    serial = _host_finding(_hostadamw_overrides(), host_available_gib=200.0)
    overlapped = _host_finding(_hostadamw_overrides(overlap_copies=True), host_available_gib=200.0)
    assert "staging_pinned 5.80" in serial.message and "staging_pinned 11.59" in overlapped.message
    assert "HostAdamW holds 131.47 GiB" in overlapped.message  # 125.67 + 5.80, each rounded


@pytest.mark.parametrize("rank0_owner", [False, True])
def test_the_gradient_prefetch_adds_a_host_copy_of_every_gradient_on_each_stepping_rank(rank0_owner):
    """HostAdamW(prefetch_grads=True) keeps every gradient on the host (fp32, 4 B per parameter) on each rank that
    steps: the check counts that and nothing else more."""
    shape = model_shape.resolve_model("qwen3-4b")
    serial = _host_finding(_hostadamw_overrides(rank0_owner), host_available_gib=400.0)
    prefetch = _host_finding(_hostadamw_overrides(rank0_owner, prefetch_grads=True), host_available_gib=400.0)
    extra = 4 * shape.params * (1 if rank0_owner else 2) / GIB
    assert f"prefetch_grads_pinned {extra:.2f}" in prefetch.message and "prefetch_grads" not in serial.message
    serial_gib, prefetch_gib = (float(re.search(r"HostAdamW holds ([\d.]+) GiB", f.message)[1]) for f in (serial, prefetch))
    assert prefetch_gib - serial_gib == pytest.approx(extra, abs=0.01)
    parts = host_adamw_bytes(shape, ranks=2, rank0_owner=rank0_owner, prefetch_grads=True)
    assert parts["prefetch_grads_pinned"] == 4.0 * shape.params * (1 if rank0_owner else 2)


def test_rlkit_preflight_reads_this_hosts_available_memory():
    """``rlkit preflight --host-gib auto`` on this machine (its real /proc/meminfo): a Qwen3-4B HostAdamW run needs
    more host memory than a CI machine has, and the command fails saying so."""
    available = preflight.available_host_gib()
    if available is None:
        pytest.skip("no /proc/meminfo")
    need = sum(host_adamw_bytes(model_shape.resolve_model("qwen3-4b"), ranks=2, param_offload=True).values()) / GIB
    if available >= need:
        pytest.skip(f"this machine has {available:.0f} GiB available, enough for {need:.0f} GiB")
    proc = subprocess.run([sys.executable, "-m", "rlkit.planning.preflight", *_hostadamw_overrides(), "--patches", "offload_views",
                           "--host-gib", "auto"], check=False, capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"ERROR   actor_rollout_ref.actor.optim.optimizer_impl: HostAdamW holds {need:.2f} GiB" in proc.stdout
    seen = float(re.search(r"but the node has ([0-9.]+) GiB available", proc.stdout).group(1))
    assert abs(seen - available) < 2.0  # MemAvailable read by the command a moment later


def test_the_host_model_matches_the_committed_runs_host_memory():
    """The host state the check counts against what the committed 2 x H200 HostAdamW arms measured (the node's
    peak above idle, /proc/meminfo at 1 Hz): a constant 32-35 GiB more (vLLM, Ray, the trainer), whichever of
    rank0_owner / master_on_host the arm used, so the model counts what changes between them."""
    shape = model_shape.resolve_model("qwen3-4b")
    gaps = {}
    for arm in ("1-fixes-hostadamw", "4-rank0-owner", "5-master-on-host-cast-once"):
        metrics = json.loads((committed_run(REPO_ROOT / "outputs" / NOTEBOOK / arm) / "metrics.json").read_text())
        recipe, host = metrics["recipe"], metrics["launch"]["host_memory"]
        need = host_adamw_bytes(shape, ranks=recipe["n_gpus"], rank0_owner=recipe["host_rank0_owner"],
                                       master_on_host="master_on_host" in recipe["patches"],
                                       param_offload=recipe["param_offload"])
        gaps[arm] = host["peak_above_baseline_gib"] - sum(need.values()) / GIB
    assert all(32 <= gap <= 35 for gap in gaps.values()), gaps


def test_a_staging_buffer_larger_than_the_host_is_refused_before_allocating():
    """At allocation (rlkit.optim.staging, HostAdamW's buffers): a request over this machine's MemTotal is refused
    before torch allocates anything (a pin the kernel grants page by page would end with the OOM killer), naming
    the buffer, both sizes and the fix; the pool keeps the buffer it had."""
    from rlkit.measure.samplers import read_meminfo
    from rlkit.optim.staging import HostMemoryError, StagingPool

    fields = read_meminfo()
    if fields is None:
        pytest.skip("no /proc/meminfo")
    pool = StagingPool(pin=False)
    pool.reserve("grad", 1024)
    too_large = fields["MemTotal"] + GIB
    with pytest.raises(HostMemoryError) as caught:
        pool.reserve("grad", too_large)
    message = str(caught.value)
    assert f"staging buffer 'grad': {too_large / GIB:.2f} GiB of pageable host memory requested" in message
    assert "GiB available (MemAvailable)" in message and "Fix: run `rlkit preflight --host-gib auto`" in message
    assert pool.nbytes() == {"grad": 1024} and pool.allocations == 1


PIN_STANDIN = '''
    """Stand-in for verl's trainer: step 1 logged, then the optimizer step's staging buffer asks for more host memory
    than this machine has (HostAdamW's StagingPool, for real, in the launched process as in verl's actor)."""
    import json, os

    from rlkit.measure.samplers import read_meminfo
    from rlkit.optim.staging import StagingPool


    def optimizer_step():  # named as verl's engine method that runs HostAdamW.step
        StagingPool(pin=False).reserve("grad", read_meminfo()["MemTotal"] + 2**30)


    print("step:1 - timing_s/step:0.1 - actor/pg_loss:0.0", flush=True)
    optimizer_step()
'''


def test_a_launch_whose_staging_does_not_fit_the_host_fails_naming_the_buffer_and_the_fix(tmp_path):
    """The allocation-time error as a launch shows it: raised in the launched process, read back from its log by
    launch_job (rlkit.verl.logs.find_crash), which names the buffer, the sizes and the fix; ``<tag>.failed/``."""
    if not Path("/proc/meminfo").exists():
        pytest.skip("no /proc/meminfo")
    env = _standin(tmp_path, PIN_STANDIN)
    root = tmp_path / "outputs"
    with pytest.raises(RuntimeError) as caught, ResultsFolder(NOTEBOOK, "host-too-small", root=root).writing() as work:
        verl_job.launch_job(_recipe(), [], work, extra_env=env)
    message = str(caught.value)
    assert "verl exited with 1" in message and "no device-memory failure; HostAdamW staging buffer 'grad':" in message
    assert "Fix: run `rlkit preflight --host-gib auto` on the node" in message
    _assert_failed_folder(root, "host-too-small", "HostAdamW staging buffer 'grad'")
    assert _processes_with(env["RLKIT_FAULT_TEST"]) == []


def test_a_run_whose_host_cannot_hold_hostadamw_is_refused_before_the_launch(tmp_path, monkeypatch):
    """grpo.run on a host pre-flight finds too small (this machine's MemAvailable made tiny): the launch is refused
    with an error naming host_memory_guard, the finding and its fix, and verl never starts; with the guard off the
    same run goes on to the launch."""
    from rlkit.experiments import grpo

    class Launched(Exception):
        pass

    def launch_verl(*args, **kwargs):
        raise Launched

    monkeypatch.setattr(preflight, "available_host_gib", lambda *args: 1e-6)
    monkeypatch.setattr(grpo, "launch_verl", launch_verl)
    fields = {"model": "tiny", "optimizer": "HostAdamW", "optimizer_offload": False, "n_gpus": 1, "train_batch_size": 2,
              "ppo_mini_batch_size": 2, "rollout_n": 2, "max_response_length": 16, "data_rows": 8, "launch": "always",
              "verify_before_launch": False}
    with pytest.raises(ParamError) as caught:
        grpo.run(_recipe(**fields), tmp_path / "refused")
    message = str(caught.value)
    assert message.startswith("GRPORecipe.host_memory_guard: pre-flight refuses the launch: HostAdamW holds")
    assert "but the node has 0.00 GiB available" in message and "Fix: " in message and "a node with more free" in message
    assert "set host_memory_guard: false" in message
    assert not list((tmp_path / "refused").glob("metrics.json"))
    with pytest.raises(Launched):
        grpo.run(_recipe(**fields, host_memory_guard=False), tmp_path / "unguarded")


def test_an_allocation_torch_refuses_is_reraised_with_the_fix():
    """Where the available memory cannot be read (not Linux), the request reaches torch, whose CPU allocator refuses
    it for real (4 EiB: more than any address space); the error is torch's, with what it was for and the fix."""
    from rlkit.optim.staging import HostMemoryError, StagingPool

    pool = StagingPool(pin=False, available_bytes=lambda: None)
    with pytest.raises(HostMemoryError) as caught:
        pool.reserve("param", 2**62)
    assert isinstance(caught.value.__cause__, RuntimeError) and "can't allocate memory" in str(caught.value.__cause__)
    message = str(caught.value)
    assert "staging buffer 'param'" in message and "torch refused it" in message and "Fix:" in message
    assert pool.nbytes() == {} and pool.allocations == 0


# ------------------------------------------------------------------------------------------------------------
# a patch asked for under an unsupported verl / torch / transformers


# A version outside every shipped patch's range for each distribution the patches name (a real, installed-looking
# distribution: a dist-info first on sys.path, which importlib.metadata and pip read before the real one).
OTHER_VERSIONS = {"verl": "0.10.0", "torch": "2.15.0", "transformers": "5.18.0"}


def _shipped_patches():
    from rlkit import patches
    from rlkit.patches.instruments import old_log_prob_memory, rank_identity
    from rlkit.patches.verl import master_on_host_verl

    return [patches.get(name) for name in patches.KNOWN_PATCHES] + [master_on_host_verl.PATCH, rank_identity.PATCH,
                                                                    old_log_prob_memory.PATCH]


def _other_version_env(tmp_path: Path, dist: str) -> dict[str, str]:
    site = tmp_path / f"other-{dist}"
    info = site / f"{dist}-{OTHER_VERSIONS[dist]}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {OTHER_VERSIONS[dist]}\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RLKIT_", "VERL_USE_EXTERNAL"))}
    return {**clean, "PYTHONPATH": os.pathsep.join([str(site), str(REPO_ROOT)])}


def test_the_other_versions_are_outside_every_shipped_range():
    from packaging.specifiers import SpecifierSet

    for patch in _shipped_patches():
        for dist, spec in patch.requires.items():
            assert OTHER_VERSIONS[dist] not in SpecifierSet(spec), (patch.name, dist, spec)


CHECK_ALL = """
import json, sys
from rlkit import patches
from rlkit.patches.verl import master_on_host_verl
from rlkit.patches.instruments import old_log_prob_memory, rank_identity
shipped = [patches.get(n) for n in patches.KNOWN_PATCHES] + [master_on_host_verl.PATCH, rank_identity.PATCH,
                                                             old_log_prob_memory.PATCH]
out = {}
for patch in shipped:
    if sys.argv[1] in patch.requires:
        try:
            patch.apply()
            out[patch.name] = "applied"
        except patches.PatchError as err:
            out[patch.name] = [str(err), patch.active()]
print("RESULT=" + json.dumps(out))
"""


@pytest.mark.verl
@pytest.mark.parametrize("dist", sorted(OTHER_VERSIONS))
def test_every_shipped_patch_refuses_an_unsupported_version_naming_it_and_the_fix(tmp_path, dist):
    """In a fresh process where ``dist`` reports a version outside the range (the guard reads the installed
    distribution's metadata, as pip does), every shipped patch that names ``dist`` refuses to apply: the error names
    the patch, its range, the installed version and the fix, and nothing is patched."""
    proc = subprocess.run([sys.executable, "-c", CHECK_ALL, dist], check=False, env=_other_version_env(tmp_path, dist),
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.split("RESULT=", 1)[1])
    expected = {p.name: p.requires[dist] for p in _shipped_patches() if dist in p.requires}
    assert set(results) == set(expected) and expected
    for name, (message, active) in results.items():
        assert f"patch {name!r} was written for {dist} {expected[name]} but {dist} {OTHER_VERSIONS[dist]} is installed" \
            in message
        assert f"Fix: pip install '{dist}{expected[name]}'" in message and "environment.yml" in message
        assert f"or run without {name!r}" in message and active is False


@pytest.mark.verl
def test_import_verl_under_an_unsupported_verl_fails_loudly_naming_the_version_and_the_fix(tmp_path):
    """The run's view: ``RLKIT_PATCHES=offload_views,no_shard`` and a verl that reports 0.10.0. ``import verl``
    (every verl process does it) stops with PluginLoadError and a banner naming the patch, the versions and the fix,
    the process's record carries the error, and the launcher's record check refuses the run."""
    record_dir = tmp_path / "records"
    env = {**_other_version_env(tmp_path, "verl"), "RLKIT_PATCHES": "offload_views,no_shard",
           "RLKIT_RECORD_DIR": str(record_dir)}
    code = "import verl\nprint('IMPORTED')"
    proc = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode != 0 and "IMPORTED" not in proc.stdout
    assert "rlkit verl plugin FAILED" in proc.stderr and "PluginLoadError" in proc.stderr
    assert "patch 'no_shard' was written for verl ==0.9.1 but verl 0.10.0 is installed" in proc.stderr
    assert "Fix: pip install 'verl==0.9.1'" in proc.stderr
    (record,) = verl_job.read_plugin_records(record_dir)
    assert "verl 0.10.0 is installed" in record["error"] and record["applied"] == []
    with pytest.raises(RuntimeError, match="verl 0.10.0 is installed"):
        verl_job.check_plugin_records(record_dir, ["offload_views", "no_shard"])
