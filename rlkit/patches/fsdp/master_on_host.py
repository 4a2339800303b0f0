"""Keep the fp32 master of FSDP1 flat parameters on the host during forward/backward.

With ``NO_SHARD`` + ``MixedPrecision(param_dtype=bf16)`` the compute runs on the bf16 copy; the fp32
flat parameter (``_local_shard``) is only the source of that copy and the target of the optimizer
step, yet it occupies 4 bytes/parameter of device memory for the whole step. :class:`HostMasters`
parks it on the host:

* ``park()`` copies each flat parameter's fp32 master into a (pinned, when CUDA is available) host
  tensor, makes that tensor FSDP's ``_local_shard`` and frees the device storage. FSDP's own cast
  (``_mp_shard.copy_(_local_shard.to(device))``) then reads the master from the host.
* While parked, the flat parameter's ``.data`` is a *device* fp32 placeholder with freed storage
  (the patch makes FSDP's reshard point there instead of at the host tensor), so every FSDP code path
  sees the same device and dtype as unpatched: gradients land on the device in bf16, are cast to
  fp32 and accumulated in fp32 exactly as in the unpatched run.
* The optimizer step updates the host master: ``with masters.exposed(): optimizer.step()`` makes each
  flat parameter's ``.data`` the host master for the step (grads stay on the device), for a host
  optimizer that updates ``param.data`` in place (HostAdamW's contract, see ``exposed``). For a device
  optimizer use ``unpark()`` -> ``step()`` -> ``park()`` instead.
* ``unpark()`` restores the fp32 master on the device (needed before ``state_dict``,
  ``summon_full_params`` or a device optimizer, which read the flat parameter's device data).

The patch itself only redirects ``FlatParamHandle._use_sharded_flat_param`` for parked handles;
handles that are not parked behave exactly as unpatched. A parked model has no fp32 device data to
move: ``unpark()`` before verl's offload/reload (``flat_param_to``) or a checkpoint.
"""
from __future__ import annotations

from contextlib import contextmanager

from rlkit.patches import Patch, PatchError, replace_attr, supported
from rlkit.patches.fsdp.cast_once import eligible

PLACEHOLDER = "_rlkit_device_placeholder"  # handle attribute: the freed device fp32 tensor while parked


def is_parked(handle) -> bool:
    return getattr(handle, PLACEHOLDER, None) is not None


def _apply():
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    original_use_sharded = FlatParamHandle._use_sharded_flat_param

    def _use_sharded_flat_param(self):
        original_use_sharded(self)
        placeholder = getattr(self, PLACEHOLDER, None)
        if placeholder is not None:
            self.flat_param.data = placeholder

    return replace_attr(FlatParamHandle, "_use_sharded_flat_param", _use_sharded_flat_param)


PATCH = Patch(
    name="master_on_host",
    summary="FSDP1 NO_SHARD fp32 master parked in (pinned) host memory during forward/backward",
    requires=supported("torch"),
    apply_fn=_apply,
    targets=("torch.distributed.fsdp._flat_param",),
)


