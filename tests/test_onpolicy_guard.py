"""The on-policy guard: each precondition alone flips the verdict, naming its config key."""
import os

import pytest

from rlkit.patches.verl import onpolicy
from rlkit.patches.verl.onpolicy import check_on_policy, onpolicy_overrides, reference_config, with_overrides

# (change to the strictly on-policy reference config, config key the reason must name)
PRECONDITIONS = [
    ({"actor_rollout_ref.actor.ppo_mini_batch_size": 8}, "actor_rollout_ref.actor.ppo_mini_batch_size"),
    ({"data.train_batch_size": 64}, "data.train_batch_size"),
    ({"actor_rollout_ref.actor.ppo_epochs": 2}, "actor_rollout_ref.actor.ppo_epochs"),
    ({"trainer.use_v1": False}, "trainer.use_v1"),
    ({"trainer.v1.trainer_mode": "colocate_async"}, "trainer.v1.trainer_mode"),
    ({"trainer.v1.trainer_mode": "my_trainer"}, "trainer.v1.trainer_mode"),
    ({"trainer.v1.sync.parameter_sync_step": 2}, "trainer.v1.sync.parameter_sync_step"),
    ({"trainer.v1.sampler.custom_sampler": {"path": "x.py", "name": "Buf"}}, "trainer.v1.sampler.custom_sampler"),
    ({"actor_rollout_ref.actor.use_rollout_log_probs": True}, "actor_rollout_ref.actor.use_rollout_log_probs"),
    ({"algorithm.use_kl_in_reward": True}, "algorithm.use_kl_in_reward"),
    ({"algorithm.adv_estimator": "optimal_token_baseline"}, "algorithm.adv_estimator"),
    ({"algorithm.adv_estimator": "tir_optimal_token_baseline"}, "algorithm.adv_estimator"),
    ({"distillation.enabled": True}, "distillation.enabled"),
    ({"actor_rollout_ref.actor.policy_loss.loss_mode": "gspo"}, "actor_rollout_ref.actor.policy_loss.loss_mode"),
    ({"algorithm.rollout_correction.bypass_mode": True}, "algorithm.rollout_correction.bypass_mode"),
    ({"algorithm.rollout_correction.rollout_rs": "token_k1"}, "algorithm.rollout_correction.rollout_rs"),
    ({"algorithm.rollout_correction.rollout_is": "geometric"}, "algorithm.rollout_correction.rollout_is"),
    (
        {"algorithm.rollout_correction.rollout_is": "token", "algorithm.rollout_correction.rollout_is_batch_normalize": True},
        "algorithm.rollout_correction.rollout_is_batch_normalize",
    ),
]


def test_reference_config_is_on_policy():
    verdict = check_on_policy(reference_config())
    assert verdict.ok and verdict.reasons == [] and bool(verdict)


@pytest.mark.parametrize("changes,key", PRECONDITIONS, ids=[k for _, k in PRECONDITIONS])
def test_each_precondition_flips_the_verdict_and_names_its_key(changes, key):
    verdict = check_on_policy(with_overrides(reference_config(), changes))
    assert not verdict.ok
    assert len(verdict.reasons) == 1, verdict.reasons
    assert key in verdict.reasons[0]
    assert "fix" in verdict.reasons[0] or "nothing to skip" in verdict.reasons[0]
    assert key in verdict.explain()


@pytest.mark.parametrize("changes", [
    {"algorithm.rollout_correction.rollout_is": "token"},
    {"algorithm.rollout_correction.rollout_is": "sequence", "algorithm.rollout_correction.rollout_is_threshold": 3.0},
    {"actor_rollout_ref.actor.use_dynamic_bsz": False},
    {"actor_rollout_ref.actor.use_kl_loss": True},
    {"algorithm.adv_estimator": "gae"},
    {"trainer.v1.trainer_mode": onpolicy.ONPOLICY_TRAINER},
    {"actor_rollout_ref.actor.policy_loss.loss_mode": onpolicy.ONPOLICY_TIS_LOSS},
])
def test_on_policy_variants_pass(changes):
    assert check_on_policy(with_overrides(reference_config(), changes)).ok


def test_every_failure_is_listed():
    changes = {"actor_rollout_ref.actor.ppo_epochs": 3, "algorithm.use_kl_in_reward": True,
               "algorithm.rollout_correction.bypass_mode": True}
    assert len(check_on_policy(with_overrides(reference_config(), changes)).reasons) == 3


