"""Checkpoint and resume through verl 0.9.1 with every patch of the last arm active (issue 25 item 3).

Two gloo ranks, real FSDP1 (NO_SHARD, bf16 compute, ``use_orig_params=False``, as verl wraps the actor), verl's own
``FSDPEngine`` train mode / ``optimizer_step`` / ``save_checkpoint`` / ``load_checkpoint`` and its
``FSDPCheckpointManager``, HostAdamW with the rank-0 owner, ``master_on_host`` (wired into the engine, param
offload on) and ``cast_once``, all applied by rlkit's verl plugin from ``RLKIT_PATCHES`` as in a verl worker.

* Process pair A trains ``STEPS`` steps uninterrupted, and separately ``SAVE_AT`` steps, saves through the
  engine, then carries on to ``STEPS`` (verl's ``save_freq`` pattern: the save must not change the run).
* Process pair B (new processes) builds a model from another seed and a fresh optimizer, leaves stale bf16
  copies resident, loads the checkpoint and trains the remaining steps. Weights, Adam state (rank 0: exp_avg,
  exp_avg_sq, step; rank 1: none) and every metric (loss, grad norm, lr) must equal A's bit for bit: on CPU
  every kernel is deterministic and nothing in the resume changes what is computed.
* Before that, B tries to load the checkpoint with another patch set, another HostAdamW option and torch's
  AdamW: each is refused on both ranks, naming the difference, before anything is loaded.

The engine is built as ``FSDPEngine.initialize`` builds it, without its accelerator-only ``__init__``
(``tests/test_master_on_host_verl.py``). On a CPU machine verl's device helpers name CUDA; only the function
verl's save/load use to move the model "to the GPU" (``load_fsdp_model_to_gpu``) is pointed at the CPU, which
is where the model lives.
"""
from __future__ import annotations

import json
import os
import tempfile
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from conftest import fresh_paths, spawn_two_ranks

from rlkit.recipes import job as verl_job

pytestmark = pytest.mark.verl

# The patches of the seed's last arm (rlkit.recipes.grpo.ARMS["5-master-on-host-cast-once"]), in the plugin's terms.
SELECTION = ["offload_views", "no_shard", "skip_old_logprob", "metric_entropy", "master_on_host", "cast_once"]
STEPS, SAVE_AT = 4, 2
LR, SEQ, SEQUENCES, MICRO_BATCHES = 1e-2, 16, 8, 2


# ------------------------------------------------------------------------------ one rank
def _init(rank: int, world: int, store: str, device: str, selection) -> None:
    """The rank's process as a verl worker sees it: the plugin applies ``selection`` and the checkpoint guard."""
    os.environ["RLKIT_PATCHES"] = ",".join(selection)
    # as the launcher sets it (rlkit.recipes.job.launch_env): the plugin also loads where rlkit is on PYTHONPATH
    # but not pip-installed, as on the offline GPU node, where the entry point alone left it unloaded
    os.environ["VERL_USE_EXTERNAL_MODULES"] = verl_job.PLUGIN_MODULE
    os.environ.pop("RLKIT_RECORD_DIR", None)
    os.environ.pop("RLKIT_ALLOW_CHECKPOINT_MISMATCH", None)
    torch.set_num_threads(1)
    if device == "cuda":
        from rlkit.measure import determinism

        torch.cuda.set_device(rank)
        determinism.enable(0)
    backend = "gloo" if device == "cpu" else "cpu:gloo,cuda:nccl"
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    import verl  # noqa: F401  (the plugin: RLKIT_PATCHES, applied when their targets are imported)
    from verl.workers.engine.fsdp import transformer_impl  # noqa: F401  (verl's engine: the deferred patches apply)

    from rlkit.patches.guards import checkpoint_fingerprint
    from rlkit.patches.verl import master_on_host_verl

    assert checkpoint_fingerprint.PATCH.active() and master_on_host_verl.PATCH.active(), "rlkit's verl plugin did not load"
    if device == "cpu":
        from verl.utils import fsdp_utils

        fsdp_utils.get_device_name = lambda: "cpu"  # load_fsdp_model_to_gpu -> torch.device("cpu:0")
        fsdp_utils.get_device_id = lambda: 0


