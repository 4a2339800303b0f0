"""Is a verl run strictly on-policy? The guard for skipping the separate old-log-prob pass.

verl's V1 trainer runs a no-grad forward over the whole batch (``_compute_old_log_prob``) before the
update, only to get ``old_log_probs``. When one optimizer step consumes the whole batch once, with
the weights that generated it, that forward computes exactly what the update's own forward computes
moments later: same weights, same tokens. rlkit then skips it and serves ``old_log_probs`` (and the
truncated importance-sampling weights derived from them) from ``log_prob.detach()`` inside the loss.

A skip in the wrong place would silently change training, so :func:`check_on_policy` lists every
precondition that fails, each naming its config key. This module reads configs only: it does not
import verl (the GPU node and the planner use it without verl).

Why ``use_dynamic_bsz`` and micro-batch sizes are *not* preconditions: bit-identity between a
separate pass and the update forward needs identical micro-batching (same packed shapes give the
same kernels), and verl's old pass uses ``log_prob_micro_batch_size_per_gpu`` /
``log_prob_max_token_len_per_gpu`` while the update uses ``ppo_*``. With different micro-batching
the two passes differ by floating-point noise only (same function of the same weights). The skip
serves the update forward's own values, so the PPO ratio is exactly 1 -- which is what on-policy
means -- whatever the micro-batching; the unskipped run carries that noise in its ratio instead.
The notebook measures the noise (``alt_micro_batch`` rows) next to the identical-batching 0.0.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The names the patch registers in verl (rlkit.patches.verl.onpolicy_verl); kept here so the guard and the
# recipe overrides need no verl import.
ONPOLICY_TRAINER = "rlkit_onpolicy"
# Loss without rollout log-probs: ignores the placeholder old_log_probs, ratio from log_prob.detach().
ONPOLICY_LOSS = "rlkit_onpolicy"
# Loss with rollout log-probs: the placeholder old_log_probs carries rollout_log_probs, from which the
# loss recomputes the truncated IS weights and the rollout_corr/* metrics against log_prob.detach().
ONPOLICY_TIS_LOSS = "rlkit_onpolicy_tis"
ONPOLICY_LOSSES = (ONPOLICY_LOSS, ONPOLICY_TIS_LOSS)
# Base policy losses whose only use of old_log_prob is the PPO ratio (so on-policy, ratio == 1).
SUPPORTED_BASE_LOSSES = ("vanilla",)
# Advantage estimators that read old_log_probs before the update (verl ray_trainer.compute_advantage).
ESTIMATORS_READING_OLD_LOG_PROBS = ("optimal_token_baseline", "tir_optimal_token_baseline")
# verl's trainer modes that train on weights older than the rollout's.
ASYNC_TRAINER_MODES = ("colocate_async", "separate_async")

_MISSING = object()


@dataclass(frozen=True)
class Verdict:
    """``ok`` when every precondition holds; otherwise ``reasons`` names each failing config key."""

    ok: bool
    reasons: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok

    def explain(self) -> str:
        if self.ok:
            return "strictly on-policy: the separate old_log_prob pass is skipped"
        lines = "\n".join(f"  - {r}" for r in self.reasons)
        return f"not strictly on-policy, the old_log_prob pass runs unchanged because:\n{lines}"


def as_mapping(config: Any) -> Mapping:
    """A plain nested mapping from an OmegaConf config (interpolations resolved) or a dict."""
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # the GPU node may lack omegaconf; dicts still work
        DictConfig = ()
    if DictConfig and isinstance(config, DictConfig):
        return OmegaConf.to_container(config, resolve=True)
    if isinstance(config, Mapping):
        return config
    raise TypeError(
        f"check_on_policy expects a verl config (OmegaConf DictConfig or nested dict), got {type(config).__name__}"
    )


def get_key(config: Mapping, dotted: str, default: Any = _MISSING) -> Any:
    """``config['a']['b']`` for ``'a.b'``; ``default`` when a level is missing (an explicit None stays None)."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def check_on_policy(config: Any) -> Verdict:
    """Every reason this verl config is not strictly on-policy (empty list: skip is safe).

    Missing keys take verl 0.9.1's defaults, except the batch sizes, which must be present.
    """
    cfg = as_mapping(config)
    reasons = [*_one_pass_per_batch(cfg), *_synchronous_trainer(cfg), *_no_early_readers(cfg), *_rollout_correction(cfg)]
    return Verdict(ok=not reasons, reasons=reasons)


