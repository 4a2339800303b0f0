"""The planner and pre-flight on several nodes (rlkit.planning.multinode, rlkit.planning.budget's nodes), docs/multinode.md's generated
block, and the checkpoint guard's HostAdamW owners. The per-node owners themselves: tests/test_multinode_ray.py."""
import io
import json
from contextlib import redirect_stdout
from dataclasses import replace
from pathlib import Path

import pytest

from rlkit.core.params import ParamError
from rlkit.experiments import phase_budget
from rlkit.models.shape import resolve_model
from rlkit.patches.guards import checkpoint_fingerprint as CF
from rlkit.planning import budget, multinode, verdict

QWEN3_4B = resolve_model("qwen3-4b")
P = float(QWEN3_4B.params)


def test_network_bytes_per_node_and_step():
    one = multinode.network_bytes_per_step(QWEN3_4B, nodes=1, gpus_per_node=8, owners="group")
    assert sum(one.values()) == 0.0  # one node: nothing crosses the network
    node = multinode.network_bytes_per_step(QWEN3_4B, nodes=2, gpus_per_node=2, owners="node")
    assert node == {"grad_allreduce": 2 * 3 / 4 * 4 * P, "owner_broadcast": 0.0, "weight_sync": 0.0}
    group = multinode.network_bytes_per_step(QWEN3_4B, nodes=2, gpus_per_node=2, owners="group")
    assert group["owner_broadcast"] == 4 * P and group["grad_allreduce"] == node["grad_allreduce"]
    assert multinode.network_bytes_per_step(QWEN3_4B, nodes=2, gpus_per_node=2, owners="none") == node
    lora = multinode.network_bytes_per_step(QWEN3_4B, nodes=2, gpus_per_node=2, lora_rank=16)
    assert lora["grad_allreduce"] == 2 * 3 / 4 * 4 * QWEN3_4B.lora_params(16)
    twice = multinode.network_bytes_per_step(QWEN3_4B, nodes=2, gpus_per_node=2, optimizer_steps=2)
    assert twice["grad_allreduce"] == 2 * node["grad_allreduce"]


@pytest.mark.parametrize("kwargs, key", [({"nodes": 0}, "nodes"), ({"gpus_per_node": 1.5}, "gpus_per_node"),
                                         ({"owners": "rack"}, "owners"), ({"link_gbps": 0}, "link_gbps")])
def test_bad_network_inputs_name_the_key(kwargs, key):
    args = {"nodes": 2, "gpus_per_node": 2, **kwargs}
    with pytest.raises(ParamError, match=key):
        multinode.network_plan(QWEN3_4B, **args)


def test_network_plan_floor_and_warnings():
    fast = multinode.network_plan(QWEN3_4B, nodes=2, gpus_per_node=2, owners="node", link_gbps=400)
    assert fast.floor_s == fast.total_bytes / 50e9 and fast.floor_s < multinode.NETWORK_WARN_S and not fast.warnings
    slow = multinode.network_plan(QWEN3_4B, nodes=2, gpus_per_node=2, owners="node", link_gbps=10)
    assert slow.floor_s > multinode.NETWORK_WARN_S and "the network binds" in slow.warnings[0]
    group = multinode.network_plan(QWEN3_4B, nodes=2, gpus_per_node=2, owners="group", link_gbps=400)
    assert any("owners='node'" in w for w in group.warnings)


def test_planner_host_memory_is_per_node():
    spec = budget.with_options(budget.PlanSpec(n_gpus=4, nodes=2, host_gib=500), "offload_views,cpu_optimizer_step")
    two_nodes = verdict.plan(spec)
    one_node = verdict.plan(replace(spec, n_gpus=2, nodes=1))
    four_on_one = verdict.plan(replace(spec, nodes=1))
    assert two_nodes.host_node_peak_gib == one_node.host_node_peak_gib < four_on_one.host_node_peak_gib
    with pytest.raises(ParamError, match="nodes"):
        budget.PlanSpec(n_gpus=4, nodes=3)


def run_budget(*argv):
    out = io.StringIO()
    with redirect_stdout(out):
        code = phase_budget.main(list(argv))
    return code, out.getvalue()