def _engine(rank: int, device: str, seed: int, *, optimizer: str = "HostAdamW", rank0_owner: bool = True):
    """verl's FSDPEngine around a random-init tiny Qwen3 (FSDP1 as verl wraps it), its optimizer, lr scheduler and
    FSDPCheckpointManager, built as ``FSDPEngine.initialize`` builds them, then offloaded as it offloads."""
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
    from verl.utils.torch_functional import get_cosine_schedule_with_warmup
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from rlkit.experiments import update_phase as U
    from rlkit.optim import HostAdamW

    where = torch.device("cpu") if device == "cpu" else torch.device("cuda", rank)
    module = U.build_fsdp_model("tiny", where, seed=seed, gradient_checkpointing=True)
    params = list(module.parameters())
    hyper = {"lr": LR, "weight_decay": 0.1, "betas": (0.9, 0.999)}
    if optimizer == "HostAdamW":
        opt = HostAdamW(params, rank0_owner=rank0_owner, check_identical_grads=rank0_owner, host_threads=1, **hyper)
    else:
        opt = torch.optim.AdamW(params, **hyper)
    engine = FSDPEngine.__new__(FSDPEngine)
    engine.module, engine.optimizer, engine.mode = module, opt, None
    engine.lr_scheduler = get_cosine_schedule_with_warmup(opt, num_warmup_steps=1, num_training_steps=STEPS + 2)
    engine._is_offload_param, engine._is_offload_optimizer = True, False
    engine.engine_config = SimpleNamespace(forward_only=False, fsdp_size=1)
    engine.optimizer_config = SimpleNamespace(clip_grad=1.0)
    engine.ulysses_parallel_group, engine.scaler, engine._qat_enabled = None, None, False
    engine.checkpoint_manager = FSDPCheckpointManager(model=module, optimizer=opt, lr_scheduler=engine.lr_scheduler,
                                                      processing_class=None, checkpoint_config=None)
    engine.to(device="cpu", model=True, optimizer=False, grad=True)  # initialize(): param offload
    return engine


def _batch(step: int, rank: int, world: int) -> torch.Tensor:
    from rlkit.experiments import update_phase as U

    return U.make_minibatch(512, SEQUENCES, SEQ, rank=rank, world_size=world, seed=100 + step)


def _train_step(engine, step: int, rank: int, world: int) -> dict:
    """One step as verl's actor update runs it: its train_mode around train_batch's own, fwd/bwd, verl's
    optimizer_step (clip, finite check, HostAdamW on the host masters), then the lr scheduler step."""
    from rlkit.experiments import update_phase as U
    from rlkit.patches.verl import master_on_host_verl

    with engine.train_mode():
        assert master_on_host_verl.host_masters(engine) is not None  # the masters stay on the host
        with engine.train_mode(disable_auto_offload=True):
            loss = U.run_fwd_bwd(engine.module, _batch(step, rank, world), MICRO_BATCHES, None)
            grad_norm = engine.optimizer_step()
    lr = engine.lr_scheduler_step()
    return {"loss": loss, "grad_norm": grad_norm, "lr": lr}


def _snapshot(engine) -> dict:
    opt = engine.optimizer
    params = list(engine.module.parameters())
    return {
        "params": [p.detach().to("cpu", copy=True) for p in params],
        "state": [{k: v.detach().to("cpu", copy=True) for k, v in opt.state[p].items()} if p in opt.state else None
                  for p in params],
        "state_params": len(opt.state),
        "adam_state_bytes": opt.adam_state_bytes(),
    }


def _resident(engine) -> int:
    from rlkit.patches.fsdp import cast_once
    from rlkit.patches.fsdp.master_on_host import fsdp_handles

    return sum(cast_once.is_resident(h) for h in fsdp_handles(engine.module))


def _refused(engine_or_manager, ckpt: str) -> str:
    """The message of the CheckpointMismatchError a load raises ('' if it loaded)."""
    from rlkit.patches.guards.checkpoint_fingerprint import CheckpointMismatchError

    try:
        engine_or_manager.load_checkpoint(ckpt, None, del_local_after_load=False)
    except CheckpointMismatchError as err:
        if getattr(engine_or_manager, "_is_offload_param", False):
            # FSDPEngine.load_checkpoint moved the model to the device before its manager refused; a refused run
            # ends there, this test carries on from verl's offloaded layout.
            from verl.utils.fsdp_utils import offload_fsdp_model_to_cpu

            offload_fsdp_model_to_cpu(engine_or_manager.module)
        return str(err)
    return ""


