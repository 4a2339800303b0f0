"""A torch.profiler trace of one update at the seed's workload: top kernels, GPU idle gaps, host syncs (issue 24).

    python -m rlkit.experiments.update_profile --out DIR [--profile h200|tiny | --tiny] [-p key=value] [--tag TAG]
    python -m rlkit.experiments.update_profile --reanalyze DIR/update_profile/<tag>

writes ``DIR/update_profile/<tag>/`` (``params.yaml``, ``env.json``, ``metrics.json``, ``trace.json.gz`` and
``SUMMARY.md``, the short summary of :func:`markdown`; the tag defaults to the profile). Needs only torch and transformers (the GPU node has neither verl nor flash-attn); one
process, one device. ``--reanalyze`` recomputes ``metrics.json``'s ``summary`` from the folder's trace with the
current :mod:`rlkit.trace_summary` (no device needed), records the commit that did it and rewrites ``SUMMARY.md``.

The update is what verl 0.9.1 runs at the seed profile (``nbs/params/05_grpo_qwen3_4b.h200-seed.yaml``), minus
verl: a random-init ``model`` (rlkit.models preset, no download), bf16 compute, non-reentrant gradient
checkpointing, ``micro_batches`` unpadded packed micro-batches of at most ``max_tokens_per_micro_batch`` tokens
(verl's ``use_dynamic_bsz`` with ``ppo_max_token_len_per_gpu``: sequences drawn until the update holds
``micro_batch_fill`` of ``micro_batches x max_tokens_per_micro_batch`` tokens, split into that many micro-batches
by longest-first balancing), each sequence a ``prompt_tokens`` prompt plus a response of
:func:`rlkit.length_model.sample_response_lengths` (geometric, mean ``response_mean``, capped at
``response_cap``); attention through rlkit's ``rlkit_varlen`` (:mod:`rlkit.patches.varlen_attention`: position ids
that restart per sequence, PyTorch's varlen flash kernel on the GPU); log-probs from the final hidden states
through :func:`rlkit.patches.chunked_logprobs.chunked_linear_logprobs` (entropy computed and detached, as with
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
``compiled_pointwise`` patch (rotary and SwiGLU); the warm-up update compiles them.

Sequence: ``warmup_steps`` updates (kernels, allocator, HostAdamW's state), ``timed_steps`` updates without the
profiler (wall time, the MFU's denominator), then one update under ``torch.profiler`` (CPU + CUDA activities,
``record_shapes`` and ``with_stack`` off) inside the annotation ``rlkit_update`` (a device synchronize at its end),
micro-batches annotated ``micro_batch<i>`` (verl's names), the attention call ``rlkit_varlen_attention``, the
log-prob call ``rlkit_chunked_logprobs``, the clip + step ``optimizer_step``. The Chrome trace is analysed by
:func:`rlkit.trace_summary.summarize` (``summary``) and kept gzipped as ``trace.json.gz`` when it fits in
``trace_max_mib``; otherwise only ``micro_batch0``'s part is kept (``trace.kept`` says which; the summary is
always of the whole update). FLOPs: :func:`rlkit.roofline.compute_limits` for the update's sequences (model
FLOPs fwd + bwd of the real tokens; hardware FLOPs + the checkpoint recompute), against
:func:`rlkit.roofline.peak_bf16_flops`; ``mfu_busy`` is the MFU the update would have with no GPU idle time.
"""
from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit import models
from rlkit import params as P

NOTEBOOK = "update_profile"  # the results folder's name (no notebook renders these yet)
WRAPS = ("plain", "fsdp", "fsdp_cast_once")
OPTIMIZERS = ("none", "gpu_adamw", "host_adamw")
UPDATE = "rlkit_update"  # annotation of the profiled update: the summary's window
ATTENTION_REGION = "rlkit_varlen_attention"
LOGPROB_REGION = "rlkit_chunked_logprobs"
OPTIMIZER_REGION = "optimizer_step"
CLIP_RATIO = 0.2  # verl's clip_ratio default
CLIP_RATIO_C = 3.0  # verl's clip_ratio_c default (dual clip)
GRAD_CLIP = 1.0  # verl's optim.clip_grad default
WEIGHT_DECAY = 0.01  # verl's optim.weight_decay default
TRACE_FILE = "trace.json.gz"
SUMMARY_FILE = "SUMMARY.md"  # markdown(metrics): the short summary to commit
GIB = 2**30


