"""Host memory per node that HostAdamW (:mod:`rlkit.optim`) holds, by component, before booking a node.

Pure arithmetic, like :mod:`rlkit.planning.budget`; the pre-flight (:mod:`rlkit.planning.preflight_memory`) holds it
against a node's available host memory and :mod:`rlkit.planning.multinode` against each node's.
"""
from __future__ import annotations

from rlkit.core.params import ParamError
from rlkit.models.shape import ModelShape


def host_adamw_bytes(shape: ModelShape, *, ranks: int, rank0_owner: bool = False, master_on_host: bool = False,
                     param_offload: bool = False, lora_rank: int = 0, overlap_copies: bool = False,
                     prefetch_grads: bool = False) -> dict[str, float]:
    """Host bytes per node that HostAdamW (:mod:`rlkit.optim`) holds for ``ranks`` ranks on the node, by component.

    What :class:`rlkit.optim.HostAdamW` allocates: on every stepping rank (rank 0 alone with ``rank0_owner``)
    ``exp_avg`` + ``exp_avg_sq`` (8 B per trainable parameter) and the fp32 master of each fp32 device parameter
    (4 B); with the ``master_on_host`` patch the parameter is host-resident on every rank and is its own master.
    The pinned staging buffers are sized to the largest flat parameter (4 B per element): "grad" on the stepping
    ranks, "param" on every rank unless the parameter is host-resident; ``overlap_copies`` keeps two of each (the
    copies of one parameter run beside the host step of the next). ``prefetch_grads`` adds a host buffer per
    parameter on each stepping rank, which holds every gradient (4 B per trainable parameter, fp32 as HostAdamW copies
    gradients down; pinned where the staging is: :mod:`rlkit.optim.prefetch`). verl's ``param_offload`` parks every
    rank's fp32 parameters on the host during rollout, next to all of that (already there with master_on_host).
    Other processes of the job (vLLM, Ray, the trainer) come on top: on the committed 2 x H200 Qwen3-4B arms
    (outputs/05_grpo_qwen3_4b/*/metrics.json, launch.host_memory) the node's peak above idle was 32-35 GiB more
    than this sum (tests/test_faults.py checks it).
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ParamError(f"ranks: must be a positive integer, got {ranks!r}. Fix: pass the GPUs per node")
    P, L = float(shape.params), float(shape.largest_flat_param)
    T = float(shape.lora_params(lora_rank)) if lora_rank else P
    steppers = 1 if rank0_owner else ranks
    buffers = 2.0 if overlap_copies else 1.0
    return {
        "adam_moments": 8.0 * T * steppers,
        "master_fp32": 4.0 * P * ranks if master_on_host else 4.0 * T * steppers,
        "staging_pinned": buffers * (4.0 * L * steppers + (0.0 if master_on_host else 4.0 * L * ranks)),
        "param_offload_fp32": 4.0 * P * ranks if param_offload and not master_on_host else 0.0,
        "prefetch_grads_pinned": 4.0 * T * steppers if prefetch_grads else 0.0,
    }