def _failing(*checks: tuple[bool, str]) -> list[str]:
    """The reasons of the checks whose condition does not hold."""
    return [reason for holds, reason in checks if not holds]


def _one_pass_per_batch(cfg: Mapping) -> list[str]:
    """One optimizer step per batch, one pass over it: the weights that generated the batch are the weights of the
    update's forward."""
    mini = get_key(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size", None)
    train = get_key(cfg, "data.train_batch_size", None)
    epochs = get_key(cfg, "actor_rollout_ref.actor.ppo_epochs", 1)
    if mini is None or train is None:
        batch = (False, ("actor_rollout_ref.actor.ppo_mini_batch_size and data.train_batch_size must both be set "
                        f"(got {mini!r} and {train!r}); fix: set ppo_mini_batch_size = train_batch_size"))
    else:
        batch = (mini == train,
                 (f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} != data.train_batch_size={train}: "
                 f"{-(-train // mini)} optimizer steps per batch, so later mini-batches are off-policy; "
                 "fix: ppo_mini_batch_size = train_batch_size"))
    return _failing(
        batch,
        (epochs == 1,
         f"actor_rollout_ref.actor.ppo_epochs={epochs}: epochs after the first train on updated weights; fix: ppo_epochs=1"),
    )


def _synchronous_trainer(cfg: Mapping) -> list[str]:
    """The V1 sync trainer, one parameter sync per step, no asynchronous or stale rollouts."""
    mode = get_key(cfg, "trainer.v1.trainer_mode", "sync")
    sync_steps = get_key(cfg, "trainer.v1.sync.parameter_sync_step", 1)
    custom_sampler = get_key(cfg, "trainer.v1.sampler.custom_sampler", {}) or {}
    return _failing(
        (bool(get_key(cfg, "trainer.use_v1", True)),
         ("trainer.use_v1=false: rlkit hooks the V1 trainer only (the legacy RayPPOTrainer still runs the pass); "
         "fix: trainer.use_v1=true")),
        (mode in ("sync", ONPOLICY_TRAINER),
         f"trainer.v1.trainer_mode={mode!r}: "
         + ("asynchronous rollout trains on trajectories from older weights"
            if mode in ASYNC_TRAINER_MODES else "unknown trainer, cannot verify it is synchronous")
         + "; fix: trainer.v1.trainer_mode=sync"),
        (sync_steps == 1,
         (f"trainer.v1.sync.parameter_sync_step={sync_steps}: several local updates per parameter sync; "
         "fix: parameter_sync_step=1")),
        (not (custom_sampler.get("path") and custom_sampler.get("name")),
         (f"trainer.v1.sampler.custom_sampler={custom_sampler.get('path')}:{custom_sampler.get('name')}: "
         "a custom replay buffer may serve stale trajectories; fix: remove it")),
        (not get_key(cfg, "actor_rollout_ref.actor.use_rollout_log_probs", False),
         ("actor_rollout_ref.actor.use_rollout_log_probs=true (fully-async/partial rollout): old_log_probs "
         "are the rollout's; fix: set it false")),
    )


def _no_early_readers(cfg: Mapping) -> list[str]:
    """Nothing may read old_log_probs before the update."""
    estimator = get_key(cfg, "algorithm.adv_estimator", "gae")
    loss_mode = get_key(cfg, "actor_rollout_ref.actor.policy_loss.loss_mode", "vanilla")
    return _failing(
        (not get_key(cfg, "algorithm.use_kl_in_reward", False),
         ("algorithm.use_kl_in_reward=true: the KL penalty reads old_log_probs before the update; "
         "fix: use_kl_in_reward=false (use actor.use_kl_loss instead)")),
        (estimator not in ESTIMATORS_READING_OLD_LOG_PROBS,
         (f"algorithm.adv_estimator={estimator}: the optimal-token baseline reads old_log_probs before the "
         "update; fix: use grpo/rloo/gae")),
        (not get_key(cfg, "distillation.enabled", False),
         "distillation.enabled=true: distillation losses read old_log_probs; fix: disable distillation"),
        (loss_mode in SUPPORTED_BASE_LOSSES + ONPOLICY_LOSSES,
         (f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r}: the on-policy loss wraps only "
         f"{list(SUPPORTED_BASE_LOSSES)}; fix: loss_mode=vanilla")),
    )


