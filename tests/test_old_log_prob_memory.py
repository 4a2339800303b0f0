"""rlkit.patches.instruments.old_log_prob_memory: old_log_prob's own torch peaks reach the step's verl metrics through
verl's real worker methods, verl's since-start peak metrics keep their value, and without CUDA nothing changes.

The allocator is a fake (SYNTHETIC byte counts, not a measurement): it keeps torch's semantics of current and peak
allocated/reserved bytes and of ``reset_peak_memory_stats`` (peaks back to the current values)."""
from __future__ import annotations

import os
import types

import pytest

from rlkit.patches.instruments import old_log_prob_memory as olp

GIB = 1024**3


class FakeAllocator:
    """torch's counters: current and peak bytes; reserved never below allocated and kept after a free (cache)."""

    def __init__(self):
        self.alloc = self.res = self.peak_alloc = self.peak_res = 0
        self.resets = 0

    def malloc(self, gib: float) -> None:
        self.alloc += int(gib * GIB)
        self.res = max(self.res, self.alloc)
        self.peak_alloc, self.peak_res = max(self.peak_alloc, self.alloc), max(self.peak_res, self.res)

    def free(self, gib: float) -> None:
        self.alloc -= int(gib * GIB)

    # MemoryStats
    def allocated(self): return self.alloc
    def reserved(self): return self.res
    def max_allocated(self): return self.peak_alloc
    def max_reserved(self): return self.peak_res

    def reset_peak(self):
        self.resets += 1
        self.peak_alloc, self.peak_res = self.alloc, self.res


class FakeTrainingWorker:
    """Stands in for verl's ``TrainingWorker`` (``self.actor``): each call moves the fake allocator as a step's pass
    would and returns what verl's returns, the update's metrics read from the allocator as verl's
    ``_postprocess_output`` reads torch's, per mini-batch."""

    def __init__(self, mem: FakeAllocator):
        self.mem = mem

    def infer_batch(self, data):
        from verl.utils import tensordict_utils as tu

        self.mem.malloc(8.0)   # parameters loaded by eval_mode
        self.mem.malloc(12.0)  # logits of a micro-batch
        self.mem.free(12.0)
        self.mem.free(8.0)
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {"mfu": 0.1}})

    def train_mini_batch(self, data):
        from verl.utils import tensordict_utils as tu

        readings = []
        for _ in range(2):  # two mini-batches
            self.mem.malloc(9.0)
            self.mem.free(9.0)
            readings.append((self.mem.max_allocated() / GIB, self.mem.max_reserved() / GIB))
        metrics = {"perf/max_memory_allocated_gb": [a for a, _ in readings],
                   "perf/max_memory_reserved_gb": [r for _, r in readings], "loss": [0.5, 0.25], "mfu": [0.2, 0.2]}
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})


def _step_metrics(mem: FakeAllocator, steps: int = 2) -> list[dict]:
    """``steps`` steps through verl's real ``ActorRolloutRefWorker.compute_log_prob`` and ``update_actor`` (as patched
    or not), each update's metrics reduced as verl's V1 trainer does (``rename_dict`` + ``reduce_metrics``)."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import reduce_metrics
    from verl.utils.py_functional import rename_dict
    from verl.workers.engine_workers import ActorRolloutRefWorker

    worker = types.SimpleNamespace(actor=FakeTrainingWorker(mem), enable_routing_replay=False)
    empty = tu.get_tensordict(tensor_dict={}, non_tensor_dict={})
    mem.malloc(30.0)  # start-up / weight sync: the process's peak before step 1
    mem.free(30.0)
    out = []
    for _ in range(steps):
        ActorRolloutRefWorker.compute_log_prob(worker, empty)
        output = ActorRolloutRefWorker.update_actor(worker, empty)
        out.append(reduce_metrics(rename_dict(output["metrics"], "actor/")))
    return out


@pytest.fixture
def patched(monkeypatch):
    """The instrument applied to verl's real worker class, with the fake allocator as its counters."""
    mem = FakeAllocator()
    monkeypatch.setattr(olp, "STATS_PROVIDER", lambda: mem)
    olp.PATCH.apply()
    try:
        yield mem
    finally:
        olp.PATCH.revert()


@pytest.mark.verl
def test_old_log_prob_peaks_reach_the_steps_metrics_through_verls_worker_methods(patched):
    steps = _step_metrics(patched)
    for metrics in steps:
        assert metrics["actor/rlkit/old_log_prob/max_allocated_gib"] == 20.0  # 8 GiB params + 12 GiB logits
        assert metrics["actor/rlkit/old_log_prob/max_reserved_gib"] == 30.0  # the cache kept since start-up
        assert metrics["actor/rlkit/old_log_prob/allocated_at_entry_gib"] == 0.0
        assert metrics["actor/rlkit/old_log_prob/reserved_at_entry_gib"] == 30.0
        assert set(olp.LOGGED_KEYS) <= metrics.keys()
    assert patched.resets == 2
    assert olp.peaks_from_steps(steps) == {"max_allocated_gib": 20.0, "max_reserved_gib": 30.0,
                                           "allocated_at_entry_gib": 0.0, "reserved_at_entry_gib": 30.0}


@pytest.mark.verl
def test_verls_own_peak_metrics_keep_their_since_start_value(patched):
    """The reset would make verl's update peaks 20 GiB (since this step's old_log_prob); folded back they are the
    30 GiB of start-up, bit for bit what verl reports without the instrument."""
    with_instrument = _step_metrics(patched)
    olp.PATCH.revert()
    without = _step_metrics(FakeAllocator())
    for a, b in zip(with_instrument, without):
        for key in ("actor/perf/max_memory_allocated_gb", "actor/perf/max_memory_reserved_gb", "actor/loss"):
            assert a[key] == b[key]
        assert a["actor/perf/max_memory_allocated_gb"] == 30.0
        assert not any(k.startswith("actor/rlkit/") for k in b)