@dataclass(frozen=True)
class Config:
    model: str  # rlkit.models preset: qwen3-4b | tiny
    device: str  # auto (cuda if available) | cuda | cpu
    wrap: str  # plain | fsdp | fsdp_cast_once (FSDP1 NO_SHARD, 1 rank, like verl's actor)
    optimizer: str  # none (fwd/bwd only) | gpu_adamw | host_adamw (HostAdamW, pinned; needs an fsdp wrap)
    overlap_copies: bool  # host_adamw: its copies on a side stream beside the host step (bit-identical)
    gradient_checkpointing: bool  # like verl's enable_gradient_checkpointing
    rmsnorm: str  # eager (transformers') | compiled (the compiled_rmsnorm patch: the same expression, torch.compile)
    pointwise: str  # eager | compiled (the compiled_pointwise patch: rotary and SwiGLU through torch.compile)
    selective_layers: int  # 0: every layer fully checkpointed; n: the selective_checkpoint patch on the first n layers
    micro_batches: int  # micro-batches in the update
    max_tokens_per_micro_batch: int  # verl's ppo_max_token_len_per_gpu (packed tokens per micro-batch, at most)
    micro_batch_fill: float  # tokens drawn / (micro_batches x max_tokens_per_micro_batch), in (0, 1]
    prompt_tokens: int  # tokens of every prompt
    response_mean: int  # mean response tokens of the geometric length model (rlkit.length_model)
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
            raise P.ParamError(f"model={self.model!r}: use an rlkit.models preset ({sorted(models.PRESETS)}).")
        if self.optimizer == "host_adamw" and self.wrap == "plain":
            raise P.ParamError("optimizer='host_adamw' steps FSDP's fp32 flat parameters; wrap='plain' has bf16 "
                               "weights. Fix: -p wrap=fsdp (or fsdp_cast_once), or -p optimizer=gpu_adamw.")
        if self.selective_layers < 0 or (self.selective_layers and not self.gradient_checkpointing):
            raise P.ParamError(f"selective_layers={self.selective_layers}: a number of layers >= 0, with "
                               "gradient_checkpointing=true (selective checkpointing is a mode of it).")
        if self.overlap_copies and self.optimizer != "host_adamw":
            raise P.ParamError(f"overlap_copies=true is a HostAdamW option, but optimizer={self.optimizer!r}. Fix: "
                               "-p optimizer=host_adamw, or -p overlap_copies=false.")
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
             "overlap_copies": False, "gradient_checkpointing": True, "rmsnorm": "eager", "pointwise": "eager",
             "selective_layers": 0, "micro_batches": 4, "max_tokens_per_micro_batch": 24576,
             "micro_batch_fill": 0.95, "prompt_tokens": 100, "response_mean": 1200, "response_cap": 4096,
             "chunk_rows": 2048, "lr": 1e-6, "warmup_steps": 1, "timed_steps": 1, "top_kernels": 15, "top_gaps": 10,
             "trace_max_mib": 16.0, "seed": 0},
    # The same code path on a CPU in seconds (per-sequence SDPA instead of the varlen kernel, no CUDA events).
    "tiny": {"model": "tiny", "device": "cpu", "wrap": "fsdp_cast_once", "optimizer": "host_adamw",
             "overlap_copies": False, "gradient_checkpointing": True, "rmsnorm": "eager", "pointwise": "eager",
             "selective_layers": 0, "micro_batches": 2, "max_tokens_per_micro_batch": 256,
             "micro_batch_fill": 0.9, "prompt_tokens": 12, "response_mean": 40, "response_cap": 120,
             "chunk_rows": 64, "lr": 1e-6, "warmup_steps": 1, "timed_steps": 1, "top_kernels": 15, "top_gaps": 10,
             "trace_max_mib": 16.0, "seed": 0},
}


