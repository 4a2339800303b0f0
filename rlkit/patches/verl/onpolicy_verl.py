"""verl 0.9.1 side of the on-policy old-log-prob skip: a policy loss and a V1 sync trainer subclass.

Imported only in verl processes (it imports verl, ray and transfer_queue); ``rlkit.patches.verl.skip_old_logprob``
registers what it defines. The config-only logic (guard, overrides) lives in :mod:`rlkit.patches.verl.onpolicy`.

Driver (``OnPolicySyncTrainer``, ``trainer.v1.trainer_mode=rlkit_onpolicy``): when the guard passes it
skips ``compute_log_prob`` and writes a placeholder ``old_log_probs`` (a copy of ``rollout_log_probs``
when rollouts carry log-probs, else zeros) because verl's ``ppo_loss`` selects that field; it keeps
the driver-side rollout correction from running on the placeholder; after the update it republishes
``actor/entropy`` and the ``rollout_corr/*`` / ``training/*`` metrics under their usual names.

Workers (``policy_loss.loss_mode=rlkit_onpolicy[_tis]``): ``old_log_prob := log_prob.detach()``, so the
PPO ratio is exactly 1; the ``_tis`` variant reads ``rollout_log_probs`` from the placeholder and
recomputes verl's truncated IS weights (and their metrics) against ``log_prob.detach()`` -- the value
the skipped pass would have produced, bit for bit, with identical micro-batching.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
import transfer_queue as tq
from omegaconf import open_dict
from tensordict import TensorDict
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.debug.metrics import calculate_debug_metrics

from rlkit.patches.verl.onpolicy import (
    ONPOLICY_LOSS,
    ONPOLICY_LOSSES,
    ONPOLICY_TIS_LOSS,
    ONPOLICY_TRAINER,
    as_mapping,
    check_on_policy,
    get_key,
    uses_rollout_log_probs,
)

BASE_LOSS = "vanilla"


class OnPolicyConfigError(ValueError):
    """The on-policy loss is configured where it would change training; the message says the fix."""


# ----------------------------------------------------------------------------------------- losses
def onpolicy_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """verl's vanilla PPO loss with ``old_log_prob = log_prob.detach()`` (``old_log_prob`` is a placeholder)."""
    _no_driver_weights(rollout_is_weights)
    return core_algos.get_policy_loss_fn(BASE_LOSS)(
        old_log_prob=log_prob.detach(),
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=None,
    )


def onpolicy_tis_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """As :func:`onpolicy_policy_loss`, with ``old_log_prob`` carrying ``rollout_log_probs``.

    The truncated IS weights pi_old/pi_rollout and the rollout_corr/* metrics are computed with verl's
    own function, from ``log_prob.detach()`` in place of the skipped pass's ``old_log_probs``.
    """
    _no_driver_weights(rollout_is_weights)
    served_old = log_prob.detach()
    rollout_log_prob = old_log_prob
    settings = rollout_correction_settings(config)
    if not response_mask.any():  # an all-padding micro-batch: nothing to weigh (verl's helper rejects it)
        return onpolicy_policy_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config)
    with torch.no_grad():
        weights_proto, _, metrics = compute_rollout_correction_and_rejection_mask(
            old_log_prob=served_old,
            rollout_log_prob=rollout_log_prob,
            response_mask=response_mask,
            rollout_is=settings["rollout_is"],
            rollout_is_threshold=settings["rollout_is_threshold"],
            rollout_is_batch_normalize=False,
            rollout_rs=None,
        )
        metrics.update(_debug_metrics(served_old, rollout_log_prob, response_mask))
    weights = weights_proto.batch["rollout_is_weights"] if weights_proto is not None else None
    pg_loss, pg_metrics = core_algos.get_policy_loss_fn(BASE_LOSS)(
        old_log_prob=served_old,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        rollout_is_weights=weights,
    )
    pg_metrics.update(metrics)
    return pg_loss, pg_metrics


