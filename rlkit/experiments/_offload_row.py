"""Child process of :mod:`rlkit.experiments.offload_bug`: one measured row, or one grad-sync run.

Launched by :func:`rlkit.measure.launch.run_module` in a fresh process (``task="offload_row"``, one rank) or
under torchrun (``task="grad_sync"``, two ranks), so no row inherits another row's device memory.
Imports only torch, transformers and rlkit; verl is used when it is installed.
"""
from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from typing import Any

import torch
import torch.distributed as dist

from rlkit.measure.launch import child_main
from rlkit.measure.samplers import GIB

# verl 0.9.1 wraps FSDP1 with these (transformer_impl.py: bf16 params, fp32 reduce, fp32 buffers).
PARAM_DTYPE, REDUCE_DTYPE, BUFFER_DTYPE = torch.bfloat16, torch.float32, torch.float32


# ---------------------------------------------------------------------------------------------------
# Building the FSDP1 model the way verl does
# ---------------------------------------------------------------------------------------------------

def wrap_fsdp1(model, *, device: torch.device, use_orig_params: bool, sharding_strategy, device_mesh=None):
    """FSDP1 wrapping as verl's engine does it: one unit per decoder layer, bf16/fp32/fp32 mixed precision."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    layer_classes = {type(layer) for layer in model.model.layers}
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_classes)
    return FSDP(
        model,
        auto_wrap_policy=policy,
        device_id=device,
        sharding_strategy=sharding_strategy,
        mixed_precision=MixedPrecision(param_dtype=PARAM_DTYPE, reduce_dtype=REDUCE_DTYPE, buffer_dtype=BUFFER_DTYPE),
        # verl syncs from rank 0; FSDP1 refuses that for CPU modules, where the seeded init is identical anyway.
        sync_module_states=device.type != "cpu",
        device_mesh=device_mesh,
        use_orig_params=use_orig_params,
    )


def fsdp_handles(fsdp_model) -> list:
    """The flat-parameter handles of every FSDP unit, in module order (no lazy init needed)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [m._handle for m in FSDP.fsdp_modules(fsdp_model) if m._handle is not None]


def token_batch(vocab_size: int, batch: int, tokens: int, seed: int, device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (batch, tokens), generator=generator).to(device)


# ---------------------------------------------------------------------------------------------------
# Where do the module's parameter views point?
# ---------------------------------------------------------------------------------------------------

def view_report(fsdp_model) -> dict[str, Any]:
    """Classify every module parameter attribute of every FSDP handle by the storage it points at.

    ``on_flat_param``: shares storage with the handle's current flat parameter (healthy).
    ``freed``: points at a storage FSDP has resized to 0 bytes (the bf16 compute copy after forward).
    ``stale``: points at some other live storage, which it keeps alive (the bug).
    """
    counts = {"on_flat_param": 0, "freed": 0, "stale": 0}
    stale_storages: dict[int, int] = {}
    dtypes: set[str] = set()
    for handle in fsdp_handles(fsdp_model):
        flat_param = handle.flat_param
        flat_ptr = flat_param.untyped_storage().data_ptr()
        infos = [(i.param_name, i.module) for i in flat_param._param_infos]
        infos += [(i.param_name, i.module) for i in flat_param._shared_param_infos]
        for param_name, module in infos:
            tensor = getattr(module, param_name)
            storage = tensor.untyped_storage()
            dtypes.add(str(tensor.dtype).removeprefix("torch."))
            if storage.nbytes() == 0:
                counts["freed"] += 1
            elif storage.data_ptr() == flat_ptr:
                counts["on_flat_param"] += 1
            else:
                counts["stale"] += 1
                stale_storages[storage.data_ptr()] = storage.nbytes()
    return {
        "views": sum(counts.values()),
        **{f"views_{k}": v for k, v in counts.items()},
        "stale_view_gib": sum(stale_storages.values()) / GIB,
        "view_dtypes": sorted(dtypes),
    }


