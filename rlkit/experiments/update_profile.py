"""A torch.profiler trace of one update at the seed's workload: top kernels, GPU idle gaps, host syncs (issue 24).

    python -m rlkit.experiments.update_profile --out DIR [--profile h200|tiny | --tiny] [-p key=value] [--tag TAG]
    python -m rlkit.experiments.update_profile --reanalyze DIR/update_profile/<tag>

writes ``DIR/update_profile/<tag>/`` (``params.yaml``, ``env.json``, ``metrics.json``, ``trace.json.gz`` and
``SUMMARY.md``, the short summary of :func:`rlkit.experiments.update_profile_markdown.markdown`; the tag defaults to
the profile). Needs only torch and transformers (the GPU node has neither verl nor flash-attn); one
process, one device. ``--reanalyze`` recomputes ``metrics.json``'s ``summary`` from the folder's trace with the
current :mod:`rlkit.measure.trace_summary` (no device needed), records the commit that did it and rewrites ``SUMMARY.md``.

The update is what verl 0.9.1 runs at the seed profile (``nbs/params/05_grpo_qwen3_4b.h200-seed.yaml``), minus
verl: a random-init ``model`` (rlkit.models.qwen preset, no download), bf16 compute, non-reentrant gradient
checkpointing, ``micro_batches`` unpadded packed micro-batches of at most ``max_tokens_per_micro_batch`` tokens
(verl's ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu``: sequences drawn until the update holds
``micro_batch_fill`` of ``micro_batches x max_tokens_per_micro_batch`` tokens, split into that many micro-batches
by longest-first balancing), each sequence a ``prompt_tokens`` prompt plus a response of
:func:`rlkit.models.lengths.sample_response_lengths` (geometric, mean ``response_mean``, capped at
``response_cap``); attention through rlkit's ``rlkit_varlen`` (:mod:`rlkit.patches.kernels.varlen_attention`: position ids
that restart per sequence, PyTorch's varlen flash kernel on the GPU); log-probs from the final hidden states
through :func:`rlkit.patches.kernels.chunked_logprobs.chunked_linear_logprobs` (entropy computed and detached, as with
``metric_entropy``); verl's PPO token loss (clipped ratio, clip 0.2, dual clip 3, on-policy old log-probs, per-sequence
advantages, token-mean over the update's response tokens). Like verl's FSDP engine: the forward under bf16
autocast, ``loss.detach().item()`` after every micro-batch's forward (``forward_step``), FSDP ``no_sync`` on all
micro-batches but the last, then grad clipping at 1.0, a finiteness check and the step, ``grad_norm.item()``.

``wrap``: ``plain`` (the model itself, bf16 weights and gradients: no FSDP, no fp32 master), ``fsdp`` (FSDP1
NO_SHARD exactly as :func:`rlkit.experiments.update_phase.build_fsdp_model` wraps verl's actor, a 1-rank process
group: fp32 master and gradients, bf16 compute copies cast at every unshard) or ``fsdp_cast_once`` (+ rlkit's
``cast_once`` patch: the bf16 copy cast once per step, as in the seed's arm 5). The fp32 master stays on the
device (arm 5 parks it on the host, which adds one host-to-device cast per step). ``optimizer``: ``none`` (no
clipping, no step: fwd/bwd only), ``gpu_adamw`` (torch AdamW on the device as verl builds it) or ``host_adamw``
(rlkit's HostAdamW with pinned staging, the seed's arms; needs an FSDP wrap). ``rmsnorm: compiled`` applies the
``compiled_rmsnorm`` patch (Qwen3's RMSNorm through torch.compile), ``pointwise: compiled`` the
``compiled_pointwise`` patch (rotary and SwiGLU); the warm-up update compiles them. ``prefetch_grads`` applies the
``grad_prefetch`` patch for HostAdamW's gradient prefetch (:mod:`rlkit.optim.prefetch`).

Sequence: ``warmup_steps`` updates (kernels, allocator, HostAdamW's state), ``timed_steps`` updates without the
profiler (wall time, the MFU's denominator), then one update under ``torch.profiler`` (CPU + CUDA activities,
``record_shapes`` and ``with_stack`` off) inside the annotation ``rlkit_update`` (a device synchronize at its end),
micro-batches annotated ``micro_batch<i>`` (verl's names), the attention call ``rlkit_varlen_attention``, the
log-prob call ``rlkit_chunked_logprobs``, the clip + step ``optimizer_step``. The Chrome trace is analysed by
:func:`rlkit.measure.trace_summary.summarize` (``summary``) and kept gzipped as ``trace.json.gz`` when it fits in
``trace_max_mib``; otherwise only ``micro_batch0``'s part is kept (``trace.kept`` says which; the summary is
always of the whole update). FLOPs: :func:`rlkit.planning.roofline.compute_limits` for the update's sequences (model
FLOPs fwd + bwd of the real tokens; hardware FLOPs + the checkpoint recompute), against
:func:`rlkit.planning.roofline.peak_bf16_flops`; ``mfu_busy`` is the MFU the update would have with no GPU idle time.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.core import params as P
from rlkit.experiments.update_profile_markdown import markdown
from rlkit.experiments.verl_update import UPDATE, annotated_attention, build, make_micro_batch, micro_batch_plan, one_update
from rlkit.models import qwen as models

NOTEBOOK = "update_profile"  # the results folder's name (no notebook renders these yet)
WRAPS = ("plain", "fsdp", "fsdp_cast_once")
OPTIMIZERS = ("none", "gpu_adamw", "host_adamw")
TRACE_FILE = "trace.json.gz"
SUMMARY_FILE = "SUMMARY.md"  # markdown(metrics): the short summary to commit
GIB = 2**30


@dataclass(frozen=True)
class Config:
    model: str  # rlkit.models.qwen preset: qwen3-4b | tiny
    device: str  # auto (cuda if available) | cuda | cpu
    wrap: str  # plain | fsdp | fsdp_cast_once (FSDP1 NO_SHARD, 1 rank, like verl's actor)
    optimizer: str  # none (fwd/bwd only) | gpu_adamw | host_adamw (HostAdamW, pinned; needs an fsdp wrap)
    overlap_copies: bool  # host_adamw: its copies on a side stream beside the host step (bit-identical)
    prefetch_grads: bool  # host_adamw + the grad_prefetch patch: gradients to the host beside the last backward
    gradient_checkpointing: bool  # like verl's enable_gradient_checkpointing
    rmsnorm: str  # eager (transformers') | compiled (the compiled_rmsnorm patch: the same expression, torch.compile)
    pointwise: str  # eager | compiled (the compiled_pointwise patch: rotary and SwiGLU through torch.compile)
    selective_layers: int  # 0: every layer fully checkpointed; n: the selective_checkpoint patch on the first n layers
    micro_batches: int  # micro-batches in the update
    max_tokens_per_micro_batch: int  # verl's ppo_max_token_len_per_gpu (packed tokens per micro-batch, at most)
    micro_batch_fill: float  # tokens drawn / (micro_batches x max_tokens_per_micro_batch), in (0, 1]
    prompt_tokens: int  # tokens of every prompt
    response_mean: int  # mean response tokens of the geometric length model (rlkit.models.lengths)
    response_cap: int  # max_response_length
    chunk_rows: int  # rows per chunk of chunked_linear_logprobs
    lr: float  # optimizer learning rate
    warmup_steps: int  # updates before the measured ones
    timed_steps: int  # updates timed without the profiler (0: the MFU uses the profiled update's wall time)
    top_kernels: int  # kernels listed in the summary
    top_gaps: int  # largest idle gaps listed in the summary
    trace_max_mib: float  # the gzipped trace kept in the results folder is at most this large
    seed: int  # weights, tokens, lengths, advantages

    def __post_init__(self):
        choices = {"device": ("auto", "cuda", "cpu"), "wrap": WRAPS, "optimizer": OPTIMIZERS,
                   "rmsnorm": ("eager", "compiled"), "pointwise": ("eager", "compiled")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise P.ParamError(f"{key}={getattr(self, key)!r}: use one of {list(allowed)}.")
        if self.model not in models.PRESETS:
            raise P.ParamError(f"model={self.model!r}: use an rlkit.models.qwen preset ({sorted(models.PRESETS)}).")
        if self.optimizer == "host_adamw" and self.wrap == "plain":
            raise P.ParamError("optimizer='host_adamw' steps FSDP's fp32 flat parameters; wrap='plain' has bf16 "
                               "weights. Fix: -p wrap=fsdp (or fsdp_cast_once), or -p optimizer=gpu_adamw.")
        if self.selective_layers < 0 or (self.selective_layers and not self.gradient_checkpointing):
            raise P.ParamError(f"selective_layers={self.selective_layers}: a number of layers >= 0, with "
                               "gradient_checkpointing=true (selective checkpointing is a mode of it).")
        for key in ("overlap_copies", "prefetch_grads"):
            if getattr(self, key) and self.optimizer != "host_adamw":
                raise P.ParamError(f"{key}=true is a HostAdamW option, but optimizer={self.optimizer!r}. Fix: "
                                   f"-p optimizer=host_adamw, or -p {key}=false.")
        for key in ("micro_batches", "max_tokens_per_micro_batch", "prompt_tokens", "response_cap", "chunk_rows",
                    "top_kernels", "top_gaps"):
            if getattr(self, key) < 1:
                raise P.ParamError(f"{key}={getattr(self, key)}: must be >= 1.")
        for key in ("warmup_steps", "timed_steps", "lr", "seed"):
            if getattr(self, key) < 0:
                raise P.ParamError(f"{key}={getattr(self, key)}: must be >= 0.")
        if self.response_mean < 2:
            raise P.ParamError(f"response_mean={self.response_mean}: must be >= 2 (tokens; the geometric mean).")
        if not 0 < self.micro_batch_fill <= 1:
            raise P.ParamError(f"micro_batch_fill={self.micro_batch_fill}: must be in (0, 1], e.g. 0.95.")
        if self.prompt_tokens + self.response_cap > self.max_tokens_per_micro_batch:
            raise P.ParamError(
                f"prompt_tokens + response_cap = {self.prompt_tokens + self.response_cap} does not fit in "
                f"max_tokens_per_micro_batch={self.max_tokens_per_micro_batch}. Fix: raise max_tokens_per_micro_batch "
                f"or lower response_cap.")
        if self.trace_max_mib <= 0:
            raise P.ParamError(f"trace_max_mib={self.trace_max_mib}: must be > 0 (MiB).")


PROFILES: dict[str, dict[str, Any]] = {
    # The seed's update on one H200: Qwen3-4B, 4 micro-batches of <= 24,576 tokens (about a third of a seed step's
    # ~11), the seed's arm-5 wrap and host optimizer (fp32 master kept on the device). ~1.5-2.5 min on the node.
    "h200": {"model": "qwen3-4b", "device": "cuda", "wrap": "fsdp_cast_once", "optimizer": "host_adamw",
             "overlap_copies": False, "prefetch_grads": False,
             "gradient_checkpointing": True, "rmsnorm": "eager", "pointwise": "eager",
             "selective_layers": 0, "micro_batches": 4, "max_tokens_per_micro_batch": 24576,
             "micro_batch_fill": 0.95, "prompt_tokens": 100, "response_mean": 1200, "response_cap": 4096,
             "chunk_rows": 2048, "lr": 1e-6, "warmup_steps": 1, "timed_steps": 1, "top_kernels": 15, "top_gaps": 10,
             "trace_max_mib": 16.0, "seed": 0},
    # The same code path on a CPU in seconds (per-sequence SDPA instead of the varlen kernel, no CUDA events).
    "tiny": {"model": "tiny", "device": "cpu", "wrap": "fsdp_cast_once", "optimizer": "host_adamw",
             "overlap_copies": False, "prefetch_grads": False,
             "gradient_checkpointing": True, "rmsnorm": "eager", "pointwise": "eager",
             "selective_layers": 0, "micro_batches": 2, "max_tokens_per_micro_batch": 256,
             "micro_batch_fill": 0.9, "prompt_tokens": 12, "response_mean": 40, "response_cap": 120,
             "chunk_rows": 64, "lr": 1e-6, "warmup_steps": 1, "timed_steps": 1, "top_kernels": 15, "top_gaps": 10,
             "trace_max_mib": 16.0, "seed": 0},
}


# ------------------------------------------------------------------------------------------------ the run
def _device(name: str):
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise P.ParamError("device='cuda' but torch sees no CUDA device. Fix: -p device=cpu (or auto).")
    return torch.device(name, 0) if name == "cuda" else torch.device(name)


def flops(cfg: Config, lengths: list[int], gpu: str | None, seconds: dict[str, float | None],
          busy_s: float | None) -> dict[str, Any]:
    """rlkit.planning.roofline's model and hardware FLOPs for the update's sequences, and each wall time's MFU."""
    from rlkit.models.shape import resolve_model
    from rlkit.planning import roofline

    shape = resolve_model(cfg.model)
    work = roofline.StepShape(tuple(lengths), tuple(lengths), cfg.gradient_checkpointing)
    peak = roofline.peak_bf16_flops(gpu) if gpu else None
    limits = {k: roofline.compute_limits(shape, work, peak[0] if peak else 1.0, s, None)["update_actor"]
              for k, s in {**seconds, "busy": busy_s}.items()}
    first = next(iter(limits.values()))
    forward = roofline.forward_flops(shape, lengths)
    return {
        "model_flops": first["model_flops"], "hardware_flops": first["hardware_flops"],
        "attention_share_of_model_flops": forward["attention"] / forward["total"],
        "peak_bf16_flops": peak[0] if peak else None,
        "peak_source": peak[1] if peak else f"no peak for {gpu or 'a CPU'} in rlkit.planning.roofline.PEAK_BF16_FLOPS",
        "limit_s": first["limit_s"] if peak else None,
        **{f"mfu_{k}": (v["fraction"] if peak else None) for k, v in limits.items()},
        **{f"hardware_fraction_{k}": (v["hardware_fraction"] if peak else None) for k, v in limits.items()},
    }


