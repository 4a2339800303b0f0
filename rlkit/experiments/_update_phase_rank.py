"""Process entry of the update-phase harness (one rank of one arm, or the benchmarks).

Launched by :func:`rlkit.experiments.update_phase.run` through :func:`rlkit.measure.launch.run_module`; never
imported by a notebook kernel. Imports only torch/transformers (the GPU node has no verl).
"""
from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from rlkit.core import params as P
from rlkit.experiments import update_phase as U
from rlkit.measure.launch import child_main
from rlkit.measure.samplers import GIB, PhaseTimer, host_peak_rss_gib


def main(message: dict[str, Any]) -> dict[str, Any]:
    cfg = P.build(U.Config, message["config"], where="update_phase config")
    if message["task"] == "bench":
        return {"copy": bench_copy(cfg), "adam": bench_adam(cfg)}
    return run_arm(cfg, message["arm"])


def _threads(cfg: U.Config, per_rank_share: int) -> int:
    threads = max(1, (cfg.host_threads or os.cpu_count() or 1) // per_rank_share)
    torch.set_num_threads(threads)
    return threads


def run_arm(cfg: U.Config, spec: str) -> dict[str, Any]:
    name, ranks = U.parse_arm(spec)
    info = U.init_distributed(U.resolve_device_kind(cfg.device))
    if info.world_size != ranks:
        raise RuntimeError(f"arm {spec!r} expects {ranks} ranks, the launcher started {info.world_size}")
    # The rank-0 owner does all host work alone; replicated arms share the cores between ranks.
    threads = _threads(cfg, 1 if name == "host_pinned_rank0" else ranks)
    if cfg.memory_cap_gib and info.device.type == "cuda":
        total = torch.cuda.get_device_properties(info.device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cfg.memory_cap_gib * GIB / total), info.device)
    timer = PhaseTimer()  # build and fwd_bwd; each optimizer step gets its own timer
    step_timers: list[PhaseTimer] = []
    result: dict[str, Any] = {
        "arm": spec, "name": name, "ranks": ranks, "status": "ok", "device": str(info.device),
        "backend": info.backend, "shared_gpu": info.shared_gpu, "threads": threads,
    }
    stage = "build"
    optimizer = None
    try:
        with timer.phase("build"):
            model = U.build_fsdp_model(cfg.model, info.device, seed=cfg.seed,
                                       gradient_checkpointing=cfg.gradient_checkpointing)
        params = list(model.parameters())
        result["num_flat_params"] = len(params)
        result["num_params"] = sum(p.numel() for p in params)
        if ranks > 1 and not _identical_across_ranks(U.param_checksums(params)):
            raise RuntimeError("ranks built different initial weights; the harness relies on identical seeds")
        optimizer = U.make_optimizer(name, params, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                     host_impl=cfg.host_impl,
                                     check_identical_grads=cfg.check_identical_grads and ranks > 1)
        batch = U.make_minibatch(model.config.vocab_size, cfg.num_sequences, cfg.seq_len,
                                 rank=info.rank, world_size=ranks, seed=cfg.seed)
        stage = "fwd_bwd"
        result["loss"] = U.run_fwd_bwd(model, batch, batch.shape[0] // cfg.micro_batch_size, timer)
        probe = params[cfg.parity_param] if -len(params) <= cfg.parity_param < len(params) else None
        if probe is None:
            raise ValueError(f"parity_param={cfg.parity_param} but the model has {len(params)} flat parameters. "
                             f"Fix: pick an index in [-{len(params)}, {len(params) - 1}].")
        before = (probe.detach().to("cpu", copy=True), probe.grad.detach().to("cpu", copy=True))
        stage = "optimizer_step"
        for _ in range(cfg.optimizer_steps):
            step_timers.append(PhaseTimer())
            U.optimizer_step(optimizer, step_timers[-1])
        optimizer.zero_grad(set_to_none=True)
        stage = "parity"
        result["parity"] = _parity(cfg, name, probe, *before)
        result["cross_rank_identical"] = _identical_across_ranks(U.param_checksums(params)) if ranks > 1 else None
    except torch.OutOfMemoryError as err:
        result.update(status="oom", oom_phase=stage, error=str(err).splitlines()[0][:500])
    _record_timings(result, timer, step_timers, moved=info.device.type == "cuda")
    result["per_rank"] = _gather_rank_reports(info, optimizer, result["peak_device_gib"])
    if info.world_size > 1:
        dist.barrier()  # no rank tears gloo down while its peer is still communicating (else: SIGABRT at exit)
    dist.destroy_process_group()
    return result


def _record_timings(result: dict[str, Any], timer: PhaseTimer, step_timers: list[PhaseTimer], *, moved: bool) -> None:
    """Each phase's time and peak into ``result``: build, fwd_bwd and the last optimizer step; every step's optimizer
    seconds; the device peak over all of them; and, for an arm that ran, its bandwidth."""
    phases = {**timer.as_dict(), **(step_timers[-1].as_dict() if step_timers else {})}
    result["phases"] = phases  # build, fwd_bwd and the last optimizer step
    result["step_seconds"] = [sum(t.seconds.get(p, 0.0) for p in U.OPTIMIZER_PHASES) for t in step_timers]
    result["first_step_phases"] = step_timers[0].as_dict() if step_timers else {}
    result["optimizer_seconds"] = result["step_seconds"][-1] if step_timers else 0.0
    result["peak_device_gib"] = max((v["peak_device_gib"] for t in [timer, *step_timers]
                                     for v in t.as_dict().values()), default=0.0)
    if result["status"] == "ok":
        result["bandwidth_gbps"] = _bandwidth(phases, result["num_params"], moved=moved)


def _identical_across_ranks(checksums: list[int]) -> bool:
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, checksums)
    return all(g == gathered[0] for g in gathered)


