"""metric_entropy against verl 0.9.1's own ppo_loss: with entropy_coeff 0 the gradient and the metrics are
bit-identical to the unpatched loss, and backward no longer reaches the (checkpointed) entropy."""
import pytest
import torch

pytestmark = pytest.mark.verl

BSZ, PROMPT, RESPONSE, VOCAB = 3, 4, 5, 17


@pytest.fixture
def patch():
    from rlkit.patches import get

    p = get("metric_entropy")
    yield p
    p.revert()


def _config(entropy_coeff):
    from verl.workers.config import ActorConfig

    cfg = ActorConfig(strategy="fsdp", ppo_mini_batch_size=4, rollout_n=1, ppo_micro_batch_size_per_gpu=2,
                      clip_ratio_low=0.2, clip_ratio_high=0.28, entropy_coeff=entropy_coeff)
    cfg.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None)
    return cfg


def _data(gen):
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    attention = torch.ones(BSZ, PROMPT + RESPONSE, dtype=torch.long)
    attention[1, PROMPT + 3:] = 0  # a shorter response
    response_mask = attention[:, PROMPT:].clone()
    data = TensorDict({
        "prompts": torch.randint(0, VOCAB, (BSZ, PROMPT), generator=gen),
        "responses": torch.randint(0, VOCAB, (BSZ, RESPONSE), generator=gen),
        "attention_mask": attention, "response_mask": response_mask,
        "old_log_probs": -torch.rand(BSZ, RESPONSE, generator=gen),
        "advantages": torch.randn(BSZ, 1, generator=gen).expand(BSZ, RESPONSE) * response_mask,
    }, batch_size=[BSZ])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    return data, int(attention.sum())


def _loss_and_grad(entropy_coeff, *, patched):
    """verl's engine-worker ppo_loss on model outputs computed from one leaf of logits, as the engine does:
    log-probs row-wise, entropy through a (reentrant) checkpoint. Returns loss, grad, metrics, recomputes."""
    from verl.utils import torch_functional as verl_F
    from verl.workers import engine_workers

    from rlkit import patches

    gen = torch.Generator().manual_seed(0)
    data, nnz = _data(gen)
    leaf = torch.randn(nnz, VOCAB, generator=gen).requires_grad_(True)
    labels = torch.randint(0, VOCAB, (nnz,), generator=gen)
    recomputes = []

    def entropy_fn(logits):
        recomputes.append(torch.is_grad_enabled())  # True only in checkpoint's backward recompute
        return verl_F.entropy_from_logits(logits)

    model_output = {"log_probs": verl_F.logprobs_from_logits(leaf, labels),
                    "entropy": torch.utils.checkpoint.checkpoint(entropy_fn, leaf, use_reentrant=True)}
    loss, metrics = engine_workers.ppo_loss(config=_config(entropy_coeff), model_output=model_output, data=data)
    loss.backward()
    assert patched == ("metric_entropy" in patches.active())
    return loss.detach(), leaf.grad, metrics, recomputes


def _metric_values(metrics):
    return {k: (v.values if hasattr(v, "values") else v) for k, v in metrics.items()}  # verl Metric: .values


def test_apply_is_idempotent_and_revert_restores_verl(patch):
    from verl.workers import engine_workers

    original = engine_workers.ppo_loss
    patch.apply()
    wrapped = engine_workers.ppo_loss
    patch.apply()
    assert engine_workers.ppo_loss is wrapped is not original
    patch.revert()
    assert engine_workers.ppo_loss is original


def test_zero_coefficient_same_gradient_and_metrics_without_the_entropy_backward(patch):
    loss0, grad0, metrics0, recomputes0 = _loss_and_grad(0.0, patched=False)
    patch.apply()
    loss1, grad1, metrics1, recomputes1 = _loss_and_grad(0.0, patched=True)
    assert torch.equal(loss0, loss1) and (grad0 - grad1).abs().max().item() == 0.0
    values0, values1 = _metric_values(metrics0), _metric_values(metrics1)
    assert values0.keys() == values1.keys() and "actor/entropy_loss" in values1
    for key in values0:
        assert torch.equal(torch.as_tensor(values0[key]).float(), torch.as_tensor(values1[key]).float()), key
    assert recomputes0 == [False, True]  # verl: the checkpointed entropy is recomputed in backward
    assert recomputes1 == [False]  # patched: it is not


def test_nonzero_coefficient_is_left_to_verl(patch):
    loss0, grad0, _, recomputes0 = _loss_and_grad(0.01, patched=False)
    patch.apply()
    loss1, grad1, _, recomputes1 = _loss_and_grad(0.01, patched=True)
    assert torch.equal(loss0, loss1) and torch.equal(grad0, grad1)
    assert recomputes0 == recomputes1 == [False, True]