def run(cfg: Config, out_dir: Path) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from rlkit import patches
    from rlkit.experiments import update_phase as U
    from rlkit.patches.kernels import varlen_attention

    device = _device(cfg.device)
    applied = [p for p in _patches_for(cfg) if not p.active()]
    for patch in applied:
        patch.apply()
    own_group = cfg.wrap != "plain" and not dist.is_initialized()
    try:
        if own_group:
            U.init_distributed(device.type)
        model, module, optimizer = build(cfg, device)
        active = patches.active()
        plan = micro_batch_plan(cfg)
        gen = torch.Generator().manual_seed(cfg.seed)
        batches = [{k: v.to(device) for k, v in make_micro_batch(seqs, module.config.vocab_size, gen).items()}
                   for seqs in plan]  # on the device before the update, as verl's batch is
        normalizer = float(sum(b["loss_mask"].sum() for b in batches))

        def update() -> dict[str, Any]:
            return one_update(model, optimizer, batches, normalizer, device, fsdp=cfg.wrap != "plain")

        steps = _unprofiled_updates(cfg, update)
        profiled = _profiled_update(device, update)
        print(f"[update_profile] profiled update: {profiled['seconds']:.2f} s; exporting the trace", file=sys.stderr)
        summary, trace = _summarized_trace(cfg, profiled["prof"], out_dir)
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        timed = [s["seconds"] for s in steps["timed"]]
        seconds = {"timed": sum(timed) / len(timed) if timed else None, "profiled": profiled["seconds"]}
        lengths = [p + r for seqs in plan for p, r in seqs]
        attention_calls = profiled["attention_calls"]
        return {
            "config": P.as_dict(cfg), "device": gpu or "cpu", "torch": torch.__version__,
            "workload": _workload(plan),
            "model": {"preset": cfg.model, "params": models.count_parameters(module), "wrap": cfg.wrap,
                      "optimizer": cfg.optimizer, "compute_dtype": "bfloat16", "patches_active": active,
                      "copies_overlapped": getattr(optimizer, "last_step_overlapped", None),
                      "grads_prefetched": getattr(optimizer, "last_step_prefetched", None),
                      "attn_implementation": varlen_attention.NAME, "attention_calls": attention_calls,
                      "varlen_kernel": set(attention_calls) == {"kernel"}},
            "timing": {"warmup": steps["warmup"], "timed": steps["timed"], "profiled_s": profiled["seconds"],
                       "profiled": profiled["result"],
                       "profiler_overhead": profiled["seconds"] / seconds["timed"] - 1 if timed else None,
                       "peak_allocated_gib": profiled["peak_gib"]},
            "flops": flops(cfg, lengths, gpu, seconds, summary["device"]["busy_ms"] / 1000 if gpu else None),
            "trace": trace,
            "summary": summary,
        }
    finally:
        if own_group and dist.is_initialized():
            dist.destroy_process_group()
        _revert(applied)


