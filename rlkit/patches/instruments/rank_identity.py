"""Instrument (not an optimization): after every verl optimizer step, check that all data-parallel
ranks hold bit-identical weights (issue 9's sanity bar: max abs diff 0.0 after each step).

With FSDP1 NO_SHARD every rank holds the whole model and must end each step with the same bits: the
gradients are all-reduced (the ``no_shard`` fix) and every rank applies the same update (or rank 0
broadcasts it, ``rank0_owner``). Without the ``no_shard`` fix the ranks drift apart, which this check
shows at step 1.

How: wraps ``FSDPEngine.optimizer_step`` (verl 0.9.1, ``verl/workers/engine/fsdp/transformer_impl.py``).
After the original step, every parameter of the engine's module is compared with rank 0's copy,
chunk by chunk (rank 0 broadcasts a chunk of at most 16 Mi elements; each rank takes ``|mine - rank 0|``),
so the extra device memory is one chunk (64 MiB in fp32). With ``master_on_host`` wired into verl the
host masters are compared (they hold the fp32 values while the flat parameters hold freed placeholders). The result (max abs diff, elements that differ
(NaN counts as differing), seconds spent) is all-reduced and appended by rank 0 to
``$RLKIT_RECORD_DIR/rank_identity-<host>-<pid>.jsonl``. It reads weights only: training is unchanged.
Its time falls inside verl's ``update_actor`` timer; it is recorded so it can be subtracted. The record
also carries the optimizer step's own wall time (clip + ``optimizer.step``) and the intra-op threads the
host step used (HostAdamW's ``host_threads``) next to torch's count in the worker, which Ray sets.
"""
from __future__ import annotations

import json
import os
import socket
import time

from rlkit.patches import Patch, replace_attr, supported

RECORD_PREFIX = "rank_identity-"
CHUNK_NUMEL = 16 * 2**20


def max_rank_difference(params, group=None, chunk_numel: int = CHUNK_NUMEL) -> tuple[float, int]:
    """(max |p - p on rank 0|, number of differing elements) over ``params``, all-reduced over ``group``."""
    import torch
    import torch.distributed as dist

    src = dist.get_global_rank(group, 0) if group is not None else 0
    worst = None
    differing = 0
    # Host tensors (masters parked by master_on_host) are compared on the GPU when there is one: NCCL is
    # far faster than gloo for 16 GB, and the extra device memory is still one chunk.
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    for p in params:
        flat = p.detach().reshape(-1)
        for start in range(0, flat.numel(), chunk_numel):
            mine = flat[start:start + chunk_numel]
            if mine.device.type == "cpu" and device is not None:
                mine = mine.to(device)
            theirs = mine.clone()
            dist.broadcast(theirs, src=src, group=group)
            diff = (mine.float() - theirs.float()).abs()
            unequal = mine != theirs  # NaN != NaN: a NaN on any rank counts as a difference
            differing += int(unequal.sum())
            local = diff.nan_to_num(nan=float("inf")).max()
            worst = local if worst is None else torch.maximum(worst, local)
    if worst is None:
        return 0.0, 0
    stats = torch.stack([worst.double(), torch.tensor(float(differing), dtype=torch.float64, device=worst.device)])
    dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=group)
    return float(stats[0]), int(stats[1])


def _host_threads(engine) -> dict:
    """Threads the host step ran with (HostAdamW) and torch's own count in this worker (Ray sets it)."""
    import torch

    return {"host_threads": getattr(getattr(engine, "optimizer", None), "host_threads", None),
            "torch_threads": torch.get_num_threads()}


def _apply():
    import torch.distributed as dist
    from verl.workers.engine.fsdp import transformer_impl

    engine_cls = transformer_impl.FSDPEngine
    original = engine_cls.optimizer_step
    calls = {"n": 0}

    def optimizer_step(self):
        step_start = time.perf_counter()
        grad_norm = original(self)
        step_seconds = time.perf_counter() - step_start  # clip + optimizer.step (HostAdamW ends synchronised)
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return grad_norm
        calls["n"] += 1
        start = time.perf_counter()
        from rlkit.patches.verl.master_on_host_verl import host_masters

        masters = host_masters(self)  # while parked, the fp32 values live in the host masters
        worst, differing = max_rank_difference(masters.masters() if masters else list(self.module.parameters()))
        seconds = time.perf_counter() - start
        record_dir = os.environ.get("RLKIT_RECORD_DIR")
        if record_dir and dist.get_rank() == 0:
            path = os.path.join(record_dir, f"{RECORD_PREFIX}{socket.gethostname()}-{os.getpid()}.jsonl")
            with open(path, "a") as f:
                f.write(json.dumps({"optimizer_step": calls["n"], "world_size": dist.get_world_size(),
                                    "max_abs_diff": worst, "differing_elements": differing,
                                    "seconds": seconds, "grad_norm": grad_norm,
                                    "optimizer_step_s": step_seconds, **_host_threads(self)}) + "\n")
        return grad_norm

    optimizer_step.__rlkit_patch__ = "rank_identity"
    return replace_attr(engine_cls, "optimizer_step", optimizer_step)


PATCH = Patch(
    name="rank_identity",
    summary="after each verl optimizer step, record max |weights - rank 0's weights| over all ranks (read-only)",
    requires=supported("verl", "torch"),
    apply_fn=_apply,
    targets=("verl.workers.engine.fsdp.transformer_impl",),
)


def read_records(record_dir) -> list[dict]:
    """All rank-identity rows written into ``record_dir``, ordered by optimizer step."""
    from pathlib import Path

    rows = []
    for path in sorted(Path(record_dir).glob(f"{RECORD_PREFIX}*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["optimizer_step"])
