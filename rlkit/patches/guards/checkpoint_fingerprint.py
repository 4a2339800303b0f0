"""A patch fingerprint beside every verl 0.9.1 FSDP checkpoint, checked before a resume loads anything.

What verl saves (``verl.utils.checkpoint.fsdp_checkpoint_manager.FSDPCheckpointManager``, which
``FSDPEngine.save_checkpoint`` / ``load_checkpoint`` call): every rank writes its own
``model_world_size_{W}_rank_{r}.pt`` (``model.state_dict()`` under ``SHARDED_STATE_DICT``, which FSDP1 turns into
the full state dict for NO_SHARD), ``optim_world_size_{W}_rank_{r}.pt`` (the rank's plain
``optimizer.state_dict()``: verl never calls ``FSDP.optim_state_dict``, so a custom optimizer's own state_dict is
what lands on disk) and ``extra_state_world_size_{W}_rank_{r}.pt`` (lr scheduler, RNG); on load each rank reads its
own three files back with ``model.load_state_dict`` / ``optimizer.load_state_dict``. Nothing in them says how the
run was patched, and some differences load without an error and train wrongly: with HostAdamW's rank-0 owner, rank
1's optimizer file holds no Adam state, so a run without the owner starts rank 1 from zero moments and the replicas
drift apart silently.

The patch wraps both methods of the manager:

* ``save_checkpoint`` of a patched run first writes ``rlkit_patches.json`` into the checkpoint folder (rank 0; each
  rank's part is gathered; an unpatched run's checkpoint stays exactly verl's): the rlkit patches selected in this
  process (:func:`rlkit.patches.active` and those waiting for their targets), the optimizer's class and options
  (HostAdamW's :meth:`~rlkit.optim.HostAdamW.options`), which ranks hold Adam state, the world size, the contents
  saved, the versions. Then verl's save runs unchanged, except that each rank's optimizer state dict is pickled as a
  trip-wire (below). (Written first, so a checkpoint verl finished always has one; verl's tracker file marks a
  checkpoint complete only after.)
* ``load_checkpoint`` first compares that file with this run (:func:`mismatches`) and, on any difference in
  :data:`CHECKED`, raises :class:`CheckpointMismatchError` on every rank, naming each difference and the fix,
  before verl reads a tensor. A checkpoint without the file was written without this patch: accepted only when
  this run is unpatched too (no rlkit patch, not HostAdamW). ``RLKIT_ALLOW_CHECKPOINT_MISMATCH=1`` loads it
  anyway, with the differences printed.

The plugin applies this patch only in a process that selects something (``rlkit.patches.verl_plugin``): installed and
unselected, rlkit wraps nothing. A run without it that resumes a patched checkpoint is refused by the checkpoint:
pickle rebuilds the optimizer state dict through :func:`_opened` when verl's ``torch.load`` reads the file, and
that names the checkpoint's patches and the fix. Without a process group (verl's manager works in one process)
the guard runs as the only rank. Versions are recorded, not compared (every patch checks its own version range
when it applies); the patch changes no computation.
"""
from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager, nullcontext
from typing import Any

from rlkit.patches import KNOWN_PATCHES, Patch, import_target, installed_versions, replace_attrs, supported

VERL_MODULE = "verl.utils.checkpoint.fsdp_checkpoint_manager"
FILENAME = "rlkit_patches.json"
FORMAT = 1
ALLOW_ENV = "RLKIT_ALLOW_CHECKPOINT_MISMATCH"
# What must agree for a resume: the patches, the optimizer's class, the HostAdamW options that decide what each
# rank's optimizer file holds or how the next steps compute, which ranks hold Adam state, the world size.
# The other options (pin_memory, broadcast_device, host_threads, check_identical_grads, overlap_copies, prefetch_grads)
# are recorded only: they change neither the state nor the numbers.
HOST_ADAMW_CHECKED = ("rank0_owner", "impl", "skip_nonfinite", "owners")
# A checked option that older checkpoints did not record, at the only value it had then. (HostAdamW's node count with
# owners="node" is recorded, not compared: a resume on another node count moves the owners, and the Adam-state ranks
# or the world size name that.)
HOST_ADAMW_DEFAULTS = {"owners": "group"}
# Patches a guarded resume may turn on or off: they change neither what a checkpoint holds nor the numbers of the
# steps after it (replay_poll hands on the same batch, only sooner; grad_prefetch's step is bit-identical to the serial
# one, tests/test_grad_prefetch.py). They are still recorded.
RESUME_NEUTRAL_PATCHES = ("replay_poll", "grad_prefetch")
CHECKED = ("patches", "optimizer", *(f"HostAdamW {o}" for o in HOST_ADAMW_CHECKED), "adam_state_ranks", "world_size")
_VERSIONED = ("torch", "verl", "transformers", "rlkit")


