"""master_on_host inside verl 0.9.1's FSDP engine (seed 000, Step 6): the fp32 master stays on the host
for the whole update; forward/backward compute from bf16 casts of it; HostAdamW steps it in place.

With ``param_offload`` verl keeps every FSDP1 flat parameter on the host between phases and, entering
train mode, loads the fp32 master to the device (``FSDPEngine.to(device, model=True)`` ->
``load_fsdp_model_to_gpu``). This patch changes only that train-mode path, for an FSDP1 engine with
param offload and the ``master_on_host`` patch active:

* ``FSDPEngine.to(<device>, model=True)`` in train mode: everything else is loaded as verl does, but
  instead of loading the masters, :meth:`HostMasters.park_offloaded` adopts the host tensors verl's
  offload left as the masters (no copy) and gives FSDP freed device placeholders.
* ``FSDPEngine.optimizer_step``: verl's own step (clip, finite check, ``optimizer.step()``) runs with
  the masters exposed, so HostAdamW updates them in place on the host; gradients stay on the device.
* ``FSDPEngine.to("cpu", model=True)`` while the masters are parked (the train-mode exit):
  :meth:`HostMasters.release_to_host` puts them back where verl's offload keeps them, and verl's offload
  then has nothing to move.

Eval mode (the old-log-prob pass) and the weight sync (``get_per_tensor_param``) keep verl's load to the
device unchanged. With ``cast_once`` the bf16 copy is cast once per step (a host-to-device transfer
instead of one per micro-batch); without it, every unshard reads the master over PCIe (seed: +18.7 s).
The optimizer must step host-resident parameters in place: ``actor.optim.optimizer=HostAdamW``
(``rlkit.recipes.grpo.GRPORecipe`` refuses anything else).
"""
from __future__ import annotations

from rlkit.patches import Patch, import_target, replace_attrs, supported

VERL_ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"
ATTR = "_rlkit_host_masters"


def host_masters(engine):
    """The :class:`HostMasters` of ``engine`` while it is parked (None otherwise)."""
    masters = getattr(engine, ATTR, None)
    return masters if masters is not None and masters.parked else None


def _wired(engine) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from rlkit.patches.fsdp import master_on_host

    return (master_on_host.PATCH.active() and getattr(engine, "mode", None) == "train"
            and engine.is_param_offload_enabled and isinstance(engine.module, FSDP)
            and not engine.engine_config.forward_only)


def _masters_of(engine):
    from rlkit.patches.fsdp.master_on_host import HostMasters

    masters = getattr(engine, ATTR, None)
    if masters is None:
        masters = HostMasters(engine.module)
        setattr(engine, ATTR, masters)
    return masters


def _apply():
    engine_cls = import_target("master_on_host_verl", VERL_ENGINE_MODULE).FSDPEngine
    original_to = engine_cls.to
    original_step = engine_cls.optimizer_step

    def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True):
        if model and device == "cpu":
            # Decided by the parked state, not engine.mode: verl's train_mini_batch nests train_batch's own
            # train_mode context, whose exit resets engine.mode to None before the outer exit offloads.
            masters = host_masters(self)
            if masters is not None:
                masters.release_to_host()
        elif model and _wired(self):
            # grad=False: verl asserts grad implies model; FSDP1 grads need no move (they live on the device).
            original_to(self, device, model=False, optimizer=optimizer, grad=False)
            _masters_of(self).park_offloaded()
            return None
        return original_to(self, device, model=model, optimizer=optimizer, grad=grad)

    def optimizer_step(self):
        masters = host_masters(self)
        if masters is None:
            return original_step(self)
        with masters.exposed():
            return original_step(self)

    to.__doc__, optimizer_step.__doc__ = original_to.__doc__, original_step.__doc__
    return replace_attrs((engine_cls, "to", to), (engine_cls, "optimizer_step", optimizer_step))


PATCH = Patch(
    name="master_on_host_verl",
    summary="verl FSDPEngine train mode: fp32 masters stay on the host (adopted from param offload), HostAdamW steps them",
    requires=supported("verl", "torch"),
    apply_fn=_apply,
    targets=(VERL_ENGINE_MODULE,),
)
