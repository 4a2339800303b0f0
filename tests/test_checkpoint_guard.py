"""The checkpoint guard where verl's checkpoint manager works without a distributed run, and the trip-wire that lets
an unpatched run (no guard: nothing of rlkit wraps verl there) refuse a patched checkpoint.

verl's ``FSDPCheckpointManager`` saves and loads in one process: with a one-rank process group, and with none at
all when ``get_rank`` / ``get_world_size`` / ``barrier`` answer for the single process, as verl's own CPU tests
(``tests/checkpoint_engine/test_fsdp_lora_only_checkpoint_on_cpu.py``) set them. The guard must work in both; before
it did not (``Default process group has not been initialized``: it gathered over the default group).
Real verl manager, real tiny Qwen3, real torch AdamW; one process, CPU.

And every field the guard checks (its ``CHECKED``), one at a time: a resume that differs from the checkpoint in that
field alone (HostAdamW with the rank-0 owner in a gloo world of one) is refused, the refusal naming that field."""
from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import gloo_world_of_one

pytestmark = pytest.mark.verl


@pytest.fixture(params=["no_process_group", "one_rank_group"])
def single_process(request, monkeypatch):
    """One process as verl's manager sees it: no process group (verl's CPU tests' stand-ins), or a gloo group of one."""
    if request.param == "one_rank_group":
        with gloo_world_of_one():
            yield request.param
        return
    import torch.distributed as dist

    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 1)
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: None)
    assert not dist.is_initialized()
    yield request.param


@pytest.fixture
def guard_and_patch():
    """The guard and one real patch (offload_views: a run with a selection), restored to their states afterwards."""
    from rlkit import patches
    from rlkit.patches.guards import checkpoint_fingerprint

    pair = [checkpoint_fingerprint.PATCH, patches.get("offload_views")]
    was = [p.active() for p in pair]
    yield pair
    for patch, active in zip(pair, was):
        patch.apply() if active else patch.revert()


def _trained():
    from rlkit.models.qwen import build_random_model

    model = build_random_model("tiny", seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.arange(8).view(1, 8)).logits.sum().backward()
    optimizer.step()
    return model, optimizer


def _manager(model, optimizer):
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    contents = ["model", "optimizer", "extra"]
    return FSDPCheckpointManager(model=model, optimizer=optimizer, lr_scheduler=None, processing_class=None,
                                 checkpoint_config={"save_contents": contents, "load_contents": contents})


def _moments(optimizer) -> list[torch.Tensor]:
    return [s["exp_avg"] for s in optimizer.state.values()]


def test_a_patched_save_and_resume_in_one_process_and_an_unpatched_resume_is_refused(
        single_process, guard_and_patch, tmp_path, monkeypatch, capfd):
    from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager

    from rlkit.patches.guards.checkpoint_fingerprint import FILENAME, CheckpointMismatchError

    stock_load = FSDPCheckpointManager.load_checkpoint
    for p in guard_and_patch:
        p.apply()
    model, optimizer = _trained()
    ckpt = str(tmp_path / "global_step_1" / "actor")
    _manager(model, optimizer).save_checkpoint(ckpt, global_step=1)
    fp = json.loads((tmp_path / "global_step_1" / "actor" / FILENAME).read_text())
    assert fp["patches"] == ["offload_views"] and fp["world_size"] == 1 and fp["adam_state_ranks"] == [0]
    assert "state_dict" not in vars(optimizer)  # the trip-wire's hook on the instance is gone after the save

    # The same selection resumes (the guard compares first; the trip-wire hands verl the state dict).
    fresh_model, fresh_opt = _trained()
    torch.manual_seed(1)
    for m in _moments(fresh_opt):
        m.normal_()
    _manager(fresh_model, fresh_opt).load_checkpoint(ckpt)
    assert all(torch.equal(a, b) for a, b in zip(_moments(fresh_opt), _moments(optimizer)))

    # An unpatched run: nothing of rlkit wraps verl's manager; the optimizer file refuses itself.
    for p in reversed(guard_and_patch):
        p.revert()
    assert FSDPCheckpointManager.load_checkpoint is stock_load and not hasattr(stock_load, "__rlkit_patch__")
    with pytest.raises(CheckpointMismatchError) as refused:
        _manager(*_trained()).load_checkpoint(ckpt)
    message = str(refused.value)
    assert "patch offload_views: active in the run that wrote the checkpoint, not in this run" in message
    assert "Fix: resume with the settings that wrote it (RLKIT_PATCHES=offload_views" in message
    assert "RLKIT_ALLOW_CHECKPOINT_MISMATCH=1" in message

    # Allowed: verl loads the very state, and the differences are printed.
    monkeypatch.setenv("RLKIT_ALLOW_CHECKPOINT_MISMATCH", "1")
    allowed_model, allowed_opt = _trained()
    _manager(allowed_model, allowed_opt).load_checkpoint(ckpt)
    assert all(torch.equal(a, b) for a, b in zip(_moments(allowed_opt), _moments(optimizer)))
    assert "loading it anyway" in capfd.readouterr().err


