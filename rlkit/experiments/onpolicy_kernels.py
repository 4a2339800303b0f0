"""The log-prob, entropy, IS-weight and PPO-loss functions of the on-policy skip's measurement
(:mod:`rlkit.experiments.skip_old_logprob`): verl's own when verl is installed, else local copies of them, so the
measurement also runs on a CPU machine without the [verl] extra. :class:`Kernels` says which it used.
"""
from __future__ import annotations

SAFETY_BOUND = 20.0  # verl rollout_corr_helper.SAFETY_BOUND


def masked_sum(values, mask, axis=None):
    import torch

    return (torch.where(mask.bool(), values, 0.0) * mask).sum(axis=axis)


def local_logprobs_from_logits(logits, labels):
    """verl ``logprobs_from_logits`` without flash-attn: ``logprobs_from_logits_v2`` (float32 path)."""
    import torch

    logits_labels = torch.gather(logits, dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)
    logsumexp_values = torch.stack([torch.logsumexp(logit, dim=-1) for logit in logits])
    return logits_labels - logsumexp_values


def local_entropy_from_logits(logits):
    """verl ``entropy_from_logits``."""
    import torch

    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


def local_is_weights(log_ratio, response_mask, level: str, threshold: float):
    """verl ``compute_rollout_correction_weights`` (TIS, no batch normalisation), weights only."""
    import torch

    if level == "token":
        raw = torch.exp(torch.clamp(log_ratio, min=-SAFETY_BOUND, max=SAFETY_BOUND))
    else:
        log_ratio_sum = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(log_ratio_sum, min=-SAFETY_BOUND, max=SAFETY_BOUND)).expand_as(log_ratio)
    return (raw * response_mask).clamp(max=threshold).detach()


def local_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_c,
                              batch_num_tokens, rollout_is_weights=None):
    """verl ``compute_policy_loss_vanilla`` with ``loss_agg_mode='token-mean'`` over the global token count."""
    import torch

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return masked_sum(pg_losses, response_mask) / batch_num_tokens * 1


class Kernels:
    """The log-prob, entropy, IS-weight and PPO-loss functions: verl's own, or the local copies, for ``cfg`` (the
    experiment's :class:`rlkit.experiments.skip_old_logprob.Config`: batch and clip settings)."""

    def __init__(self, cfg, prefer_verl: bool = True) -> None:
        self.cfg = cfg
        self.source = "local"
        self.why_local = "" if prefer_verl else "local copies requested"
        if prefer_verl:
            try:
                from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
                from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
                from verl.utils import torch_functional as verl_F
                from verl.workers.config import ActorConfig
            except ImportError as err:
                self.why_local = f"verl not importable: {err}"
            else:
                self.source = "verl"
                self._verl_loss = compute_policy_loss_vanilla
                self._verl_is = compute_rollout_correction_weights
                self._verl_F = verl_F
                self._actor_config = ActorConfig(
                    strategy="fsdp", ppo_mini_batch_size=cfg.num_sequences, rollout_n=1,
                    ppo_micro_batch_size_per_gpu=cfg.micro_batch_size, clip_ratio_low=cfg.clip_ratio_low,
                    clip_ratio_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c,
                )

    def describe(self) -> dict[str, str]:
        if self.source == "verl":
            return {
                "source": "verl",
                "log_probs": "verl.utils.torch_functional.logprobs_from_logits",
                "entropy": "verl.utils.torch_functional.entropy_from_logits",
                "is_weights": "verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_weights",
                "policy_loss": "verl.trainer.ppo.core_algos.compute_policy_loss_vanilla (token-mean)",
            }
        return {
            "source": "local",
            "why_local": self.why_local,
            "log_probs": "rlkit copy of verl logprobs_from_logits_v2 (float32 path)",
            "entropy": "rlkit copy of verl entropy_from_logits",
            "is_weights": "rlkit copy of verl compute_rollout_correction_weights (TIS)",
            "policy_loss": "rlkit copy of verl compute_policy_loss_vanilla (token-mean)",
        }

    def log_probs(self, logits, labels):
        if self.source == "verl":
            return self._verl_F.logprobs_from_logits(logits, labels)
        return local_logprobs_from_logits(logits, labels)

    def entropy(self, logits):
        if self.source == "verl":
            return self._verl_F.entropy_from_logits(logits)
        return local_entropy_from_logits(logits)

    def is_weights(self, log_ratio, response_mask, level: str):
        if self.source == "verl":
            weights, _ = self._verl_is(log_ratio, response_mask, rollout_is=level,
                                       rollout_is_threshold=self.cfg.is_threshold)
            return weights
        return local_is_weights(log_ratio, response_mask, level, self.cfg.is_threshold)

    def policy_loss(self, old_log_prob, log_prob, advantages, response_mask, batch_num_tokens, weights):
        c = self.cfg
        if self.source == "verl":
            self._actor_config.global_batch_info.update(
                dp_size=1, batch_num_tokens=batch_num_tokens, global_batch_size=c.num_sequences, loss_scale_factor=None
            )
            loss, _ = self._verl_loss(
                old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                response_mask=response_mask.bool(), loss_agg_mode="token-mean", config=self._actor_config,
                rollout_is_weights=weights,
            )
            return loss
        return local_policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask.bool(), c.clip_ratio_low,
                                         c.clip_ratio_high, c.clip_ratio_c, batch_num_tokens, weights)


# ------------------------------------------------------------------------ the measurement (child process)


def masked_max_abs_diff(a, b, mask) -> float:
    import torch

    return float(torch.where(mask.bool(), (a.float() - b.float()).abs(), 0.0).max())


# (check, key of the skip's difference, key of the unskipped run's difference from a repeat of itself)