# ------------------------------------------------------------------------------------------------ the workload
def draw_sequences(cfg: Config) -> list[tuple[int, int]]:
    """(prompt, response) token counts, drawn in order until the next one would pass the update's token target."""
    from rlkit.length_model import sample_response_lengths

    target = cfg.micro_batch_fill * cfg.micro_batches * cfg.max_tokens_per_micro_batch
    pool = sample_response_lengths(cfg.response_mean, cfg.response_cap, int(target // (cfg.prompt_tokens + 1)) + 1,
                                   seed=cfg.seed)
    out, total = [], 0
    for response in pool:
        if total + cfg.prompt_tokens + response > target:
            break
        out.append((cfg.prompt_tokens, response))
        total += cfg.prompt_tokens + response
    return out


def pack(lengths: list[int], bins: int) -> list[list[int]]:
    """Indices of ``lengths`` in ``bins`` groups of balanced token sums: longest first into the lightest group
    (verl balances its dynamic micro-batches the same way, Karmarkar-Karp aside); each group in draw order."""
    groups: list[list[int]] = [[] for _ in range(bins)]
    loads = [0] * bins
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        b = min(range(bins), key=loads.__getitem__)
        groups[b].append(i)
        loads[b] += lengths[i]
    return [sorted(g) for g in groups]


def micro_batch_plan(cfg: Config) -> list[list[tuple[int, int]]]:
    """The update's micro-batches: (prompt, response) per sequence, every micro-batch within the token limit
    (the last drawn sequences are dropped until the balanced split fits)."""
    seqs = draw_sequences(cfg)
    while True:
        groups = pack([p + r for p, r in seqs], cfg.micro_batches)
        if all(sum(sum(seqs[i]) for i in g) <= cfg.max_tokens_per_micro_batch for g in groups):
            break
        seqs = seqs[:-1]
    if any(not g for g in groups):
        raise P.ParamError(f"the update's tokens do not fill {cfg.micro_batches} micro-batches. Fix: raise "
                           f"micro_batch_fill or max_tokens_per_micro_batch, or lower micro_batches.")
    return [[seqs[i] for i in g] for g in groups]


def make_micro_batch(seqs: list[tuple[int, int]], vocab: int, gen) -> dict[str, Any]:
    """One packed row [1, tokens]: random ids, positions restarting per sequence, next-token labels, the mask of
    labels that are response tokens, and one random advantage per sequence (GRPO's per-sequence scalar)."""
    import torch

    lengths = [p + r for p, r in seqs]
    ids = torch.randint(0, vocab, (1, sum(lengths)), generator=gen)
    positions = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    mask = torch.cat([(torch.arange(p + r) >= p - 1) & (torch.arange(p + r) < p + r - 1) for p, r in seqs])
    adv = torch.cat([torch.full((p + r,), float(a)) for (p, r), a in zip(seqs, torch.randn(len(seqs), generator=gen))])
    return {"input_ids": ids, "position_ids": positions, "labels": ids.roll(-1, dims=1),
            "loss_mask": mask.float().unsqueeze(0), "advantages": adv.unsqueeze(0)}


def ppo_token_loss(log_probs, batch: dict[str, Any], normalizer: float):
    """verl's vanilla PPO policy loss (clip ratio 0.2, dual clip 3.0 for negative advantages), token-mean over
    ``normalizer`` tokens; on-policy: the old log-probs are these, detached."""
    import torch

    ratio = torch.exp(log_probs - log_probs.detach())
    adv = batch["advantages"]
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - CLIP_RATIO, 1 + CLIP_RATIO))
    loss = torch.where(adv < 0, torch.minimum(-adv * CLIP_RATIO_C, loss), loss)
    return (loss * batch["loss_mask"]).sum() / normalizer


# ------------------------------------------------------------------------------------------------ the model
def install_logprob_forward(module, chunk_rows: int) -> None:
    """The causal LM's forward returns (log-probs, entropy) from the final hidden states, never logits: verl's
    ``use_fused_kernels`` path (its forward replacement), with rlkit's chunked kernel. Set on the instance, so an
    FSDP root calls it inside its forward (the root unit's weights are unsharded there)."""
    from torch.profiler import record_function

    from rlkit.patches.chunked_logprobs import chunked_linear_logprobs

    def forward(input_ids, position_ids, labels):
        hidden = module.model(input_ids=input_ids, position_ids=position_ids, use_cache=False).last_hidden_state
        with record_function(LOGPROB_REGION):
            return chunked_linear_logprobs(hidden, module.lm_head.weight, labels, chunk_rows=chunk_rows)

    module.forward = forward


@contextmanager
def annotated_attention():
    """``rlkit_varlen`` (the patch must be applied) wrapped in the annotation ``rlkit_varlen_attention``, so the
    trace attributes its kernels (segments, layout copies, the varlen kernel) to attention."""
    from torch.profiler import record_function
    from transformers import AttentionInterface

    from rlkit.patches import varlen_attention

    original = AttentionInterface._global_mapping[varlen_attention.NAME]

    def annotated(*args, **kwargs):
        with record_function(ATTENTION_REGION):
            return original(*args, **kwargs)

    AttentionInterface._global_mapping[varlen_attention.NAME] = annotated
    try:
        yield
    finally:
        AttentionInterface._global_mapping[varlen_attention.NAME] = original