def _revert(applied: list) -> None:
    """Revert the patches this run applied. While the run's own error propagates (an OOM in a forward), a revert's
    error is printed, not raised: it would replace the first cause in the run's FAILED.txt (session 23's OOM read as
    cast_once's "cannot invalidate")."""
    failing = sys.exc_info()[1] is not None
    for patch in reversed(applied):
        try:
            patch.revert()
        except Exception as exc:
            if not failing:
                raise
            print(f"[update_profile] after the failure, reverting {patch.name} also failed: {exc}", file=sys.stderr)


def _patches_for(cfg: Config) -> list:
    """The patches the configuration asks for (varlen attention always); sets the selective layers' count as verl's
    processes get it from the recipe."""
    from rlkit.patches.fsdp import cast_once, grad_prefetch
    from rlkit.patches.kernels import compiled_pointwise, compiled_rmsnorm, varlen_attention
    from rlkit.patches.verl import selective_checkpoint

    if cfg.selective_layers:
        os.environ[selective_checkpoint.ENV] = str(cfg.selective_layers)
    return ([varlen_attention.PATCH] + ([cast_once.PATCH] if cfg.wrap == "fsdp_cast_once" else [])
            + ([compiled_rmsnorm.PATCH] if cfg.rmsnorm == "compiled" else [])
            + ([compiled_pointwise.PATCH] if cfg.pointwise == "compiled" else [])
            + ([selective_checkpoint.PATCH] if cfg.selective_layers else [])
            + ([grad_prefetch.PATCH] if cfg.prefetch_grads else []))


