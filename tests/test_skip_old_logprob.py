"""The skip serves the same numbers: bit-exact log-probs, IS weights, PPO loss and gradients; verl wiring."""
import dataclasses

import pytest
import torch

from rlkit.core.params import ParamError
from rlkit.core.results import load_profile
from rlkit.experiments import onpolicy_kernels as K
from rlkit.experiments import skip_old_logprob as exp

# measure() runs in this process here: no process-wide deterministic mode (tests/test_determinism.py runs it
# in a child, as run() does).
TINY = {**load_profile(exp.NOTEBOOK, "tiny"), "deterministic": False}


def _tiny(**changes):
    return {**TINY, **changes}


@pytest.fixture(scope="module")
def tiny_local():
    return exp.measure(_tiny(), prefer_verl=False)


def test_served_log_probs_are_bit_exact_on_tiny_qwen3(tiny_local):
    bits = tiny_local["bit_exactness"]
    assert tiny_local["implementation"]["source"] == "local"
    assert tiny_local["setup"]["num_micro_batches"] == 4 and tiny_local["setup"]["gradient_checkpointing"]
    assert bits["served_vs_old_log_prob_max_abs_diff"] == 0.0
    assert bits["entropy_update_vs_old_pass_max_abs_diff"] == 0.0
    assert bits["ratio_max_abs_dev_from_1_skip"] == 0.0


def test_ppo_loss_grads_and_is_weights_with_skip_equal_without(tiny_local):
    bits = tiny_local["bit_exactness"]
    assert bits["loss_skip"] == bits["loss_no_skip"] and bits["loss_skip"] != 0.0
    assert bits["grad_max_abs_diff"] == 0.0
    assert bits["is_weights_token_max_abs_diff"] == 0.0
    assert bits["is_weights_sequence_max_abs_diff"] == 0.0
    assert bits["is_weights_token_mean"] != 1.0  # the simulated rollout differs, so the weights matter


def test_comparison_detects_a_different_old_policy():
    """Control: the masked diff the measurement reports is non-zero when the old pass used other weights."""
    from rlkit.models.qwen import build_random_model

    cfg = exp.Config(**_tiny(num_sequences=4, response_length=8))
    model = build_random_model(cfg.model, seed=cfg.seed)
    batch = exp.make_batch(cfg, model.config.vocab_size, "cpu")
    labels = batch["input_ids"][:, cfg.prompt_length:]

    def log_probs():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    logits_to_keep=cfg.response_length + 1)
        return K.local_logprobs_from_logits(out.logits[:, :-1].float(), labels)

    with torch.no_grad():
        before = log_probs()
        next(model.parameters()).add_(1e-3)
        after = log_probs()
    assert K.masked_max_abs_diff(before, after, batch["response_mask"]) > 0.0


@pytest.mark.parametrize("key,value", [
    ("model", "qwen9"), ("micro_batch_size", 100), ("alt_micro_batch_size", 2), ("rollout_noise", -1.0),
    ("is_threshold", 1.0), ("num_sequences", 0),
])
def test_bad_parameters_name_the_key(key, value):
    with pytest.raises(ParamError, match=key):
        exp.Config(**_tiny(**{key: value}))


def test_config_fields_match_the_profiles():
    names = {f.name for f in dataclasses.fields(exp.Config)}
    assert set(TINY) == names
    assert set(load_profile(exp.NOTEBOOK, "h200")) == names


# ------------------------------------------------------------------------------------------- verl
@pytest.mark.verl
def test_local_copies_equal_verl_functions_bitwise():
    cfg = exp.Config(**_tiny())
    verl_k, local_k = K.Kernels(cfg), K.Kernels(cfg, prefer_verl=False)
    assert verl_k.source == "verl" and local_k.source == "local"
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=gen)
    labels = torch.randint(0, 50, (3, 7), generator=gen)
    mask = (torch.rand(3, 7, generator=gen) > 0.2).float()
    assert torch.equal(verl_k.log_probs(logits, labels), local_k.log_probs(logits, labels))
    assert torch.equal(verl_k.entropy(logits), local_k.entropy(logits))
    log_ratio = torch.randn(3, 7, generator=gen)
    for level in ("token", "sequence"):
        assert torch.equal(verl_k.is_weights(log_ratio, mask, level), local_k.is_weights(log_ratio, mask, level))
    old, new = torch.randn(3, 7, generator=gen), torch.randn(3, 7, generator=gen)
    adv = torch.randn(3, 7, generator=gen)
    w = torch.rand(3, 7, generator=gen) * 2
    for weights in (None, w):
        assert torch.equal(verl_k.policy_loss(old, new, adv, mask, 17, weights),
                           local_k.policy_loss(old, new, adv, mask, 17, weights))