@pytest.mark.verl
def test_the_wrappers_keep_verls_dispatch_and_revert_restores_the_originals(patched):
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from verl.workers.engine_workers import ActorRolloutRefWorker as W

    assert W.compute_log_prob.__rlkit_patch__ == "old_log_prob_memory" == W.update_actor.__rlkit_patch__
    original = W.compute_log_prob.__wrapped__
    assert getattr(W.compute_log_prob, MAGIC_ATTR) == getattr(original, MAGIC_ATTR)  # the worker group reads it
    olp.PATCH.apply()  # idempotent
    assert W.compute_log_prob.__wrapped__ is original
    olp.PATCH.revert()
    assert W.compute_log_prob is original and not hasattr(W.update_actor, "__rlkit_patch__")


@pytest.mark.verl
def test_without_cuda_the_instrument_changes_nothing():
    """The real provider on a CPU machine gives no counters: verl's outputs come back untouched, no state is kept."""
    import torch
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker as W

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    assert olp.cuda_stats() is None

    def one_step(worker):
        W.compute_log_prob(worker, tu.get_tensordict(tensor_dict={}, non_tensor_dict={}))
        return W.update_actor(worker, tu.get_tensordict(tensor_dict={}, non_tensor_dict={}))["metrics"]

    mem = FakeAllocator()
    worker = types.SimpleNamespace(actor=FakeTrainingWorker(mem), enable_routing_replay=False)
    olp.PATCH.apply()
    try:
        metrics = one_step(worker)
    finally:
        olp.PATCH.revert()
    assert metrics == one_step(types.SimpleNamespace(actor=FakeTrainingWorker(FakeAllocator()), enable_routing_replay=False))
    assert not hasattr(worker, "_rlkit_old_log_prob_memory") and mem.resets == 0


def test_fold_restores_every_peak_reading_and_reports_a_pass_once():
    mem = FakeAllocator()
    window = olp.Window(mem)
    mem.malloc(30.0)
    mem.free(30.0)
    window.exit(window.enter())
    folded = window.fold({"perf/max_memory_allocated_gb": [1.0, 31.0], "perf/max_memory_reserved_gb": 2.0})
    assert folded["perf/max_memory_allocated_gb"] == [30.0, 31.0] and folded["perf/max_memory_reserved_gb"] == 30.0
    assert folded[olp.KEYS[0]] == 0.0
    assert olp.KEYS[0] not in window.fold({})  # the next update, without a pass before it, reports none


@pytest.mark.verl
def test_an_update_output_without_metrics_comes_back_as_it_is():
    """None off the output ranks, and the empty TensorDict verl's TransferQueue bridge returns on a rank that does not
    collect."""
    from tensordict import TensorDict

    window = olp.Window(FakeAllocator())
    window.exit(window.enter())
    assert olp._with_folded_metrics(None, window) is None
    empty = TensorDict({}, batch_size=(0,))
    assert olp._with_folded_metrics(empty, window) is empty and list(empty.keys()) == []
    assert window.last is not None  # still there for an update that reports


def test_the_plugin_selects_the_instrument_only_when_asked():
    from rlkit.patches import verl_plugin

    _, _, instruments, _ = verl_plugin._selection([], {olp.ENV: "1"})
    assert [p.name for p in instruments] == ["old_log_prob_memory"]
    assert verl_plugin._selection([], {}) == ([], [], [], [])
    assert verl_plugin._selection([], {olp.ENV: ""}) == ([], [], [], [])


def test_the_recipe_turns_it_on_by_default_and_off_when_asked():
    from rlkit.recipes import grpo, job

    assert job.recipe_env(grpo.GRPORecipe())[olp.ENV] == "1"
    assert job.recipe_env(grpo.GRPORecipe(record_old_log_prob_memory=False))[olp.ENV] == ""


def test_runs_without_the_keys_have_no_record():
    assert olp.peaks_from_steps([{"actor/perf/max_memory_allocated_gb": 39.9}]) is None
    assert olp.peaks_from_steps([{olp.LOGGED_KEYS[0]: 4.5}, {olp.LOGGED_KEYS[0]: 3.0}]) == {"max_allocated_gib": 4.5}


@pytest.mark.verl
def test_the_plugin_applies_it_in_a_verl_process_when_the_workers_are_imported(tmp_path):
    """A fresh ``import verl`` with only the instrument asked for: recorded, pending until verl's workers module is
    imported, then applied there."""
    import json
    import subprocess
    import sys

    code = ("import glob, json, os, verl\n"
            "from verl.workers.engine_workers import ActorRolloutRefWorker as W\n"
            "(p,) = glob.glob(os.path.join(os.environ['RLKIT_RECORD_DIR'], '*.json'))\n"
            "print('RESULT=' + json.dumps({'record': json.load(open(p)), "
            "'patched': getattr(W.compute_log_prob, '__rlkit_patch__', None)}))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLKIT_", "VERL_USE_EXTERNAL"))}
    env.update(RLKIT_PATCHES="", RLKIT_RECORD_DIR=str(tmp_path), **{olp.ENV: "1"})
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT=", 1)[1].splitlines()[0])
    assert out["patched"] == "old_log_prob_memory"
    assert out["record"]["instruments"]["old_log_prob_memory"] is True
    assert out["record"]["state"]["old_log_prob_memory"] == "applied" and out["record"]["error"] is None