def _worker(rank: int, world: int, device: str, phase: str, store: str, ckpt: str, out_dir: str) -> None:
    _init(rank, world, store, device, SELECTION)
    try:
        out: dict = {}
        if phase == "train":
            ref = _engine(rank, device, seed=0)
            out["ref"] = [_train_step(ref, s, rank, world) for s in range(STEPS)]
            out["ref_snapshot"] = _snapshot(ref)
            del ref
            saving = _engine(rank, device, seed=0)
            out["saving"] = [_train_step(saving, s, rank, world) for s in range(SAVE_AT)]
            saving.save_checkpoint(ckpt, None, global_step=SAVE_AT, max_ckpt_to_keep=None)
            out["saving"] += [_train_step(saving, s, rank, world) for s in range(SAVE_AT, STEPS)]
            out["saving_snapshot"] = _snapshot(saving)
        else:
            from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

            from rlkit import patches

            engine = _engine(rank, device, seed=1)  # other weights than the checkpoint's
            before = _snapshot(engine)["params"]
            # Differently patched runs are refused before anything is loaded.
            patches.get("cast_once").revert()
            out["refused_patch"] = _refused(engine, ckpt)
            patches.get("cast_once").apply()
            for kind, options in (("refused_owner", {"rank0_owner": False}), ("refused_adamw", {"optimizer": "AdamW"})):
                other = _engine(rank, device, seed=1, **options)
                out[kind] = _refused(other, ckpt)
                if kind == "refused_owner":  # HostAdamW itself refuses another rank role's state dict
                    own = torch.load(os.path.join(ckpt, f"optim_world_size_{world}_rank_{rank}.pt"), weights_only=False)
                    try:
                        other.optimizer.load_state_dict(own)
                        out["owner_state_dict"] = ""
                    except ValueError as err:
                        out["owner_state_dict"] = str(err)
                del other
            out["untouched_by_refusals"] = all(torch.equal(a, b) for a, b in zip(before, _snapshot(engine)["params"]))
            # A forward/backward of the fresh weights leaves their bf16 copies resident: the load must drop them.
            with engine.train_mode():
                from rlkit.experiments import update_phase as U

                U.run_fwd_bwd(engine.module, _batch(99, rank, world), 1, None)
            out["resident_before_load"] = _resident(engine)
            engine.load_checkpoint(ckpt, None, del_local_after_load=False)
            out["resident_after_load"] = _resident(engine)
            loaded = _snapshot(engine)
            out["loaded_step"] = [float(s["step"]) for s in loaded["state"] if s is not None]
            out["resumed"] = [_train_step(engine, s, rank, world) for s in range(SAVE_AT, STEPS)]
            out["resumed_snapshot"] = _snapshot(engine)
            # The same folder through a plain manager of this run (no engine): accepted.
            out["manager_accepts"] = _refused(FSDPCheckpointManager(
                model=engine.module, optimizer=engine.optimizer, lr_scheduler=None, processing_class=None,
                checkpoint_config={"load_contents": ["optimizer"]}), ckpt) == ""
        torch.save(out, os.path.join(out_dir, f"{phase}_rank{rank}.pt"))
        dist.barrier()  # no rank tears gloo down while its peer is still communicating
    finally:
        dist.destroy_process_group()


def _phase_args(world: int, device: str, phase: str, make, ckpt: str, out_dir: str):
    """A ``make_args`` for :func:`spawn_two_ranks`: a fresh rendezvous file per attempt."""
    return lambda: (world, device, phase, *make(), ckpt, out_dir)


def _run_phases(device: str, world: int, tmp: str) -> tuple[str, list[dict], list[dict]]:
    ckpt = os.path.join(tmp, "global_step_2", "actor")
    out_dir = os.path.join(tmp, "out")
    os.makedirs(out_dir)
    results = {}
    for phase in ("train", "resume"):
        args = _phase_args(world, device, phase, fresh_paths(os.path.join(tmp, phase), "store"), ckpt, out_dir)
        if world == 2:
            spawn_two_ranks(_worker, args)
        else:
            torch.multiprocessing.spawn(_worker, args=args(), nprocs=1, join=True)
        results[phase] = [torch.load(os.path.join(out_dir, f"{phase}_rank{r}.pt"), weights_only=False)
                          for r in range(world)]
    return ckpt, results["train"], results["resume"]


