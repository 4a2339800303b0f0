"""A two-node Ray cluster on this host and FSDP1 NO_SHARD + HostAdamW ranks placed on its nodes (tests/test_multinode_ray.py).

Why a hand-made harness and not verl's trainer: verl 0.9.1's trainer always starts a rollout engine (vLLM or SGLang),
which needs a GPU, so ``main_ppo`` cannot run a step on a CPU-only CI machine. What HostAdamW's owners depend on is
what verl's workers are: Ray actors placed on Ray nodes, one torch.distributed rank each, FSDP1 NO_SHARD over the
world (the ``no_shard`` patch's strategy), HostAdamW built in every rank. That is what runs here, with gloo on CPU.

The nodes are real raylets (``ray.cluster_utils.Cluster``: a head and a second node, each its own raylet process with
its own node id), bound to 127.0.0.1. Each node carries a custom resource and a label naming it (``node-a``,
``node-b``), and a rank asks for one unit of its node's resource, so the placement is by node, as
``trainer.nnodes=2`` places verl's workers. HostAdamW tells the nodes apart by Ray's node id (:func:`node_id`), not by
hostname, which both share.
"""
from __future__ import annotations

import os
import socket
from contextlib import contextmanager

NODES = ("node-a", "node-b")
RANKS_PER_NODE = 2
WORLD = len(NODES) * RANKS_PER_NODE  # each node can hold every rank: the one-node run places them all on node-a
STEPS = 4
WIDTH, LAYERS = 16, 3


# Ray turns 127.0.0.1 into the host's routable address when it connects (resolve_ip_for_localhost), except where
# clusters are "not supported"; this switch says so, in the driver (the constant) and in the raylets and workers it
# starts (the variable), so that every address stays on the loopback.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# What the raylets and workers the driver starts inherit: the loopback switch, and a longer wait for the agents a raylet
# starts (a raylet aborts when an agent has not reported its port in time, which a loaded 2-core host exceeded).
RAYLET_ENV = {LOOPBACK_ENV: "0", "RAY_agent_register_timeout_ms": "120000"}
AGENT_PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port", "runtime_env_agent_port")


@contextmanager
def cluster():
    """A head and a second raylet on 127.0.0.1, each with ``WORLD`` units of its own resource, connected;
    shut down and the loopback switch restored on exit."""
    import ray
    from ray._private import ray_constants

    saved = {name: os.environ.get(name) for name in RAYLET_ENV}, ray_constants.ENABLE_RAY_CLUSTER
    os.environ.update(RAYLET_ENV)
    ray_constants.ENABLE_RAY_CLUSTER = False
    started = None
    try:
        started = _start()
        yield started
    finally:
        ray.shutdown()
        if started is not None:
            started.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = saved[1]
        for name, value in saved[0].items():
            if value is None:
                os.environ.pop(name)
            else:
                os.environ[name] = value


def _start():
    """Start and connect the two nodes, a second time if a raylet does not come up: on a loaded 2-core host a raylet
    occasionally gives up waiting for its metrics agent ("timed out during startup"); nothing the test checks depends
    on which attempt started the cluster, and a second failure fails the test."""
    from ray.cluster_utils import Cluster

    def node_args(name):
        # Fixed agent ports: with port 0 the raylet waits for each agent to write the port it bound, and gives up after
        # a fixed wait that a loaded 2-core host exceeded while the agents' Python started.
        ports = {key: free_port() for key in AGENT_PORTS}
        return {"num_cpus": WORLD, "resources": {name: WORLD}, "labels": {"rlkit/node": name},
                "node_ip_address": "127.0.0.1", "object_store_memory": 80 * 1024 * 1024, **ports}

    for attempt in range(2):
        started = Cluster(shutdown_at_exit=True)
        try:
            started.add_node(**node_args(NODES[0]), include_dashboard=False)
            started.add_node(**node_args(NODES[1]))
            started.wait_for_nodes()
            started.connect()
            return started
        except Exception:
            started.shutdown()
            if attempt:
                raise
    raise AssertionError("unreachable")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model():
    """A tiny random-init model with one FSDP unit per block (several flat parameters, as a decoder has)."""
    import torch

    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()) for _ in range(LAYERS)]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(WIDTH, 1))


def initial_flat():
    """The model's parameters before any step, flattened in the order FSDP's flat parameters hold them."""
    import torch

    return torch.cat([p.detach().reshape(-1) for p in _model().parameters()])


def train_rank(rank: int, world: int, port: int, owners: str) -> dict:
    """One rank: FSDP1 NO_SHARD over the world (gloo), HostAdamW(rank0_owner, owners), ``STEPS`` steps on this rank's
    own data (so the all-reduce matters); returns its flat parameters, node and role."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only, whatever the host's interfaces are
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from rlkit.optim.host_adamw import HostAdamW
    from rlkit.optim.host_ranks import node_id

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = _model()
        wrapped = FSDP(model, device_id=torch.device("cpu"), sharding_strategy=ShardingStrategy.NO_SHARD, use_orig_params=False,
                       auto_wrap_policy=ModuleWrapPolicy({torch.nn.Sequential}))
        opt = HostAdamW(wrapped.parameters(), lr=1e-2, weight_decay=0.1, rank0_owner=True, owners=owners,
                        check_identical_grads=True, host_threads=1)
        data = torch.Generator().manual_seed(1000 + rank)
        for _ in range(STEPS):
            x = torch.randn(8, WIDTH, generator=data)
            opt.zero_grad()
            wrapped(x).pow(2).mean().backward()
            opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in wrapped.parameters()])
        result = {"rank": rank, "node": node_id(), "flat": flat, "is_owner": opt.is_owner,
                  "adam_state_params": opt.adam_state_params(), "nodes": opt.options()["nodes"]}
        dist.barrier()  # no rank tears gloo down while a peer still communicates
        return result
    finally:
        dist.destroy_process_group()


def run(placement: list[str], owners: str) -> list[dict]:
    """Ranks ``0..len(placement)-1``, rank r on the node named ``placement[r]``, each a Ray actor; their results."""
    import ray

    remote = ray.remote(num_cpus=0)(_Rank)
    port = free_port()
    actors = [remote.options(resources={node: 1}).remote() for node in placement]
    try:
        return ray.get([a.train.remote(r, len(placement), port, owners) for r, a in enumerate(actors)], timeout=300)
    finally:
        for a in actors:
            ray.kill(a)


class _Rank:
    def train(self, rank: int, world: int, port: int, owners: str) -> dict:
        return train_rank(rank, world, port, owners)
