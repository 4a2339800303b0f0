"""Cast the bf16 compute copy of each FSDP1 flat parameter once per optimizer step.

Unpatched FSDP1 ``NO_SHARD`` + ``MixedPrecision(param_dtype=bf16)`` rebuilds the bf16 copy
(``_mp_shard``) from the fp32 master (``_local_shard``) in every pre-forward and every pre-backward
unshard, and frees it at every reshard: ``2 x micro-batches`` casts per flat parameter per step.
With the master on the device those casts are cheap device-to-device copies; with the master on
the host (``master_on_host``) each one is a host-to-device transfer of the fp32 bytes.

This patch keeps the copy resident instead:

* ``FlatParamHandle.pre_unshard``: a handle whose resident copy is valid switches to it without
  casting; otherwise FSDP's own cast runs and, when the forward records autograd (a training
  micro-batch), the copy is marked resident. No-grad forwards (log-prob, reference policy) reuse a
  valid copy but never create one, so their memory behaviour is unchanged.
* ``FlatParamHandle.post_reshard``: a resident copy is not freed.
* Invalidation (free the copy; the next unshard re-casts from the current master) happens after
  **every** ``torch.optim.Optimizer.step`` (a global step post-hook), when the master is no longer
  the tensor the copy was cast from (moved, e.g. by verl's offload/reload, or parked/unparked), when
  FSDP forces full precision (``summon_full_params``/state-dict load may write the master), and on
  :func:`invalidate`. Anything else that writes the fp32 master in place must call :func:`invalidate`.

Only the bf16 *compute copy* changes lifetime: the flat parameter stays fp32, gradients are cast to
fp32 and accumulated in fp32 exactly as unpatched, so loss and gradients are bit-identical to the
unpatched run. Handles that are sharded, CPU-offloaded, ``use_orig_params=True`` or not using
parameter mixed precision are left untouched.
"""
from __future__ import annotations

import weakref

from rlkit.patches import Patch, replace_attrs, supported

RESIDENT = "_rlkit_resident_bf16"  # handle attribute: True while _mp_shard holds a valid cast of the master
SOURCE = "_rlkit_resident_source"  # handle attribute: (device, data_ptr) of the master the copy was cast from

# Handles holding a resident copy, so that invalidation can find them without a module reference.
_resident_handles: weakref.WeakSet = weakref.WeakSet()


def eligible(handle) -> bool:
    """Handles cast-once and master-on-host apply to: NO_SHARD, bf16 param mixed precision, no CPU offload, flat views."""
    return (
        not handle.uses_sharded_strategy
        and handle._uses_param_mixed_precision
        and not handle._offload_params
        and not handle._use_orig_params
    )


def is_resident(handle) -> bool:
    return bool(getattr(handle, RESIDENT, False))


def _master_identity(handle) -> tuple:
    master = handle.flat_param._local_shard
    return (str(master.device), master.untyped_storage().data_ptr())


def _invalidate_handle(handle) -> None:
    if not is_resident(handle):
        return
    flat_param = handle.flat_param
    mp_storage = flat_param._mp_shard.untyped_storage()
    if mp_storage.size() > 0 and flat_param.untyped_storage().data_ptr() == mp_storage.data_ptr():
        raise RuntimeError(
            "cast_once: cannot invalidate the bf16 copy of a flat parameter while forward/backward is "
            "using it; call invalidate() after backward (e.g. after the optimizer step)"
        )
    setattr(handle, RESIDENT, False)
    _resident_handles.discard(handle)
    handle._free_low_precision_sharded_param()  # FSDP's own free: record_stream + release the storage


def invalidate(module=None) -> int:
    """Drop resident bf16 copies (all of them, or those of ``module``'s FSDP handles); returns how many."""
    if module is None:
        handles = list(_resident_handles)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        handles = [m._handle for m in FSDP.fsdp_modules(module) if m._handle is not None]
    dropped = 0
    for handle in handles:
        if is_resident(handle):
            _invalidate_handle(handle)
            dropped += 1
    return dropped


def resident_vs_master_max_abs_diff(module, chunk_numel: int = 1 << 26) -> float | None:
    """max |resident bf16 copy - bf16 cast of the current fp32 master| over ``module``'s handles.

    ``None`` when no handle holds a resident copy. The fresh cast reads the master wherever it lives
    (device, or host when ``master_on_host`` parked it), in chunks so the check adds little memory.
    """
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    worst = None
    with torch.no_grad():
        for fsdp_module in FSDP.fsdp_modules(module):
            handle = fsdp_module._handle
            if handle is None or not is_resident(handle):
                continue
            resident = handle.flat_param._mp_shard
            master = handle.flat_param._local_shard
            diff = 0.0
            for start in range(0, master.numel(), chunk_numel):
                stop = min(start + chunk_numel, master.numel())
                fresh = master[start:stop].to(handle.device).to(resident.dtype)
                diff = max(diff, (resident[start:stop].float() - fresh.float()).abs().max().item())
            worst = diff if worst is None else max(worst, diff)
    return worst


def _apply():
    import torch
    from torch.distributed.fsdp._flat_param import FlatParamHandle
    from torch.optim.optimizer import register_optimizer_step_post_hook

    original_pre_unshard = FlatParamHandle.pre_unshard
    original_post_reshard = FlatParamHandle.post_reshard

    def pre_unshard(self):
        if not eligible(self):
            return original_pre_unshard(self)
        if self._force_full_precision:
            # summon_full_params / state-dict load expose the fp32 master and may write it.
            _invalidate_handle(self)
            return original_pre_unshard(self)
        if is_resident(self) and getattr(self, SOURCE, None) != _master_identity(self):
            _invalidate_handle(self)  # the master moved since the cast
        if is_resident(self):
            # The state FSDP's cast leaves behind, without the cast.
            self._check_low_precision_shard()
            self.flat_param.data = self.flat_param._mp_shard
            self._check_on_compute_device(self.flat_param)
            return True
        ran = original_pre_unshard(self)
        if torch.is_grad_enabled():
            setattr(self, RESIDENT, True)
            setattr(self, SOURCE, _master_identity(self))
            _resident_handles.add(self)
        return ran

    def post_reshard(self):
        if eligible(self) and is_resident(self) and not self._force_full_precision:
            return  # keep the resident copy until the optimizer step invalidates it
        return original_post_reshard(self)

    restore = replace_attrs((FlatParamHandle, "pre_unshard", pre_unshard), (FlatParamHandle, "post_reshard", post_reshard))
    hook = register_optimizer_step_post_hook(lambda optimizer, args, kwargs: invalidate())

    def undo() -> None:
        hook.remove()
        in_use = 0
        for handle in list(_resident_handles):
            try:
                _invalidate_handle(handle)
            except RuntimeError:  # a forward that failed midway (an OOM) still holds it: forget it, FSDP frees it
                setattr(handle, RESIDENT, False)
                _resident_handles.discard(handle)
                in_use += 1
        restore()
        if in_use:
            raise RuntimeError(f"cast_once was reverted while forward/backward is using it: {in_use} bf16 copies of a "
                               "forward/backward that did not finish (FSDP is restored; do not step that model again)")

    return undo


PATCH = Patch(
    name="cast_once",
    summary="FSDP1 NO_SHARD bf16 compute copy cast once per optimizer step, resident across micro-batches",
    requires=supported("torch"),
    apply_fn=_apply,
    targets=("torch.distributed.fsdp._flat_param", "torch.optim.optimizer"),
)