def _rollout_correction(cfg: Mapping) -> list[str]:
    """Rollout correction: what needs old_log_probs for the whole batch before the update."""
    rc = "algorithm.rollout_correction"
    rollout_rs = get_key(cfg, f"{rc}.rollout_rs", None)
    rollout_is = get_key(cfg, f"{rc}.rollout_is", None)
    return _failing(
        (not get_key(cfg, f"{rc}.bypass_mode", False),
         (f"{rc}.bypass_mode=true: verl already skips the pass and trains against the rollout's "
         "log-probs (ratio pi_theta/pi_rollout, a different algorithm); nothing to skip")),
        (rollout_rs is None,
         (f"{rc}.rollout_rs={rollout_rs!r}: decoupled rejection sampling rewrites response_mask before the "
         "advantages and the loss's token count, which needs old_log_probs first; fix: rollout_rs=null")),
        (rollout_is in (None, "token", "sequence"),
         f"{rc}.rollout_is={rollout_is!r}: unknown IS level; fix: null, token or sequence"),
        (rollout_is is None or not get_key(cfg, f"{rc}.rollout_is_batch_normalize", False),
         (f"{rc}.rollout_is_batch_normalize=true: normalising IS weights needs the batch-wide mean of "
         "old_log_probs-based weights before the update; fix: rollout_is_batch_normalize=false")),
    )


def uses_rollout_log_probs(config: Any) -> bool:
    """Whether rollouts return their log-probs (verl default: true), so IS weights can be served."""
    return bool(get_key(as_mapping(config), "actor_rollout_ref.rollout.calculate_log_probs", True))


def onpolicy_overrides(config: Any) -> list[str]:
    """Hydra overrides that turn the skip on for ``config``; ``[]`` (and the reasons printed) if unsafe.

    - ``trainer.v1.trainer_mode``: rlkit's sync trainer, which skips the pass and writes a placeholder.
    - ``policy_loss.loss_mode``: the on-policy loss (``old = log_prob.detach()``); the IS variant when
      rollouts carry log-probs.
    - ``policy_loss.rollout_correction.*``: the IS level/threshold the loss recomputes (always set:
      verl's ``PolicyLossConfig`` dataclass defaults ``rollout_is`` to ``sequence``).
    - ``calculate_entropy=true``: ``actor/entropy`` now comes from the update forward; with
      ``entropy_checkpointing=true`` when entropy was not computed there before, so its
      (tokens x vocab) softmax is recomputed in backward instead of being kept alive.
    """
    cfg = as_mapping(config)
    verdict = check_on_policy(cfg)
    if not verdict.ok:
        print(f"rlkit skip_old_logprob: {verdict.explain()}")
        return []
    with_rollout = uses_rollout_log_probs(cfg)
    overrides = [
        f"trainer.v1.trainer_mode={ONPOLICY_TRAINER}",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={ONPOLICY_TIS_LOSS if with_rollout else ONPOLICY_LOSS}",
    ]
    rc = "algorithm.rollout_correction"
    rollout_is = get_key(cfg, f"{rc}.rollout_is", None) if with_rollout else None
    threshold = get_key(cfg, f"{rc}.rollout_is_threshold", 2.0)
    prefix = "++actor_rollout_ref.actor.policy_loss.rollout_correction"
    overrides += [
        f"{prefix}.rollout_is={'null' if rollout_is is None else rollout_is}",
        f"{prefix}.rollout_is_threshold={threshold}",
        f"{prefix}.rollout_is_batch_normalize=false",
        f"{prefix}.rollout_rs=null",
        f"{prefix}.bypass_mode=false",
    ]
    entropy_in_update = bool(get_key(cfg, "actor_rollout_ref.actor.calculate_entropy", False)) or (
        get_key(cfg, "actor_rollout_ref.actor.entropy_coeff", 0) != 0
    )
    overrides.append("actor_rollout_ref.actor.calculate_entropy=true")
    if not entropy_in_update:
        overrides.append("actor_rollout_ref.actor.entropy_checkpointing=true")
    return overrides


