"""How rlkit enters every verl process: the ``verl.plugins`` entry point.

``import verl`` loads every ``verl.plugins`` entry point (pyproject.toml declares this module), in the
driver, in every Ray worker and in vLLM's processes. On import this module reads the run's patch
selection from one place, the environment variable ``RLKIT_PATCHES`` (comma-separated names from
``rlkit.patches.KNOWN_PATCHES``; Ray workers inherit the driver's environment), resolves the names and
checks every patch's versions, then applies each patch when the modules it changes are imported
(:meth:`rlkit.patches.Patch.apply_when_imported`): the torch-level patches at once (torch is imported),
the verl-level ones when the process imports verl's FSDP engine, workers or loss registry, so a process
that builds no actor (a vLLM worker, the driver) does not import the FSDP engine because of rlkit.
When ``RLKIT_RECORD_DIR`` is set, it writes one JSON record per process saying which patches are
applied and which are still pending, and rewrites it whenever a deferred patch applies.

verl wraps ``ep.load()`` in ``except Exception`` and logs failures at debug level, so an ordinary
exception here would vanish and the run would train unpatched. A failure (an unknown name, a version
outside a patch's range: at ``import verl``; a deferred apply: in the ``import`` statement that brought
in its targets) therefore prints a banner to stderr, writes an error record, and raises
:class:`PluginLoadError`, a ``BaseException`` that neither verl's loader nor an ``except Exception``
around an import catches. The recipe launcher (``rlkit.recipes.job.check_plugin_records``) also reads the
records after the run and rejects any error or mismatch, and a run in which no Ray worker applied
everything. Besides a selection the process gets the checkpoint guard (``rlkit.patches.guards.checkpoint_fingerprint``,
recorded under ``guards``): verl's checkpoints record the patches that wrote them, and a resume by a differently
patched run is refused. With nothing selected the plugin replaces nothing (installed means inert). Nothing else
lives here: importing this module activates the selection.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

PATCHES_ENV = "RLKIT_PATCHES"
RECORD_DIR_ENV = "RLKIT_RECORD_DIR"
# Measurement aids, not optimizations (they change no computation): the emulated card size in GiB
# (rlkit.patches.instruments.emulate_card), the after-step rank-identity check (rlkit.patches.instruments.rank_identity)
# and old_log_prob's own peak memory (rlkit.patches.instruments.old_log_prob_memory, RLKIT_OLD_LOG_PROB_MEMORY).
EMULATE_ENV = "RLKIT_EMULATE_GPU_GIB"
RANK_CHECK_ENV = "RLKIT_CHECK_RANK_IDENTITY"
_VERSIONED = ("torch", "verl", "transformers", "vllm", "ray", "rlkit")
AT_IMPORT_VERL = "import verl"  # ``applied_on`` of a patch applied during activation
_lock = threading.RLock()  # one record per process, rewritten from whichever thread imports a target


class PluginLoadError(BaseException):
    """rlkit could not apply the requested patches. A BaseException so verl's plugin loader
    (``except Exception`` + debug log) cannot swallow it."""


def requested_patches(environ=os.environ) -> list[str]:
    """Patch names selected for this run (empty when ``RLKIT_PATCHES`` is unset or blank)."""
    return [name.strip() for name in environ.get(PATCHES_ENV, "").split(",") if name.strip()]


def _role() -> str:
    """Which kind of verl process this is, from what is known at import time."""
    argv = " ".join(sys.argv)
    if "default_worker.py" in argv:
        return "ray_worker"
    if "verl.trainer.main_ppo" in argv or argv.endswith("main_ppo.py"):
        return "driver"
    return "other"


def _record(payload: dict) -> Path | None:
    """Write this process's record atomically (a reader never sees half a file)."""
    record_dir = os.environ.get(RECORD_DIR_ENV)
    if not record_dir:
        return None
    path = Path(record_dir)
    path.mkdir(parents=True, exist_ok=True)
    payload.update(pid=os.getpid(), time=time.time())  # a forked child writes its own record
    target = path / f"{socket.gethostname()}-{os.getpid()}.json"
    tmp = target.with_suffix(".json.partial")
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    os.replace(tmp, target)
    return target


def _base_record(requested: list[str]) -> dict:
    from rlkit.patches import installed_versions

    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "role": _role(),
        "argv": sys.argv[:4],
        "rank": os.environ.get("RANK"),
        "local_rank": os.environ.get("LOCAL_RANK"),
        "world_size": os.environ.get("WORLD_SIZE"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "requested": requested,
        "versions": installed_versions(_VERSIONED),
        "time": time.time(),
    }