class CheckpointMismatchError(RuntimeError):
    """A checkpoint written by a differently patched run (see :func:`mismatches`)."""


# ----------------------------------------------------------------------------------------------
# the fingerprint


def selected_patches() -> list[str]:
    """The rlkit patches of this process, applied or waiting for their targets, in registry order."""
    from rlkit import patches

    names = set(patches.active()) | {p.name for p in patches.pending()}
    return [n for n in KNOWN_PATCHES if n in names]


def optimizer_fingerprint(optimizer) -> dict[str, Any]:
    """The optimizer's class and options (HostAdamW's; none for others: their hyper-parameters live in state_dict)."""
    if optimizer is None:
        return {"class": None, "options": {}, "holds_adam_state": False}
    cls = type(optimizer)
    options = optimizer.options() if callable(getattr(optimizer, "options", None)) else {}
    holds = bool(getattr(optimizer, "is_owner", True))
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "options": options, "holds_adam_state": holds}


def _grouped() -> bool:
    """Whether a default process group exists. verl's manager also runs without one (one process: its own CPU tests
    save and load that way), and so does the guard then, as the only rank."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if _grouped() else 0


def _rank_parts(manager) -> list[dict[str, Any]]:
    """Every rank's optimizer fingerprint, in rank order (a collective over the default group, if there is one)."""
    import torch.distributed as dist

    part = {"rank": _rank(), "optimizer": optimizer_fingerprint(manager.optimizer)}
    if not _grouped():
        return [part]
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, part)
    return parts


def fingerprint(manager, *, global_step: int | None = None) -> dict:
    """This run's fingerprint for ``manager`` (an FSDPCheckpointManager); a collective (every rank's optimizer)."""
    from rlkit.patches.verl import master_on_host_verl

    parts = _rank_parts(manager)
    optimizer = dict(parts[0]["optimizer"])
    optimizer.pop("holds_adam_state")
    return {
        "format": FORMAT,
        "written_by": __name__,
        "global_step": global_step,
        "patches": selected_patches(),
        "wiring": ["master_on_host_verl"] if master_on_host_verl.PATCH.active() else [],
        "optimizer": optimizer,
        "adam_state_ranks": [p["rank"] for p in parts if p["optimizer"]["holds_adam_state"]],
        "world_size": len(parts),
        "contents": {"save": list(manager.checkpoint_save_contents), "load": list(manager.checkpoint_load_contents)},
        "versions": installed_versions(_VERSIONED),
    }


def is_unpatched(fp: dict) -> bool:
    """A run that needs no fingerprint: no rlkit patch and not HostAdamW."""
    return not fp["patches"] and not str(fp["optimizer"].get("class") or "").startswith("rlkit.")