@pytest.mark.verl
def test_measure_with_verl_functions_is_bit_exact():
    m = exp.measure(_tiny(num_sequences=4, timing_repeats=1), prefer_verl=True)
    bits = m["bit_exactness"]
    assert m["implementation"]["source"] == "verl"
    assert bits["served_vs_old_log_prob_max_abs_diff"] == 0.0 and bits["grad_max_abs_diff"] == 0.0
    assert bits["is_weights_token_max_abs_diff"] == 0.0 and bits["loss_abs_diff"] == 0.0


@pytest.fixture
def patch():
    from rlkit.patches import get

    p = get("skip_old_logprob")
    p.apply()
    yield p
    p.revert()


@pytest.mark.verl
def test_patch_registers_and_revert_unregisters(patch):
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from rlkit import patches
    from rlkit.patches.verl import onpolicy
    from rlkit.patches.verl import onpolicy_verl as verl_onpolicy

    assert "skip_old_logprob" in patches.active()
    assert get_trainer_cls(onpolicy.ONPOLICY_TRAINER) is verl_onpolicy.OnPolicySyncTrainer
    assert issubclass(verl_onpolicy.OnPolicySyncTrainer, PPOTrainerSync)
    assert core_algos.get_policy_loss_fn(onpolicy.ONPOLICY_TIS_LOSS) is verl_onpolicy.onpolicy_tis_policy_loss
    assert core_algos.get_policy_loss_fn(onpolicy.ONPOLICY_LOSS) is verl_onpolicy.onpolicy_policy_loss
    patch.apply()  # idempotent
    patch.revert()
    assert "skip_old_logprob" not in patches.active()
    for name in onpolicy.ONPOLICY_LOSSES:
        with pytest.raises(ValueError, match="Unsupported loss mode"):
            core_algos.get_policy_loss_fn(name)
    with pytest.raises(ValueError, match="Unknown trainer"):
        get_trainer_cls(onpolicy.ONPOLICY_TRAINER)
    assert get_trainer_cls("sync") is PPOTrainerSync


def _actor_config(rollout_is):
    from verl.workers.config import ActorConfig, PolicyLossConfig

    # As the recipe overrides deliver it to the worker: a plain dict (see test_onpolicy_guard).
    policy_loss = PolicyLossConfig(rollout_correction={"rollout_is": rollout_is, "rollout_is_threshold": 2.0})
    cfg = ActorConfig(strategy="fsdp", ppo_mini_batch_size=4, rollout_n=1, ppo_micro_batch_size_per_gpu=2,
                      clip_ratio_low=0.2, clip_ratio_high=0.28, policy_loss=policy_loss)
    cfg.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None)
    return cfg


def _loss_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 6, 11, generator=gen)
    labels = torch.randint(0, 11, (4, 6), generator=gen)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 4:] = False
    adv = torch.randn(4, 1, generator=gen).expand(4, 6) * mask
    rollout = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1) + 0.1 * torch.randn(4, 6, generator=gen)
    return logits, labels, mask, adv, rollout.clamp(max=0) * mask


