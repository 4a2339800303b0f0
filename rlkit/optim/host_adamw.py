"""HostAdamW: the AdamW step on the host, one parameter at a time (seed 000, Steps 2, 4 and 5).

With FSDP1 NO_SHARD every rank holds the whole model, and a device AdamW step needs params, grads,
exp_avg and exp_avg_sq co-resident (4 x 16 GB for Qwen3-4B in fp32): it does not fit a 48 GB card.
HostAdamW keeps the fp32 master, exp_avg and exp_avg_sq in host memory. ``step()`` walks the
parameters (with FSDP1 ``use_orig_params=False``: one FlatParameter per FSDP unit) one at a time:

0. ``grad_checks`` (whole model, on the device) every gradient finite; optionally identical across ranks,
1. ``grad_d2h``   gradient -> the host "grad" staging buffer (pinned when CUDA is available),
2. ``host_step``  torch's own functional AdamW on the host master (same kernel as torch.optim.AdamW
                  with the matching flag, so the result is bit-identical by construction; :mod:`rlkit.optim.host_step`),
3. ``param_pack`` master -> the host "param" staging buffer (cast if the device param is not fp32),
4. ``broadcast``  (rank-0 owner only) the updated master from rank 0 to every rank, on the host,
5. ``param_h2d``  staging buffer -> the device parameter.

Host staging is therefore one parameter, never the whole model. Each step above is a named phase of
an optional ``timer`` (:class:`rlkit.measure.samplers.PhaseTimer`), which the update-phase harness uses.

Host-resident parameters: a parameter whose ``.data`` is a host fp32 tensor (a CPU model, or a flat
parameter inside ``rlkit.patches.fsdp.master_on_host.HostMasters.exposed()``, whose gradient stays on the
device) is its own master. It is stepped in place: no master copy, and ``param_pack`` / ``param_h2d``
do nothing (their phases are still entered, so every step reports the same phase names). Its
gradient still comes down through the "grad" staging buffer; with ``rank0_owner`` the parameter
itself is broadcast.

Rank-0 owner (``rank0_owner=True``): with a process group of N ranks whose gradients are identical
(FSDP NO_SHARD all-reduces them), only rank 0 keeps Adam state and steps; the others receive the
updated fp32 master and allocate no Adam state. ``check_identical_grads=True`` asserts the premise
cheaply (one int64 checksum per gradient, all-reduced). Where the broadcast runs (``broadcast_device``):
on the host over gloo (the given group when its backend handles CPU tensors, verl's default group is
``cpu:gloo,cuda:nccl``, else a gloo group over the same ranks), or, by default when the group has an NCCL
backend, over NCCL on the GPU: a device parameter is written on the owner and broadcast in place, a
host-resident parameter goes through a device buffer the size of the largest one. The update-phase
harness measured the host broadcast of Qwen3-4B's 16 GB fp32 master at 4.9 s per step on 2 x H200
(outputs/02_host_adamw/h200), more than the host step itself. Either way every rank receives the owner's
bits.

Per-node owners (``rank0_owner=True, owners="node"``): one owner per node, broadcasting inside its node
(:mod:`rlkit.optim.host_ranks`).

Non-finite gradients: verl skips ``step()`` itself when the grad norm is not finite; with
``skip_nonfinite=True`` (default) HostAdamW also checks every gradient before touching anything and
leaves params, master and state (step counter included) untouched if one is not finite.

Checkpoints: ``state_dict()`` holds torch.optim.AdamW's per-parameter state plus this rank's role, and
``load_state_dict()`` keeps the state on the host and refuses another role's (:mod:`rlkit.optim.host_checkpoint`).

Overlapped copies (``overlap_copies=True``): where every gradient is on a CUDA device, the staging is pinned and
no broadcast follows the step, the copies run on a side CUDA stream beside the host's work, bit-identical to the
serial step (:mod:`rlkit.optim.overlap`; tests/test_host_adamw.py runs the same schedule on the CPU with a stand-in
stream, and on the GPU). Anywhere else the option leaves the serial step.

Gradient prefetch (``prefetch_grads=True``, with the ``grad_prefetch`` patch): each final gradient is copied to a host
buffer of its own as FSDP hands it over in the last micro-batch's backward, and the step multiplies it by the clip
coefficient instead of copying the clipped gradient down, bit-identical to the serial step (:mod:`rlkit.optim.prefetch`;
tests/test_grad_prefetch.py). Where no prefetched gradient applies, the step copies the gradient down as before.

Host threads: the step runs torch's CPU kernels with ``host_threads`` intra-op threads (by default this process's
CPUs shared between the ranks of this host that step; :mod:`rlkit.optim.host_ranks`), bit-identical for any count.

verl: ``actor.optim.optimizer_impl=rlkit.optim actor.optim.optimizer=HostAdamW`` (extra keywords via
``override_optimizer_config``); keep ``optimizer_offload=false`` so verl does not ship the host state
to the device at every ``train_mode`` enter.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist

from rlkit.optim.host_checkpoint import STATE_DICT_KEY, check_role, host_state
from rlkit.optim.host_ranks import (
    _check_owners,
    _default_host_threads,
    _intra_op_threads,
    _node_groups,
    assert_identical,
    resolve_broadcast_device,
)
from rlkit.optim.host_step import adam, check_hyperparameters, is_own_master, master_and_state
from rlkit.optim.overlap import CudaCopies, step_overlapped
from rlkit.optim.prefetch import GradPrefetch
from rlkit.optim.staging import StagingPool


class HostAdamW(torch.optim.Optimizer):
    """AdamW whose master weights and moments live on the host; see the module docstring.

    Same keywords as :class:`torch.optim.AdamW` (``lr, betas, eps, weight_decay, amsgrad, maximize``),
    plus:

    impl: ``"fused"`` (default; torch's fused CPU kernel), ``"foreach"`` or ``"forloop"``; each is
        bit-identical to torch.optim.AdamW with ``fused=True`` / ``foreach=True`` / ``foreach=False``.
    pin_memory: staging buffers pinned (``True``, needs CUDA), pageable (``False``), or pinned exactly
        when CUDA is available (``None``).
    rank0_owner: rank 0 of ``process_group`` alone holds state and steps; the others receive the
        updated master. Needs ``torch.distributed`` initialised.
    owners: with ``rank0_owner``: ``"group"`` (default) one owner, rank 0 of ``process_group``; ``"node"`` one
        owner per node, the lowest rank of the group on that node, broadcasting only inside its node.
    process_group: the ranks that share identical gradients (default: the world).
    skip_nonfinite: check all gradients first and skip the whole step if one is not finite.
    check_identical_grads: debug assertion that every rank holds the same gradients (checksums).
    timer: object with ``phase(name)`` context manager (e.g. rlkit.measure.samplers.PhaseTimer), or None.
    host_threads: intra-op threads for the step: ``None`` (default) the CPUs of this process shared between
        the ranks of this host that step (see the module docstring), ``0`` leave torch's setting, ``n`` n.
    broadcast_device: rank-0 owner only: ``"auto"`` (default) ``"cuda"`` when CUDA is available and the group
        has an NCCL backend, else the host; ``"host"``; or a device (``"cuda"``, ``"cpu"``) to broadcast on
        over ``process_group``, whose backend must handle it.
    overlap_copies: run the gradient and parameter copies on a side CUDA stream beside the host step (see the
        module docstring; bit-identical); ``False`` (default) the serial step.
    prefetch_grads: copy each final gradient to the host during the last backward and clip it there (see the module
        docstring; bit-identical; needs the ``grad_prefetch`` patch); ``False`` (default) copy it down in the step.
    copy_streams: the streams the overlapped copies and the prefetch run on: ``None`` (default) CUDA's
        (:class:`rlkit.optim.overlap.CudaCopies`); tests pass :class:`rlkit.optim.overlap.HostCopies` to run the
        overlapped schedule on the CPU.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
        impl: str = "fused",
        pin_memory: bool | None = None,
        rank0_owner: bool = False,
        process_group=None,
        skip_nonfinite: bool = True,
        check_identical_grads: bool = False,
        timer=None,
        host_threads: int | None = None,
        broadcast_device: str = "auto",
        overlap_copies: bool = False,
        owners: str = "group",
        copy_streams=None,
        prefetch_grads: bool = False,
    ) -> None:
        check_hyperparameters(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, impl=impl)
        _check_owners(owners, rank0_owner)
        if host_threads is not None and (isinstance(host_threads, bool) or not isinstance(host_threads, int)
                                         or host_threads < 0):
            raise ValueError(f"HostAdamW host_threads={host_threads!r}: expected None (automatic), 0 (keep "
                             "torch's setting) or a positive int. Fix: pass one of those.")
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad,
                        "maximize": maximize}
        super().__init__(params, defaults)
        self.impl = impl
        self.staging = StagingPool(pin_memory)
        self.skip_nonfinite = skip_nonfinite
        self.check_identical_grads = check_identical_grads
        self.timer = timer
        self.rank0_owner = rank0_owner
        self.owners = owners
        self.last_step_skipped = False
        self._masters: dict[torch.Tensor, torch.Tensor] = {}  # host fp32 masters of fp32 device params
        self._group, self._comm_group, self._owner = None, None, 0
        # Where the owner's broadcast runs (the whole group, or this node's part of it with owners="node").
        self._owner_group, self._owner_host_group, self._nodes = None, None, None
        self._is_owner = True
        if rank0_owner or check_identical_grads:
            self._setup_group(process_group, required=rank0_owner)
        self._broadcast_device = resolve_broadcast_device(broadcast_device, self._owner_group) if rank0_owner else None
        # Host-resident params cross to the other ranks through this device buffer (emptied after each step).
        self._device_staging = (StagingPool(device=self._broadcast_device)
                                if self._broadcast_device is not None else None)
        self.host_threads = _default_host_threads(rank0_owner) if host_threads is None else host_threads
        self.overlap_copies = bool(overlap_copies)
        self.last_step_overlapped = False  # whether the last step ran its copies beside the host step
        self._copies = CudaCopies() if copy_streams is None else copy_streams  # overlap_copies' streams
        self.prefetch_grads = bool(prefetch_grads)
        self.last_step_prefetched = 0  # gradients the last step took from the prefetched host copies
        self._prefetch = (GradPrefetch([p for g in self.param_groups for p in g["params"]], self.staging, self._copies)
                          if self.prefetch_grads and self._is_owner else None)

    # ------------------------------------------------------------------ process group
    def _setup_group(self, process_group, *, required: bool) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            if required:
                raise ValueError("HostAdamW(rank0_owner=True) needs torch.distributed initialised. Fix: call "
                                 "torch.distributed.init_process_group first, or pass rank0_owner=False.")
            return  # a single process: there is nothing to compare gradients with
        group = process_group if process_group is not None else dist.group.WORLD
        self._group = group
        backend = str(dist.get_backend(group))
        # Host tensors go over gloo: reuse the group if it has a CPU backend, else make a gloo twin.
        self._comm_group = group if "gloo" in backend else dist.new_group(
            ranks=dist.get_process_group_ranks(group), backend="gloo")
        self._owner = dist.get_global_rank(group, 0)
        self._owner_group, self._owner_host_group = group, self._comm_group
        if self.rank0_owner and self.owners == "node":
            self._owner_group, self._owner_host_group, self._nodes = _node_groups(group, self._comm_group)
            self._owner = min(dist.get_process_group_ranks(self._owner_group))
        if self.rank0_owner:
            self._is_owner = dist.get_rank() == self._owner

    @property
    def is_owner(self) -> bool:
        """True where Adam state lives: every rank without rank0_owner, rank 0 of the group with it."""
        return self._is_owner

    def _phase(self, name: str):
        return self.timer.phase(name) if self.timer is not None else nullcontext()

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = [(group, p) for group in self.param_groups for p in group["params"] if p.grad is not None]
        with self._phase("grad_checks"):
            if self.check_identical_grads and self._comm_group is not None:
                assert_identical([p.grad for _, p in work], self._comm_group)
            finite = self._grads_finite(work) if self.skip_nonfinite else True
        if not finite:
            self.last_step_skipped = True
            self._discard_prefetch()
            return loss
        self.last_step_skipped, self.last_step_prefetched = False, 0
        self.last_step_overlapped = self._can_overlap(work)
        self._reserve_staging(work, buffers=2 if self.last_step_overlapped else 1)
        with _intra_op_threads(self.host_threads):
            if self.last_step_overlapped:
                step_overlapped(self, work, self._copies)
            else:
                for group, p in work:
                    self._step_one(group, p)
        self._discard_prefetch()
        if self._device_staging is not None:
            self._device_staging.release()  # device memory only during the step, not through the next forward
        return loss

    def _step_one(self, group: dict[str, Any], p: torch.Tensor) -> None:
        in_place = is_own_master(p)
        # What rank 0 broadcasts: the updated parameter itself, or its packed copy.
        out = p.data if in_place else self.staging.view("param", p.numel(), p.dtype).view(p.shape)
        if self._is_owner:
            with self._phase("grad_d2h"):
                grad = self.prefetched_grad(p)
                if grad is None:
                    grad = self.staging.view("grad", p.numel(), torch.float32).view(p.shape)
                    grad.copy_(p.grad)
            master, _ = self._host_step(group, p, grad)
            with self._phase("param_pack"):
                if not in_place:
                    out.copy_(master)
        if self._broadcast_device is not None:
            self._broadcast_on_device(p, out, in_place)
            return
        if self.rank0_owner:
            with self._phase("broadcast"):
                dist.broadcast(out, src=self._owner, group=self._owner_host_group)
        with self._phase("param_h2d"):
            if not in_place:
                p.copy_(out)

    def prefetched_grad(self, p: torch.Tensor) -> torch.Tensor | None:
        """``p``'s clipped gradient from its prefetched host copy (:mod:`rlkit.optim.prefetch`), or None: copy it down."""
        grad = self._prefetch.take(p) if self._prefetch is not None else None
        self.last_step_prefetched += grad is not None
        return grad

    def _discard_prefetch(self) -> None:
        if self._prefetch is not None:
            self._prefetch.discard()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._discard_prefetch()  # copies of these gradients belong to no step now
        super().zero_grad(set_to_none)

    def _host_step(self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """AdamW on ``p``'s host master with ``grad`` (host fp32); (the master, whether it is ``p`` itself)."""
        in_place = is_own_master(p)
        with self._phase("host_step"):
            master, state = master_and_state(self.state[p], self._masters, p, group, in_place)
            adam(self.impl, group, master, grad, state)
        return master, in_place

    def _can_overlap(self, work) -> bool:
        return (self.overlap_copies and bool(work) and not self.rank0_owner
                and self._copies.usable(work, self.staging))

    def _broadcast_on_device(self, p: torch.Tensor, out: torch.Tensor, in_place: bool) -> None:
        """Rank-0 owner over the device backend: every rank ends with the owner's bits in ``p``."""
        if not in_place and p.device == self._broadcast_device:
            with self._phase("param_h2d"):
                if self._is_owner:
                    p.copy_(out)
            with self._phase("broadcast"):
                dist.broadcast(p.data, src=self._owner, group=self._owner_group)
            return
        # A host-resident parameter (or one on another device): through the device buffer.
        with self._phase("broadcast"):
            buffer = self._device_staging.view("broadcast", p.numel(), p.dtype).view(p.shape)
            source = p.data if in_place else out
            if self._is_owner:
                buffer.copy_(source)
            dist.broadcast(buffer, src=self._owner, group=self._owner_group)
            if not self._is_owner:
                (p.data if in_place else p).copy_(buffer)
        with self._phase("param_h2d"):
            if not in_place and self._is_owner:
                p.copy_(out)

    def _reserve_staging(self, work, buffers: int = 1) -> None:
        """Size each staging buffer once, to the largest parameter of this step (``buffers`` 2: two per direction,
        tagged ``grad0``/``grad1`` and ``param0``/``param1``, for the overlapped step)."""
        if not work:
            return
        tags = [""] if buffers == 1 else [str(i) for i in range(buffers)]
        packed = [p.numel() * p.element_size() for _, p in work if not is_own_master(p)]
        for tag in tags:
            if packed:
                self.staging.reserve("param" + tag, max(packed))
            if self._is_owner:
                self.staging.reserve("grad" + tag, max(p.numel() * 4 for _, p in work))

    def _grads_finite(self, work) -> bool:
        flags = [torch.isfinite(p.grad).all() for _, p in work]
        finite = torch.stack(flags).all().to("cpu", torch.int32) if flags else torch.ones((), dtype=torch.int32)
        if self.rank0_owner:  # the owner decides; every rank it broadcasts to must take the same branch
            dist.broadcast(finite, src=self._owner, group=self._owner_host_group)
        return bool(finite.item())

    # ------------------------------------------------------------------ accounting
    def adam_state_bytes(self) -> int:
        """Bytes of Adam moments (exp_avg, exp_avg_sq, max_exp_avg_sq, step) held by this rank."""
        return sum(t.numel() * t.element_size() for s in self.state.values()
                   for k, t in s.items() if k != "master" and torch.is_tensor(t))

    def adam_state_params(self) -> int:
        """Parameters with Adam state on this rank."""
        return sum(1 for s in self.state.values() if "exp_avg" in s)

    def master_bytes(self) -> int:
        """Bytes of host fp32 masters this optimizer allocated (a host-resident parameter is its own, not counted)."""
        saved = sum(s["master"].numel() * 4 for s in self.state.values() if "master" in s)
        return saved + sum(m.numel() * 4 for m in self._masters.values())

    def memory_report(self) -> dict[str, Any]:
        return {
            "adam_state_bytes": self.adam_state_bytes(),
            "adam_state_params": self.adam_state_params(),
            "master_bytes": self.master_bytes(),
            "staging_bytes": self.staging.nbytes(),
            "staging_pinned": self.staging.pinned,
            "staging_allocations": self.staging.allocations,
            "is_owner": self.is_owner,
            "host_threads": self.host_threads,
        }

    def options(self) -> dict[str, Any]:
        """The options this optimizer was built with beyond the param groups' hyper-parameters (those travel in
        ``state_dict``); a verl checkpoint records them (``rlkit.patches.guards.checkpoint_fingerprint``)."""
        return {
            "impl": self.impl,
            "rank0_owner": self.rank0_owner,
            "skip_nonfinite": self.skip_nonfinite,
            "check_identical_grads": self.check_identical_grads,
            "pin_memory": self.staging.pinned,
            "broadcast_device": str(self._broadcast_device) if self._broadcast_device is not None else "host",
            "host_threads": self.host_threads,
            "overlap_copies": self.overlap_copies,
            "prefetch_grads": self.prefetch_grads,
            "group_size": dist.get_world_size(self._group) if self._group is not None else 1,
            "owners": self.owners,
            "nodes": self._nodes,  # nodes with an owner (owners="node"); None otherwise
        }

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """torch's state_dict plus ``"host_adamw"``: whether this rank holds Adam state (``rank0_owner``), so that
        :meth:`load_state_dict` refuses another rank's layout (torch's ``load_state_dict`` ignores the key)."""
        state_dict = super().state_dict()
        state_dict[STATE_DICT_KEY] = {"rank0_owner": self.rank0_owner, "is_owner": self.is_owner}
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Like torch's, but state tensors stay on the host (fp32) instead of moving to the params' device; a state
        dict saved on a rank with the other role is refused (:func:`rlkit.optim.host_checkpoint.check_role`)."""
        check_role(state_dict.get(STATE_DICT_KEY), is_owner=self.is_owner, rank0_owner=self.rank0_owner)
        self.param_groups, self.state = host_state(self.param_groups, state_dict)
        self._masters.clear()  # fp32 masters are rebuilt from the restored parameters at the next step