def _unprofiled_updates(cfg: Config, update) -> dict[str, list[dict[str, Any]]]:
    """The warm-up updates, then the timed ones, each with its wall time."""
    steps: dict[str, list[dict[str, Any]]] = {"warmup": [], "timed": []}
    for kind, count in (("warmup", cfg.warmup_steps), ("timed", cfg.timed_steps)):
        for _ in range(count):
            t0 = time.perf_counter()
            result = update()
            steps[kind].append({"seconds": time.perf_counter() - t0, **result})
            print(f"[update_profile] {kind} update: {steps[kind][-1]['seconds']:.2f} s", file=sys.stderr)
    return steps


def _profiled_update(device, update) -> dict[str, Any]:
    """One update under torch.profiler: the profiler, the update's result and time, the attention kernels it called
    and the device's peak allocation."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rlkit.patches.kernels import varlen_attention

    with annotated_attention():
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        calls = dict(varlen_attention.CALLS)
        with profile(activities=activities, record_shapes=False, with_stack=False, profile_memory=False) as prof:
            torch.ones(8, device=device).sum().item()  # the profiler's first events, outside the window
            t0 = time.perf_counter()
            result = update()
            seconds = time.perf_counter() - t0
        attention_calls = {k: v - calls.get(k, 0) for k, v in varlen_attention.CALLS.items() if v - calls.get(k, 0)}
    return {"prof": prof, "result": result, "seconds": seconds, "attention_calls": attention_calls,
            "peak_gib": torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None}


def _summarized_trace(cfg: Config, prof, out_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The profiled update's Chrome trace: its summary (:func:`rlkit.measure.trace_summary.summarize`, of the whole
    update) and what of it is kept gzipped in ``out_dir`` (:func:`rlkit.measure.trace_summary.write_capped`)."""
    from rlkit.measure import trace_summary

    raw = out_dir / "trace.json"
    prof.export_chrome_trace(str(raw))
    doc = trace_summary.load_doc(raw)
    raw.unlink()
    summary = trace_summary.summarize(doc["traceEvents"], window=UPDATE, top_kernels=cfg.top_kernels,
                                      top_gaps=cfg.top_gaps)
    trace = trace_summary.write_capped(doc, out_dir / TRACE_FILE, int(cfg.trace_max_mib * 2**20),
                                       fallback="micro_batch0")
    return summary, trace


