"""HostAdamW: the AdamW step on the host, one parameter at a time (seed 000, Steps 2, 4 and 5).

With FSDP1 NO_SHARD every rank holds the whole model, and a device AdamW step needs params, grads,
exp_avg and exp_avg_sq co-resident (4 x 16 GB for Qwen3-4B in fp32): it does not fit a 48 GB card.
HostAdamW keeps the fp32 master, exp_avg and exp_avg_sq in host memory. ``step()`` walks the
parameters (with FSDP1 ``use_orig_params=False``: one FlatParameter per FSDP unit) one at a time:

0. ``grad_checks`` (whole model, on the device) every gradient finite; optionally identical across ranks,
1. ``grad_d2h``   gradient -> the host "grad" staging buffer (pinned when CUDA is available),
2. ``host_step``  torch's own functional AdamW on the host master (same kernel as torch.optim.AdamW
                  with the matching flag, so the result is bit-identical by construction),
3. ``param_pack`` master -> the host "param" staging buffer (cast if the device param is not fp32),
4. ``broadcast``  (rank-0 owner only) the updated master from rank 0 to every rank, on the host,
5. ``param_h2d``  staging buffer -> the device parameter.

Host staging is therefore one parameter, never the whole model. Each step above is a named phase of
an optional ``timer`` (:class:`rlkit.measure.PhaseTimer`), which the update-phase harness uses.

Host-resident parameters: a parameter whose ``.data`` is a host fp32 tensor (a CPU model, or a flat
parameter inside ``rlkit.patches.master_on_host.HostMasters.exposed()``, whose gradient stays on the
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

Per-node owners (``rank0_owner=True, owners="node"``): on several nodes one owner would send the whole fp32
master over the network every step. After FSDP's all-reduce every node holds the same gradients, so the lowest
rank of each node (its local rank 0) runs the same AdamW on the same inputs and gets the same bits; its broadcast
stays inside the node. The ranks are grouped by :func:`node_id` (gathered once, at construction; every rank of the
world must build its HostAdamW, as verl does, because each node's group is created on every rank). Owners hold
identical Adam state; each rank's checkpoint file says whether it holds some (docs/multinode.md).

Non-finite gradients: verl skips ``step()`` itself when the grad norm is not finite; with
``skip_nonfinite=True`` (default) HostAdamW also checks every gradient before touching anything and
leaves params, master and state (step counter included) untouched if one is not finite.

Checkpoints: ``state_dict()`` holds ``step``, ``exp_avg``, ``exp_avg_sq`` per parameter exactly as
torch.optim.AdamW does, plus this rank's role (``"host_adamw"``: with ``rank0_owner`` the other ranks' state
dicts are empty, and ``load_state_dict()`` refuses one saved on a rank with the other role); ``load_state_dict()``
keeps that state on the host (the base class would move it to the parameters' device). The fp32 master of
an fp32 parameter equals the parameter after every step, so it is not saved; it is rebuilt from the (restored)
parameter at the next step. The master of a non-fp32 parameter is not recoverable from it and is saved as
``state["master"]``. A host-resident parameter is its own master: restoring the parameter restores it. Through
verl's checkpoint manager (each rank saves and loads its own ``optimizer.state_dict()``):
``rlkit.patches.checkpoint_fingerprint`` and tests/test_checkpoint_resume.py.

Overlapped copies (``overlap_copies=True``): where every gradient is on a CUDA device, the staging is pinned and
no broadcast follows the step (no ``rank0_owner``), the copies run on a side CUDA stream beside the host's work:
the next parameter's gradient comes down while the host steps the current one, and the current one's parameter
goes up while the host steps the next (two staging buffers per direction, so a buffer is written again only after
its copy has finished). The arithmetic is the serial step's, parameter by parameter, so the result is bit-identical
(tests/test_host_adamw.py, on the GPU); the phases ``grad_d2h`` and ``param_h2d`` then time only the waits. Before
returning, the compute stream is made to wait for the last copies. Anywhere else the option leaves the serial step.

Host threads: the step runs torch's CPU kernels (the fused AdamW, the fp32 copies) with ``host_threads``
intra-op threads and restores the process's setting afterwards. By default (``None``) that is the CPUs this
process may run on, shared between the ranks on this host that step at the same time (all of them, or
only the rank-0 owner; without the owner the ranks on this host are counted over torch.distributed at
construction, a collective; several jobs on one host: ``RLKIT_HOST_THREADS`` sets each rank's threads). Why
not torch's own setting: Ray starts verl's workers with OMP_NUM_THREADS set to
the CPUs the actor requested, and verl requests none, so torch runs with one thread there and the whole
host step of a 4B model is single-threaded. The kernels are elementwise, so the result does not depend on
the thread count (bit-identical; tests/test_host_adamw.py checks 1 against 2 threads).

verl: ``actor.optim.optimizer_impl=rlkit.optim actor.optim.optimizer=HostAdamW`` (extra keywords via
``override_optimizer_config``); keep ``optimizer_offload=false`` so verl does not ship the host state
to the device at every ``train_mode`` enter.
"""
from __future__ import annotations

