"""What crosses the network in one GRPO step on N nodes x G GPUs, and the time it takes at least (docs/multinode.md).

Pure arithmetic, like :mod:`rlkit.planning.budget`, per node and per optimizer step, for the patched colocated setup (FSDP1
NO_SHARD, vLLM on the same GPUs, TP=1):

- ``grad_allreduce``: FSDP1 NO_SHARD all-reduces every trainable parameter's gradient across all N x G ranks once per
  optimizer step (the last micro-batch; the others run under ``no_sync``), in fp32 (verl's mixed precision reduces in
  fp32). A ring all-reduce of S bytes over W ranks moves 2 (W - 1) / W x S through every link of the ring, and a ring
  over N nodes crosses each node's network link once in and once out, so each node sends (and receives) that much.
  NCCL's trees and several rings split the same bytes differently, not fewer of them: it is the floor.
- ``owner_broadcast``: HostAdamW's updated fp32 master (4 B per parameter) from its owner to the other ranks. With one
  owner for the whole job (``owners="group"``) every other node receives all of it each step (the owner's node sends at
  least that much); with an owner per node (``owners="node"``) it stays inside each node: 0. Without an owner: 0.
- ``weight_sync``: the actor's weights to vLLM: CUDA IPC inside each GPU (colocated), 0 over the network.

Not counted: the rollout batch through Ray's object store (token ids, masks, log-probs: kilobytes per sequence) and
the trainer's metrics, orders of magnitude below the gradients for a model of 10^8 parameters or more.

The time floor is the bytes over the link's bandwidth (full duplex: sending and receiving overlap). It is a floor:
the all-reduce also sums on the GPUs, and NCCL does not reach a link's full rate.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from rlkit.core.env import REPO_ROOT
from rlkit.core.params import ParamError
from rlkit.models.shape import ModelShape, resolve_model

OWNERS = ("none", "group", "node")  # HostAdamW: no owner, one owner for the job, one owner per node
DEFAULT_LINK_GBPS = 25.0  # a department cluster's Ethernet; InfiniBand HDR is 200
# A network floor above this many seconds per step is a warning: arm 1's step at the seed's workload took 89.4 s on one
# H200 (outputs/05_grpo_qwen3_4b/h200-seed-1-fixes-hostadamw.session19/metrics.json, summary.step_s), so 5 s is where
# the network alone would add over 5% to a step of that size.
NETWORK_WARN_S = 5.0
FP32 = 4


def _positive_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ParamError(f"{key}: must be a positive integer, got {value!r}. Fix: set a positive integer")
    return value


def network_bytes_per_step(shape: ModelShape, *, nodes: int, gpus_per_node: int, owners: str = "node",
                           lora_rank: int = 0, optimizer_steps: int = 1) -> dict[str, float]:
    """Bytes each node sends over the network per training step, by component (see the module docstring).

    ``optimizer_steps``: optimizer steps per training step (mini-batches x epochs; 1 when strictly on-policy).
    """
    _positive_int("nodes", nodes)
    _positive_int("gpus_per_node", gpus_per_node)
    _positive_int("optimizer_steps", optimizer_steps)
    if owners not in OWNERS:
        raise ParamError(f"owners: {owners!r} is not one of {list(OWNERS)}. Fix: 'node' for HostAdamW(owners='node'), "
                         "'group' for one rank-0 owner, 'none' without rank0_owner")
    if nodes == 1:
        return {"grad_allreduce": 0.0, "owner_broadcast": 0.0, "weight_sync": 0.0}
    world = nodes * gpus_per_node
    trainable = float(shape.lora_params(lora_rank)) if lora_rank else float(shape.params)
    return {
        "grad_allreduce": optimizer_steps * 2.0 * (world - 1) / world * FP32 * trainable,
        "owner_broadcast": optimizer_steps * FP32 * float(shape.params) if owners == "group" else 0.0,
        "weight_sync": 0.0,
    }


@dataclass(frozen=True)
class NetworkPlan:
    """:func:`network_plan`'s result: bytes per node per step, the floor in seconds at ``link_gbps``, warnings."""

    nodes: int
    gpus_per_node: int
    owners: str
    link_gbps: float
    bytes_per_node: dict[str, float]
    total_bytes: float
    floor_s: float
    warnings: tuple[str, ...]

    def as_dict(self) -> dict:
        return asdict(self)