@pytest.mark.parametrize("rollout_is", [None, "token", "sequence"])
@pytest.mark.verl
def test_registered_loss_equals_decoupled_verl_with_separate_old_pass(patch, rollout_is):
    """The worker-side loss with the placeholder == verl's vanilla loss fed a separate pass + driver IS weights."""
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
    from verl.utils.torch_functional import logprobs_from_logits

    from rlkit.patches.verl.onpolicy import ONPOLICY_TIS_LOSS

    logits, labels, mask, adv, rollout = _loss_inputs()
    config = _actor_config(rollout_is)
    with torch.no_grad():  # the skipped pass
        old = logprobs_from_logits(logits, labels)
    weights, _, _ = compute_rollout_correction_and_rejection_mask(old, rollout, mask.float(), rollout_is=rollout_is)
    results = {}
    for arm in ("skip", "no_skip"):
        leaf = logits.clone().requires_grad_(True)
        log_prob = logprobs_from_logits(leaf, labels)
        if arm == "skip":
            loss, metrics = core_algos.get_policy_loss_fn(ONPOLICY_TIS_LOSS)(
                old_log_prob=rollout, log_prob=log_prob, advantages=adv, response_mask=mask, config=config)
        else:
            loss, metrics = core_algos.compute_policy_loss_vanilla(
                old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask, config=config,
                rollout_is_weights=weights.batch["rollout_is_weights"] if weights is not None else None)
        loss.backward()
        results[arm] = (loss.detach(), leaf.grad, metrics)
    assert torch.equal(results["skip"][0], results["no_skip"][0])
    assert torch.equal(results["skip"][1], results["no_skip"][1])
    skip_metrics = results["skip"][2]
    assert skip_metrics["actor/ppo_kl"] == 0.0
    assert "rollout_corr/kl" in skip_metrics and "training/rollout_probs_diff_max" in skip_metrics
    assert ("rollout_corr/rollout_is_mean" in skip_metrics) == (rollout_is is not None)


@pytest.mark.verl
def test_plain_onpolicy_loss_ignores_the_placeholder(patch):
    from verl.trainer.ppo import core_algos

    from rlkit.patches.verl.onpolicy import ONPOLICY_LOSS
    from rlkit.patches.verl.onpolicy_verl import OnPolicyConfigError

    logits, labels, mask, adv, _ = _loss_inputs(1)
    log_prob = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    fn = core_algos.get_policy_loss_fn(ONPOLICY_LOSS)
    config = _actor_config(None)
    a, _ = fn(old_log_prob=torch.zeros(4, 6), log_prob=log_prob, advantages=adv, response_mask=mask, config=config)
    b, _ = fn(old_log_prob=torch.randn(4, 6), log_prob=log_prob, advantages=adv, response_mask=mask, config=config)
    assert torch.equal(a, b)
    with pytest.raises(OnPolicyConfigError, match="driver-side rollout_is_weights"):
        fn(old_log_prob=log_prob, log_prob=log_prob, advantages=adv, response_mask=mask, config=config,
           rollout_is_weights=torch.ones(4, 6))


def _trainer_config(**changes):
    from omegaconf import OmegaConf

    from rlkit.patches.verl import onpolicy

    cfg = onpolicy.with_overrides(onpolicy.reference_config(), {
        "trainer.v1.trainer_mode": onpolicy.ONPOLICY_TRAINER,
        "actor_rollout_ref.actor.policy_loss.loss_mode": onpolicy.ONPOLICY_TIS_LOSS,
        "actor_rollout_ref.actor.policy_loss.rollout_correction": {"rollout_is": None, "rollout_is_threshold": 2.0},
        "actor_rollout_ref.rollout.temperature": 1.0,  # read by verl's own pass (fallback test)
        **changes,
    })
    return OmegaConf.create(cfg)


class _NoForward:
    def compute_log_prob(self, batch):
        raise AssertionError("the old_log_prob forward ran")


class _FakeTransferQueue:
    """A dict-backed stand-in for the TransferQueue client (the store, not the code under test)."""

    def __init__(self, fields):
        self.fields = fields

    def kv_batch_get(self, keys, partition_id, select_fields):
        from tensordict import TensorDict

        return TensorDict({f: self.fields[f] for f in select_fields}, batch_size=len(keys))

    def kv_batch_put(self, keys, partition_id, fields):
        self.fields.update(dict(fields.items()))


def _trainer(monkeypatch, config, fields):
    from types import SimpleNamespace

    from rlkit.patches.verl import onpolicy_verl as verl_onpolicy

    store = _FakeTransferQueue(fields)
    monkeypatch.setattr(verl_onpolicy, "tq", store)
    trainer = object.__new__(verl_onpolicy.OnPolicySyncTrainer)  # the verl __init__ needs Ray; set what the hook reads
    trainer.config = config
    trainer.skip_old_log_prob, _ = verl_onpolicy.skip_decision(config)
    trainer.serve_rollout_log_probs = verl_onpolicy.uses_rollout_log_probs(config)
    trainer.actor_rollout_wg = _NoForward()
    batch = SimpleNamespace(keys=["a", "b"], partition_id="train", extra_info={})
    return trainer, batch, store