def _gather_rank_reports(info: U.DistInfo, optimizer, peak_device_gib: float) -> list[dict[str, Any]]:
    report = {"rank": info.rank, "host_peak_rss_gib": host_peak_rss_gib(), "peak_device_gib": peak_device_gib,
              "adam_state_bytes": 0, "adam_state_params": 0}
    if hasattr(optimizer, "memory_report"):
        report.update(optimizer.memory_report())
    elif optimizer is not None:  # torch AdamW: its state lives on the device
        report["adam_state_bytes"] = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                                         for t in s.values() if torch.is_tensor(t))
        report["adam_state_params"] = len(optimizer.state)
    gathered: list[Any] = [None] * info.world_size
    dist.all_gather_object(gathered, report)
    return gathered


def _bandwidth(phases: dict[str, Any], num_params: int, *, moved: bool) -> dict[str, float]:
    """GB/s (1e9) of each host phase: fp32 bytes moved, and params/s of the host step.

    Without a device (``moved`` False) parameters are stepped in place, so the pack/upload phases
    move nothing and get no bandwidth."""
    out = {}
    nbytes = num_params * 4
    transfers = ("grad_d2h", "param_h2d", "param_pack", "broadcast") if moved else ("grad_d2h", "broadcast")
    for name in transfers:
        if name in phases and phases[name]["seconds"] > 0:
            out[name] = nbytes / phases[name]["seconds"] / 1e9
    if "host_step" in phases:
        out["host_step"] = num_params * U.ADAMW_BYTES_PER_PARAM / phases["host_step"]["seconds"] / 1e9
    return out


def _parity(cfg: U.Config, name: str, probe, param0, grad0) -> dict[str, Any]:
    """Compare ``probe`` after the steps with torch AdamW on host and on the model's device."""
    after = probe.detach().to("cpu", copy=True)
    flags = {"fused": {"fused": True}, "foreach": {"foreach": True}, "forloop": {"foreach": False}}[cfg.host_impl]
    host_ref = _torch_adamw_steps(cfg, param0, grad0, "cpu", flags)
    device_ref = _torch_adamw_steps(cfg, param0, grad0, probe.device, {})  # verl passes no impl flag
    ulp_tol = 2 * torch.finfo(torch.float32).eps * float(param0.abs().max())
    host_diff = float((after - host_ref).abs().max())
    device_diff = float((after - device_ref).abs().max())
    host_arm = name != "gpu_adamw"
    # Same kernel -> must be bit-exact; a different kernel (CPU vs device) -> within 2 ulp.
    host_tol, device_tol = (0.0, ulp_tol) if host_arm else (ulp_tol, 0.0)
    return {
        "param_index": cfg.parity_param,
        "numel": param0.numel(),
        "host_reference": {"what": f"torch.optim.AdamW({flags}) on the host", "max_abs_diff": host_diff,
                           "tolerance": host_tol, "ok": host_diff <= host_tol},
        "device_reference": {"what": f"torch.optim.AdamW() on {probe.device}", "max_abs_diff": device_diff,
                             "tolerance": device_tol, "ok": device_diff <= device_tol},
        "ok": host_diff <= host_tol and device_diff <= device_tol,
    }


