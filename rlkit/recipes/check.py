"""verl's own check of a rendered config: Hydra composition of verl's ``ppo_trainer`` config (no verl import), and
its validation inside a fresh process that imported verl, so the rlkit plugin loads there and records each patch it
applied (:func:`rlkit.recipes.job.check_plugin_records`).

Command line (used by :func:`verify_subprocess`): ``python -m rlkit.recipes.check verify --overrides F --result F``.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlkit.core.env import REPO_ROOT
from rlkit.recipes.job import check_plugin_records, clear_plugin_records, launch_env


def verl_config_dir() -> Path:
    """verl's ``trainer/config`` directory, found without importing verl."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("verl is not installed; install rlkit[verl] (verl 0.9.1)")
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


def compose_verl_config(overrides: list[str]):
    """Compose verl's ``ppo_trainer`` config with ``overrides`` (raises on unknown keys)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def verify_in_verl(overrides: list[str]) -> dict[str, Any]:
    """Inside a process that imported verl: compose + verl's validate_config + config dataclasses.

    ``import verl`` applies the torch-level patches; the verl-level ones wait for the modules they change
    (the FSDP engine, the workers, the loss registry), which a config check never imports. So that the
    check also shows every selected patch applying to this verl, it imports those modules
    (:func:`rlkit.patches.import_targets`) as an actor worker would; ``active_patches`` is then the whole
    selection, and ``deferred_patches`` the ones that waited for that import.
    """
    import verl  # noqa: F401 - loads the rlkit plugin through verl's entry points
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from rlkit import patches

    deferred = patches.import_targets()
    config = compose_verl_config(overrides)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    checked = []
    for section in ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model",
                    "algorithm"):
        node = OmegaConf.select(config, section)
        omega_conf_to_dataclass(node)
        checked.append(section)
    return {"validated_sections": checked, "active_patches": patches.active(), "deferred_patches": deferred,
            "pending_patches": [p.name for p in patches.pending()],
            "use_reference_policy": bool(need_reference_policy(config)), "use_critic": bool(need_critic(config))}


def write_overrides(out_dir: Path, overrides: list[str]) -> Path:
    """``out_dir/overrides.json``: the verify step's input, and what ``rlkit grpo collect`` rebuilds a stopped run from."""
    path = Path(out_dir) / "overrides.json"
    path.write_text(json.dumps(overrides, indent=1))
    return path


def verify_subprocess(recipe, overrides: list[str], out_dir: Path, timeout: float = 600) -> dict:
    """Run :func:`verify_in_verl` in a fresh process with the run's env; check the plugin records."""
    record_dir = out_dir / "plugin_records_verify"
    clear_plugin_records(record_dir)
    overrides_path = write_overrides(out_dir, overrides)
    result_path = out_dir / "verify_result.json"
    result_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "rlkit.recipes.check", "verify", "--overrides", str(overrides_path),
           "--result", str(result_path)]
    log_path = out_dir / "verify.log"
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT, env=launch_env(recipe, record_dir),
                              timeout=timeout, cwd=REPO_ROOT)
    if proc.returncode != 0 or not result_path.exists():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"verl rejected the rendered config or the rlkit plugin failed "
                           f"(exit {proc.returncode}); last lines of {log_path}:\n{tail}")
    result = json.loads(result_path.read_text())
    records = check_plugin_records(record_dir, recipe.active_patches)
    result["plugin_records"] = records
    if sorted(result["active_patches"]) != sorted(recipe.active_patches) or result["pending_patches"]:
        # active() lists them in registry order
        raise RuntimeError(f"verl process has active patches {result['active_patches']} and "
                           f"{result['pending_patches']} still pending after importing their targets, recipe "
                           f"asked for {list(recipe.active_patches)}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlkit.recipes.check", description="verl's own check of rendered overrides")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("verify", help="compose and validate the overrides inside a process that imported verl")
    p.add_argument("--overrides", required=True)
    p.add_argument("--result", required=True)
    ns = parser.parse_args(argv)
    result = verify_in_verl(json.loads(Path(ns.overrides).read_text()))
    Path(ns.result).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