def network_plan(shape: ModelShape, *, nodes: int, gpus_per_node: int, owners: str = "node", lora_rank: int = 0,
                 optimizer_steps: int = 1, link_gbps: float = DEFAULT_LINK_GBPS) -> NetworkPlan:
    """The per-step network bytes and their time floor, with a warning where the network would bind."""
    if not (isinstance(link_gbps, (int, float)) and link_gbps > 0):
        raise ParamError(f"link_gbps: must be a positive link speed in Gbit/s, got {link_gbps!r}. Fix: e.g. 25 or 100")
    parts = network_bytes_per_step(shape, nodes=nodes, gpus_per_node=gpus_per_node, owners=owners,
                                   lora_rank=lora_rank, optimizer_steps=optimizer_steps)
    total = sum(parts.values())
    floor = total / (link_gbps * 1e9 / 8)
    warnings = []
    if parts["owner_broadcast"]:
        alone = parts["owner_broadcast"] / (link_gbps * 1e9 / 8)
        warnings.append(f"one HostAdamW owner for {nodes} nodes sends the fp32 master ({parts['owner_broadcast'] / 1e9:.1f} GB) "
                        f"over the network every step ({alone:.1f} s at {link_gbps:g} Gbit/s); owners='node' keeps it "
                        "inside each node")
    if floor > NETWORK_WARN_S:
        warnings.append(f"the network binds: {total / 1e9:.1f} GB per node per step take at least {floor:.1f} s at "
                        f"{link_gbps:g} Gbit/s (over {NETWORK_WARN_S:g} s)")
    return NetworkPlan(nodes=nodes, gpus_per_node=gpus_per_node, owners=owners, link_gbps=float(link_gbps),
                       bytes_per_node=parts, total_bytes=total, floor_s=floor, warnings=tuple(warnings))


def network_plan_for(spec, *, owners: str | None = None, link_gbps: float = DEFAULT_LINK_GBPS) -> NetworkPlan:
    """The network plan of a :class:`rlkit.planning.budget.PlanSpec`'s nodes; ``owners`` by default follows its rank0_owner
    option: one HostAdamW owner per node."""
    owners = owners or ("node" if spec.rank0_owner else "none")
    return network_plan(resolve_model(spec.model), nodes=spec.nodes, gpus_per_node=spec.n_gpus // spec.nodes,
                        owners=owners, lora_rank=spec.lora_rank, link_gbps=link_gbps)


def format_network_plan(p: NetworkPlan) -> str:
    lines = [f"network per node per step ({p.nodes} nodes x {p.gpus_per_node} GPUs, HostAdamW owners: {p.owners}):"]
    lines += [f"  {name:16s} {value / 1e9:8.2f} GB" for name, value in p.bytes_per_node.items()]
    lines.append(f"  {'total':16s} {p.total_bytes / 1e9:8.2f} GB  -> at least {p.floor_s:.2f} s at {p.link_gbps:g} Gbit/s")
    lines += [f"  WARNING: {w}" for w in p.warnings]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# docs/multinode.md's generated block

DOC_BEGIN = "<!-- network:begin (generated by `python -m rlkit.planning.multinode --write`; do not edit) -->"
DOC_END = "<!-- network:end -->"
DOC_MODELS = ("qwen3-4b", "qwen3-8b")
DOC_LAYOUTS = ((1, 2), (2, 2), (4, 2), (2, 4))  # (nodes, GPUs per node)
DOC_LINKS_GBPS = (25.0, 100.0)


def docs_block() -> str:
    """The per-step network bytes and host memory per node that docs/multinode.md quotes, from this module."""
    from rlkit.planning.host_memory import host_adamw_bytes

    links = " | ".join(f"floor at {g:g} Gbit/s (s)" for g in DOC_LINKS_GBPS)
    header = (f"| model | nodes x GPUs | HostAdamW owners | gradient all-reduce (GB) | owner broadcast (GB) | "
              f"total per node (GB) | {links} | host memory per node: HostAdamW + param offload (GiB) |")
    lines = [DOC_BEGIN, "", header, "|---" * (7 + len(DOC_LINKS_GBPS)) + "|"]
    for model in DOC_MODELS:
        shape = resolve_model(model)
        for nodes, gpus in DOC_LAYOUTS:
            host = sum(host_adamw_bytes(shape, ranks=gpus, rank0_owner=True, param_offload=True).values()) / 2**30
            for owners in (("node", "group") if nodes > 1 else ("node",)):
                plans = [network_plan(shape, nodes=nodes, gpus_per_node=gpus, owners=owners, link_gbps=g)
                         for g in DOC_LINKS_GBPS]
                b = plans[0].bytes_per_node
                floors = " | ".join(f"{p.floor_s:.2f}" for p in plans)
                lines.append(f"| {model} | {nodes} x {gpus} | {owners} | {b['grad_allreduce'] / 1e9:.2f} | "
                             f"{b['owner_broadcast'] / 1e9:.2f} | {plans[0].total_bytes / 1e9:.2f} | {floors} | {host:.1f} |")
    lines += ["", DOC_END]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m rlkit.planning.multinode [--write]``: print docs/multinode.md's generated block, or write it into the file."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    block = docs_block()
    if argv != ["--write"]:
        print(block)
        return 0
    path = REPO_ROOT / "docs" / "multinode.md"
    text = path.read_text()
    if DOC_BEGIN not in text or DOC_END not in text:
        print(f"{path}: no {DOC_BEGIN!r} ... {DOC_END!r} block to replace. Fix: put the two markers back", file=sys.stderr)
        return 2
    head, rest = text.split(DOC_BEGIN, 1)
    path.write_text(head + block + rest.split(DOC_END, 1)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