# Metrics the skipped pass produced and where they come from with the skip (shown in notebook 04).
METRICS_WITH_SKIP: dict[str, str] = {
    "actor/entropy": "republished from the update forward's actor/entropy_loss (calculate_entropy=true); "
    "same token values, aggregated per micro-batch instead of once over the batch",
    "rollout_corr/* (kl, k3_kl, training_ppl, rollout_ppl, log_ppl_*, ppl_ratio, chi2_*)": "recomputed in the "
    "loss from log_prob.detach() vs rollout_log_probs; averaged over micro-batches instead of over the batch",
    "rollout_corr/rollout_is_* (IS weight statistics)": "recomputed in the loss per micro-batch (same weights)",
    "training/rollout_probs_diff_*, training/rollout_actor_probs_pearson_corr": "recomputed in the loss per "
    "micro-batch (calculate_debug_metrics)",
    "actor/ppo_kl, actor/pg_clipfrac, actor/pg_clipfrac_lower": "exactly 0 (ratio == 1); without the skip they "
    "show the old-pass-vs-update numerical noise",
    "rlkit/old_log_prob_skipped": "new: 1.0 when the pass was skipped",
}


def reference_config() -> dict[str, Any]:
    """The keys the guard reads, as verl 0.9.1 defaults plus the seed's strictly on-policy recipe."""
    return {
        "data": {"train_batch_size": 32},
        "trainer": {
            "use_v1": True,
            "v1": {"trainer_mode": "sync", "sync": {}, "sampler": {"custom_sampler": {"path": None, "name": None}}},
        },
        "algorithm": {
            "adv_estimator": "grpo",
            "use_kl_in_reward": False,
            "rollout_correction": {
                "rollout_is": None, "rollout_is_threshold": 2.0, "rollout_rs": None,
                "rollout_rs_threshold": None, "bypass_mode": False, "loss_type": "ppo_clip",
                "rollout_is_batch_normalize": False,
            },
        },
        "distillation": {"enabled": False},
        "actor_rollout_ref": {
            "actor": {
                "ppo_mini_batch_size": 32, "ppo_epochs": 1, "use_dynamic_bsz": True,
                "policy_loss": {"loss_mode": "vanilla"}, "calculate_entropy": False, "entropy_coeff": 0,
                "use_kl_loss": False,
            },
            "rollout": {"n": 8, "calculate_log_probs": True},
        },
    }


def with_overrides(config: Mapping, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of a nested-dict config with dotted keys set (``{"algorithm.use_kl_in_reward": True}``)."""
    import copy

    out = copy.deepcopy(dict(config))
    for dotted, value in overrides.items():
        node = out
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


# Off-policy variants of the reference config shown in notebook 04, one precondition each.
OFF_POLICY_EXAMPLES: dict[str, dict[str, Any]] = {
    "4 mini-batches per batch": {"actor_rollout_ref.actor.ppo_mini_batch_size": 8},
    "2 PPO epochs": {"actor_rollout_ref.actor.ppo_epochs": 2},
    "KL in reward": {"algorithm.use_kl_in_reward": True},
    "decoupled rejection sampling": {
        "algorithm.rollout_correction.rollout_rs": "token_k1", "algorithm.rollout_correction.rollout_rs_threshold": "0.5_2.0",
    },
    "bypass mode": {"algorithm.rollout_correction.bypass_mode": True},
    "optimal-token baseline": {"algorithm.adv_estimator": "optimal_token_baseline"},
    "async trainer": {"trainer.v1.trainer_mode": "separate_async"},
    "DAPO recipe (32 prompts / mini-batch 8, 2 syncs)": {
        "data.train_batch_size": 32, "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
        "trainer.v1.sync.parameter_sync_step": 2,
    },
}


def guard_examples() -> list[dict[str, Any]]:
    """The guard's verdict on the reference config and each off-policy example."""
    rows = []
    base = reference_config()
    cases = {"strictly on-policy (reference)": {}, **OFF_POLICY_EXAMPLES}
    for name, changes in cases.items():
        verdict = check_on_policy(with_overrides(base, changes))
        rows.append({"config": name, "changes": changes, "ok": verdict.ok, "reasons": list(verdict.reasons)})
    return rows