def mismatches(saved: dict | None, current: dict, *, neutral_may_differ: bool = True) -> list[str]:
    """The differences in :data:`CHECKED` between a checkpoint's fingerprint and this run's, as sentences; a patch of
    :data:`RESUME_NEUTRAL_PATCHES` on one side only is not one unless ``neutral_may_differ`` is False."""
    if saved is None:
        if is_unpatched(current):
            return []
        return [(f"the checkpoint has no {FILENAME}: it was written by a run without rlkit's checkpoint fingerprint "
                 f"(stock verl, or an rlkit before it), and this run has patches {current['patches']} and optimizer "
                 f"{current['optimizer']['class']}")]
    found = []
    ignored = RESUME_NEUTRAL_PATCHES if neutral_may_differ else ()
    old = [n for n in saved.get("patches") or [] if n not in ignored]
    new = [n for n in current["patches"] if n not in ignored]
    for name in old:
        if name not in new:
            found.append(f"patch {name}: active in the run that wrote the checkpoint, not in this run")
    for name in new:
        if name not in old:
            found.append(f"patch {name}: active in this run, not in the run that wrote the checkpoint")
    optimizer_loaded = "optimizer" in current["contents"]["load"] and "optimizer" in saved.get(
        "contents", {}).get("save", ["optimizer"])
    if optimizer_loaded:
        was, now = saved.get("optimizer") or {}, current["optimizer"]
        optimizer = []
        if was.get("class") != now["class"]:
            optimizer.append(f"optimizer: {was.get('class')} wrote the checkpoint, this run builds {now['class']}")
        elif str(now["class"]).endswith("HostAdamW"):
            for option in HOST_ADAMW_CHECKED:
                default = HOST_ADAMW_DEFAULTS.get(option)
                a, b = (was.get("options") or {}).get(option, default), now["options"].get(option, default)
                if a != b:
                    optimizer.append(f"HostAdamW {option}: {a!r} in the checkpoint, {b!r} in this run")
        same_world = saved.get("world_size") == current["world_size"]
        if saved.get("adam_state_ranks") != current["adam_state_ranks"] and not optimizer and same_world:
            # Named on its own only when nothing above explains it (e.g. the owner of another process group).
            optimizer.append(f"Adam state: held by ranks {saved.get('adam_state_ranks')} in the checkpoint, "
                             f"by ranks {current['adam_state_ranks']} in this run")
        found += optimizer
    if saved.get("world_size") != current["world_size"]:
        found.append(f"world_size: {saved.get('world_size')} ranks wrote the checkpoint, this run has "
                     f"{current['world_size']}")
    return found


def _fix(saved: dict | None) -> str:
    if saved is None:
        return ("resume with the same patches and optimizer that wrote it (unpatched: RLKIT_PATCHES unset and "
                "torch's AdamW), or start a fresh run (trainer.resume_mode=disable)")
    options = (saved.get("optimizer") or {}).get("options") or {}
    override = ",".join(f"{o}:{json.dumps(options[o])}" for o in HOST_ADAMW_CHECKED if o in options)
    optimizer = f"optimizer {(saved.get('optimizer') or {}).get('class')}"
    if override:
        optimizer += f" with actor.optim.override_optimizer_config={{{override}}}"
    return (f"resume with the settings that wrote it (RLKIT_PATCHES={','.join(saved.get('patches') or [])}, "
            f"{optimizer}, {saved.get('world_size')} ranks), or start a fresh run (trainer.resume_mode=disable)")


def refusal(path: str, saved: dict | None, found: list[str]) -> str:
    lines = "\n".join(f"  - {f}" for f in found)
    return (f"rlkit refuses to resume from {path}: the checkpoint was written by a differently patched run.\n"
            f"{lines}\nFix: {_fix(saved)}; or set {ALLOW_ENV}=1 to load it anyway.")


def read(local_path: str) -> dict | None:
    path = os.path.join(local_path, FILENAME)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write(manager, local_path: str, global_step: int | None = None) -> dict:
    """Gather every rank's part and write the fingerprint (rank 0); returns it on every rank. An unpatched run writes
    nothing (:func:`is_unpatched`, the same answer on every rank): its checkpoint stays exactly verl's, and a
    checkpoint without the file loads only into an unpatched run."""
    fp = fingerprint(manager, global_step=global_step)
    if is_unpatched(fp):
        return fp
    if _rank() == 0:
        os.makedirs(local_path, exist_ok=True)
        target = os.path.join(local_path, FILENAME)
        tmp = target + ".partial"
        with open(tmp, "w") as f:
            json.dump(fp, f, indent=2, default=str)
        os.replace(tmp, target)
    return fp


def check(manager, local_path: str) -> list[str]:
    """Compare the checkpoint's fingerprint with this run; raise :class:`CheckpointMismatchError` on every rank on a
    difference (rank 0 reads the file, so only it needs to see the folder). Returns the differences (allowed)."""
    import torch.distributed as dist

    current = fingerprint(manager)
    box = [read(local_path) if _rank() == 0 else None]
    if _grouped():
        dist.broadcast_object_list(box, src=0)
    saved = box[0]
    return _refuse_or_allow(local_path, saved, mismatches(saved, current))


