"""HostAdamW's checkpoints: its state dict on the host, and the rank's role recorded beside it.

Checkpoints: ``state_dict()`` holds ``step``, ``exp_avg``, ``exp_avg_sq`` per parameter exactly as
torch.optim.AdamW does, plus this rank's role (``"host_adamw"``: with ``rank0_owner`` the other ranks' state
dicts are empty, and ``load_state_dict()`` refuses one saved on a rank with the other role); ``load_state_dict()``
keeps that state on the host (the base class would move it to the parameters' device). The fp32 master of
an fp32 parameter equals the parameter after every step, so it is not saved; it is rebuilt from the (restored)
parameter at the next step. The master of a non-fp32 parameter is not recoverable from it and is saved as
``state["master"]``. A host-resident parameter is its own master: restoring the parameter restores it. Through
verl's checkpoint manager (each rank saves and loads its own ``optimizer.state_dict()``):
``rlkit.patches.guards.checkpoint_fingerprint`` and tests/test_checkpoint_resume.py.
"""
from __future__ import annotations

from collections import defaultdict
from copy import deepcopy
from typing import Any

import torch

STATE_DICT_KEY = "host_adamw"  # state_dict entry: this rank's role under rank0_owner


def check_role(saved_role: dict[str, Any] | None, *, is_owner: bool, rank0_owner: bool) -> None:
    """Refuse a state dict HostAdamW saved on a rank with the other role (the rank-0 owner's on a rank without state,
    or a non-owner's, which holds no Adam state, on a rank that steps): loaded, the owner would restart its moments
    from zero and the ranks would drift apart without an error. ``None``: not saved by HostAdamW, nothing to check."""
    if saved_role is None or bool(saved_role.get("is_owner", True)) == is_owner:
        return

    def role(owner: bool, owner_mode) -> str:
        return ("holds Adam state" if owner else "holds no Adam state") + f" (rank0_owner={owner_mode})"

    saved = role(bool(saved_role.get("is_owner")), saved_role.get("rank0_owner"))
    raise ValueError(
        f"HostAdamW.load_state_dict: the state dict was saved by a rank that {saved}, and this rank "
        f"{role(is_owner, rank0_owner)}. Fix: build the optimizer with the saved rank0_owner and "
        f"process group, and load each rank's own state dict.")


def host_state(groups: list[dict[str, Any]], state_dict: dict[str, Any]):
    """(param groups, state) of ``state_dict`` mapped onto ``groups``' parameters, the state tensors on the host in
    fp32 (torch's ``load_state_dict`` would move them to the parameters' device)."""
    saved_groups = state_dict["param_groups"]
    if len(groups) != len(saved_groups):
        raise ValueError(f"state_dict has {len(saved_groups)} param groups, this optimizer {len(groups)}. "
                         "Fix: build the optimizer over the same parameter groups as the saved one.")
    id_to_param: dict[Any, torch.Tensor] = {}
    for i, (group, saved) in enumerate(zip(groups, saved_groups)):
        if len(group["params"]) != len(saved["params"]):
            raise ValueError(f"param group {i}: state_dict has {len(saved['params'])} params, this optimizer "
                             f"{len(group['params'])}. Fix: build the optimizer over the same model.")
        id_to_param.update(zip(saved["params"], group["params"]))
    state: defaultdict[torch.Tensor, dict[str, Any]] = defaultdict(dict)
    for param_id, values in state_dict["state"].items():
        if param_id not in id_to_param:
            raise ValueError(f"state_dict has state for unknown parameter id {param_id!r}. "
                             "Fix: load a state_dict saved from the same model and optimizer.")
        state[id_to_param[param_id]] = {
            k: v.detach().to(device="cpu", dtype=torch.float32, copy=True) if torch.is_tensor(v) else deepcopy(v)
            for k, v in values.items()
        }
    param_groups = [{**deepcopy({k: v for k, v in saved.items() if k != "params"}), "params": group["params"]}
                    for group, saved in zip(groups, saved_groups)]
    return param_groups, state
