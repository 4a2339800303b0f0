"""no_shard: an (N, 1) mesh gets NO_SHARD over the N-rank replicate group, so gradients are all-reduced.

Two gloo ranks on verl's (2, 1) ("ddp", "fsdp") mesh, the same model, different micro-batches:
without the fix FSDP1 clamps HYBRID_SHARD to NO_SHARD over a one-rank group and the gradients
differ; with it they are bit-identical.
"""
from __future__ import annotations

import json
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
from conftest import fresh_paths, spawn_two_ranks
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from rlkit import patches
from rlkit.patches import PatchError
from rlkit.patches.fsdp import no_shard
from rlkit.patches.fsdp.no_shard import sharding_strategy_for_mesh


def _grad_diff_across_ranks(mesh, strategy, rank: int) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16)), nn.Linear(16, 1))
    fsdp = FSDP(model, device_id=torch.device("cpu"), sharding_strategy=strategy, device_mesh=mesh,
                use_orig_params=False, auto_wrap_policy=ModuleWrapPolicy({nn.Sequential}))
    torch.manual_seed(100 + rank)  # a different micro-batch on each rank
    fsdp(torch.randn(8, 16)).square().mean().backward()
    grads = torch.cat([p.grad.reshape(-1) for p in fsdp.parameters()])
    gathered = [torch.empty_like(grads) for _ in range(2)]
    dist.all_gather(gathered, grads)
    return {"max_abs_grad_diff": (gathered[0] - gathered[1]).abs().max().item(),
            "max_abs_grad": grads.abs().max().item(),
            "reduce_group_size": fsdp.process_group.size()}


def _worker(rank: int, rendezvous: str, out_path: str, use_verl: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("ddp", "fsdp"))  # verl's fsdp_size=1 mesh
    other_meshes = {"1d": init_device_mesh("cpu", (2,)), "1x2": init_device_mesh("cpu", (1, 2))}
    results = {}
    for fixed in (False, True):
        if use_verl:
            from verl.workers.engine.fsdp import transformer_impl

            if fixed:
                no_shard.apply()
            strategy = transformer_impl.get_sharding_strategy(mesh)
            results[f"others/{fixed}"] = {
                f"{name}/{zero3}": transformer_impl.get_sharding_strategy(m, zero3_enable=zero3).name
                for name, m in other_meshes.items() for zero3 in (True, False)
            }
            no_shard.revert()
        else:
            strategy = sharding_strategy_for_mesh(mesh, fixed=fixed)
        results[str(fixed)] = {"strategy": strategy.name, **_grad_diff_across_ranks(mesh, strategy, rank)}
    results["rule"] = {
        f"{name}/{zero3}/{fixed}": sharding_strategy_for_mesh(m, fixed=fixed, zero3_enable=zero3).name
        for name, m in {**other_meshes, "2x1": mesh}.items() for zero3 in (True, False) for fixed in (False, True)
    }
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()  # no rank tears gloo down while its peer is still communicating
    dist.destroy_process_group()


def _spawn(use_verl: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        make = fresh_paths(tmp, "rdzv", "out.json")
        _, out, _ = spawn_two_ranks(_worker, lambda: (*make(), use_verl))
        with open(out) as f:
            return json.load(f)


def _assert_bug_then_fix(results: dict) -> None:
    bug, fixed = results["False"], results["True"]
    assert bug["strategy"] == "HYBRID_SHARD" and bug["reduce_group_size"] == 1
    assert bug["max_abs_grad_diff"] > 1e-3 * bug["max_abs_grad"] > 0  # independent replicas
    assert fixed["strategy"] == "NO_SHARD" and fixed["reduce_group_size"] == 2
    assert fixed["max_abs_grad_diff"] == 0.0  # all-reduced: bit-identical


def test_pure_torch_rule_shows_the_bug_and_the_fix():
    results = _spawn(use_verl=False)
    _assert_bug_then_fix(results)
    rule = results["rule"]
    # Only the (N, 1) mesh changes; everything else is verl's rule.
    assert rule["2x1/True/True"] == rule["2x1/False/True"] == "NO_SHARD"
    assert rule["2x1/True/False"] == "HYBRID_SHARD" and rule["2x1/False/False"] == "_HYBRID_SHARD_ZERO2"
    for fixed in (False, True):
        assert rule[f"1d/True/{fixed}"] == "FULL_SHARD" and rule[f"1d/False/{fixed}"] == "SHARD_GRAD_OP"
        assert rule[f"1x2/True/{fixed}"] == "HYBRID_SHARD" and rule[f"1x2/False/{fixed}"] == "_HYBRID_SHARD_ZERO2"


@pytest.mark.verl
def test_verl_get_sharding_strategy_patched_where_the_engine_calls_it():
    results = _spawn(use_verl=True)
    _assert_bug_then_fix(results)
    # Other meshes: the patched verl function answers exactly what verl's own does.
    assert results["others/True"] == results["others/False"]
    # And the rlkit rule with fixed=False reproduces verl's original on every mesh checked.
    for key, name in results["others/False"].items():
        assert results["rule"][f"{key}/False"] == name


@pytest.mark.verl
def test_apply_is_idempotent_and_revert_restores_verl():
    from verl.workers.engine.fsdp import transformer_impl, utils

    original = transformer_impl.get_sharding_strategy
    assert original is utils.get_sharding_strategy
    try:
        no_shard.apply()
        patched = transformer_impl.get_sharding_strategy
        no_shard.apply()
        assert transformer_impl.get_sharding_strategy is patched is not original
        assert "no_shard" in patches.active()
    finally:
        no_shard.revert()
    assert transformer_impl.get_sharding_strategy is original
    assert not no_shard.active()


def test_apply_without_verl_fails_naming_verl(monkeypatch):
    monkeypatch.setattr(patches, "installed_version", lambda dist: None if dist == "verl" else patches.Version("2.13"))
    with pytest.raises(PatchError, match="verl"):
        no_shard.apply()
    assert not no_shard.active()


def test_apply_with_unimportable_verl_names_verl_and_the_fix(monkeypatch):
    monkeypatch.setattr(patches.Patch, "check_versions", lambda self: None)
    monkeypatch.setitem(sys.modules, no_shard.VERL_ENGINE_MODULE, None)
    with pytest.raises(PatchError, match=r"verl.*sharding_strategy_for_mesh"):
        no_shard.apply()
    assert not no_shard.active()


def test_fixed_strategy_is_only_for_replicate_only_meshes():
    class Mesh:  # the rule reads only ndim and size(dim)
        def __init__(self, *shape):
            self.shape, self.ndim = shape, len(shape)

        def size(self, dim):
            return self.shape[dim]

    assert no_shard.is_replicate_only(Mesh(2, 1)) and no_shard.is_replicate_only(Mesh(8, 1))
    assert not no_shard.is_replicate_only(Mesh(2)) and not no_shard.is_replicate_only(Mesh(1, 2))
    assert sharding_strategy_for_mesh(Mesh(4, 1), fixed=True) is ShardingStrategy.NO_SHARD
    with pytest.raises(NotImplementedError):
        sharding_strategy_for_mesh(Mesh(2, 2, 1), fixed=False)