def _selection(requested: list[str], environ) -> tuple[list, list, list, list]:
    """(requested patches, wiring patches, instrument patches, guards) as Patch objects; unknown names raise.

    Nothing selected (``RLKIT_PATCHES`` unset or blank, no instrument asked for) gives nothing at all: rlkit installed
    beside verl replaces no verl or torch attribute in a process that asked for nothing. With a selection the process
    also gets the checkpoint guard (``checkpoint_fingerprint``: a patched run's checkpoints record its patches, and its resume compares them
    before verl reads a tensor); it is left out (``guards`` empty in the record) where its versions do not fit. An
    unpatched run resuming a patched checkpoint is refused by the checkpoint itself, without a guard in that run
    (``checkpoint_fingerprint``: the optimizer files carry a trip-wire)."""
    from rlkit import patches

    instruments = []
    if environ.get(RANK_CHECK_ENV, "").strip() in ("1", "true", "True"):
        from rlkit.patches.instruments import rank_identity

        instruments.append(rank_identity.PATCH)
    from rlkit.patches.instruments import old_log_prob_memory

    if old_log_prob_memory.requested(environ):
        instruments.append(old_log_prob_memory.PATCH)
    if not requested and not instruments:
        return [], [], [], []
    selected = [patches.get(name) for name in requested]
    wiring = []
    if "master_on_host" in requested:  # the FSDP-level patch alone would leave verl loading the masters
        from rlkit.patches.verl import master_on_host_verl

        wiring.append(master_on_host_verl.PATCH)
    from rlkit.patches.guards import checkpoint_fingerprint

    try:
        checkpoint_fingerprint.PATCH.check_versions()
        guards = [checkpoint_fingerprint.PATCH]
    except patches.PatchError:
        guards = []
    return selected, wiring, instruments, guards


def _refresh(record: dict, handled: list) -> None:
    """The record's view of every patch this process handles: applied, or still waiting for its targets."""
    from rlkit import patches

    state = {p.name: "applied" if p.active() else "pending" if p.pending() else "not applied" for p in handled}
    record.update(
        applied=[n for n in record["requested"] if state.get(n) == "applied"],
        pending=[n for n in record["requested"] if state.get(n) == "pending"],
        state=state, active=patches.active(),
    )


def _fail(record: dict, err: BaseException) -> PluginLoadError:
    """Record the error and print the banner; the PluginLoadError to raise where the failure surfaced."""
    record.update(error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())
    _record(record)
    banner = "=" * 78
    print(
        f"\n{banner}\nrlkit verl plugin FAILED in pid {os.getpid()} ({record['role']}): "
        f"{PATCHES_ENV}={','.join(record['requested'])!r}\n{record['error']}\n"
        f"Fix: correct {PATCHES_ENV} (known: see rlkit.patches.KNOWN_PATCHES) or the versions "
        f"the patch names.\n{banner}",
        file=sys.stderr, flush=True,
    )
    return PluginLoadError(record["error"])


def activate(environ=os.environ) -> list[str]:
    """Check the patches named in ``RLKIT_PATCHES`` and apply each now or when its targets are imported;
    record, and fail loudly on any error. Returns the names applied at once."""
    requested = requested_patches(environ)
    record = _base_record(requested)
    record.update(applied=[], pending=[], state={}, active=[], wiring=[], instruments={}, guards=[], targets={},
                  applied_on={}, error=None)
    handled: list = []

    def on_apply(patch, trigger: str, error: BaseException | None) -> None:
        with _lock:
            _refresh(record, handled)
            if error is not None:
                raise _fail(record, error) from error
            record["applied_on"][patch.name] = trigger
            _record(record)

    with _lock:
        try:
            selected, wiring, instruments, guards = _selection(requested, environ)
            handled[:] = [*selected, *wiring, *instruments, *guards]
            for patch in handled:  # every version checked before anything changes
                patch.check_versions()
            record.update(wiring=[p.name for p in wiring], guards=[p.name for p in guards],
                          targets={p.name: list(p.targets) for p in handled})
            from rlkit.patches.instruments import emulate_card

            gib = emulate_card.requested_gib(environ)
            if gib:  # torch only: installed at once
                record["instruments"]["emulated_card"] = emulate_card.install(gib)
            for patch in instruments:
                record["instruments"][patch.name] = True
            # In this order, so that patches on one target wrap each other as when they applied eagerly
            # (rank_identity outermost around master_on_host_verl's optimizer_step).
            for patch in handled:
                if patch.apply_when_imported(on_apply):
                    record["applied_on"][patch.name] = AT_IMPORT_VERL
            _refresh(record, handled)
        except BaseException as err:
            raise _fail(record, err) from err
        _record(record)
    return list(record["applied"])


# Importing this module is the plugin's entry: verl imports it at ``import verl``.
APPLIED = activate()