def _assert_resumes_exactly(ckpt: str, train: list[dict], resume: list[dict], world: int) -> None:
    from rlkit import patches
    from rlkit.patches.guards import checkpoint_fingerprint as F

    # What is on disk: the fingerprint, and each rank's own optimizer file (rank 1's without Adam state).
    with open(os.path.join(ckpt, F.FILENAME)) as f:
        fingerprint = json.load(f)
    assert fingerprint["patches"] == [n for n in patches.KNOWN_PATCHES if n in SELECTION]
    assert fingerprint["wiring"] == ["master_on_host_verl"] and fingerprint["global_step"] == SAVE_AT
    assert fingerprint["optimizer"]["class"] == "rlkit.optim.host_adamw.HostAdamW"
    assert fingerprint["optimizer"]["options"]["rank0_owner"] is True
    assert fingerprint["adam_state_ranks"] == [0] and fingerprint["world_size"] == world
    # This process selects no patch, so each optimizer file refuses itself when read (the trip-wire an unpatched run
    # meets, most of all on rank 1's file, which holds no Adam state); RLKIT_ALLOW_CHECKPOINT_MISMATCH lets it load.
    paths = [os.path.join(ckpt, f"optim_world_size_{world}_rank_{r}.pt") for r in range(world)]
    with pytest.raises(F.CheckpointMismatchError, match="patch cast_once: active in the run that wrote the checkpoint"):
        torch.load(paths[-1], weights_only=False)
    with mock.patch.dict(os.environ, {F.ALLOW_ENV: "1"}):
        optim = [torch.load(path, weights_only=False) for path in paths]
    flat_params = len(train[0]["ref_snapshot"]["params"])
    assert len(optim[0]["state"]) == flat_params and optim[0]["host_adamw"] == {"rank0_owner": True, "is_owner": True}
    for rank_file in optim[1:]:
        assert rank_file["state"] == {} and rank_file["host_adamw"]["is_owner"] is False

    for rank, (a, b) in enumerate(zip(train, resume)):
        # Saving in the middle changes nothing; the resumed steps equal the uninterrupted ones, bit for bit.
        assert a["saving"] == a["ref"], rank
        assert b["resumed"] == a["ref"][SAVE_AT:], (rank, b["resumed"], a["ref"][SAVE_AT:])
        for got, want in zip(a["saving_snapshot"]["params"], a["ref_snapshot"]["params"], strict=True):
            assert torch.equal(got, want)
        got, want = b["resumed_snapshot"], a["ref_snapshot"]
        for p, q in zip(got["params"], want["params"], strict=True):
            assert torch.equal(p, q), (rank, (p - q).abs().max())
        if rank == 0:
            assert b["loaded_step"] == [float(SAVE_AT)] * flat_params
            for s, t in zip(got["state"], want["state"], strict=True):
                assert set(s) == set(t) == {"step", "exp_avg", "exp_avg_sq"}
                for key in t:
                    assert torch.equal(s[key], t[key]), (key, (s[key] - t[key]).abs().max())
            assert float(got["state"][0]["step"]) == STEPS
        else:  # rank 1 holds no Adam state, before and after the resume
            assert got["state_params"] == want["state_params"] == 0
            assert got["adam_state_bytes"] == want["adam_state_bytes"] == 0 and b["loaded_step"] == []
        # the stale bf16 copies of the other seed's weights were dropped by the load, not used
        assert b["resident_before_load"] > 0 and b["resident_after_load"] == 0
        assert b["manager_accepts"]
    for r in resume[1:]:  # the replicas stay identical
        for p, q in zip(r["resumed_snapshot"]["params"], resume[0]["resumed_snapshot"]["params"]):
            assert torch.equal(p, q)

    # Every refusal: on each rank, naming the difference and the fix, before any weight changed.
    for b in resume:
        assert b["untouched_by_refusals"]
        for kind in ("refused_patch", "refused_owner", "refused_adamw"):
            assert b[kind].startswith(f"rlkit refuses to resume from {ckpt}: the checkpoint was written by a "
                                      "differently patched run."), b[kind]
            assert "Fix: resume with the settings that wrote it (RLKIT_PATCHES=" + ",".join(
                fingerprint["patches"]) in b[kind] and "RLKIT_ALLOW_CHECKPOINT_MISMATCH=1" in b[kind]
        assert "  - patch cast_once: active in the run that wrote the checkpoint, not in this run" in b["refused_patch"]
        assert "HostAdamW rank0_owner: True in the checkpoint, False in this run" in b["refused_owner"]
        assert "override_optimizer_config={rank0_owner:true,impl:\"fused\",skip_nonfinite:true,owners:\"group\"}" in b["refused_owner"]
        assert ("optimizer: rlkit.optim.host_adamw.HostAdamW wrote the checkpoint, this run builds "
                "torch.optim.adamw.AdamW") in b["refused_adamw"]
    assert resume[0]["owner_state_dict"] == ""  # rank 0 is an owner either way
    for b in resume[1:]:
        assert "saved by a rank that holds no Adam state (rank0_owner=True)" in b["owner_state_dict"]