def _workload(plan) -> dict[str, Any]:
    """The update's micro-batches: sequences and tokens, each sequence as (prompt, response) tokens."""
    lengths = [p + r for seqs in plan for p, r in seqs]
    return {
        "micro_batches": len(plan), "sequences": len(lengths), "tokens": sum(lengths),
        "response_tokens": sum(r for seqs in plan for _, r in seqs),
        "tokens_per_micro_batch": [sum(p + r for p, r in seqs) for seqs in plan],
        "sequences_per_micro_batch": [len(seqs) for seqs in plan],
        "sequence_tokens_mean": sum(lengths) / len(lengths), "sequence_tokens_max": max(lengths),
        "responses": [[r for _, r in seqs] for seqs in plan],
    }


def reanalyze(folder: str | Path) -> dict[str, Any]:
    """``metrics.json``'s summary again from the folder's ``trace.json.gz`` with the current code (no device)."""
    import json

    from rlkit.core.env import git_sha
    from rlkit.core.jsonio import write_json_atomic
    from rlkit.measure import trace_summary

    folder = Path(folder)
    metrics = json.loads((folder / "metrics.json").read_text())
    cfg = metrics["config"]
    if metrics["trace"]["kept"] != "the whole trace":
        raise ValueError(f"{folder}: the kept trace is not the whole update ({metrics['trace']['kept']}); its summary "
                         f"would not be the update's, so metrics.json keeps the one measured on the node")
    events = trace_summary.load_events(folder / TRACE_FILE)
    metrics["summary"] = trace_summary.summarize(events, window=UPDATE, top_kernels=cfg["top_kernels"],
                                                 top_gaps=cfg["top_gaps"])
    metrics["analysis"] = {"git_sha": git_sha(), "trace_kept": metrics["trace"]["kept"]}
    write_json_atomic(folder / "metrics.json", metrics)
    (folder / SUMMARY_FILE).write_text(markdown(metrics))
    return metrics


def main(argv=None) -> int:
    from rlkit.experiments import built_in_parser, run_built_in

    parser = built_in_parser("update_profile", __doc__.split("\n\n")[0], PROFILES, NOTEBOOK)
    parser.add_argument("--reanalyze", default=None, metavar="FOLDER",
                        help="recompute FOLDER/metrics.json's summary from FOLDER/trace.json.gz, then exit")
    ns = parser.parse_args(argv)
    if ns.reanalyze:
        try:
            reanalyze(ns.reanalyze)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"reanalyzed: {ns.reanalyze}")
        return 0

    def produce(cfg, work_dir: Path) -> dict:
        metrics = run(cfg, work_dir)
        (work_dir / SUMMARY_FILE).write_text(markdown(metrics))
        return metrics

    metrics = run_built_in(ns, Config, PROFILES, NOTEBOOK, produce)
    if metrics is None:
        return 2
    print(markdown(metrics), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