def rollout_correction_settings(actor_config) -> dict[str, Any]:
    """``policy_loss.rollout_correction.{rollout_is, rollout_is_threshold}`` as the recipe overrides set them."""
    policy_loss = actor_config.policy_loss if actor_config is not None else None
    rc = policy_loss.get("rollout_correction", None) if policy_loss is not None else None
    if rc is None:
        raise OnPolicyConfigError(
            f"loss_mode={ONPOLICY_TIS_LOSS} needs actor.policy_loss.rollout_correction; "
            "fix: add the overrides from rlkit.patches.verl.onpolicy.onpolicy_overrides(config)"
        )
    return {"rollout_is": rc.get("rollout_is", None), "rollout_is_threshold": rc.get("rollout_is_threshold", 2.0)}


def _debug_metrics(actor_log_prob, rollout_log_prob, response_mask) -> dict[str, Any]:
    """verl's training/rollout_probs_diff_* metrics (the old pass computed them) for this micro-batch."""
    data = DataProto.from_dict(
        tensors={
            "old_log_probs": actor_log_prob,
            "rollout_log_probs": rollout_log_prob,
            "response_mask": response_mask,
            "responses": response_mask,  # only its width is read
        }
    )
    return calculate_debug_metrics(data)


def _no_driver_weights(rollout_is_weights) -> None:
    if rollout_is_weights is not None:
        raise OnPolicyConfigError(
            "the on-policy loss received driver-side rollout_is_weights, computed from a placeholder "
            f"old_log_probs; fix: run with trainer.v1.trainer_mode={ONPOLICY_TRAINER}"
        )


POLICY_LOSSES = {ONPOLICY_LOSS: onpolicy_policy_loss, ONPOLICY_TIS_LOSS: onpolicy_tis_policy_loss}


# ----------------------------------------------------------------------------------------- trainer
def placeholder_old_log_probs(data: TensorDict, with_rollout: bool) -> TensorDict:
    """``{"old_log_probs": ...}`` for the skipped pass: rollout log-probs (nested, response-shaped) or zeros."""
    if with_rollout:
        placeholder = data["rollout_log_probs"].clone()
    else:
        placeholder = torch.zeros_like(data["response_mask"], dtype=torch.float32)
    return TensorDict({"old_log_probs": placeholder}, batch_size=data.batch_size)


@contextmanager
def rollout_correction_in_loss(algorithm_config):
    """Keep verl's driver-side rollout correction off (it would read the placeholder); the loss does it.

    ``_compute_advantage`` skips it when ``bypass_mode`` is set, which changes nothing else there.
    """
    rc = algorithm_config.get("rollout_correction", None)
    if rc is None:
        yield
        return
    previous = rc.get("bypass_mode", False)
    with open_dict(rc):
        rc["bypass_mode"] = True
    try:
        yield
    finally:
        with open_dict(rc):
            rc["bypass_mode"] = previous


def republish_metrics(metrics: dict[str, Any]) -> None:
    """Give the update forward's metrics the names the skipped pass used."""
    if "actor/entropy_loss" in metrics:
        metrics["actor/entropy"] = metrics["actor/entropy_loss"]
    for key in [k for k in metrics if k.startswith(("actor/rollout_corr/", "actor/training/"))]:
        metrics[key[len("actor/"):]] = metrics.pop(key)


