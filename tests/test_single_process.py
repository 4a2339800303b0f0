"""Every patch that wraps a method of verl's FSDP engine works where verl's method works: one process on a CPU, with no
process group or with a gloo group of one.

verl's own CPU tests build a bare ``FSDPEngine`` (``object.__new__``) around a plain module and call its methods in
one process; ``optimizer_step`` (clip + step) and ``to("cpu")`` work there without a process group. The engine's
wrappers are found from the registry (every shipped patch whose targets include the engine module), applied all
together (master_on_host too, so that its verl wiring is live), and must give verl's own results. The checkpoint
manager's single-process paths: tests/test_checkpoint_guard.py."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import gloo_world_of_one

pytestmark = pytest.mark.verl

ENGINE = "verl.workers.engine.fsdp.transformer_impl"


@pytest.fixture(params=["no_process_group", "one_rank_group"])
def single_process(request):
    import torch.distributed as dist

    if request.param == "one_rank_group":
        with gloo_world_of_one():
            yield request.param
        return
    assert not dist.is_initialized()
    yield request.param


@pytest.fixture
def engine_patches():
    """Every shipped patch that wraps the FSDP engine, plus master_on_host (its wiring's condition), applied; each
    restored to its state afterwards."""
    from rlkit import patches

    chosen = [p for p in patches.shipped() if ENGINE in p.targets] + [patches.get("master_on_host")]
    assert {"no_shard", "master_on_host_verl", "rank_identity", "chunked_logprobs"} <= {p.name for p in chosen}
    was = [p.active() for p in chosen]
    yield chosen
    for patch, active in zip(chosen, was):
        patch.apply() if active else patch.revert()


def _bare_engine():
    """verl's FSDPEngine around a plain module with a gradient, as verl's CPU tests build one."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    engine = FSDPEngine.__new__(FSDPEngine)
    engine.module, engine.optimizer, engine.mode = module, torch.optim.AdamW(module.parameters(), lr=1e-2), "train"
    engine.optimizer_config = SimpleNamespace(clip_grad=0.5)
    engine.engine_config = SimpleNamespace(forward_only=False, fsdp_size=1)
    engine._is_offload_param, engine._is_offload_optimizer = True, False
    engine.scaler, engine._qat_enabled, engine.ulysses_parallel_group = None, False, None
    module(torch.randn(5, 8)).square().sum().backward()
    return engine


def _step_and_offload(engine) -> tuple[float, list[torch.Tensor]]:
    grad_norm = engine.optimizer_step()
    engine.to("cpu", model=True, optimizer=True, grad=True)
    return grad_norm, [p.detach().clone() for p in engine.module.parameters()]


def test_engine_wrappers_give_verls_results_in_one_process(single_process, engine_patches):
    for patch in engine_patches:
        patch.revert()
    stock_norm, stock_params = _step_and_offload(_bare_engine())
    for patch in engine_patches:
        patch.apply()
    norm, params = _step_and_offload(_bare_engine())
    assert norm == stock_norm and all(torch.equal(a, b) for a, b in zip(params, stock_params))


def test_the_sharding_rule_on_a_one_rank_mesh_is_verls(engine_patches):
    """no_shard changes only an (N, 1) mesh; a one-rank 1-D mesh keeps verl's FULL_SHARD / SHARD_GRAD_OP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import ShardingStrategy
    from verl.workers.engine.fsdp import transformer_impl

    with gloo_world_of_one():
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
        for patch in engine_patches:
            patch.apply()
        assert transformer_impl.get_sharding_strategy(mesh) == ShardingStrategy.FULL_SHARD
        assert transformer_impl.get_sharding_strategy(mesh, zero3_enable=False) == ShardingStrategy.SHARD_GRAD_OP