def test_an_unpatched_checkpoint_stays_verls_own(single_process, guard_and_patch, tmp_path):
    """The guard in a run whose fingerprint says unpatched (here: the guard alone, torch's AdamW) writes no file and no
    trip-wire: the optimizer file is the plain dict verl writes, loadable without rlkit."""
    from rlkit.patches.guards.checkpoint_fingerprint import FILENAME

    guard, _ = guard_and_patch
    guard.apply()
    model, optimizer = _trained()
    ckpt = str(tmp_path / "actor")
    _manager(model, optimizer).save_checkpoint(ckpt, global_step=1)
    assert not os.path.exists(os.path.join(ckpt, FILENAME))
    saved = torch.load(os.path.join(ckpt, "optim_world_size_1_rank_0.pt"), weights_only=True)
    assert type(saved) is dict and set(saved) == {"state", "param_groups"}


# ------------------------------------------------------------------------------ every checked field, one at a time
def _host_adamw(model, **options):
    from rlkit.optim import HostAdamW

    return HostAdamW(model.parameters(), lr=1e-3, host_threads=1, **{"rank0_owner": True, **options})


def _trained_host(**options):
    from rlkit.models.qwen import build_random_model

    model = build_random_model("tiny", seed=0)
    optimizer = _host_adamw(model, **options)
    model(torch.arange(8).view(1, 8)).logits.sum().backward()
    optimizer.step()
    return model, optimizer


# What the resuming run changes, and the words its refusal must contain. Each differs from the saving run (HostAdamW,
# rank-0 owner, impl fused, skip_nonfinite on, owners "group", patch offload_views) in that one field.
RUN_CHANGES = {
    "HostAdamW rank0_owner": ({"rank0_owner": False}, "HostAdamW rank0_owner: True in the checkpoint, False in this run"),
    "HostAdamW impl": ({"impl": "forloop"}, "HostAdamW impl: 'fused' in the checkpoint, 'forloop' in this run"),
    "HostAdamW skip_nonfinite": ({"skip_nonfinite": False},
                                 "HostAdamW skip_nonfinite: True in the checkpoint, False in this run"),
    "HostAdamW owners": ({"owners": "node"}, "HostAdamW owners: 'group' in the checkpoint, 'node' in this run"),
    "optimizer": ("torch AdamW", ("optimizer: rlkit.optim.host_adamw.HostAdamW wrote the checkpoint, this run builds "
                                 "torch.optim.adamw.AdamW")),
    "patches": ("without offload_views", ("patch offload_views: active in the run that wrote the checkpoint, not in "
                                         "this run")),
}
# Fields one process cannot change alone (one rank holds the state, the world is one rank): the checkpoint's record
# of them differs instead, as a checkpoint of another layout would.
SAVED_CHANGES = {
    "adam_state_ranks": ({"adam_state_ranks": []}, ("Adam state: held by ranks [] in the checkpoint, by ranks [0] in "
                                                   "this run")),
    "world_size": ({"world_size": 2}, "world_size: 2 ranks wrote the checkpoint, this run has 1"),
}


def test_every_checked_field_is_covered_here():
    from rlkit.patches.guards.checkpoint_fingerprint import CHECKED

    assert set(RUN_CHANGES) | set(SAVED_CHANGES) == set(CHECKED)


@pytest.fixture
def host_adamw_checkpoint(guard_and_patch, tmp_path):
    """A checkpoint of a patched run with HostAdamW's rank-0 owner, saved through verl's manager (a gloo world of one)."""
    from rlkit.patches.guards.checkpoint_fingerprint import FILENAME

    with gloo_world_of_one():
        for p in guard_and_patch:
            p.apply()
        ckpt = str(tmp_path / "actor")
        model, optimizer = _trained_host()
        _manager(model, optimizer).save_checkpoint(ckpt, global_step=1)
        yield ckpt, os.path.join(ckpt, FILENAME), optimizer