def test_missing_batch_sizes_are_a_reason():
    cfg = reference_config()
    del cfg["data"]["train_batch_size"]
    verdict = check_on_policy(cfg)
    assert not verdict.ok and "data.train_batch_size" in verdict.reasons[0]


def test_omegaconf_input_with_interpolation():
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(reference_config())
    cfg.actor_rollout_ref.actor.ppo_mini_batch_size = "${data.train_batch_size}"
    assert check_on_policy(cfg).ok
    cfg.actor_rollout_ref.actor.ppo_epochs = 2
    assert "actor_rollout_ref.actor.ppo_epochs" in check_on_policy(cfg).reasons[0]


def test_bad_input_type():
    with pytest.raises(TypeError, match="OmegaConf DictConfig or nested dict"):
        check_on_policy(["not", "a", "config"])


def test_overrides_empty_and_reasons_printed_when_off_policy(capsys):
    assert onpolicy_overrides(with_overrides(reference_config(), {"actor_rollout_ref.actor.ppo_epochs": 2})) == []
    assert "actor_rollout_ref.actor.ppo_epochs" in capsys.readouterr().out


def test_overrides_when_on_policy():
    overrides = onpolicy_overrides(with_overrides(reference_config(), {"algorithm.rollout_correction.rollout_is": "token"}))
    assert f"trainer.v1.trainer_mode={onpolicy.ONPOLICY_TRAINER}" in overrides
    assert f"actor_rollout_ref.actor.policy_loss.loss_mode={onpolicy.ONPOLICY_TIS_LOSS}" in overrides
    assert "++actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is=token" in overrides
    assert "actor_rollout_ref.actor.calculate_entropy=true" in overrides
    assert "actor_rollout_ref.actor.entropy_checkpointing=true" in overrides


def test_overrides_without_rollout_log_probs_and_with_entropy_already_in_update():
    cfg = with_overrides(reference_config(), {
        "actor_rollout_ref.rollout.calculate_log_probs": False, "algorithm.rollout_correction.rollout_is": "token",
        "actor_rollout_ref.actor.entropy_coeff": 0.001,
    })
    overrides = onpolicy_overrides(cfg)
    assert f"actor_rollout_ref.actor.policy_loss.loss_mode={onpolicy.ONPOLICY_LOSS}" in overrides
    # verl runs no IS correction without rollout log-probs, so neither does the loss
    assert "++actor_rollout_ref.actor.policy_loss.rollout_correction.rollout_is=null" in overrides
    assert not any("entropy_checkpointing" in o for o in overrides)


def test_guard_examples_cover_reference_and_off_policy():
    rows = onpolicy.guard_examples()
    assert rows[0]["ok"] and not any(r["ok"] for r in rows[1:])
    assert all(r["reasons"] for r in rows[1:])


def _compose_verl(overrides):
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose("ppo_trainer", overrides=overrides)


# The seed's strictly on-policy recipe on verl's real default config (32 prompts x 8, one mini-batch).
RECIPE = [
    "algorithm.adv_estimator=grpo", "data.train_batch_size=32", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "algorithm.rollout_correction.rollout_is=token",
]


@pytest.mark.verl
def test_overrides_compose_with_verls_real_config():
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    from rlkit.patches.verl.onpolicy_verl import skip_decision

    base = _compose_verl(RECIPE)
    assert check_on_policy(base).ok
    final = _compose_verl(RECIPE + onpolicy_overrides(base))
    assert check_on_policy(final).ok
    assert skip_decision(final) == (True, [])
    OmegaConf.resolve(final)
    actor = omega_conf_to_dataclass(final.actor_rollout_ref.actor)
    assert actor.policy_loss.loss_mode == onpolicy.ONPOLICY_TIS_LOSS
    assert actor.policy_loss.get("rollout_correction").get("rollout_is") == "token"
    assert actor.calculate_entropy and actor.entropy_checkpointing
    # Without the explicit override the worker's PolicyLossConfig dataclass default is sequence-level IS.
    plain = _compose_verl(RECIPE)
    OmegaConf.resolve(plain)
    assert omega_conf_to_dataclass(plain.actor_rollout_ref.actor).policy_loss.rollout_correction.rollout_is == "sequence"


@pytest.mark.verl
def test_verl_default_config_is_off_policy_for_the_right_reason():
    verdict = check_on_policy(_compose_verl([]))  # train_batch_size 1024 vs ppo_mini_batch_size 256
    assert not verdict.ok
    assert len(verdict.reasons) == 1 and "ppo_mini_batch_size=256" in verdict.reasons[0]
