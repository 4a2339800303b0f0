"""Where HostAdamW runs: its host threads, its owners (one per node with ``owners="node"``), where the owner
broadcasts (``broadcast_device``), and the check that every rank holds the same gradients.

Host threads: the step runs torch's CPU kernels (the fused AdamW, the fp32 copies) with ``host_threads``
intra-op threads and restores the process's setting afterwards. By default (``None``) that is the CPUs this
process may run on, shared between the ranks on this host that step at the same time (all of them, or
only the rank-0 owner; without the owner the ranks on this host are counted over torch.distributed at
construction, a collective; several jobs on one host: ``RLKIT_HOST_THREADS`` sets each rank's threads). Why
not torch's own setting: Ray starts verl's workers with OMP_NUM_THREADS set to
the CPUs the actor requested, and verl requests none, so torch runs with one thread there and the whole
host step of a 4B model is single-threaded. The kernels are elementwise, so the result does not depend on
the thread count (bit-identical; tests/test_host_adamw.py checks 1 against 2 threads).

Per-node owners (``rank0_owner=True, owners="node"``): on several nodes one owner would send the whole fp32
master over the network every step. After FSDP's all-reduce every node holds the same gradients, so the lowest
rank of each node (its local rank 0) runs the same AdamW on the same inputs and gets the same bits; its broadcast
stays inside the node. The ranks are grouped by :func:`node_id` (gathered once, at construction; every rank of the
world must build its HostAdamW, as verl does, because each node's group is created on every rank). Owners hold
identical Adam state; each rank's checkpoint file says whether it holds some (docs/multinode.md).
"""
from __future__ import annotations

import os
import socket
import sys
from contextlib import contextmanager

import torch
import torch.distributed as dist

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


def resolve_broadcast_device(choice: str, owner_group) -> torch.device | None:
    """Where the rank-0 owner broadcasts (HostAdamW's ``broadcast_device``): ``None`` the host, else a device."""
    if not isinstance(choice, str) or not choice:
        raise ValueError(f"HostAdamW broadcast_device={choice!r}: expected 'auto', 'host' or a device name "
                         "such as 'cuda'. Fix: pass one of those.")
    if choice == "host":
        return None
    if choice == "auto":
        nccl = "nccl" in str(dist.get_backend(owner_group))
        return torch.device("cuda", torch.cuda.current_device()) if nccl and torch.cuda.is_available() else None
    device = torch.device(choice)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


_CHECKSUM_CHUNK = 1 << 26  # elements summed at a time: the int64 upcast stays <= 512 MiB


def _bit_checksum(t: torch.Tensor) -> torch.Tensor:
    """Order-independent int64 sum of the raw bits of ``t`` (exact, so equal tensors give equal sums)."""
    as_int = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    bits = t.detach().contiguous().view(-1).view(as_int)
    return torch.stack([chunk.sum(dtype=torch.int64) for chunk in bits.split(_CHECKSUM_CHUNK)]).sum()


def assert_identical(grads: list[torch.Tensor], group) -> None:
    """Raise on every rank of ``group`` (gloo) if any of ``grads`` differs across its ranks (int64 checksums of the
    raw bits, all-reduced)."""
    sums = torch.stack([_bit_checksum(g) for g in grads]).cpu() if grads else torch.zeros(0, dtype=torch.int64)
    low, high = sums.clone(), sums.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    differing = (low != high).nonzero().flatten().tolist()
    if differing:
        raise RuntimeError(
            f"HostAdamW(check_identical_grads=True): gradients of parameters {differing[:8]} differ across "
            f"ranks. rank0_owner needs identical gradients (FSDP NO_SHARD all-reduce). Fix: apply the "
            f"no_shard patch so FSDP syncs gradients, or pass rank0_owner=False.")