import inspect
import os
import socket
import sys
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from copy import deepcopy
from typing import Any

import torch
import torch.distributed as dist
from torch.optim.adam import adam as _adam_functional

from rlkit.optim.staging import StagingPool

IMPLS = ("fused", "foreach", "forloop")
STATE_DICT_KEY = "host_adamw"  # state_dict entry: this rank's role under rank0_owner

if "decoupled_weight_decay" not in inspect.signature(_adam_functional).parameters:  # torch < 2.7
    raise ImportError("rlkit.optim.HostAdamW needs torch.optim.adam.adam(decoupled_weight_decay=...) "
                      f"(torch >= 2.7); this torch is {torch.__version__}. Fix: install torch>=2.11,<2.15.")


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
    timer: object with ``phase(name)`` context manager (e.g. rlkit.measure.PhaseTimer), or None.
    host_threads: intra-op threads for the step: ``None`` (default) the CPUs of this process shared between
        the ranks of this host that step (see the module docstring), ``0`` leave torch's setting, ``n`` n.
    broadcast_device: rank-0 owner only: ``"auto"`` (default) ``"cuda"`` when CUDA is available and the group
        has an NCCL backend, else the host; ``"host"``; or a device (``"cuda"``, ``"cpu"``) to broadcast on
        over ``process_group``, whose backend must handle it.
    overlap_copies: run the gradient and parameter copies on a side CUDA stream beside the host step (see the
        module docstring; bit-identical); ``False`` (default) the serial step.
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
    ) -> None:
        _check_hyperparameters(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, impl=impl)
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
        self._broadcast_device = self._resolve_broadcast_device(broadcast_device) if rank0_owner else None
        # Host-resident params cross to the other ranks through this device buffer (emptied after each step).
        self._device_staging = (StagingPool(device=self._broadcast_device)
                                if self._broadcast_device is not None else None)
        self.host_threads = _default_host_threads(rank0_owner) if host_threads is None else host_threads
        self.overlap_copies = bool(overlap_copies)
        self.last_step_overlapped = False  # whether the last step ran its copies beside the host step
        self._copy_streams: dict[torch.device, Any] = {}  # the side stream per device (overlap_copies)

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

    def _resolve_broadcast_device(self, choice: str) -> torch.device | None:
        if not isinstance(choice, str) or not choice:
            raise ValueError(f"HostAdamW broadcast_device={choice!r}: expected 'auto', 'host' or a device name "
                             "such as 'cuda'. Fix: pass one of those.")
        if choice == "host":
            return None
        if choice == "auto":
            nccl = "nccl" in str(dist.get_backend(self._owner_group))
            return torch.device("cuda", torch.cuda.current_device()) if nccl and torch.cuda.is_available() else None
        device = torch.device(choice)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device

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
                self._assert_identical_grads(work)
            finite = self._grads_finite(work) if self.skip_nonfinite else True
        if not finite:
            self.last_step_skipped = True
            return loss
        self.last_step_skipped = False
        self.last_step_overlapped = self._can_overlap(work)
        self._reserve_staging(work, buffers=2 if self.last_step_overlapped else 1)
        with _intra_op_threads(self.host_threads):
            if self.last_step_overlapped:
                self._step_overlapped(work)
            else:
                for group, p in work:
                    self._step_one(group, p)
        if self._device_staging is not None:
            self._device_staging.release()  # device memory only during the step, not through the next forward
        return loss

    def _step_one(self, group: dict[str, Any], p: torch.Tensor) -> None:
        in_place = _is_own_master(p)
        # What rank 0 broadcasts: the updated parameter itself, or its packed copy.
        out = p.data if in_place else self.staging.view("param", p.numel(), p.dtype).view(p.shape)
        if self._is_owner:
            with self._phase("grad_d2h"):
                grad = self.staging.view("grad", p.numel(), torch.float32).view(p.shape)
                grad.copy_(p.grad)
            with self._phase("host_step"):
                master, state = self._master_and_state(p, group, in_place)
                self._adam(group, master, grad, state)
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

    def _adam(self, group: dict[str, Any], master: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]) -> None:
        """torch's own functional AdamW on one host master (the kernel torch.optim.AdamW runs, see the docstring)."""
        beta1, beta2 = group["betas"]
        _adam_functional(
            [master], [grad], [state["exp_avg"]], [state["exp_avg_sq"]],
            [state["max_exp_avg_sq"]] if group["amsgrad"] else [], [state["step"]],
            foreach=self.impl == "foreach", fused=self.impl == "fused",
            capturable=False, differentiable=False, has_complex=False, decoupled_weight_decay=True,
            amsgrad=group["amsgrad"], beta1=beta1, beta2=beta2, lr=group["lr"],
            weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
        )

    def _can_overlap(self, work) -> bool:
        return (self.overlap_copies and bool(work) and not self.rank0_owner and self.staging.pinned
                and all(p.grad.is_cuda for _, p in work))

    def _step_overlapped(self, work) -> None:
        """The serial step's arithmetic, parameter by parameter, with its copies on a side stream (module docstring)."""
        device = work[0][1].grad.device
        compute, copies = torch.cuda.current_stream(device), self._copy_stream(device)
        copies.wait_stream(compute)  # the gradients are final on the compute stream
        up_done: list[torch.cuda.Event | None] = [None, None]  # per param buffer: its last upload has finished

        def grad_down(k: int):
            p = work[k][1]
            grad = self.staging.view(f"grad{k % 2}", p.numel(), torch.float32).view(p.shape)
            with torch.cuda.stream(copies):
                grad.copy_(p.grad, non_blocking=True)
                done = torch.cuda.Event()
                done.record(copies)
            return grad, done

        pending = grad_down(0)
        for k, (group, p) in enumerate(work):
            grad, down_done = pending
            if k + 1 < len(work):
                pending = grad_down(k + 1)  # its buffer was last read by parameter k - 1's host step, finished
            in_place = _is_own_master(p)
            with self._phase("grad_d2h"):
                down_done.synchronize()
            with self._phase("host_step"):
                master, state = self._master_and_state(p, group, in_place)
                self._adam(group, master, grad, state)
            if in_place:
                continue
            with self._phase("param_pack"):
                if up_done[k % 2] is not None:
                    up_done[k % 2].synchronize()  # parameter k - 2's upload has read this buffer
                out = self.staging.view(f"param{k % 2}", p.numel(), p.dtype).view(p.shape)
                out.copy_(master)
            with self._phase("param_h2d"), torch.cuda.stream(copies):
                p.copy_(out, non_blocking=True)
                up_done[k % 2] = torch.cuda.Event()
                up_done[k % 2].record(copies)
        compute.wait_stream(copies)  # the next forward reads the parameters after their uploads
        copies.synchronize()  # and the staging buffers are free for the next step

    def _copy_stream(self, device: torch.device):
        if device not in self._copy_streams:
            self._copy_streams[device] = torch.cuda.Stream(device)
        return self._copy_streams[device]

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

    def _master_and_state(self, p: torch.Tensor, group: dict[str, Any], in_place: bool):
        state = self.state[p]
        fp32_param = p.dtype == torch.float32
        if in_place:
            master = p.data
            self._masters.pop(p, None)  # built while p was on the device (e.g. unparked): stale now
        else:
            master = self._masters.get(p) if fp32_param else state.get("master")
        if master is None:
            master = torch.empty(p.shape, dtype=torch.float32, device="cpu")
            master.copy_(p)
            if fp32_param:
                self._masters[p] = master
            else:
                state["master"] = master
        if "step" not in state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(master)
            state["exp_avg_sq"] = torch.zeros_like(master)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = torch.zeros_like(master)
        return master, state

    def _reserve_staging(self, work, buffers: int = 1) -> None:
        """Size each staging buffer once, to the largest parameter of this step (``buffers`` 2: two per direction,
        tagged ``grad0``/``grad1`` and ``param0``/``param1``, for the overlapped step)."""
        if not work:
            return
        tags = [""] if buffers == 1 else [str(i) for i in range(buffers)]
        packed = [p.numel() * p.element_size() for _, p in work if not _is_own_master(p)]
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

    def _assert_identical_grads(self, work) -> None:
        """Raise on every rank if any gradient differs across ranks (int64 checksum of the raw bits)."""
        sums = torch.stack([_bit_checksum(p.grad) for _, p in work]).cpu() if work else torch.zeros(0, dtype=torch.int64)
        low, high = sums.clone(), sums.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN, group=self._comm_group)
        dist.all_reduce(high, op=dist.ReduceOp.MAX, group=self._comm_group)
        differing = (low != high).nonzero().flatten().tolist()
        if differing:
            raise RuntimeError(
                f"HostAdamW(check_identical_grads=True): gradients of parameters {differing[:8]} differ across "
                f"ranks. rank0_owner needs identical gradients (FSDP NO_SHARD all-reduce). Fix: apply the "
                f"no_shard patch so FSDP syncs gradients, or pass rank0_owner=False.")

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
        ``state_dict``); a verl checkpoint records them (``rlkit.patches.checkpoint_fingerprint``)."""
        return {
            "impl": self.impl,
            "rank0_owner": self.rank0_owner,
            "skip_nonfinite": self.skip_nonfinite,
            "check_identical_grads": self.check_identical_grads,
            "pin_memory": self.staging.pinned,
            "broadcast_device": str(self._broadcast_device) if self._broadcast_device is not None else "host",
            "host_threads": self.host_threads,
            "overlap_copies": self.overlap_copies,
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
        """Like torch's, but state tensors stay on the host (fp32) instead of moving to the params' device.

        A state dict HostAdamW saved on a rank with the other role (the rank-0 owner's on a rank without state, or
        a non-owner's, which holds no Adam state, on a rank that steps) is refused: loaded, the owner would restart
        its moments from zero and the ranks would drift apart without an error."""
        saved_role = state_dict.get(STATE_DICT_KEY)
        if saved_role is not None and bool(saved_role.get("is_owner", True)) != self.is_owner:
            def role(owner: bool, rank0_owner) -> str:
                return ("holds Adam state" if owner else "holds no Adam state") + f" (rank0_owner={rank0_owner})"

            saved = role(bool(saved_role.get("is_owner")), saved_role.get("rank0_owner"))
            raise ValueError(
                f"HostAdamW.load_state_dict: the state dict was saved by a rank that {saved}, and this rank "
                f"{role(self.is_owner, self.rank0_owner)}. Fix: build the optimizer with the saved rank0_owner and "
                f"process group, and load each rank's own state dict.")
        groups, saved_groups = self.param_groups, state_dict["param_groups"]
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
        self.param_groups = [
            {**deepcopy({k: v for k, v in saved.items() if k != "params"}), "params": group["params"]}
            for group, saved in zip(groups, saved_groups)
        ]
        self.state = state
        self._masters.clear()  # fp32 masters are rebuilt from the restored parameters at the next step


HOST_THREADS_ENV = "RLKIT_HOST_THREADS"  # threads per stepping rank, for jobs that share a host with other jobs


def _default_host_threads(rank0_owner: bool) -> int:
    """This process's CPUs, divided among the ranks of this host that run the host step concurrently.

    ``RLKIT_HOST_THREADS`` overrides it: the ranks of one job are counted, other jobs on the host are not.
    """
    value = os.environ.get(HOST_THREADS_ENV)
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{HOST_THREADS_ENV}={value!r}: expected a positive number of threads per stepping "
                             f"rank. Fix: set it to e.g. the host's CPUs divided by the jobs on it, or unset it.")
        return int(value)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cpus if rank0_owner else max(1, cpus // ranks_on_this_host())


def ranks_on_this_host() -> int:
    """Ranks of the job on this host: counted over torch.distributed when it is up, else the launchers' variables.

    Counted, not read from the environment, because the environment misled where it mattered: in verl's Ray
    workers (2 ranks on one 32-CPU host) the environment-based default gave each rank all 32 CPUs
    (outputs/05_grpo_qwen3_4b/1-fixes-hostadamw/metrics.json, host_threads 32). The count is a collective: every rank of
    the world must build its HostAdamW, as verl and torchrun scripts do.
    """
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        hosts: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(hosts, socket.gethostname())
        return hosts.count(socket.gethostname())
    return max(int(os.environ.get(name) or 1) for name in ("LOCAL_WORLD_SIZE", "RAY_LOCAL_WORLD_SIZE"))


NODE_ID_ENV = "RLKIT_NODE_ID"  # names this process's node where the hostname cannot (several raylets on one host)
OWNERS = ("group", "node")


def node_id() -> str:
    """The node this process runs on: ``RLKIT_NODE_ID`` if set, else Ray's node id inside a Ray worker, else the
    hostname. Ray's id first because a Ray node is what verl places ranks on (``trainer.nnodes``), and a node's
    raylets are told apart by it even where two share a hostname; ray is not imported for this."""
    if os.environ.get(NODE_ID_ENV):
        return os.environ[NODE_ID_ENV]
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return f"ray:{ray.get_runtime_context().get_node_id()}"
    return socket.gethostname()


def _node_groups(group, host_group):
    """(this node's part of ``group``, its gloo twin, the number of nodes), from every rank's :func:`node_id`.

    ``dist.new_group`` is a collective over the whole world: every rank creates every node's group, in the same order
    (nodes ordered by their lowest rank)."""
    ranks = dist.get_process_group_ranks(group)
    ids: list[str | None] = [None] * len(ranks)
    dist.all_gather_object(ids, node_id(), group=host_group)
    members: dict[str, list[int]] = {}
    for rank, node in zip(ranks, ids):
        members.setdefault(node, []).append(rank)
    backend = str(dist.get_backend(group))
    mine = None
    for node_ranks in members.values():
        device_group = dist.new_group(ranks=node_ranks, backend=backend)
        gloo_group = device_group if "gloo" in backend else dist.new_group(ranks=node_ranks, backend="gloo")
        if dist.get_rank() in node_ranks:
            mine = (device_group, gloo_group)
    return (*mine, len(members))


def _check_owners(owners, rank0_owner) -> None:
    if owners not in OWNERS:
        raise ValueError(f"HostAdamW owners={owners!r} is not one of {list(OWNERS)}. Fix: 'group' (one owner, rank 0) "
                         "or 'node' (one owner per node).")
    if owners == "node" and not rank0_owner:
        raise ValueError("HostAdamW owners='node' is a mode of the rank-0 owner. Fix: also pass rank0_owner=True, or "
                         "leave owners='group'.")


@contextmanager
def _intra_op_threads(threads: int):
    """torch's intra-op thread count set to ``threads`` (0: unchanged) for the block, then restored."""
    previous = torch.get_num_threads()
    if threads and threads != previous:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)


def _is_own_master(p: torch.Tensor) -> bool:
    """A host fp32 parameter: its storage already is the fp32 master HostAdamW would keep."""
    return p.device.type == "cpu" and p.dtype == torch.float32


_CHECKSUM_CHUNK = 1 << 26  # elements summed at a time: the int64 upcast stays <= 512 MiB


def _bit_checksum(t: torch.Tensor) -> torch.Tensor:
    """Order-independent int64 sum of the raw bits of ``t`` (exact, so equal tensors give equal sums)."""
    as_int = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    bits = t.detach().contiguous().view(-1).view(as_int)
    return torch.stack([chunk.sum(dtype=torch.int64) for chunk in bits.split(_CHECKSUM_CHUNK)]).sum()


def _check_hyperparameters(*, lr, betas, eps, weight_decay, impl) -> None:
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