def build(cfg: Config, device):
    """(model to call, the Hugging Face module inside it, optimizer or None)."""
    import torch

    from rlkit.experiments import update_phase as U
    from rlkit.patches import varlen_attention

    dtype = torch.bfloat16
    if cfg.wrap == "plain":
        module = models.build_random_model(cfg.model, seed=cfg.seed, dtype=dtype, device=device)
        module.config.use_cache = False
        if cfg.gradient_checkpointing:
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = module
    else:
        model = U.build_fsdp_model(cfg.model, device, seed=cfg.seed, gradient_checkpointing=cfg.gradient_checkpointing,
                                   param_dtype=dtype)
        module = model.module
    module.set_attn_implementation(varlen_attention.NAME)
    install_logprob_forward(module, cfg.chunk_rows)
    model.train()
    params = list(model.parameters())
    if cfg.optimizer == "none":
        optimizer = None
    elif cfg.optimizer == "gpu_adamw":
        optimizer = U.make_optimizer("gpu_adamw", params, lr=cfg.lr, weight_decay=WEIGHT_DECAY)
    else:
        optimizer = U.make_optimizer("host_pinned", params, lr=cfg.lr, weight_decay=WEIGHT_DECAY,
                                     overlap_copies=cfg.overlap_copies)
    return model, module, optimizer


def one_update(model, optimizer, batches: list[dict[str, Any]], normalizer: float, device, *,
               fsdp: bool) -> dict[str, Any]:
    """One update as verl's FSDP engine runs it (module docstring); the device is synchronized at its end."""
    import torch
    from torch.profiler import record_function

    losses, entropies, grad_norm = [], [], None
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    with record_function(UPDATE):
        (model if optimizer is None else optimizer).zero_grad(set_to_none=True)
        for i, batch in enumerate(batches):
            sync = model.no_sync() if fsdp and i < len(batches) - 1 else nullcontext()
            with sync, record_function(f"micro_batch{i}"):
                with autocast:
                    log_probs, entropy = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                                               labels=batch["labels"])
                    loss = ppo_token_loss(log_probs, batch, normalizer)
                    entropies.append((entropy.detach() * batch["loss_mask"]).sum())  # a metric, no sync
                losses.append(loss.detach().item())  # verl's forward_step: "loss": loss.detach().item()
                loss.backward()
        if optimizer is not None:
            with record_function(OPTIMIZER_REGION):
                norm = model.clip_grad_norm_(GRAD_CLIP) if fsdp else torch.nn.utils.clip_grad_norm_(
                    model.parameters(), GRAD_CLIP)
                if torch.isfinite(norm):
                    optimizer.step()
                grad_norm = norm.item()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return {"loss": sum(losses), "entropy": float(sum(entropies)) / normalizer, "grad_norm": grad_norm}


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
    """rlkit.roofline's model and hardware FLOPs for the update's sequences, and each wall time's MFU."""
    from rlkit import roofline
    from rlkit.model_shape import resolve_model

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
        "peak_source": peak[1] if peak else f"no peak for {gpu or 'a CPU'} in rlkit.roofline.PEAK_BF16_FLOPS",
        "limit_s": first["limit_s"] if peak else None,
        **{f"mfu_{k}": (v["fraction"] if peak else None) for k, v in limits.items()},
        **{f"hardware_fraction_{k}": (v["hardware_fraction"] if peak else None) for k, v in limits.items()},
    }


