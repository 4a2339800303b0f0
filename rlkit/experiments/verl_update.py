"""verl 0.9.1's actor update in small, without verl: the update's packed micro-batches and PPO token loss, the model
(random-init, FSDP1 NO_SHARD as verl wraps it, log-probs from the final hidden states, annotated attention), and one
update as verl's FSDP engine runs it. :mod:`rlkit.experiments.update_profile` profiles it; ``cfg`` is that module's
``Config``.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any

from rlkit.core import params as P
from rlkit.models import qwen as models

UPDATE = "rlkit_update"  # annotation of the profiled update: the summary's window
ATTENTION_REGION = "rlkit_varlen_attention"
LOGPROB_REGION = "rlkit_chunked_logprobs"
OPTIMIZER_REGION = "optimizer_step"
CLIP_RATIO = 0.2  # verl's clip_ratio default
CLIP_RATIO_C = 3.0  # verl's clip_ratio_c default (dual clip)
GRAD_CLIP = 1.0  # verl's optim.clip_grad default
WEIGHT_DECAY = 0.01  # verl's optim.weight_decay default


# the workload
def draw_sequences(cfg) -> list[tuple[int, int]]:
    """(prompt, response) token counts, drawn in order until the next one would pass the update's token target."""
    from rlkit.models.lengths import sample_response_lengths

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


def micro_batch_plan(cfg) -> list[list[tuple[int, int]]]:
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


# the model
def install_logprob_forward(module, chunk_rows: int) -> None:
    """The causal LM's forward returns (log-probs, entropy) from the final hidden states, never logits: verl's
    ``use_fused_kernels`` path (its forward replacement), with rlkit's chunked kernel. Set on the instance, so an
    FSDP root calls it inside its forward (the root unit's weights are unsharded there)."""
    from torch.profiler import record_function

    from rlkit.patches.kernels.chunked_logprobs import chunked_linear_logprobs

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

    from rlkit.patches.kernels import varlen_attention

    original = AttentionInterface._global_mapping[varlen_attention.NAME]

    def annotated(*args, **kwargs):
        with record_function(ATTENTION_REGION):
            return original(*args, **kwargs)

    AttentionInterface._global_mapping[varlen_attention.NAME] = annotated
    try:
        yield
    finally:
        AttentionInterface._global_mapping[varlen_attention.NAME] = original


def build(cfg, device):
    """(model to call, the Hugging Face module inside it, optimizer or None)."""
    import torch

    from rlkit.experiments import update_phase as U
    from rlkit.patches.kernels import varlen_attention

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
                                     overlap_copies=cfg.overlap_copies, prefetch_grads=cfg.prefetch_grads)
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