def _refuse_or_allow(path: str, saved: dict | None, found: list[str]) -> list[str]:
    """Raise :class:`CheckpointMismatchError` naming ``found``, unless it is empty or ``RLKIT_ALLOW_CHECKPOINT_MISMATCH``
    is set (then rank 0 prints it and the load goes on)."""
    if not found:
        return []
    message = refusal(path, saved, found)
    if os.environ.get(ALLOW_ENV, "").strip() in ("1", "true", "True"):
        if _rank() == 0:
            print(f"{message}\n{ALLOW_ENV} is set: loading it anyway.", file=sys.stderr, flush=True)
        return found
    raise CheckpointMismatchError(message)


# ----------------------------------------------------------------------------------------------
# the trip-wire: how a run without the guard refuses a patched checkpoint
#
# An unpatched process wraps nothing (installed means inert), so nothing of rlkit runs when its verl loads a
# checkpoint. A patched run's save therefore puts the check into the checkpoint: each rank's optimizer file holds
# its state dict as a _Tripwire, which pickle rebuilds through _opened, the moment verl's torch.load reads the file.


class _Tripwire(dict):
    """An optimizer state dict that unpickles through :func:`_opened` (a plain dict comes out)."""

    def __init__(self, state: dict, saved: dict):
        super().__init__(state)
        self.saved = saved

    def __reduce__(self):
        return _opened, (self.saved, dict(self))


def _opened(saved: dict, state: dict) -> dict:
    """verl read a patched run's optimizer file: hand it the state dict where the guard is active (it compared
    ``rlkit_patches.json`` with this run before verl opened a file); elsewhere this process has no patch selected,
    which differs from the checkpoint's patches, so it is refused (or allowed, printed, with the override). A neutral
    patch counts here: without the guard the optimizer is not in sight, and a checkpoint of HostAdamW with only
    neutral patches must not load into torch's AdamW."""
    if PATCH.active():
        return state
    current = {"patches": selected_patches(), "optimizer": {"class": None, "options": {}},
               "adam_state_ranks": saved.get("adam_state_ranks"), "world_size": saved.get("world_size"),
               "contents": {"load": []}}  # only the patches are known here: the optimizer is not in sight
    where = f"a checkpoint of global step {saved.get('global_step')}"
    _refuse_or_allow(where, saved, mismatches(saved, current, neutral_may_differ=False))
    return state


@contextmanager
def _tripwired(optimizer, fp: dict):
    """While verl saves, ``optimizer.state_dict()`` returns its state dict as a :class:`_Tripwire` (an attribute of
    this instance, removed afterwards; the class is not touched)."""
    own, shadowed = optimizer.state_dict, vars(optimizer).get("state_dict")
    optimizer.state_dict = lambda: _Tripwire(own(), fp)
    try:
        yield
    finally:
        if shadowed is None:
            del optimizer.state_dict
        else:
            optimizer.state_dict = shadowed


# ----------------------------------------------------------------------------------------------
# the patch


def _apply():
    manager_cls = import_target("checkpoint_fingerprint", VERL_MODULE).FSDPCheckpointManager
    original_save, original_load = manager_cls.save_checkpoint, manager_cls.load_checkpoint

    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep=None):
        fp = write(self, local_path, global_step) if local_path is not None else None
        wired = fp is not None and not is_unpatched(fp) and self.optimizer is not None
        with _tripwired(self.optimizer, fp) if wired else nullcontext():
            return original_save(self, local_path, hdfs_path=hdfs_path, global_step=global_step,
                                 max_ckpt_to_keep=max_ckpt_to_keep)

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load=False):
        if local_path is not None:
            check(self, local_path)
        return original_load(self, local_path, hdfs_path=hdfs_path, del_local_after_load=del_local_after_load)

    save_checkpoint.__doc__, load_checkpoint.__doc__ = original_save.__doc__, original_load.__doc__
    save_checkpoint.__rlkit_patch__ = load_checkpoint.__rlkit_patch__ = "checkpoint_fingerprint"
    return replace_attrs((manager_cls, "save_checkpoint", save_checkpoint), (manager_cls, "load_checkpoint", load_checkpoint))


PATCH = Patch(
    name="checkpoint_fingerprint",
    summary="verl FSDP checkpoints carry rlkit_patches.json; a resume from a differently patched run is refused",
    requires=supported("verl", "torch"),
    apply_fn=_apply,
    targets=(VERL_MODULE,),
)