def run(cfg: Config, out_dir: Path) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from rlkit import patches, trace_summary
    from rlkit.experiments import update_phase as U
    from rlkit.patches import cast_once, compiled_pointwise, compiled_rmsnorm, selective_checkpoint, varlen_attention

    device = _device(cfg.device)
    wanted = ([varlen_attention.PATCH] + ([cast_once.PATCH] if cfg.wrap == "fsdp_cast_once" else [])
              + ([compiled_rmsnorm.PATCH] if cfg.rmsnorm == "compiled" else [])
              + ([compiled_pointwise.PATCH] if cfg.pointwise == "compiled" else [])
              + ([selective_checkpoint.PATCH] if cfg.selective_layers else []))
    if cfg.selective_layers:  # the count the patch reads, as verl's processes get it from the recipe
        os.environ[selective_checkpoint.ENV] = str(cfg.selective_layers)
    applied = [p for p in wanted if not p.active()]
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
        steps = {"warmup": [], "timed": []}
        for kind, count in (("warmup", cfg.warmup_steps), ("timed", cfg.timed_steps)):
            for _ in range(count):
                t0 = time.perf_counter()
                result = one_update(model, optimizer, batches, normalizer, device, fsdp=cfg.wrap != "plain")
                steps[kind].append({"seconds": time.perf_counter() - t0, **result})
                print(f"[update_profile] {kind} update: {steps[kind][-1]['seconds']:.2f} s", file=sys.stderr)
        with annotated_attention():
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            calls = dict(varlen_attention.CALLS)
            with profile(activities=activities, record_shapes=False, with_stack=False, profile_memory=False) as prof:
                torch.ones(8, device=device).sum().item()  # the profiler's first events, outside the window
                t0 = time.perf_counter()
                result = one_update(model, optimizer, batches, normalizer, device, fsdp=cfg.wrap != "plain")
                profiled_s = time.perf_counter() - t0
            attention_calls = {k: v - calls.get(k, 0) for k, v in varlen_attention.CALLS.items() if v - calls.get(k, 0)}
        peak_gib = torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else None
        print(f"[update_profile] profiled update: {profiled_s:.2f} s; exporting the trace", file=sys.stderr)
        raw = out_dir / "trace.json"
        prof.export_chrome_trace(str(raw))
        doc = trace_summary.load_doc(raw)
        raw.unlink()
        summary = trace_summary.summarize(doc["traceEvents"], window=UPDATE, top_kernels=cfg.top_kernels,
                                          top_gaps=cfg.top_gaps)
        trace = trace_summary.write_capped(doc, out_dir / TRACE_FILE, int(cfg.trace_max_mib * 2**20),
                                           fallback="micro_batch0")
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        timed = [s["seconds"] for s in steps["timed"]]
        seconds = {"timed": sum(timed) / len(timed) if timed else None, "profiled": profiled_s}
        lengths = [p + r for seqs in plan for p, r in seqs]
        return {
            "config": P.as_dict(cfg), "device": gpu or "cpu", "torch": torch.__version__,
            "workload": {
                "micro_batches": len(plan), "sequences": len(lengths), "tokens": sum(lengths),
                "response_tokens": sum(r for seqs in plan for _, r in seqs),
                "tokens_per_micro_batch": [sum(p + r for p, r in seqs) for seqs in plan],
                "sequences_per_micro_batch": [len(seqs) for seqs in plan],
                "sequence_tokens_mean": sum(lengths) / len(lengths), "sequence_tokens_max": max(lengths),
                "responses": [[r for _, r in seqs] for seqs in plan],
            },
            "model": {"preset": cfg.model, "params": models.count_parameters(module), "wrap": cfg.wrap,
                      "optimizer": cfg.optimizer, "compute_dtype": "bfloat16", "patches_active": active,
                      "copies_overlapped": getattr(optimizer, "last_step_overlapped", None),
                      "attn_implementation": varlen_attention.NAME, "attention_calls": attention_calls,
                      "varlen_kernel": set(attention_calls) == {"kernel"}},
            "timing": {"warmup": steps["warmup"], "timed": steps["timed"], "profiled_s": profiled_s,
                       "profiled": result, "profiler_overhead": profiled_s / seconds["timed"] - 1 if timed else None,
                       "peak_allocated_gib": peak_gib},
            "flops": flops(cfg, lengths, gpu, seconds, summary["device"]["busy_ms"] / 1000 if gpu else None),
            "trace": trace,
            "summary": summary,
        }
    finally:
        if own_group and dist.is_initialized():
            dist.destroy_process_group()
        for patch in reversed(applied):
            patch.revert()


