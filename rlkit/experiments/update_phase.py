"""Update-phase harness: one mini-batch of fwd/bwd on a random-init Qwen3 under FSDP1 NO_SHARD, then
the optimizer step, with the optimizer as the variable (notebook 02; seed 000, Steps 2, 4, 5).

    python -m rlkit.experiments.update_phase --profile tiny|h200 [-p key=value]

The model is wrapped exactly like verl 0.9.1's FSDP1 actor: one FSDP unit per decoder layer,
``ShardingStrategy.NO_SHARD`` (the fsdp_size=1 layout of the seed), ``MixedPrecision(param_dtype=bf16,
reduce_dtype=fp32, buffer_dtype=fp32)``, ``use_orig_params=False`` (so the optimizer sees one
FlatParameter per unit), non-reentrant gradient checkpointing, ``no_sync`` on every micro-batch but
the last. Arms (``name`` or ``name@ranks``):

- ``gpu_adamw``: torch.optim.AdamW on the device with verl's arguments (the baseline; may OOM under
  the memory cap: recorded as a result, not an error),
- ``host_pageable``: HostAdamW with pageable staging buffers,
- ``host_pinned``: HostAdamW with pinned staging buffers (pinned only where CUDA exists),
- ``host_pinned_rank0``: + rank 0 owns the Adam state and broadcasts the master (needs >= 2 ranks).

Each arm runs in a fresh process (torchrun for several ranks) through :func:`rlkit.measure.launch.run_module`;
with fewer GPUs than ranks, the ranks share GPU 0 and every collective runs on gloo (NCCL refuses two
ranks on one device). ``memory_cap_gib`` emulates a smaller card through
``torch.cuda.set_per_process_memory_fraction`` (per process).

The optimizer steps ``optimizer_steps`` times on the one gradient: the first step allocates the host
state (page faults of ~48 GB for Qwen3-4B), so phases of the last step are reported as the steady
state and every step's total is kept (``step_seconds``).

Parity, per arm, on one flat parameter (``parity_param``): the parameter after the steps is compared
with torch.optim.AdamW stepped on a host copy of the same parameter and gradient (``host_reference``,
flags matching ``host_impl``: HostAdamW arms must match it exactly, max abs diff 0.0) and with
torch.optim.AdamW with verl's default flags on the model's device (``device_reference``: the
gpu_adamw arm must match it exactly; host arms within 2 ulp of the largest |param|, because the
device kernel rounds differently from the CPU one). Multi-rank arms also check that every rank ends
with bit-identical parameters (int64 checksums of the raw bits).

Building blocks reused by other experiments (signatures kept stable): :func:`init_distributed`,
:func:`build_fsdp_model`, :func:`make_minibatch`, :func:`run_fwd_bwd`, :func:`make_optimizer`,
:func:`optimizer_step`, :func:`param_checksums`.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from rlkit.core.params import ParamError, as_dict

NOTEBOOK = "02_host_adamw"
ARMS = ("gpu_adamw", "host_pageable", "host_pinned", "host_pinned_rank0")
HOST_PHASES = ("grad_checks", "grad_d2h", "host_step", "param_pack", "broadcast", "param_h2d")
OPTIMIZER_PHASES = HOST_PHASES + ("gpu_step",)
ADAMW_BYTES_PER_PARAM = 28  # fused AdamW reads p, g, m, v (16 B) and writes p, m, v (12 B) in fp32


@dataclass(frozen=True)
class Config:
    model: str  # rlkit.models.qwen preset: tiny | qwen3-735m | qwen3-4b | qwen3-8b
    device: str  # auto (cuda if available) | cuda | cpu
    arms: tuple[str, ...]  # arm names from ARMS, optionally "@<ranks>" (default 1 rank)
    num_sequences: int  # sequences in the mini-batch, all ranks together (seed: 256)
    seq_len: int  # tokens per sequence
    micro_batch_size: int  # sequences per micro-batch per rank
    gradient_checkpointing: bool  # like verl's enable_gradient_checkpointing
    lr: float  # AdamW learning rate
    weight_decay: float  # AdamW weight decay
    host_impl: str  # HostAdamW kernel: fused | foreach | forloop
    host_threads: int  # CPU threads for the host step; 0 = all cores of the machine
    check_identical_grads: bool  # HostAdamW debug assertion (checksum all-reduce) on multi-rank arms
    optimizer_steps: int  # optimizer steps on the one gradient; the last is reported (the first allocates state)
    memory_cap_gib: float  # per-process device memory cap in GiB (emulates a smaller card); 0 = none
    parity_param: int  # index of the flat parameter checked for parity (negative counts from the end)
    bench_copy_mib: int  # pinned vs pageable copy benchmark size in MiB; 0 = skip
    bench_adam_numel: int  # elements stepped in the host AdamW throughput benchmark; 0 = skip
    bench_adam_tensors: int  # ... split into this many tensors
    bench_repeats: int  # timed repetitions of each benchmark (best is reported)
    arm_timeout_s: float  # wall-clock limit per arm process
    seed: int  # model init and batch seed

    def __post_init__(self):
        if self.device not in ("auto", "cuda", "cpu"):
            raise ParamError(f"device={self.device!r}: use 'auto', 'cuda' or 'cpu'.")
        if self.host_impl not in ("fused", "foreach", "forloop"):
            raise ParamError(f"host_impl={self.host_impl!r}: use 'fused', 'foreach' or 'forloop'.")
        if not self.arms:
            raise ParamError(f"arms is empty. Fix: list at least one of {list(ARMS)}.")
        for spec in self.arms:
            name, ranks = parse_arm(spec)
            if name == "host_pinned_rank0" and ranks < 2:
                raise ParamError(f"arms: {spec!r} needs at least 2 ranks (rank 0 owns the state for the "
                                 f"others). Fix: write 'host_pinned_rank0@2'.")
            if self.num_sequences % ranks or (self.num_sequences // ranks) % self.micro_batch_size:
                raise ParamError(
                    f"num_sequences={self.num_sequences} does not split into {ranks} rank(s) x micro-batches of "
                    f"micro_batch_size={self.micro_batch_size} (arm {spec!r}). Fix: make num_sequences a "
                    f"multiple of ranks * micro_batch_size.")
        for key in ("seq_len", "micro_batch_size", "num_sequences", "optimizer_steps", "bench_repeats",
                    "bench_adam_tensors"):
            if getattr(self, key) < 1:
                raise ParamError(f"{key}={getattr(self, key)}: must be >= 1.")
        for key in ("memory_cap_gib", "host_threads", "bench_copy_mib", "bench_adam_numel", "lr", "weight_decay"):
            if getattr(self, key) < 0:
                raise ParamError(f"{key}={getattr(self, key)}: must be >= 0.")
        if self.arm_timeout_s <= 0:
            raise ParamError(f"arm_timeout_s={self.arm_timeout_s}: must be > 0 seconds.")


def parse_arm(spec: str) -> tuple[str, int]:
    """``"host_pinned_rank0@2"`` -> ``("host_pinned_rank0", 2)``; ranks default to 1."""
    name, _, ranks = spec.partition("@")
    if name not in ARMS:
        raise ParamError(f"arms: unknown arm {spec!r}. Fix: use one of {list(ARMS)}, optionally with '@<ranks>'.")
    if ranks and (not ranks.isdigit() or int(ranks) < 1):
        raise ParamError(f"arms: {spec!r} has a bad rank count {ranks!r}. Fix: write e.g. '{name}@2'.")
    return name, int(ranks or 1)


# ---------------------------------------------------------------------------------------- building blocks
@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    device: Any  # torch.device of this rank
    backend: str
    shared_gpu: bool  # several ranks on one GPU (all collectives on gloo)


def resolve_device_kind(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ParamError("device='cuda' but no CUDA device is visible. Fix: use device='auto' or 'cpu'.")
    return device


def init_distributed(device_kind: str) -> DistInfo:
    """Initialise the default process group for this process (torchrun env, or a 1-rank group).

    verl's backend is ``cpu:gloo,cuda:nccl``; when ranks outnumber GPUs they share GPU 0 and use gloo
    for everything (gloo all-reduces CUDA tensors through the host; NCCL refuses a shared device).
    """
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    shared_gpu = False
    if device_kind == "cuda":
        gpus = torch.cuda.device_count()
        shared_gpu = world > gpus
        device = torch.device("cuda", 0 if shared_gpu else local_rank)
        torch.cuda.set_device(device)
        backend = "gloo" if shared_gpu else "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend=backend, rank=rank, world_size=world)
        else:
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    return DistInfo(rank, world, device, backend, shared_gpu)


def build_fsdp_model(model: str, device, *, seed: int = 0, gradient_checkpointing: bool = True,
                     process_group=None, param_dtype=None, **model_overrides):
    """A random-init Qwen3 preset wrapped in FSDP1 exactly as verl 0.9.1 wraps the actor.

    fp32 weights built directly on ``device`` with the same seed on every rank (so ranks start
    identical without verl's ``sync_module_states`` broadcast; :func:`param_checksums` verifies it),
    one FSDP unit per decoder layer, NO_SHARD, bf16 compute (``param_dtype``) with fp32 reduce and
    buffers, ``use_orig_params=False``, non-reentrant gradient checkpointing enabled before wrapping.
    """
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from rlkit.models.qwen import build_random_model

    module = build_random_model(model, seed=seed, dtype=torch.float32, device=device, **model_overrides)
    module.config.use_cache = False
    if gradient_checkpointing:
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layer_classes = {type(layer) for layer in module.model.layers}
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=layer_classes)
    mixed = MixedPrecision(param_dtype=param_dtype or torch.bfloat16, reduce_dtype=torch.float32,
                           buffer_dtype=torch.float32)
    return FSDP(module, auto_wrap_policy=policy, device_id=device, sharding_strategy=ShardingStrategy.NO_SHARD,
                mixed_precision=mixed, sync_module_states=False, use_orig_params=False,
                process_group=process_group)


def make_minibatch(vocab_size: int, num_sequences: int, seq_len: int, *, rank: int = 0, world_size: int = 1,
                   seed: int = 0):
    """This rank's share of a deterministic random mini-batch of token ids, ``[num_sequences/world, seq_len]`` on CPU."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (num_sequences, seq_len), generator=gen)
    return tokens.chunk(world_size)[rank].contiguous()


def run_fwd_bwd(model, batch, micro_batches: int, timer, *, device=None) -> float:
    """Forward/backward over ``batch`` in ``micro_batches`` chunks, gradients accumulated like verl.

    Causal-LM loss (labels = inputs) divided by the number of micro-batches; FSDP ``no_sync`` on all
    but the last micro-batch, so gradients are all-reduced once. Returns the mean loss. Timed as the
    ``fwd_bwd`` phase of ``timer`` (anything with ``phase(name)``; None for no timing).
    """
    import torch

    device = device if device is not None else next(model.parameters()).device
    chunks = batch.chunk(micro_batches)
    total = torch.zeros((), dtype=torch.float32, device=device)
    with timer.phase("fwd_bwd") if timer is not None else nullcontext():
        for i, chunk in enumerate(chunks):
            ids = chunk.to(device, non_blocking=True)
            sync = model.no_sync() if i < len(chunks) - 1 and hasattr(model, "no_sync") else nullcontext()
            with sync:
                loss = model(input_ids=ids, labels=ids).loss / len(chunks)
                loss.backward()
            total += loss.detach().float()
    return float(total.item())


def make_optimizer(arm: str, params, *, lr: float, weight_decay: float, host_impl: str = "fused",
                   check_identical_grads: bool = False, timer=None, overlap_copies: bool = False,
                   prefetch_grads: bool = False):
    """The optimizer of ``arm``: torch AdamW as verl builds it (lr, weight_decay, betas), or HostAdamW
    (``overlap_copies``: its copies beside the host step; ``prefetch_grads``: the gradients' copy beside backward)."""
    import torch

    from rlkit.optim import HostAdamW

    betas = (0.9, 0.999)  # verl's OptimizerConfig default
    if arm == "gpu_adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=betas)
    options = {
        "host_pageable": {"pin_memory": False},
        "host_pinned": {"pin_memory": None},
        "host_pinned_rank0": {"pin_memory": None, "rank0_owner": True},
    }[arm]
    # host_threads=0: the harness sets torch's thread count per arm itself (_update_phase_rank._threads).
    return HostAdamW(params, lr=lr, weight_decay=weight_decay, betas=betas, impl=host_impl,
                     check_identical_grads=check_identical_grads, timer=timer, host_threads=0,
                     overlap_copies=overlap_copies, prefetch_grads=prefetch_grads, **options)


def optimizer_step(optimizer, timer) -> None:
    """One optimizer step; HostAdamW times its own phases (``HOST_PHASES``), others are ``gpu_step``."""
    from rlkit.optim import HostAdamW

    if isinstance(optimizer, HostAdamW):
        optimizer.timer = timer
        optimizer.step()
    else:
        with timer.phase("gpu_step") if timer is not None else nullcontext():
            optimizer.step()


def param_checksums(params) -> list[int]:
    """Exact int64 checksums of the raw bits of each parameter (equal tensors -> equal sums)."""
    from rlkit.optim.host_ranks import _bit_checksum

    return [int(_bit_checksum(p.detach())) for p in params]


# ---------------------------------------------------------------------------------------- orchestration
CHILD = "rlkit.experiments._update_phase_rank"


def run(cfg: Config) -> dict[str, Any]:
    """Run every arm and the two benchmarks, each in a fresh process; return the metrics dict."""
    from rlkit.measure.launch import LaunchError, run_module

    config = as_dict(cfg)
    arms = []
    for spec in cfg.arms:
        name, ranks = parse_arm(spec)
        try:
            row = run_module(CHILD, {"task": "arm", "arm": spec, "config": config}, nproc=ranks,
                             timeout=cfg.arm_timeout_s)
        except LaunchError as err:
            row = {"arm": spec, "name": name, "ranks": ranks, "status": "failed", "error": str(err)[-2000:]}
        except subprocess.TimeoutExpired:
            row = {"arm": spec, "name": name, "ranks": ranks, "status": "timeout",
                   "error": f"no result within arm_timeout_s={cfg.arm_timeout_s}"}
        arms.append(row)
        print(f"[update_phase] {spec}: {row['status']} {row.get('optimizer_seconds', '')}", file=sys.stderr)
    bench = run_module(CHILD, {"task": "bench", "config": config}, nproc=1, timeout=cfg.arm_timeout_s)
    return {"config": config, "arms": arms, "bench_copy": bench["copy"], "bench_adam": bench["adam"],
            "summary": summarize(arms, bench)}


def summarize(arms: list[dict], bench: dict) -> dict[str, Any]:
    """Headline numbers: parity verdicts, optimizer-phase seconds, Adam bytes per rank, copy efficiency."""
    ok = [a for a in arms if a["status"] == "ok"]
    pinned = bench["copy"].get("gbps", {})
    efficiency = {}
    for a in ok:
        bw = a.get("bandwidth_gbps", {})
        if "grad_d2h" in bw and "d2h_pinned" in pinned:
            efficiency[a["arm"]] = {"grad_d2h": bw["grad_d2h"] / pinned["d2h_pinned"],
                                    "param_h2d": bw["param_h2d"] / pinned["h2d_pinned"]}
    return {
        "parity_ok": all(a["parity"]["ok"] for a in ok) if ok else None,
        "cross_rank_identical": {a["arm"]: a["cross_rank_identical"] for a in ok if a["ranks"] > 1},
        "status": {a["arm"]: a["status"] for a in arms},
        "optimizer_seconds": {a["arm"]: a["optimizer_seconds"] for a in ok},
        "adam_state_bytes_per_rank": {a["arm"]: [r["adam_state_bytes"] for r in a["per_rank"]] for a in ok},
        "transfer_efficiency_vs_pinned_bench": efficiency,
        "host_step_vs_torch_fused": bench["adam"].get("ratio_torch_over_host"),
    }


def describe(metrics: dict[str, Any]) -> str:
    """The notebook's findings: each arm's parity with torch's AdamW, its optimizer seconds and Adam bytes, the benchmarks, in plain sentences, every number read from ``metrics`` (:func:`rlkit.experiments.prose.host_adamw`)."""
    from rlkit.experiments.prose import host_adamw

    return host_adamw(metrics)


# ---------------------------------------------------------------------------------------- notebook views
def arms_table(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per arm for a DataFrame: phase seconds, memory, Adam GiB per rank, parity."""
    from rlkit.measure.samplers import GIB

    rows = []
    for a in metrics["arms"]:
        row = {"arm": a["arm"], "status": a["status"]}
        if a["status"] == "oom":
            row["oom_phase"] = a.get("oom_phase")
        phases = a.get("phases", {})
        for name in ("fwd_bwd",) + OPTIMIZER_PHASES:
            if name in phases:
                row[f"{name}_s"] = phases[name]["seconds"]
        if a["status"] == "ok":
            row["optimizer_s"] = a["optimizer_seconds"]
            for r in a["per_rank"]:
                row[f"adam_gib_rank{r['rank']}"] = r["adam_state_bytes"] / GIB
            row["host_peak_rss_gib"] = max(r["host_peak_rss_gib"] for r in a["per_rank"])
            row["parity_host_ref_max_abs"] = a["parity"]["host_reference"]["max_abs_diff"]
            row["parity_device_ref_max_abs"] = a["parity"]["device_reference"]["max_abs_diff"]
            row["parity_ok"] = a["parity"]["ok"]
        if "peak_device_gib" in a:
            row["peak_device_gib"] = a["peak_device_gib"]
        rows.append(row)
    return rows


def phase_figure(metrics: dict[str, Any]):
    """Plotly stacked bars: seconds per optimizer phase for every arm that finished."""
    import plotly.graph_objects as go

    ok = [a for a in metrics["arms"] if a["status"] == "ok"]
    fig = go.Figure()
    for name in OPTIMIZER_PHASES:
        ys = [a["phases"].get(name, {}).get("seconds", 0.0) for a in ok]
        if any(ys):
            fig.add_bar(name=name, x=[a["arm"] for a in ok], y=ys)
    fig.update_layout(barmode="stack", title="Optimizer phase: seconds per phase", yaxis_title="seconds")
    return fig


def memory_figure(metrics: dict[str, Any]):
    """Plotly grouped bars: Adam state GiB per rank, host peak RSS and peak device memory per arm."""
    import plotly.graph_objects as go

    from rlkit.measure.samplers import GIB

    ok = [a for a in metrics["arms"] if a["status"] == "ok"]
    fig = go.Figure()
    ranks = sorted({r["rank"] for a in ok for r in a["per_rank"]})
    for rank in ranks:
        fig.add_bar(name=f"Adam state rank {rank}", x=[a["arm"] for a in ok],
                    y=[next((r["adam_state_bytes"] / GIB for r in a["per_rank"] if r["rank"] == rank), 0.0)
                       for a in ok])
    fig.add_bar(name="host peak RSS (max rank)", x=[a["arm"] for a in ok],
                y=[max(r["host_peak_rss_gib"] for r in a["per_rank"]) for a in ok])
    fig.add_bar(name="peak device", x=[a["arm"] for a in ok], y=[a["peak_device_gib"] for a in ok])
    fig.update_layout(barmode="group", title="Memory per arm", yaxis_title="GiB")
    return fig


if __name__ == "__main__":
    from rlkit.experiments import experiment_main

    sys.exit(experiment_main(Config, run, NOTEBOOK))