def skip_decision(config) -> tuple[bool, list[str]]:
    """(skip, reasons): the guard plus the consistency of the worker-side loss with it.

    Raises :class:`OnPolicyConfigError` where the workers' loss would silently change training.
    """
    config = as_mapping(config)
    verdict = check_on_policy(config)
    loss_mode = get_key(config, "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla")
    ours = loss_mode in ONPOLICY_LOSSES
    if not verdict.ok:
        if ours:
            raise OnPolicyConfigError(
                f"actor.policy_loss.loss_mode={loss_mode} ignores old_log_probs, but the run is not strictly "
                f"on-policy:\n" + "\n".join(f"  - {r}" for r in verdict.reasons)
                + "\nfix: drop the rlkit on-policy overrides (loss_mode=vanilla) or fix the reasons above"
            )
        return False, list(verdict.reasons)
    if not ours:
        return False, [(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r} reads old_log_probs (a placeholder "
            f"would be pi_old), so the pass runs; to skip it: loss_mode={ONPOLICY_TIS_LOSS} "
            "(use rlkit.patches.verl.onpolicy.onpolicy_overrides)"
        )]
    with_rollout = uses_rollout_log_probs(config)
    expected = ONPOLICY_TIS_LOSS if with_rollout else ONPOLICY_LOSS
    if loss_mode != expected:
        raise OnPolicyConfigError(
            f"actor.policy_loss.loss_mode={loss_mode} but rollout.calculate_log_probs={with_rollout}; "
            f"fix: loss_mode={expected} (use rlkit.patches.verl.onpolicy.onpolicy_overrides)"
        )
    if with_rollout:
        wanted = {
            "rollout_is": get_key(config, "algorithm.rollout_correction.rollout_is", None),
            "rollout_is_threshold": get_key(config, "algorithm.rollout_correction.rollout_is_threshold", 2.0),
        }
        for key, value in wanted.items():
            have = get_key(config, f"actor_rollout_ref.actor.policy_loss.rollout_correction.{key}", "<unset>")
            if have != value and not (key == "rollout_is_threshold" and wanted["rollout_is"] is None):
                raise OnPolicyConfigError(
                    f"actor.policy_loss.rollout_correction.{key}={have!r} but algorithm.rollout_correction.{key}"
                    f"={value!r}: the loss would compute other IS weights than verl; fix: use the overrides "
                    "from rlkit.patches.verl.onpolicy.onpolicy_overrides(config)"
                )
    return True, []


class OnPolicySyncTrainer(PPOTrainerSync):
    """verl's sync trainer that serves old_log_probs from the update forward when strictly on-policy."""

    # verl compares trainer_mode with "sync" in several places (replay buffer, refill, checkpoint resume);
    # this trainer *is* the sync trainer, registered under another name so that it is opt-in.
    @property
    def trainer_mode(self) -> str:
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, registered_name: str) -> None:
        self.registered_trainer_mode = registered_name

    def __init__(self, config):
        super().__init__(config)
        self.skip_old_log_prob, reasons = skip_decision(config)
        self.serve_rollout_log_probs = uses_rollout_log_probs(config)
        if self.skip_old_log_prob:
            print("rlkit skip_old_logprob: strictly on-policy, old_log_probs are served from the update forward")
        else:
            print("rlkit skip_old_logprob: the old_log_prob pass runs unchanged because:\n"
                  + "\n".join(f"  - {r}" for r in reasons))

    def _compute_old_log_prob(self, batch, metrics: dict):
        if not self.skip_old_log_prob:
            return super()._compute_old_log_prob(batch, metrics)
        field = "rollout_log_probs" if self.serve_rollout_log_probs else "response_mask"
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=[field])
        tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=placeholder_old_log_probs(data, self.serve_rollout_log_probs),
        )
        metrics["rlkit/old_log_prob_skipped"] = 1.0
        return batch

    def _compute_advantage(self, batch, metrics: dict):
        if not self.skip_old_log_prob:
            return super()._compute_advantage(batch, metrics)
        with rollout_correction_in_loss(self.config.algorithm):
            return super()._compute_advantage(batch, metrics)

    def _update_actor(self, batch, metrics: dict):
        batch = super()._update_actor(batch, metrics)
        if self.skip_old_log_prob:
            republish_metrics(metrics)
        return batch


# ----------------------------------------------------------------------------------------- registry
def register():
    """Register the losses and the trainer in verl's registries; returns the undo callable."""
    existing = TRAINER_REGISTRY.get(ONPOLICY_TRAINER)
    if existing is not None and existing is not OnPolicySyncTrainer:
        raise ValueError(f"verl trainer name {ONPOLICY_TRAINER!r} is already taken by {existing!r}")
    for name, fn in POLICY_LOSSES.items():
        if core_algos.POLICY_LOSS_REGISTRY.get(name, fn) is not fn:
            raise ValueError(f"verl policy loss {name!r} is already registered to another function")
    for name, fn in POLICY_LOSSES.items():
        core_algos.register_policy_loss(name)(fn)
    register_trainer(ONPOLICY_TRAINER)(OnPolicySyncTrainer)

    def unregister() -> None:
        for name in POLICY_LOSSES:
            core_algos.POLICY_LOSS_REGISTRY.pop(name, None)
        TRAINER_REGISTRY.pop(ONPOLICY_TRAINER, None)

    return unregister