def test_resume_through_verl_with_every_patch_is_bit_exact_and_other_patch_sets_are_refused():
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, train, resume = _run_phases("cpu", 2, tmp)
        _assert_resumes_exactly(ckpt, train, resume, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_resume_through_verl_on_the_gpu_is_bit_exact():
    """The same on CUDA (two GPUs when there are two, else one rank on one): verl's real offload and reload
    between the host and the device, the masters parked on the host, deterministic mode."""
    world = min(2, torch.cuda.device_count())
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, train, resume = _run_phases("cuda", world, tmp)
        _assert_resumes_exactly(ckpt, train, resume, world)


# ------------------------------------------------------------------------------ the guard on its own
def _fingerprint(**changes) -> dict:
    base = {"patches": ["offload_views", "master_on_host", "cast_once"],
            "optimizer": {"class": "rlkit.optim.host_adamw.HostAdamW",
                          "options": {"impl": "fused", "rank0_owner": True, "skip_nonfinite": True, "host_threads": 8}},
            "adam_state_ranks": [0], "world_size": 2,
            "contents": {"save": ["model", "optimizer", "extra"], "load": ["model", "optimizer", "extra"]}}
    return {**base, **changes}


def test_mismatches_name_each_difference_and_ignore_what_changes_nothing():
    from rlkit.patches.guards.checkpoint_fingerprint import mismatches

    saved = _fingerprint()
    assert mismatches(saved, _fingerprint()) == []
    recorded_only = _fingerprint(optimizer={"class": saved["optimizer"]["class"],
                                            "options": {**saved["optimizer"]["options"], "host_threads": 1}})
    assert mismatches(saved, recorded_only) == []  # host_threads changes neither state nor numbers
    assert mismatches(saved, _fingerprint(patches=["offload_views", "master_on_host", "skip_old_logprob"])) == [
        "patch cast_once: active in the run that wrote the checkpoint, not in this run",
        "patch skip_old_logprob: active in this run, not in the run that wrote the checkpoint"]
    owner = _fingerprint(optimizer={"class": saved["optimizer"]["class"],
                                    "options": {**saved["optimizer"]["options"], "rank0_owner": False}},
                         adam_state_ranks=[0, 1])
    assert mismatches(saved, owner) == ["HostAdamW rank0_owner: True in the checkpoint, False in this run"]
    assert mismatches(saved, _fingerprint(world_size=4, adam_state_ranks=[0])) == [
        "world_size: 2 ranks wrote the checkpoint, this run has 4"]
    no_optimizer = _fingerprint(optimizer={"class": "torch.optim.adamw.AdamW", "options": {}},
                                contents={"save": [], "load": ["model"]})
    assert mismatches(saved, no_optimizer) == []  # the optimizer is not loaded: its differences do not matter


def test_a_checkpoint_without_fingerprint_loads_only_into_an_unpatched_run():
    from rlkit.patches.guards.checkpoint_fingerprint import FILENAME, mismatches, refusal

    stock = _fingerprint(patches=[], optimizer={"class": "torch.optim.adamw.AdamW", "options": {}},
                         adam_state_ranks=[0, 1])
    assert mismatches(None, stock) == []
    (found,) = mismatches(None, _fingerprint())
    assert f"the checkpoint has no {FILENAME}" in found and "cast_once" in found
    message = refusal("/ckpt/actor", None, [found])
    assert "Fix: resume with the same patches and optimizer that wrote it" in message
    assert "trainer.resume_mode=disable" in message


def test_patch_apply_is_idempotent_and_revert_restores_verl():
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    from rlkit.patches.guards import checkpoint_fingerprint

    was_active = checkpoint_fingerprint.PATCH.active()  # the plugin applies it at import verl, in this process too
    checkpoint_fingerprint.PATCH.revert()
    try:
        stock = (FSDPCheckpointManager.save_checkpoint, FSDPCheckpointManager.load_checkpoint)
        checkpoint_fingerprint.PATCH.apply()
        patched = (FSDPCheckpointManager.save_checkpoint, FSDPCheckpointManager.load_checkpoint)
        checkpoint_fingerprint.PATCH.apply()
        assert (FSDPCheckpointManager.save_checkpoint, FSDPCheckpointManager.load_checkpoint) == patched
        assert all(getattr(f, "__rlkit_patch__", None) == "checkpoint_fingerprint" for f in patched)
        checkpoint_fingerprint.PATCH.revert()
        assert (FSDPCheckpointManager.save_checkpoint, FSDPCheckpointManager.load_checkpoint) == stock
    finally:
        if was_active:
            checkpoint_fingerprint.PATCH.apply()
    assert checkpoint_fingerprint.PATCH.active() == was_active