@contextlib.contextmanager
def emulated_device_moves():
    """Make every ``FlatParamHandle.flat_param_to`` copy into new storage, as a real device move does.

    On a CPU-only machine "offload to cpu" is a no-op ``.to()`` returning the same storage, which
    would hide the mechanism. Forcing ``copy=True`` inside the original torch method reproduces what
    a CUDA->CPU move does to storage; a patch applied inside this context wraps the copying method.
    """
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    original = FlatParamHandle.flat_param_to

    def moving_flat_param_to(self, *args, **kwargs):
        return original(self, *args, **{**kwargs, "copy": True})

    FlatParamHandle.flat_param_to = moving_flat_param_to
    try:
        yield
    finally:
        FlatParamHandle.flat_param_to = original


# ---------------------------------------------------------------------------------------------------
# Offload / reload: verl's own functions when verl is installed, else a copy of verl 0.9.1's loop
# ---------------------------------------------------------------------------------------------------

@torch.no_grad()
def _rlkit_offload_to_cpu(model) -> None:
    """rlkit's copy of verl 0.9.1 ``offload_fsdp_model_to_cpu`` (FSDP1 branch), for machines without verl."""
    from torch.distributed.fsdp._runtime_utils import _lazy_init

    _lazy_init(model, model)
    for handle in model._all_handles:
        if handle._offload_params:
            continue
        handle.flat_param_to(torch.device("cpu"), non_blocking=True)
        handle.flat_param._local_shard = handle.flat_param.data
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@torch.no_grad()
def _rlkit_load_to_device(model, device: torch.device) -> None:
    """rlkit's copy of verl 0.9.1 ``load_fsdp_model_to_gpu`` (FSDP1 branch)."""
    from torch.distributed.fsdp._runtime_utils import _lazy_init

    _lazy_init(model, model)
    for handle in model._all_handles:
        if handle._offload_params:
            continue
        handle.flat_param_to(device, non_blocking=True)
        handle.flat_param._local_shard = handle.flat_param.data


def offload_functions(device: torch.device):
    """(offload, reload, offload_impl, reload_impl): verl's functions where they can run here."""
    try:
        from verl.utils import fsdp_utils
    except ImportError:
        fsdp_utils = None
    rlkit_copy = "rlkit copy of verl 0.9.1 {} (verl not installed)"
    if fsdp_utils is None:
        return (_rlkit_offload_to_cpu, functools.partial(_rlkit_load_to_device, device=device),
                rlkit_copy.format("offload_fsdp_model_to_cpu"), rlkit_copy.format("load_fsdp_model_to_gpu"))
    offload_impl = "verl.utils.fsdp_utils.offload_fsdp_model_to_cpu"
    if device.type == "cuda":
        return (fsdp_utils.offload_fsdp_model_to_cpu, fsdp_utils.load_fsdp_model_to_gpu,
                offload_impl, "verl.utils.fsdp_utils.load_fsdp_model_to_gpu")
    # verl's loader asks the accelerator for its device index, which fails on a CPU-only machine.
    return (fsdp_utils.offload_fsdp_model_to_cpu, functools.partial(_rlkit_load_to_device, device=device),
            offload_impl, "rlkit copy of verl 0.9.1 load_fsdp_model_to_gpu (verl's needs an accelerator)")


# ---------------------------------------------------------------------------------------------------
# Tasks
# ---------------------------------------------------------------------------------------------------

def _init_single_rank_group(backend: str) -> None:
    rendezvous = os.path.join(tempfile.mkdtemp(prefix="rlkit-pg-"), "rendezvous")
    dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=0, world_size=1)


def _allocated_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None  # CPU rows check the mechanism (view storages), not bytes
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() / GIB


def _determinism(config: dict[str, Any]) -> dict[str, Any]:
    from rlkit.measure import determinism

    return determinism.enable(config["seed"]) if config["deterministic"] else determinism.settings(seed=config["seed"])


TRAIN_LR = 1e-3  # the one AdamW step after the reload (torch's defaults otherwise)