def _torch_adamw_steps(cfg: U.Config, param0, grad0, device, flags) -> torch.Tensor:
    """``param0`` after ``optimizer_steps`` torch AdamW steps on the gradient ``grad0``."""
    p = torch.nn.Parameter(param0.to(device, copy=True))
    p.grad = grad0.to(device, copy=True)
    reference = torch.optim.AdamW([p], lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999), **flags)
    for _ in range(cfg.optimizer_steps):
        reference.step()
    return p.detach().to("cpu")


# ---------------------------------------------------------------------------------------- benchmarks
def bench_copy(cfg: U.Config) -> dict[str, Any]:
    """Best-of-N host<->device copy bandwidth, pinned vs pageable, ``bench_copy_mib`` MiB."""
    if cfg.bench_copy_mib == 0:
        return {"skipped": "bench_copy_mib=0"}
    if not torch.cuda.is_available() or U.resolve_device_kind(cfg.device) != "cuda":
        return {"skipped": "no CUDA device: host<->device copies need one"}
    nbytes = cfg.bench_copy_mib * 2**20
    device_buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    hosts = {"pinned": torch.empty(nbytes, dtype=torch.uint8, pin_memory=True),
             "pageable": torch.empty(nbytes, dtype=torch.uint8)}
    for h in hosts.values():
        h.fill_(1)  # touch the pages, so first-touch faults are not timed
    gbps = {}
    for kind, host in hosts.items():
        for direction, (dst, src) in {"h2d": (device_buf, host), "d2h": (host, device_buf)}.items():
            times = []
            for _ in range(cfg.bench_repeats + 1):  # the first is a warm-up
                torch.cuda.synchronize()
                start = time.perf_counter()
                dst.copy_(src)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            gbps[f"{direction}_{kind}"] = nbytes / min(times[1:]) / 1e9
    return {"bytes": nbytes, "repeats": cfg.bench_repeats, "gbps": gbps}


def bench_adam(cfg: U.Config) -> dict[str, Any]:
    """Host AdamW throughput: HostAdamW's host_step phase vs torch.optim.AdamW(fused=True), CPU tensors."""
    from rlkit.optim import HostAdamW

    if cfg.bench_adam_numel == 0:
        return {"skipped": "bench_adam_numel=0"}
    threads = _threads(cfg, 1)
    sizes = [cfg.bench_adam_numel // cfg.bench_adam_tensors] * cfg.bench_adam_tensors
    gen = torch.Generator().manual_seed(cfg.seed)

    def tensors():
        ps = [torch.nn.Parameter(torch.randn(n, generator=gen)) for n in sizes]
        for p in ps:
            p.grad = torch.randn(p.numel(), generator=gen) * 1e-3
        return ps

    torch_params = tensors()
    torch_opt = torch.optim.AdamW(torch_params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    torch_times = []
    for _ in range(cfg.bench_repeats + 1):
        start = time.perf_counter()
        torch_opt.step()
        torch_times.append(time.perf_counter() - start)
    del torch_params, torch_opt
    host_params = tensors()
    host_opt = HostAdamW(host_params, lr=cfg.lr, weight_decay=cfg.weight_decay, impl="fused", host_threads=0)
    host_step, host_total = [], []
    for _ in range(cfg.bench_repeats + 1):
        host_opt.timer = PhaseTimer()
        start = time.perf_counter()
        host_opt.step()
        host_total.append(time.perf_counter() - start)
        host_step.append(host_opt.timer.seconds["host_step"])
    numel = sum(sizes)
    best_torch, best_host = min(torch_times[1:]), min(host_step[1:])  # first step allocates state
    return {
        "threads": threads, "numel": numel, "tensors": len(sizes), "repeats": cfg.bench_repeats,
        "torch_fused_seconds": best_torch, "host_step_seconds": best_host,
        "host_total_seconds": min(host_total[1:]),
        "torch_fused_gbps": numel * U.ADAMW_BYTES_PER_PARAM / best_torch / 1e9,
        "host_step_gbps": numel * U.ADAMW_BYTES_PER_PARAM / best_host / 1e9,
        "ratio_torch_over_host": best_torch / best_host,
    }


if __name__ == "__main__":
    child_main(main)
