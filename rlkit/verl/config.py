"""verl's configuration read without verl: Hydra overrides, a YAML file or a launch script into one tree.

Parsing is pure Python (PyYAML for values); neither verl nor OmegaConf is needed. Keys the input does
not set take verl 0.9.1's defaults from :data:`VERL_DEFAULTS` (:class:`VerlConfig`). Used by
:mod:`rlkit.planning.preflight`; verl's own composition and validation are :mod:`rlkit.recipes.job`'s.
"""
from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from rlkit.core.params import ParamError

# verl 0.9.1 defaults (verl/trainer/config/_generated_ppo_trainer.yaml) of every key a check reads.
# ``${oc.select:...}`` defaults there are resolved by :meth:`VerlConfig.get` (see FOLLOWS).
VERL_DEFAULTS: dict[str, Any] = {
    "actor_rollout_ref.actor.strategy": "fsdp",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size": -1,
    "actor_rollout_ref.actor.fsdp_config.param_offload": False,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": False,
    "actor_rollout_ref.actor.fsdp_config.use_orig_params": False,
    "actor_rollout_ref.actor.ppo_micro_batch_size": None,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": None,
    "actor_rollout_ref.actor.use_dynamic_bsz": False,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,
    "actor_rollout_ref.actor.optim.optimizer_impl": "torch.optim",
    "actor_rollout_ref.actor.entropy_coeff": 0,
    "actor_rollout_ref.actor.calculate_entropy": False,
    "actor_rollout_ref.model.path": "~/models/deepseek-llm-7b-chat",
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.model.lora_rank": 0,
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.model.use_fused_kernels": False,
    "actor_rollout_ref.model.fused_kernel_options.impl_backend": "torch",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": None,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": None,
    "actor_rollout_ref.rollout.name": None,  # '???' (mandatory) in verl
    "actor_rollout_ref.rollout.n": 1,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.5,
    "actor_rollout_ref.rollout.enforce_eager": False,
    "actor_rollout_ref.rollout.cudagraph_capture_sizes": None,
    "actor_rollout_ref.rollout.free_cache_engine": True,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "actor_rollout_ref.rollout.max_num_batched_tokens": 8192,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": None,
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": None,
    "actor_rollout_ref.rollout.disable_log_stats": True,
    "critic.ppo_micro_batch_size": None,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.train_batch_size": 1024,
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
    "ray_kwargs.ray_init.runtime_env.py_executable": None,
}


# Keys whose verl default is another key's value (``${oc.select:<other>,<fallback>}``).
FOLLOWS: dict[str, str] = {
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": "actor_rollout_ref.actor.use_dynamic_bsz",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_use_dynamic_bsz": "actor_rollout_ref.actor.use_dynamic_bsz",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "critic.forward_micro_batch_size": "critic.ppo_micro_batch_size",
}


class PreflightInputError(ParamError):
    """The configuration could not be read; the message names the item and the fix."""


_KEY = re.compile(r"^[A-Za-z_][\w\-]*(\.[A-Za-z_0-9][\w\-]*)*$")


# Hydra writes a flow dict's entries as key:value (no space); YAML reads "key:value" as one key with no value
_FLOW_KEY = re.compile(r"(?<=[{,])(\s*[A-Za-z_][\w\-]*):(?![\s/])")


def _value(raw: str) -> Any:
    """A Hydra override value: YAML scalars and flow lists/dicts (Hydra's ``{a:1,b:x}`` included); anything
    unparsable stays a string."""
    if raw == "":
        return ""
    if raw.lstrip().startswith("{"):
        raw = _FLOW_KEY.sub(r"\1: ", raw)
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _set(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise PreflightInputError(
                f"{'.'.join(parts[: i + 1])}: is a value ({child!r}), but {dotted} treats it as a section. "
                f"Fix: remove one of the two overrides."
            )
        node = child
    node[parts[-1]] = value


def _delete(tree: dict, dotted: str) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.get(part, {}) if isinstance(node, dict) else {}
    if isinstance(node, dict):
        node.pop(parts[-1], None)


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """Hydra overrides -> nested dict. ``~key`` deletes; ``+``/``++`` prefixes add or force a key."""
    tree: dict[str, Any] = {}
    for item in overrides:
        item = item.strip()
        if not item:
            continue
        if item.startswith("~"):
            key = item[1:].split("=", 1)[0]
            if not _KEY.match(key):
                raise PreflightInputError(f"override {item!r}: {key!r} is not a dotted key. Fix: write ~a.b.c")
            _delete(tree, key)
            continue
        if "=" not in item:
            raise PreflightInputError(f"override {item!r} is not KEY=VALUE. Fix: write it as {item}=<value>")
        key, raw = item.split("=", 1)
        key = key.lstrip("+")
        if not _KEY.match(key):
            raise PreflightInputError(f"override {item!r}: {key!r} is not a dotted config key. Fix: write a.b.c=value")
        _set(tree, key, _value(raw))
    return tree


def overrides_from_command(text: str) -> list[str]:
    """The Hydra overrides of a shell command or script (``python3 -m verl.trainer.main_ppo k=v ...``)."""
    joined = re.sub(r"\\\r?\n", " ", text)
    joined = "\n".join(line.split("#", 1)[0] if line.lstrip().startswith("#") else line for line in joined.splitlines())
    try:
        tokens = shlex.split(joined, comments=True)
    except ValueError as err:
        raise PreflightInputError(f"cannot split the command into words ({err}). Fix: balance its quotes") from err
    pattern = re.compile(r"^(\+{0,2}|~)[A-Za-z_][\w\-]*\.[\w.\-]+(=|$)")
    return [t for t in tokens if pattern.match(t) and ("=" in t or t.startswith("~"))]


def load_config(source: str | os.PathLike) -> dict[str, Any]:
    """A nested dict from a YAML file, or from the overrides in a shell script / command file."""
    path = Path(source)
    if not path.is_file():
        raise PreflightInputError(f"{path}: no such file. Fix: pass a YAML file, a shell script or key=value overrides")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise PreflightInputError(f"{path}: not valid YAML ({err}). Fix: correct the file") from err
        if not isinstance(data, dict):
            raise PreflightInputError(f"{path}: must hold a mapping of config sections, got {type(data).__name__}")
        data.pop("defaults", None)  # Hydra composition list, not a config value
        return data
    return parse_overrides(overrides_from_command(text))


class VerlConfig:
    """Read access to a user config with verl 0.9.1's defaults behind it."""

    def __init__(self, tree: Mapping[str, Any]) -> None:
        self.tree = tree

    def is_set(self, key: str) -> bool:
        node: Any = self.tree
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return False
            node = node[part]
        return not (isinstance(node, str) and node.startswith("${"))  # unresolved interpolation

    def get(self, key: str) -> Any:
        if self.is_set(key):
            node: Any = self.tree
            for part in key.split("."):
                node = node[part]
            return node
        if key in FOLLOWS:
            return self.get(FOLLOWS[key])
        if key not in VERL_DEFAULTS:
            raise KeyError(f"{key} has no verl default known to rlkit.planning.preflight")
        return VERL_DEFAULTS[key]

    @property
    def world_size(self) -> int:
        return int(self.get("trainer.n_gpus_per_node")) * int(self.get("trainer.nnodes"))

    def seq_len(self) -> int:
        return int(self.get("data.max_prompt_length")) + int(self.get("data.max_response_length"))


def merge_trees(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge_trees(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out