@pytest.mark.verl
def test_trainer_skips_the_forward_and_writes_the_placeholder(monkeypatch):
    rollout = torch.nested.nested_tensor([torch.tensor([-0.5, -1.0]), torch.tensor([-2.0, -0.1, -0.3])],
                                         layout=torch.jagged)
    trainer, batch, store = _trainer(monkeypatch, _trainer_config(), {"rollout_log_probs": rollout})
    assert trainer.trainer_mode == "sync"  # verl's sync code paths (replay buffer, refill) stay selected
    metrics = {}
    assert trainer._compute_old_log_prob(batch, metrics) is batch
    assert metrics["rlkit/old_log_prob_skipped"] == 1.0
    assert torch.equal(store.fields["old_log_probs"].values(), rollout.values())


@pytest.mark.verl
def test_trainer_writes_zeros_without_rollout_log_probs(monkeypatch):
    from rlkit.patches.verl.onpolicy import ONPOLICY_LOSS

    mask = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    config = _trainer_config(**{"actor_rollout_ref.rollout.calculate_log_probs": False,
                                "actor_rollout_ref.actor.policy_loss.loss_mode": ONPOLICY_LOSS})
    trainer, batch, store = _trainer(monkeypatch, config, {"response_mask": mask})
    trainer._compute_old_log_prob(batch, {})
    assert store.fields["old_log_probs"].values().abs().sum() == 0 and store.fields["old_log_probs"].values().numel() == 5


@pytest.mark.verl
def test_trainer_falls_back_to_verls_pass_when_not_on_policy(monkeypatch, capsys):
    from rlkit.patches.verl import onpolicy_verl as verl_onpolicy

    config = _trainer_config(**{"actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
                                "actor_rollout_ref.actor.ppo_epochs": 2})
    skip, reasons = verl_onpolicy.skip_decision(config)
    assert not skip and "actor_rollout_ref.actor.ppo_epochs" in reasons[0]
    trainer, batch, _ = _trainer(monkeypatch, config, {})
    with pytest.raises(AssertionError, match="the old_log_prob forward ran"):  # verl's original pass is called
        trainer._compute_old_log_prob(batch, {})


@pytest.mark.verl
def test_skip_decision_refuses_configs_that_would_change_training():
    from rlkit.patches.verl.onpolicy_verl import OnPolicyConfigError, skip_decision

    with pytest.raises(OnPolicyConfigError, match="ppo_epochs"):  # our loss, but off-policy
        skip_decision(_trainer_config(**{"actor_rollout_ref.actor.ppo_epochs": 2}))
    with pytest.raises(OnPolicyConfigError, match="calculate_log_probs"):
        skip_decision(_trainer_config(**{"actor_rollout_ref.rollout.calculate_log_probs": False}))
    with pytest.raises(OnPolicyConfigError, match="rollout_is"):
        skip_decision(_trainer_config(**{"algorithm.rollout_correction.rollout_is": "token"}))
    skip, reasons = skip_decision(_trainer_config(**{"actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla"}))
    assert not skip and "placeholder" in reasons[0]


@pytest.mark.verl
def test_driver_rollout_correction_is_held_off_and_restored():
    from rlkit.patches.verl.onpolicy_verl import rollout_correction_in_loss

    config = _trainer_config()
    with rollout_correction_in_loss(config.algorithm):
        assert config.algorithm.rollout_correction.bypass_mode is True
    assert config.algorithm.rollout_correction.bypass_mode is False


@pytest.mark.verl
def test_metrics_are_republished_under_the_old_names():
    from rlkit.patches.verl.onpolicy_verl import republish_metrics

    metrics = {"actor/entropy_loss": 2.5, "actor/rollout_corr/kl": 0.01, "actor/training/rollout_probs_diff_max": 0.2,
               "actor/pg_loss": 0.1}
    republish_metrics(metrics)
    assert metrics == {"actor/entropy_loss": 2.5, "actor/entropy": 2.5, "rollout_corr/kl": 0.01,
                       "training/rollout_probs_diff_max": 0.2, "actor/pg_loss": 0.1}
