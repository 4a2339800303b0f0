"""Re-point FSDP1's per-parameter views after ``FlatParamHandle.flat_param_to`` (NO_SHARD, use_orig_params=False).

``FlatParamHandle.flat_param_to`` replaces ``flat_param.data`` with a copy on the target device but
refreshes the module's per-parameter views only when ``use_orig_params=True``. With
``use_orig_params=False`` and NO_SHARD the module attributes (``Tensor`` views set by the handle's
constructor) keep pointing at the old storage, so it stays alive: verl's ``offload_fsdp_model_to_cpu``
frees nothing, and ``load_fsdp_model_to_gpu`` then allocates a second device copy.

The patch wraps the method itself rather than verl's offload functions: verl imports those by name
into its engine modules, but every one of them ends in ``handle.flat_param_to``, so this catches all
callers (and FSDP's own CPUOffload move at construction). Sharded strategies (their views point into
the padded unsharded buffer, rebuilt at the next unshard) and ``use_orig_params=True`` (already
refreshed by PyTorch) keep their behaviour; so does any call made while the handle is inside
forward/backward/summon_full_params, where FSDP manages the views itself.
"""
from __future__ import annotations

import functools

from rlkit.patches import Patch, replace_attr, supported


def needs_view_refresh(handle) -> bool:
    """Whether ``flat_param_to`` leaves this handle's module views on the old storage."""
    from torch.distributed.fsdp._flat_param import HandleTrainingState

    return (
        not handle._use_orig_params
        and not handle.uses_sharded_strategy
        and handle._training_state == HandleTrainingState.IDLE
    )


def _apply():
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    original = FlatParamHandle.flat_param_to

    @functools.wraps(original)
    def flat_param_to(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if needs_view_refresh(self):
            # Same call the handle's constructor makes: module attributes become Tensor views into
            # the (moved) flat parameter, releasing the old storage.
            self._use_unsharded_views(as_params=False)

    flat_param_to.__rlkit_patch__ = "offload_views"
    return replace_attr(FlatParamHandle, "flat_param_to", flat_param_to)


PATCH = Patch(
    name="offload_views",
    summary="FSDP1 NO_SHARD + use_orig_params=False: re-point module views after flat_param_to so offload frees memory",
    requires=supported("torch"),
    apply_fn=_apply,
    targets=("torch.distributed.fsdp._flat_param",),
)

apply = PATCH.apply
revert = PATCH.revert
active = PATCH.active
