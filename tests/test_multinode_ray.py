"""HostAdamW's per-node owners on a real two-node Ray cluster on this host (tests/_ray_nodes.py says how and why).

Four ranks, two on each raylet, FSDP1 NO_SHARD + HostAdamW(rank0_owner=True, owners="node") over gloo: every rank ends
with the same bits, and those equal a one-node run of the same four ranks with one global owner. Runs in `make test`
(about a minute on 2 cores; CI has no GPU).
"""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
import _ray_nodes as nodes  # tests/ is on sys.path under pytest
from ray import cloudpickle

cloudpickle.register_pickle_by_value(nodes)  # the raylets' workers cannot import tests/ by name


def test_per_node_owners_on_two_ray_nodes_are_bit_identical_to_one_node():
    with nodes.cluster():
        _check_two_nodes()


def _check_two_nodes():
    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == 2 and {next(iter(set(n["Resources"]) & set(nodes.NODES))) for n in alive} == set(nodes.NODES)

    two = nodes.run([name for name in nodes.NODES for _ in range(nodes.RANKS_PER_NODE)], owners="node")
    one = nodes.run([nodes.NODES[0]] * len(two), owners="group")

    # placement: ranks 0-1 on one raylet, 2-3 on the other, told apart by Ray's node id
    by_node = {}
    for r in two:
        by_node.setdefault(r["node"], []).append(r["rank"])
    assert sorted(by_node.values()) == [[0, 1], [2, 3]] and all(k.startswith("ray:") for k in by_node)
    assert len({r["node"] for r in one}) == 1
    # one owner per node, the node's lowest rank; it alone holds Adam state
    assert [r["is_owner"] for r in two] == [True, False, True, False]
    assert [r["adam_state_params"] > 0 for r in two] == [True, False, True, False]
    assert {r["nodes"] for r in two} == {2}
    assert [r["is_owner"] for r in one] == [True, False, False, False]
    # every rank of both runs holds the same bits, and training moved them
    reference = one[0]["flat"]
    for r in two + one:
        assert r["flat"].equal(reference), f"rank {r['rank']} differs by {(r['flat'] - reference).abs().max()}"
    assert not reference.equal(nodes.initial_flat())