def markdown(metrics: dict[str, Any], *, name_chars: int = 90) -> str:
    """The short summary to commit beside the results (``SUMMARY.md``): wall time and MFU, GPU time by category,
    the top kernels, the largest idle gaps, the host syncs and their sources; every number from ``metrics``."""
    from rlkit.results import fmt

    s, f, t, w = metrics["summary"], metrics["flops"], metrics["timing"], metrics["workload"]
    d, cfg = s["device"], metrics["config"]

    def pct(x):
        return fmt(None if x is None else 100 * x, ".1f") + ("" if x is None else " %")

    def short(name):
        return name if len(name) <= name_chars else name[:name_chars - 3] + "..."

    timed = [x["seconds"] for x in t["timed"]]
    lines = [
        f"# One update, profiled ({metrics['device']}, torch {metrics['torch']})", "",
        (f"{cfg['model']}, wrap {cfg['wrap']}, optimizer {cfg['optimizer']}: {w['micro_batches']} micro-batches, "
         f"{w['sequences']} sequences, {w['tokens']:,} tokens (mean {w['sequence_tokens_mean']:.0f}, max "
         f"{w['sequence_tokens_max']}; per micro-batch {', '.join(f'{n:,}' for n in w['tokens_per_micro_batch'])})."),
        "",
        (f"- wall time: {fmt(sum(timed) / len(timed) if timed else None, '.2f')} s unprofiled, "
         f"{t['profiled_s']:.2f} s profiled (overhead {pct(t['profiler_overhead'])}); peak allocated "
         f"{fmt(t['peak_allocated_gib'], '.1f')} GiB"),
        (f"- model FLOPs {f['model_flops'] / 1e12:.3g} TFLOP (attention {pct(f['attention_share_of_model_flops'])}); "
         f"MFU {pct(f['mfu_timed'])} (profiled {pct(f['mfu_profiled'])}), {pct(f['mfu_busy'])} of the busy time alone; "
         f"peak {fmt(f['peak_bf16_flops'] and f['peak_bf16_flops'] / 1e12, '.0f')} TFLOP/s"),
        (f"- {s['timeline']}: busy {d['busy_ms']:.1f} ms of {s['window']['ms']:.1f} ms ({pct(d['busy_fraction'])}), "
         f"idle {d['idle_ms']:.1f} ms in {s['idle_gaps']['count']:,} gaps; host syncs {s['host_syncs']['count']} "
         f"({s['host_syncs']['ms']:.1f} ms blocked), device-to-host copies {s['host_syncs']['d2h_copies']['count']}"),
        f"- trace: {metrics['trace']['kept']}", "",
        "| category | ms | share of kernel time | share of window |", "|---|---|---|---|",
        *[f"| {c} | {v['ms']:.1f} | {pct(v['share'])} | {pct(v['share_of_window'])} |"
          for c, v in sorted(s["categories"].items(), key=lambda kv: -kv[1]["ms"]) if v["count"]], "",
        *_passes_table(s, pct), "",
        "| kernel | category | count | ms | share |", "|---|---|---|---|---|",
        *[f"| `{short(r['name'])}` | {r['category']} | {r['count']} | {r['total_ms']:.1f} | {pct(r['share'])} |"
          for r in s["top_kernels"]], "",
        "| idle gap at (ms) | ms | before | after | host | phase |", "|---|---|---|---|---|---|",
        *[f"| {g['start_ms']:.1f} | {g['ms']:.2f} | `{short(g['before'] or '-')}` | `{short(g['after'] or '-')}` | "
          f"{', '.join(g['host']) or '-'} | {g['region'] or '-'} |" for g in s["idle_gaps"]["largest"]], "",
        "Idle time by phase: " + ", ".join(f"{k} {v['ms']:.1f} ms ({v['count']} gaps)"
                                           for k, v in s["idle_gaps"]["by_region"].items()) + ".", "",
        "| sync source | count | ms | kinds | phases |", "|---|---|---|---|---|",
        *[f"| `{r['op']}` | {r['count']} | {r['ms']:.2f} | {r['kinds']} | {r['regions']} |"
          for r in s["host_syncs"]["by_source"]],
    ]
    return "\n".join(lines) + "\n"


def _passes_table(summary: dict[str, Any], pct) -> list[str]:
    """Kernel time by pass (forward, the checkpoint's recompute, backward, optimizer) and category; a summary made
    before the passes were counted has none."""
    passes = summary.get("passes")
    if not passes:
        return ["*Kernel time by pass: not in this summary (`--reanalyze` adds it from the trace).*"]
    cats = [c for c in summary["categories"] if any(v["ms_by_category"].get(c) for v in passes.values())]
    return ["| pass | ms | share of kernel time | " + " | ".join(cats) + " |", "|---" * (len(cats) + 3) + "|",
            *[f"| {p} | {v['ms']:.1f} | {pct(v['share'])} | "
              + " | ".join(f"{v['ms_by_category'].get(c, 0.0):.1f}" for c in cats) + " |"
              for p, v in passes.items() if v["count"]]]


def reanalyze(folder: str | Path) -> dict[str, Any]:
    """``metrics.json``'s summary again from the folder's ``trace.json.gz`` with the current code (no device)."""
    import json

    from rlkit import trace_summary
    from rlkit.env import git_sha
    from rlkit.jsonio import write_json_atomic

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
