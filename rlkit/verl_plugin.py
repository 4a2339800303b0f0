"""How rlkit enters every verl process: the ``verl.plugins`` entry point.

``import verl`` loads every ``verl.plugins`` entry point (pyproject.toml declares this module), in the
driver and in every Ray worker. On import this module reads the run's patch selection from one place,
the environment variable ``RLKIT_PATCHES`` (comma-separated names from ``rlkit.patches.KNOWN_PATCHES``;
Ray workers inherit the driver's environment), applies exactly those patches, and, when
``RLKIT_RECORD_DIR`` is set, writes one JSON record per process saying what it applied.

verl wraps ``ep.load()`` in ``except Exception`` and logs failures at debug level, so an ordinary
exception here would vanish and the run would train unpatched. A failure therefore prints a banner
to stderr, writes an error record, and raises :class:`PluginLoadError`, a ``BaseException`` that
verl's handler does not catch: ``import verl`` itself fails. The recipe launcher
(``rlkit.verl_job.check_plugin_records``) also reads the records after the run and rejects any error or
mismatch. Nothing else lives here: importing this module applies patches.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

PATCHES_ENV = "RLKIT_PATCHES"
RECORD_DIR_ENV = "RLKIT_RECORD_DIR"
# Measurement aids, not optimizations (they change no computation): the emulated card size in GiB
# (rlkit.emulate_card) and the after-step rank-identity check (rlkit.patches.rank_identity).
EMULATE_ENV = "RLKIT_EMULATE_GPU_GIB"
RANK_CHECK_ENV = "RLKIT_CHECK_RANK_IDENTITY"
_VERSIONED = ("torch", "verl", "transformers", "vllm", "ray", "rlkit")


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


def _versions() -> dict[str, str | None]:
    out = {}
    for dist in _VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _record(payload: dict) -> Path | None:
    record_dir = os.environ.get(RECORD_DIR_ENV)
    if not record_dir:
        return None
    path = Path(record_dir)
    path.mkdir(parents=True, exist_ok=True)
    target = path / f"{socket.gethostname()}-{os.getpid()}.json"
    tmp = target.with_suffix(".json.partial")
    tmp.write_text(json.dumps(payload, indent=2, default=str))
    os.replace(tmp, target)
    return target


def _base_record(requested: list[str]) -> dict:
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
        "versions": _versions(),
        "time": time.time(),
    }


def _instruments(environ) -> dict:
    """Install the measurement aids the environment asks for; returns what was installed."""
    from rlkit import emulate_card

    out = {}
    gib = emulate_card.requested_gib(environ)
    if gib:
        out["emulated_card"] = emulate_card.install(gib)
    if environ.get(RANK_CHECK_ENV, "").strip() in ("1", "true", "True"):
        from rlkit.patches import rank_identity

        rank_identity.PATCH.apply()
        out["rank_identity"] = True
    return out


def activate(environ=os.environ) -> list[str]:
    """Apply the patches named in ``RLKIT_PATCHES``; record and fail loudly on any error."""
    requested = requested_patches(environ)
    record = _base_record(requested)
    try:
        from rlkit import patches

        applied = patches.apply(requested)
        wiring = []
        if "master_on_host" in applied:  # the FSDP-level patch alone would leave verl loading the masters
            from rlkit.patches import master_on_host_verl

            master_on_host_verl.PATCH.apply()
            wiring.append(master_on_host_verl.PATCH.name)
        record.update(applied=applied, active=patches.active(), wiring=wiring, error=None)
        record.update(instruments=_instruments(environ))
    except BaseException as err:
        record.update(applied=[], active=[], error=f"{type(err).__name__}: {err}",
                      traceback=traceback.format_exc())
        _record(record)
        banner = "=" * 78
        print(
            f"\n{banner}\nrlkit verl plugin FAILED in pid {os.getpid()} ({record['role']}): "
            f"{PATCHES_ENV}={','.join(requested)!r}\n{record['error']}\n"
            f"Fix: correct {PATCHES_ENV} (known: see rlkit.patches.KNOWN_PATCHES) or the versions "
            f"the patch names.\n{banner}",
            file=sys.stderr, flush=True,
        )
        raise PluginLoadError(record["error"]) from err
    _record(record)
    return applied


# Importing this module is the plugin's entry: verl imports it at ``import verl``.
APPLIED = activate()
