"""metric_entropy: a metric-only entropy is kept out of the update's backward (verl 0.9.1 engine workers).

With ``calculate_entropy=true`` in the update (the on-policy skip turns it on so ``actor/entropy`` survives
the skipped pass) and ``entropy_coeff == 0``, verl's ``ppo_loss`` still adds ``- 0 * entropy_loss`` to the
loss. Backward then runs through the entropy: with ``entropy_checkpointing`` it recomputes
``entropy_from_logits`` over the whole micro-batch (a bf16 softmax and an fp32 temporary, 6 bytes per
token x vocabulary element) while the log-prob backward holds its own logits buffers. On the 2 x H200 arms
emulating 47.4 GiB cards that recompute ran out of memory (outputs/05_grpo_qwen3_4b/2-skip-old-logprob-entropy-backprop).

This patch wraps the ``ppo_loss`` that verl's engine workers bind at start-up: when ``entropy_coeff == 0``
the entropy reaches the loss detached. The entropy branch contributes ``-0 * d(entropy)`` to the logits'
gradient, so dropping it leaves every gradient value unchanged (only the sign of an exact zero could
differ); the entropy metric is the same tensor. With ``entropy_coeff != 0`` nothing changes.
"""
from __future__ import annotations

from rlkit.patches import Patch, import_target, replace_attr

VERL_WORKERS_MODULE = "verl.workers.engine_workers"


def _apply():
    workers = import_target("metric_entropy", VERL_WORKERS_MODULE)
    original = workers.ppo_loss

    def ppo_loss(config, model_output, data, dp_group=None):
        entropy = model_output.get("entropy")
        if entropy is not None and config.entropy_coeff == 0 and entropy.requires_grad:
            model_output = {**model_output, "entropy": entropy.detach()}
        return original(config, model_output, data, dp_group=dp_group)

    ppo_loss.__doc__ = original.__doc__
    return replace_attr(workers, "ppo_loss", ppo_loss)


PATCH = Patch(
    name="metric_entropy",
    summary="verl ppo_loss: with entropy_coeff 0 the entropy metric is detached, so backward skips its recompute",
    requires={"verl": "==0.9.1", "torch": ">=2.11,<2.15"},
    apply_fn=_apply,
)
