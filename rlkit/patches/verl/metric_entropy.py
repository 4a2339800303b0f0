"""metric_entropy: a metric-only entropy costs the update no extra device memory (verl 0.9.1 engine workers).

The on-policy skip turns ``calculate_entropy=true`` on in the update so ``actor/entropy`` survives the
skipped pass, with ``entropy_coeff == 0``: the entropy is a metric, not part of the objective. verl still
makes the update pay for it twice; this patch removes both costs without touching the loss or gradient.

1. Backward. verl's ``ppo_loss`` adds ``- 0 * entropy_loss`` to the loss, so backward runs through the
   entropy: with ``entropy_checkpointing`` it recomputes ``entropy_from_logits`` over the whole micro-batch
   while the log-prob backward holds its own logits buffers. On the 2 x H200 arms emulating 47.4 GiB cards
   that recompute ran out of memory (outputs/05_grpo_qwen3_4b/2-skip-old-logprob-entropy-backprop).
   The wrapped ``ppo_loss`` hands the entropy over detached. The entropy branch contributes
   ``-0 * d(entropy)`` to the logits' gradient, so every gradient value is unchanged (only the sign of an
   exact zero could differ) and the metric is the same tensor.
2. Forward. Without flash-attn (verl's padded-logits path) ``entropy_from_logits`` runs on the whole
   micro-batch at once: a softmax and its product with the logits, each as large as the logits (fp32 under
   bf16 autocast: 8 bytes per token x vocabulary element next to the 2-byte logits). The skip arms peaked
   6.36 GiB above 1-fixes-hostadamw with it; with the chunks below 4-rank0-owner's actor peak fell from
   46.24 to 39.87 GiB, that of 1-fixes-hostadamw (outputs/05_grpo_qwen3_4b/4-rank0-owner.session4/ and
   4-rank0-owner/). When no gradient is recorded (the forward of verl's entropy
   checkpoint, a no-grad pass) and outside ``torch.compile``, the patched ``entropy_from_logits`` runs
   verl's own function on ``ENTROPY_CHUNK_ROWS`` rows at a time, so that temporary is one chunk. Each row's
   entropy is the same computation; only the reduction kernels' work split may differ with the row count,
   so values agree to fp32 rounding (tests/test_metric_entropy.py states the bound it checks).

Because of (2) the entropy's forward value is no longer bit-identical to verl's, which is harmless for a
metric but would enter the loss with ``entropy_coeff != 0``. The patch therefore refuses that
configuration at the first loss (before any optimizer step) with an error naming the fix.
"""
from __future__ import annotations

import torch

from rlkit.patches import Patch, PatchError, import_target, replace_attrs, supported

VERL_WORKERS_MODULE = "verl.workers.engine_workers"
VERL_FUNCTIONAL_MODULE = "verl.utils.torch_functional"
ENTROPY_CHUNK_ROWS = 1024  # 1024 x 151936 x 8 B = 1.16 GiB of fp32 temporaries for Qwen3's vocabulary


def chunked_entropy(entropy_fn, logits: torch.Tensor, chunk_rows: int = ENTROPY_CHUNK_ROWS) -> torch.Tensor:
    """``entropy_fn`` over ``logits`` (..., vocab) applied ``chunk_rows`` rows at a time, same shape out.

    Falls back to one call where chunking does not apply: gradient recorded through the result, nested or
    non-contiguous logits (a row view would copy), no more rows than one chunk, or inside ``torch.compile``
    (verl compiles the entropy on its remove-padding path, where a chunk loop over a dynamic row count would
    recompile per count, and the compiled kernel fuses the temporaries anyway).
    """
    records_grad = torch.is_grad_enabled() and logits.requires_grad
    if records_grad or torch.compiler.is_compiling():
        return entropy_fn(logits)
    if logits.is_nested or logits.dim() < 2 or not logits.is_contiguous():
        return entropy_fn(logits)
    rows = logits.view(-1, logits.shape[-1])
    if rows.shape[0] <= chunk_rows:
        return entropy_fn(logits)
    return torch.cat([entropy_fn(chunk) for chunk in rows.split(chunk_rows)]).view(logits.shape[:-1])


def _apply():
    workers = import_target("metric_entropy", VERL_WORKERS_MODULE)
    functional = import_target("metric_entropy", VERL_FUNCTIONAL_MODULE)
    original_loss = workers.ppo_loss
    original_entropy = functional.entropy_from_logits

    def ppo_loss(config, model_output, data, dp_group=None):
        if config.entropy_coeff != 0:
            raise PatchError(
                f"patch 'metric_entropy' is for a metric-only entropy, but actor entropy_coeff="
                f"{config.entropy_coeff}: it computes the entropy's forward in row chunks, whose rounding would "
                "enter the loss. Fix: set actor_rollout_ref.actor.entropy_coeff=0 or drop metric_entropy "
                "from RLKIT_PATCHES / the recipe's patches.")
        entropy = model_output.get("entropy")
        if entropy is not None and entropy.requires_grad:
            model_output = {**model_output, "entropy": entropy.detach()}
        return original_loss(config, model_output, data, dp_group=dp_group)

    def entropy_from_logits(logits):
        return chunked_entropy(original_entropy, logits)

    ppo_loss.__doc__ = original_loss.__doc__
    entropy_from_logits.__doc__ = original_entropy.__doc__
    return replace_attrs((workers, "ppo_loss", ppo_loss), (functional, "entropy_from_logits", entropy_from_logits))


PATCH = Patch(
    name="metric_entropy",
    summary="verl: a metric-only entropy (entropy_coeff 0) is detached from the loss and computed in row chunks",
    requires=supported("verl", "torch"),
    apply_fn=_apply,
    targets=(VERL_WORKERS_MODULE, VERL_FUNCTIONAL_MODULE),
)