def train_step(fsdp, input_ids: torch.Tensor) -> float:
    """One optimizer step of the reloaded model (causal-LM loss on ``input_ids``, torch AdamW): what the
    actor does right after verl reloads it. Returns the loss."""
    fsdp.train()
    optimizer = torch.optim.AdamW(fsdp.parameters(), lr=TRAIN_LR)
    loss = fsdp(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    fsdp.eval()
    return float(loss.detach())


def after_reload(fsdp, input_ids: torch.Tensor, row: dict[str, Any], *, repeat: bool) -> dict[str, Any]:
    """What the reloaded model computes: logits, then one train step, then logits and weights again.

    Returns ``{"row": tensors, "repeat": tensors or None}`` with ``logits_after_reload``,
    ``logits_after_step`` and ``weight_probes`` (:func:`rlkit.measure.determinism.probe` of every flat parameter
    after the step); ``row`` gets the train loss and the exact int64 checksums of the weights after the
    step (``weight_checksums_after_step``). With ``repeat`` the same work runs a second time from the same
    weights (restored bit for bit, a fresh optimizer): the unpatched computation against itself on this
    device, the yardstick for the fixed row's difference from it.
    """
    from rlkit.measure import determinism
    from rlkit.optim.host_ranks import _bit_checksum

    flat_params = [h.flat_param for h in fsdp_handles(fsdp)]
    start = [p.detach().clone() for p in flat_params] if repeat else None
    out: dict[str, Any] = {"row": {}, "repeat": {} if repeat else None}
    for name, tensors in out.items():
        if tensors is None:
            continue
        if name == "repeat":
            with torch.no_grad():
                for p, saved in zip(flat_params, start):
                    p.copy_(saved)
        with torch.no_grad():
            tensors["logits_after_reload"] = fsdp(input_ids=input_ids).logits.float().cpu()
        loss = train_step(fsdp, input_ids)
        with torch.no_grad():
            tensors["logits_after_step"] = fsdp(input_ids=input_ids).logits.float().cpu()
        tensors["weight_probes"] = [determinism.probe(p) for p in flat_params]
        checksums = [int(_bit_checksum(p.detach())) for p in flat_params]
        if name == "row":
            row["train_loss"], row["weight_checksums_after_step"] = loss, checksums
        else:
            row["repeat_train_loss"], row["repeat_weight_checksums_after_step"] = loss, checksums
    return out


def _round_trip(fsdp, input_ids: torch.Tensor, row: dict[str, Any], offload, reload, *, forward_first: bool,
                device: torch.device) -> None:
    """(A forward,) offload, reload: the allocated memory and the views after each step, into ``row``."""
    if forward_first:
        with torch.no_grad():
            fsdp(input_ids=input_ids)
        row["after_forward_gib"] = _allocated_gib(device)
    row["before_offload"] = view_report(fsdp)
    offload(fsdp)
    row["after_offload_gib"] = _allocated_gib(device)
    row["after_offload"] = view_report(fsdp)
    reload(fsdp)
    row["after_reload_gib"] = _allocated_gib(device)
    row["after_reload"] = view_report(fsdp)


def offload_row(config: dict[str, Any]) -> dict[str, Any]:
    """One row: wrap, (forward,) offload, reload, then :func:`after_reload` (an unfixed row twice)."""
    from torch.distributed.fsdp import ShardingStrategy

    from rlkit.measure import determinism
    from rlkit.models.qwen import build_random_model
    from rlkit.patches.fsdp import offload_views

    settings = _determinism(config)
    device = torch.device("cuda", 0) if config["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _init_single_rank_group("nccl" if device.type == "cuda" else "gloo")
    stack = contextlib.ExitStack()
    if device.type == "cpu":
        stack.enter_context(emulated_device_moves())
    with stack:
        offload, reload, offload_impl, reload_impl = offload_functions(device)  # may import verl + its plugins
        if offload_views.active():
            raise RuntimeError("offload_views was applied on import (RLKIT_PATCHES?); each row must choose the fix itself")
        if config["fix"]:
            offload_views.apply()
        # fp32 random init on the host, moved by FSDP's device_id, as verl builds its actor.
        model = build_random_model(config["model"], seed=config["seed"])
        n_params = sum(p.numel() for p in model.parameters())
        vocab_size = model.config.vocab_size
        fsdp = wrap_fsdp1(model, device=device, use_orig_params=config["use_orig_params"],
                          sharding_strategy=ShardingStrategy.NO_SHARD)
        model_gib = sum(h.flat_param.numel() * h.flat_param.element_size() for h in fsdp_handles(fsdp)) / GIB
        row: dict[str, Any] = {
            "status": "ok",
            "use_orig_params": config["use_orig_params"],
            "forward_first": config["forward_first"],
            "fix": config["fix"],
            "device": str(device),
            "memory_measured": device.type == "cuda",
            "model_params": n_params,
            "model_gib": model_gib,
            "after_wrap_gib": _allocated_gib(device),
            "after_forward_gib": None,
            "offload_impl": offload_impl,
            "reload_impl": reload_impl,
            "emulated_device_move": device.type == "cpu",
            "determinism": settings,
        }
        input_ids = token_batch(vocab_size, 1, config["forward_tokens"], config["seed"] + 1, device)
        _round_trip(fsdp, input_ids, row, offload, reload, forward_first=config["forward_first"], device=device)
        # The round trip must not change what the model computes, nor how it trains: the parent compares
        # these across rows (fix off vs on) for bit-equality, and an unfixed row against its own repeat.
        with determinism.recording_nondeterministic_op(row):
            torch.save(after_reload(fsdp, input_ids, row, repeat=not config["fix"]), config["tensors_path"])
        row["patches_active"] = offload_views.active()
        offload_views.revert()
    dist.destroy_process_group()
    return row


def grad_sync(config: dict[str, Any]) -> dict[str, Any] | None:
    """Two ranks, (2, 1) mesh, different micro-batches: do the gradients agree after backward?"""
    from torch.distributed.device_mesh import init_device_mesh

    from rlkit.models.qwen import build_random_model
    from rlkit.patches.fsdp.no_shard import sharding_strategy_for_mesh

    device_type = config["device"]
    settings = _determinism(config)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    # verl's create_device_mesh(world_size, fsdp_size=1)
    mesh = init_device_mesh(device_type, (world_size, 1), mesh_dim_names=("ddp", "fsdp"))
    strategy = sharding_strategy_for_mesh(mesh, fixed=config["fix"])
    model = build_random_model(config["model"], seed=config["seed"])
    fsdp = wrap_fsdp1(model, device=device, use_orig_params=False, sharding_strategy=strategy, device_mesh=mesh)
    input_ids = token_batch(model.config.vocab_size, config["batch"], config["tokens"],
                            config["seed"] + 1000 + rank, device)
    loss = fsdp(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    grads = torch.cat([h.flat_param.grad.detach().float().reshape(-1) for h in fsdp_handles(fsdp)])
    gathered = [torch.empty_like(grads) for _ in range(world_size)]
    dist.all_gather(gathered, grads)
    losses = [torch.zeros(1, device=device) for _ in range(world_size)]
    dist.all_gather(losses, loss.detach().float().reshape(1))
    result = {
        "fix": config["fix"],
        "requested_strategy": strategy.name,
        "effective_strategy": fsdp_handles(fsdp)[0]._sharding_strategy.name,
        "grad_reduce_group_size": fsdp.process_group.size(),
        "max_abs_grad_diff": max((g - gathered[0]).abs().max().item() for g in gathered[1:]),
        "max_abs_grad": grads.abs().max().item(),
        "rank_losses": [x.item() for x in losses],
        "grad_numel": grads.numel(),
        "determinism": settings,
    }
    dist.barrier()  # no rank tears gloo down while its peer is still communicating
    dist.destroy_process_group()
    return result if rank == 0 else None


TASKS = {"offload_row": offload_row, "grad_sync": grad_sync}


def main(config: dict[str, Any]) -> dict[str, Any] | None:
    return TASKS[config["task"]](config)


if __name__ == "__main__":
    child_main(main)