def _resume(ckpt: str, change):
    from rlkit import patches

    if change == "torch AdamW":
        model, optimizer = _trained()
    else:
        model, optimizer = _trained_host(**(change if isinstance(change, dict) else {}))
    if change == "without offload_views":
        patches.get("offload_views").revert()
    _manager(model, optimizer).load_checkpoint(ckpt)
    return optimizer


@pytest.mark.parametrize("field", [*RUN_CHANGES, *SAVED_CHANGES])
def test_a_resume_that_differs_in_one_checked_field_is_refused_naming_it(host_adamw_checkpoint, field):
    """Each field the guard checks, changed alone (in this run or in the checkpoint's record): refused before verl
    loads anything, the refusal naming that field and only it; unchanged, the same run resumes its Adam state."""
    from rlkit.patches.guards.checkpoint_fingerprint import CheckpointMismatchError

    ckpt, record, saved_optimizer = host_adamw_checkpoint
    resumed = _resume(ckpt, {})  # the control: nothing differs
    assert [s["exp_avg"] for s in resumed.state.values()] and all(
        torch.equal(a["exp_avg"], b["exp_avg"]) for a, b in zip(resumed.state.values(), saved_optimizer.state.values()))
    change, expected = RUN_CHANGES.get(field) or SAVED_CHANGES[field]
    if field in SAVED_CHANGES:
        with open(record) as f:
            fp = json.load(f)
        with open(record, "w") as f:
            json.dump({**fp, **change}, f)
        change = {}
    with pytest.raises(CheckpointMismatchError) as refused:
        _resume(ckpt, change)
    differences = [line[4:] for line in str(refused.value).splitlines() if line.startswith("  - ")]
    assert differences == [expected]


def _same_moments(resumed, saved) -> bool:
    return bool(_moments(resumed)) and all(torch.equal(a, b) for a, b in zip(_moments(resumed), _moments(saved)))


@pytest.mark.parametrize("neutral", ["replay_poll", "grad_prefetch"])
def test_a_resume_may_turn_a_neutral_patch_on_or_off(host_adamw_checkpoint, neutral, monkeypatch):
    """A patch that changes neither the checkpoint nor the numbers (RESUME_NEUTRAL_PATCHES) turned on for the resume, and
    one the checkpoint's run had turned off: each resumes its Adam state; a non-neutral patch the same way is refused."""
    from rlkit import patches
    from rlkit.patches.guards.checkpoint_fingerprint import RESUME_NEUTRAL_PATCHES, CheckpointMismatchError

    assert neutral in RESUME_NEUTRAL_PATCHES
    ckpt, record, saved_optimizer = host_adamw_checkpoint
    monkeypatch.setenv("RLKIT_REPLAY_POLL_S", "0.2")  # replay_poll's interval, as the recipe sets it
    patch = patches.get(neutral)
    patch.apply()
    try:
        assert _same_moments(_resume(ckpt, {}), saved_optimizer)  # on in this run only
    finally:
        patch.revert()
    with open(record) as f:
        fp = json.load(f)
    for name in (neutral, "cast_once"):  # on in the checkpoint's run only
        with open(record, "w") as f:
            json.dump({**fp, "patches": [*fp["patches"], name]}, f)
        if name == neutral:
            assert _same_moments(_resume(ckpt, {}), saved_optimizer)
        else:
            with pytest.raises(CheckpointMismatchError, match="patch cast_once: active in the run that wrote"):
                _resume(ckpt, {})


def test_without_the_guard_a_neutral_patch_still_counts():
    """The trip-wire's side (an unpatched process): the optimizer is not in sight there, so a checkpoint whose only
    patch is neutral is still refused, lest a HostAdamW checkpoint load into torch's AdamW."""
    from rlkit.patches.guards import checkpoint_fingerprint as guard

    saved = {"patches": ["replay_poll"], "world_size": 1, "global_step": 2}
    current = {"patches": [], "world_size": 1, "contents": {"load": []}}
    assert guard.mismatches(saved, current) == []  # the guarded side lets it differ
    assert not guard.PATCH.active() and guard.selected_patches() == []  # this process: unpatched, no guard
    with pytest.raises(guard.CheckpointMismatchError, match="patch replay_poll: active in the run that wrote"):
        guard._opened(saved, {"state": {}, "param_groups": []})  # what unpickling the optimizer file calls
