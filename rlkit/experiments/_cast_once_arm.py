"""One arm of :mod:`rlkit.experiments.cast_once` in a fresh process: the FSDP model with the arm's patches, its
HostAdamW, ``steps`` measured training steps (casts counted, peaks, checksums), the final masters' probes.

Launched by :func:`rlkit.experiments.cast_once.run` through :func:`rlkit.measure.launch.run_module`; never
imported by the notebook kernel.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from rlkit.experiments.cast_once import ARMS, Config
from rlkit.measure import determinism


def run_arm(message: dict[str, Any]) -> dict[str, Any]:
    import torch

    from rlkit import patches
    from rlkit.core import params as P
    from rlkit.experiments import update_phase as U
    from rlkit.measure.samplers import GIB, host_peak_rss_gib
    from rlkit.patches.instruments.cast_count import CastCounter

    cfg = P.build(Config, message["config"], where="cast_once config")
    arm = message["arm"]
    spec = ARMS[arm]
    info = U.init_distributed(U.resolve_device_kind(cfg.device))
    torch.set_num_threads(cfg.host_threads or os.cpu_count() or 1)
    settings = determinism.enable(cfg.seed) if cfg.deterministic else determinism.settings(seed=cfg.seed)
    if cfg.memory_cap_gib and info.device.type == "cuda":
        total = torch.cuda.get_device_properties(info.device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.memory_cap_gib * GIB / total), info.device)
    patches.apply([n for n in ("master_on_host", "cast_once") if spec[n]])
    model, params, optimizer, masters = _arm_model(cfg, spec, info.device)
    result: dict[str, Any] = {
        "arm": arm, "status": "ok", "device": str(info.device), "patches": patches.active(),
        "num_flat_params": len(params), "num_params": sum(p.numel() for p in params),
        "micro_batches": cfg.micro_batches, "steps": [], "determinism": settings,
        "device_allocated_before_step1_gib": torch.cuda.memory_allocated(info.device) / GIB
        if info.device.type == "cuda" else 0.0,
    }
    counter = CastCounter()
    progress = {"stage": "fwd_bwd"}  # where an out-of-memory error stopped the arm
    probes: dict[str, Any] = {"grads": [], "masters": []}  # for max abs differences between arms (parent)
    try:
        with counter.active(), determinism.recording_nondeterministic_op(result):
            for step in range(1, cfg.steps + 1):
                row = _arm_step(cfg, spec, step, (model, params, optimizer, masters), counter, probes, progress)
                result["steps"].append(row)
                print(f"[cast_once] arm {arm} step {step}: loss {row['loss']:.6f} casts {row['casts']['casts']} "
                      f"step {row['step_seconds']:.2f}s peak {row['peak_device_gib']:.2f} GiB", file=sys.stderr)
    except torch.OutOfMemoryError as err:
        result.update(status="oom", oom_phase=progress["stage"], error=str(err).splitlines()[0][:500])
    if result["status"] == "ok":
        _record_masters(result, probes, params, masters, message["probe_path"])
    result["host_peak_rss_gib"] = host_peak_rss_gib()
    result["host_master_gib"] = masters.host_bytes() / GIB if masters is not None else 0.0
    patches.revert_all()
    return result


def _arm_model(cfg: Config, spec: dict[str, bool], device):
    """The FSDP model of an arm, its flat parameters, its HostAdamW and, with ``master_on_host``, its host masters."""
    from rlkit.experiments import update_phase as U
    from rlkit.optim.host_adamw import HostAdamW
    from rlkit.patches.fsdp.master_on_host import HostMasters

    model = U.build_fsdp_model(cfg.model, device, seed=cfg.seed, gradient_checkpointing=cfg.gradient_checkpointing)
    params = list(model.parameters())
    if not spec["master_on_host"]:
        optimizer = U.make_optimizer("host_pinned", params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                     host_impl=cfg.host_impl)
        return model, params, optimizer, None
    masters = HostMasters(model)
    masters.park()
    optimizer = HostAdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999), impl=cfg.host_impl,
                          pin_memory=None, host_threads=0)  # exposed() masters are host fp32: stepped in place;
    # host_threads 0: torch's count, which run_arm set from cfg
    return model, params, optimizer, masters


def _arm_step(cfg: Config, spec: dict[str, bool], step: int, arm, counter, probes: dict[str, Any],
              progress: dict[str, str]) -> dict[str, Any]:
    """One training step of an arm (forward/backward over the micro-batches, then the optimizer), measured."""
    import torch

    from rlkit.experiments import update_phase as U
    from rlkit.measure.samplers import PhaseTimer
    from rlkit.optim.host_ranks import _bit_checksum
    from rlkit.patches.fsdp import cast_once

    model, params, optimizer, masters = arm
    batch = U.make_minibatch(model.config.vocab_size, cfg.num_sequences, cfg.seq_len, seed=cfg.seed + step)
    timer = PhaseTimer()
    progress["stage"] = "fwd_bwd"
    loss = U.run_fwd_bwd(model, batch, cfg.micro_batches, timer)
    # Checks between backward and the step, outside the timed phases.
    resident_diff = cast_once.resident_vs_master_max_abs_diff(model) if spec["cast_once"] else None
    grad_checksums = [int(_bit_checksum(p.grad)) for p in params]
    probes["grads"].append([determinism.probe(p.grad) for p in params])
    grad_norm = sum(float(torch.linalg.vector_norm(p.grad)) ** 2 for p in params) ** 0.5
    progress["stage"] = "optimizer_step"
    optimizer.timer = None  # one "optimizer" phase; nested phases would reset the peak counter
    with timer.phase("optimizer"):
        if masters is not None:
            masters.step(optimizer)
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    casts = counter.take()
    phases = timer.as_dict()
    return {
        "step": step,
        "loss": loss,
        "grad_norm": grad_norm,
        "grad_checksums": grad_checksums,
        "resident_max_abs_diff": resident_diff,
        "casts": casts.as_dict(),
        "fwd_bwd_seconds": phases["fwd_bwd"]["seconds"],
        "optimizer_seconds": phases["optimizer"]["seconds"],
        "step_seconds": phases["fwd_bwd"]["seconds"] + phases["optimizer"]["seconds"],
        "peak_device_gib": max(v["peak_device_gib"] for v in phases.values()),
        "fwd_bwd_peak_device_gib": phases["fwd_bwd"]["peak_device_gib"],
        "resident_copies_after_step": sum(cast_once.is_resident(h) for h in _handles(model)),
    }


def _record_masters(result: dict[str, Any], probes: dict[str, Any], params, masters, probe_path) -> None:
    """The final masters' checksums into ``result``; every probe saved for the parent's comparisons."""
    import torch

    from rlkit.optim.host_ranks import _bit_checksum

    sources = [masters.host_master(h) for h in masters.handles] if masters is not None else params
    result["master_checksums"] = [int(_bit_checksum(t.detach())) for t in sources]
    probes["masters"] = [determinism.probe(t) for t in sources]
    torch.save(probes, probe_path)


def _handles(model) -> list:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return [m._handle for m in FSDP.fsdp_modules(model) if m._handle is not None]


if __name__ == "__main__":
    from rlkit.measure.launch import child_main

    child_main(run_arm)