def test_budget_cli_nodes_prints_the_planners_network():
    args = ["--n-gpus", "4", "--nodes", "2", "--options", "offload_views,cpu_optimizer_step,rank0_owner"]
    _, text = run_budget(*args)
    assert "network per node per step (2 nodes x 2 GPUs, HostAdamW owners: node)" in text
    _, js = run_budget(*args, "--owners", "group", "--link-gbps", "100", "--json")
    network = json.loads(js)["network"]
    expected = multinode.network_plan(QWEN3_4B, nodes=2, gpus_per_node=2, owners="group", link_gbps=100)
    assert network["total_bytes"] == expected.total_bytes and network["warnings"] == list(expected.warnings)
    _, single = run_budget("--n-gpus", "2")
    assert "network per node" not in single
    code, _ = run_budget("--n-gpus", "4", "--nodes", "3")
    assert code == 2


HOST_ADAMW = ["trainer.nnodes=2", "actor_rollout_ref.model.path=Qwen/Qwen3-4B",
              "actor_rollout_ref.actor.optim.optimizer_impl=rlkit.optim", "actor_rollout_ref.actor.optim.optimizer=HostAdamW",
              "+actor_rollout_ref.actor.optim.override_optimizer_config.rank0_owner=true"]


def network_findings(extra=(), **kw):
    from test_preflight import findings

    return [f for f in findings(list(extra), **kw) if f.check == "network"]


def test_preflight_warns_where_the_network_binds():
    assert network_findings(HOST_ADAMW[1:]) == []  # one node: no network finding
    group = network_findings(HOST_ADAMW, link_gbps=400)
    assert [f.severity for f in group] == ["warning"] and "owners=node" in group[0].fix
    owners_node = HOST_ADAMW + ["+actor_rollout_ref.actor.optim.override_optimizer_config.owners=node"]
    fast = network_findings(owners_node, link_gbps=400)
    assert [f.severity for f in fast] == ["info"] and "owners: node" in fast[0].message
    slow = network_findings(owners_node, link_gbps=10)
    assert [f.severity for f in slow] == ["warning"] and "the network binds" in slow[0].message
    bad = network_findings(HOST_ADAMW + ["+actor_rollout_ref.actor.optim.override_optimizer_config.owners=rack"])
    assert [f.severity for f in bad] == ["error"] and bad[0].key.endswith("owners")


def test_docs_give_the_planners_network_bytes():
    text = (Path(__file__).resolve().parent.parent / "docs" / "multinode.md").read_text()
    block = text[text.index(multinode.DOC_BEGIN):text.index(multinode.DOC_END) + len(multinode.DOC_END)]
    assert block == multinode.docs_block(), "docs/multinode.md is stale. Fix: python -m rlkit.planning.multinode --write"
    plan = multinode.network_plan(QWEN3_4B, nodes=2, gpus_per_node=2, owners="node")
    assert f"| qwen3-4b | 2 x 2 | node | {plan.bytes_per_node['grad_allreduce'] / 1e9:.2f} |" in block


def fingerprint(owners=None, adam_ranks=(0,), world=4):
    options = {"rank0_owner": True, "impl": "fused", "skip_nonfinite": True}
    if owners is not None:
        options["owners"] = owners
    return {"patches": [], "optimizer": {"class": "rlkit.optim.host_adamw.HostAdamW", "options": options},
            "adam_state_ranks": list(adam_ranks), "world_size": world,
            "contents": {"save": ["model", "optimizer"], "load": ["model", "optimizer"]}}


def test_checkpoint_guard_compares_owners_and_refuses_another_node_count():
    assert CF.mismatches(fingerprint(None), fingerprint("group")) == []  # written before owners was recorded
    assert CF.mismatches(fingerprint("node", (0, 2)), fingerprint("node", (0, 2))) == []
    found = CF.mismatches(fingerprint("group"), fingerprint("node", (0, 2)))
    assert found == ["HostAdamW owners: 'group' in the checkpoint, 'node' in this run"]
    # 2 nodes x 2 GPUs resumed on 1 node x 4 GPUs: the owners move
    moved = CF.mismatches(fingerprint("node", (0, 2)), fingerprint("node", (0,)))
    assert moved == ["Adam state: held by ranks [0, 2] in the checkpoint, by ranks [0] in this run"]
    # 2 x 2 resumed on 1 x 2: the world size too
    smaller = CF.mismatches(fingerprint("node", (0, 2)), fingerprint("node", (0,), world=2))
    assert any(m.startswith("world_size") for m in smaller)
