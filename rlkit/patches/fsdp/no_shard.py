"""Give an (N, 1) device mesh NO_SHARD over its N-rank replicate group, so FSDP1 all-reduces gradients.

verl builds a 2-D ``("ddp", "fsdp")`` mesh of shape ``(world_size, 1)`` for ``fsdp_size=1`` and its
``get_sharding_strategy`` answers HYBRID_SHARD for every 2-D mesh. FSDP1's hybrid path shards over
mesh dim 1 (one rank) and replicates over dim 0; seeing a one-rank shard group it silently switches
to NO_SHARD over that one-rank group, so ``_reduce_grad_no_shard`` all-reduces over a group of one:
the ranks never exchange gradients and train different models (verl #7493, PyTorch #154888, both
closed without a fix). Asking for NO_SHARD directly makes FSDP1 take its non-hybrid path, which
uses mesh dim 0, the N-rank replicate group.

:func:`sharding_strategy_for_mesh` is the single rule, usable without verl (the experiment builds the
bugged and fixed wrapping from it on a machine without verl); the patch routes verl's by-name import
``verl.workers.engine.fsdp.transformer_impl.get_sharding_strategy`` through it.
"""
from __future__ import annotations

from rlkit.patches import Patch, import_target, replace_attr, supported

VERL_ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"


def is_replicate_only(mesh) -> bool:
    """A 2-D mesh whose shard dimension (dim 1) has a single rank: pure data parallelism."""
    return mesh.ndim == 2 and mesh.size(1) == 1


def sharding_strategy_for_mesh(mesh, *, fixed: bool, zero3_enable: bool = True):
    """The FSDP1 strategy verl 0.9.1 requests for ``mesh`` (``fixed=False``), or the corrected one.

    verl's rule: 1-D -> FULL_SHARD (SHARD_GRAD_OP without zero3), 2-D -> HYBRID_SHARD
    (_HYBRID_SHARD_ZERO2). The fix changes only the (N, 1) case, to NO_SHARD.
    """
    from torch.distributed.fsdp import ShardingStrategy

    if fixed and is_replicate_only(mesh):
        return ShardingStrategy.NO_SHARD
    if mesh.ndim == 1:
        return ShardingStrategy.FULL_SHARD if zero3_enable else ShardingStrategy.SHARD_GRAD_OP
    if mesh.ndim == 2:
        return ShardingStrategy.HYBRID_SHARD if zero3_enable else ShardingStrategy._HYBRID_SHARD_ZERO2
    raise NotImplementedError(f"device mesh ndim={mesh.ndim}; verl supports only 1 or 2")


def _apply():
    engine = import_target("no_shard", VERL_ENGINE_MODULE,
                           "install rlkit's [verl] extra (verl==0.9.1), or, without verl, build the FSDP wrapping "
                           "with rlkit.patches.fsdp.no_shard.sharding_strategy_for_mesh(mesh, fixed=True)")
    original = engine.get_sharding_strategy

    def get_sharding_strategy(device_mesh, zero3_enable=True):
        if is_replicate_only(device_mesh):
            return sharding_strategy_for_mesh(device_mesh, fixed=True, zero3_enable=zero3_enable)
        return original(device_mesh, zero3_enable=zero3_enable)

    get_sharding_strategy.__doc__ = original.__doc__
    get_sharding_strategy.__rlkit_patch__ = "no_shard"
    return replace_attr(engine, "get_sharding_strategy", get_sharding_strategy)


PATCH = Patch(
    name="no_shard",
    summary="verl fsdp_size=1: NO_SHARD over the replicate group instead of HYBRID_SHARD clamped to a 1-rank group",
    requires=supported("verl", "torch"),
    apply_fn=_apply,
    targets=(VERL_ENGINE_MODULE,),
)

apply = PATCH.apply
revert = PATCH.revert
active = PATCH.active