def fsdp_handles(module) -> list:
    """The FlatParamHandles of every FSDP instance in ``module`` (lazily initialised first)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._runtime_utils import _lazy_init

    fsdp_modules = FSDP.fsdp_modules(module)  # pre-order: the first one is the root
    if fsdp_modules:
        _lazy_init(fsdp_modules[0], fsdp_modules[0])  # creates _local_shard/_mp_shard, as FSDP's first forward does
    return [m._handle for m in fsdp_modules if m._handle is not None]


class HostMasters:
    """The host-resident fp32 masters of one FSDP1 model's flat parameters.

    ``pin`` defaults to ``torch.cuda.is_available()``: pinned memory lets the cast's host-to-device
    copy DMA straight from the master (seed Step 4). The host tensors are allocated once and reused
    across park/unpark cycles.
    """

    def __init__(self, module, *, pin: bool | None = None) -> None:
        import torch

        if not PATCH.active():
            raise PatchError("HostMasters needs the master_on_host patch: rlkit.patches.apply(['master_on_host'])")
        self.handles = fsdp_handles(module)
        bad = [h for h in self.handles if not eligible(h)]
        if not self.handles or bad:
            raise PatchError(
                "master_on_host supports FSDP1 NO_SHARD with MixedPrecision(param_dtype=...), "
                "use_orig_params=False and no CPU offload; "
                f"{len(bad)} of {len(self.handles)} flat parameters do not qualify"
            )
        self.pin = torch.cuda.is_available() if pin is None else pin
        self._host: dict[int, torch.Tensor] = {}

    def host_master(self, handle):
        """The host fp32 tensor holding ``handle``'s master (valid while parked)."""
        return self._host[id(handle)]

    @property
    def parked(self) -> bool:
        return all(is_parked(h) for h in self.handles)

    def park(self) -> None:
        """Move every fp32 master to the host and free its device storage (handles must be idle)."""
        import torch
        from torch.distributed.utils import _free_storage

        for handle in self.handles:
            if is_parked(handle):
                continue
            _check_idle(handle)
            flat_param = handle.flat_param
            device_master = flat_param._local_shard
            host = self._host.get(id(handle))
            if host is None:
                host = torch.empty(device_master.shape, dtype=device_master.dtype, device="cpu", pin_memory=self.pin)
                self._host[id(handle)] = host
            host.copy_(device_master)  # synchronous: the device storage is freed right after
            setattr(handle, PLACEHOLDER, device_master)
            flat_param._local_shard = host
            flat_param.data = device_master
            _free_storage(device_master)

    def unpark(self) -> None:
        """Bring every fp32 master back to the device (the unpatched layout)."""
        from torch.distributed.utils import _alloc_storage

        for handle in self.handles:
            if not is_parked(handle):
                continue
            _check_idle(handle)
            flat_param = handle.flat_param
            device_master = getattr(handle, PLACEHOLDER)
            _alloc_storage(device_master, device_master.size())
            device_master.copy_(self._host[id(handle)])
            setattr(handle, PLACEHOLDER, None)
            flat_param._local_shard = device_master
            flat_param.data = device_master

    def park_offloaded(self) -> None:
        """Park masters that already live on the host (verl's param offload between phases): adopt each
        flat parameter's host fp32 tensor as its master and give FSDP a freed device placeholder. Nothing
        is copied: the fp32 master never goes to the device, only FSDP's casts read it from the host."""
        import torch
        from torch.distributed.utils import _free_storage

        for handle in self.handles:
            if is_parked(handle):
                continue
            _check_idle(handle)
            flat_param = handle.flat_param
            host = flat_param.data
            if host.device.type != "cpu":
                raise RuntimeError("park_offloaded needs the flat parameters on the host (param offload); "
                                   f"found one on {host.device}: use park() for a model on the device")
            placeholder = torch.empty(host.shape, dtype=host.dtype, device=handle.device)
            _free_storage(placeholder)
            self._host[id(handle)] = host
            setattr(handle, PLACEHOLDER, placeholder)
            flat_param._local_shard = host
            flat_param.data = placeholder

    def release_to_host(self) -> None:
        """Leave the parked state with every master on the host, the layout verl's param offload leaves
        (``data`` and ``_local_shard`` both the host tensor); its offload then has nothing to move."""
        for handle in self.handles:
            if not is_parked(handle):
                continue
            _check_idle(handle)
            host = self._host.pop(id(handle))
            setattr(handle, PLACEHOLDER, None)
            handle.flat_param._local_shard = host
            handle.flat_param.data = host

    def masters(self) -> list:
        """The tensor holding each flat parameter's fp32 value now: the host master while parked."""
        return [self._host[id(h)] if is_parked(h) else h.flat_param for h in self.handles]

    def step(self, optimizer) -> None:
        """``optimizer.step()`` with the masters exposed (a host optimizer updates them in place)."""
        with self.exposed():
            optimizer.step()

    @contextmanager
    def exposed(self):
        """For a host optimizer step: each flat parameter's ``.data`` is its host fp32 master.

        Contract for the optimizer: ``param.data`` (pinned host fp32) is the master, updated in place;
        ``param.grad`` stays on the device (fp32). After the block the placeholders are restored, and
        the next cast reads the updated master.
        """
        for handle in self.handles:
            if not is_parked(handle):
                raise RuntimeError("HostMasters.exposed() needs parked masters; call park() first")
            _check_idle(handle)
            handle.flat_param.data = self._host[id(handle)]
        try:
            yield [h.flat_param for h in self.handles]
        finally:
            for handle in self.handles:
                handle.flat_param.data = getattr(handle, PLACEHOLDER)

    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._host.values())


def _check_idle(handle) -> None:
    from torch.distributed.fsdp._flat_param import HandleTrainingState

    if handle._training_state != HandleTrainingState.IDLE:
        raise RuntimeError(
            f"master_on_host: flat parameter is in state {handle._training_state.name}; park/unpark/expose "
            "only between steps (after backward, outside forward)"
        )
