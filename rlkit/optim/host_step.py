"""HostAdamW's arithmetic for one parameter: its host fp32 master and Adam state, and the AdamW step on them.

The step is torch's own functional AdamW (``torch.optim.adam.adam`` with ``decoupled_weight_decay=True``), the kernel
torch.optim.AdamW runs: ``impl`` ``"fused"``, ``"foreach"`` or ``"forloop"`` is bit-identical to torch.optim.AdamW with
``fused=True`` / ``foreach=True`` / ``foreach=False``. The master of an fp32 device parameter is kept beside the state
(``masters``, rebuilt from the parameter after a restore), that of any other dtype in the state (``state["master"]``,
which a checkpoint saves); a host fp32 parameter is its own master (:func:`is_own_master`). Where the gradient comes
from and where the result goes: :mod:`rlkit.optim.host_adamw`.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch
from torch.optim.adam import adam as _adam_functional

IMPLS = ("fused", "foreach", "forloop")

if "decoupled_weight_decay" not in inspect.signature(_adam_functional).parameters:  # torch < 2.7
    raise ImportError("rlkit.optim.HostAdamW needs torch.optim.adam.adam(decoupled_weight_decay=...) "
                      f"(torch >= 2.7); this torch is {torch.__version__}. Fix: install torch>=2.11,<2.15.")


def is_own_master(p: torch.Tensor) -> bool:
    """A host fp32 parameter: its storage already is the fp32 master HostAdamW would keep."""
    return p.device.type == "cpu" and p.dtype == torch.float32


def check_hyperparameters(*, lr, betas, eps, weight_decay, impl) -> None:
    if impl not in IMPLS:
        raise ValueError(f"HostAdamW impl={impl!r} is not one of {list(IMPLS)}. Fix: pick one (default 'fused').")
    if not isinstance(lr, (int, float)) or lr < 0:
        raise ValueError(f"HostAdamW lr={lr!r}: expected a float >= 0. Fix: pass a non-negative float lr.")
    if not 0.0 <= eps:
        raise ValueError(f"HostAdamW eps={eps!r}: expected >= 0.")
    if len(tuple(betas)) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"HostAdamW betas={betas!r}: expected two floats in [0, 1).")
    if weight_decay < 0:
        raise ValueError(f"HostAdamW weight_decay={weight_decay!r}: expected >= 0.")


def master_and_state(state: dict[str, Any], masters: dict[torch.Tensor, torch.Tensor], p: torch.Tensor,
                     group: dict[str, Any], in_place: bool):
    """``p``'s host fp32 master and its Adam ``state`` (the optimizer's entry for ``p``), each made at first use;
    ``masters`` holds the masters of fp32 device parameters; ``in_place``: ``p`` is its own master."""
    fp32_param = p.dtype == torch.float32
    if in_place:
        master = p.data
        masters.pop(p, None)  # built while p was on the device (e.g. unparked): stale now
    else:
        master = masters.get(p) if fp32_param else state.get("master")
    if master is None:
        master = torch.empty(p.shape, dtype=torch.float32, device="cpu")
        master.copy_(p)
        if fp32_param:
            masters[p] = master
        else:
            state["master"] = master
    if "step" not in state:
        state["step"] = torch.tensor(0.0, dtype=torch.float32)
        state["exp_avg"] = torch.zeros_like(master)
        state["exp_avg_sq"] = torch.zeros_like(master)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = torch.zeros_like(master)
    return master, state


def adam(impl: str, group: dict[str, Any], master: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]) -> None:
    """torch's own functional AdamW on one host master (the kernel torch.optim.AdamW runs, see the docstring)."""
    beta1, beta2 = group["betas"]
    _adam_functional(
        [master], [grad], [state["exp_avg"]], [state["exp_avg_sq"]],
        [state["max_exp_avg_sq"]] if group["amsgrad"] else [], [state["step"]],
        foreach=impl == "foreach", fused=impl == "fused",
        capturable=False, differentiable=False, has_complex=False, decoupled_weight_decay=True,
        amsgrad=group["amsgrad"], beta1=beta1, beta2=beta2, lr=group["lr"],
        weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
    )
