"""compiled_rmsnorm: Qwen3's RMSNorm through torch.compile. On this CPU (Inductor's C++ kernels): the guard that the
compiled function is transformers' own expression (and the refusal of one that is not), apply/revert, and a tiny
Qwen3 wrapped as verl wraps the actor (FSDP1 NO_SHARD, bf16 compute, gradient checkpointing) against the eager norm
within the module's stated tolerance, and in fp32 through verl 0.9.1's own engine and PPO loss (packed, rlkit_varlen,
chunked log-probs) to fp32 rounding, where only the summation order can differ. On a GPU: the same at Qwen3-4B's
widths, in bf16."""
from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3 import modeling_qwen3

from rlkit.patches import PatchError, compiled_rmsnorm

BF16_STEP = 2.0 ** -8  # one bf16 rounding, relative
GRAD_BOUND = 2.0 ** -6  # of a flat parameter's largest gradient entry (the module docstring says why)


@pytest.fixture
def patch():
    compiled_rmsnorm.PATCH.apply()
    yield compiled_rmsnorm.PATCH
    compiled_rmsnorm.PATCH.revert()


def test_the_compiled_function_is_transformers_expression():
    compiled_rmsnorm.check_same_expression(modeling_qwen3.Qwen3RMSNorm)  # raises if not bit for bit


def test_a_transformers_norm_that_computes_otherwise_is_refused(monkeypatch):
    def weight_in_fp32(self, hidden_states):  # a plausible rewrite: the weight multiplied before the cast back
        x = hidden_states.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.float() * x).to(hidden_states.dtype)

    monkeypatch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", weight_in_fp32)
    with pytest.raises(PatchError, match=r"Qwen3RMSNorm.forward no longer computes rlkit's rms_norm .*Fix: "):
        compiled_rmsnorm.PATCH.apply()
    assert not compiled_rmsnorm.PATCH.active() and modeling_qwen3.Qwen3RMSNorm.forward is weight_in_fp32


def test_apply_is_idempotent_and_revert_restores_the_forward():
    original = modeling_qwen3.Qwen3RMSNorm.forward
    compiled_rmsnorm.PATCH.apply()
    compiled_rmsnorm.PATCH.apply()
    assert modeling_qwen3.Qwen3RMSNorm.forward is compiled_rmsnorm.forward
    compiled_rmsnorm.PATCH.revert()
    assert modeling_qwen3.Qwen3RMSNorm.forward is original and not compiled_rmsnorm.PATCH.active()


def _update(model: str, device, patched: bool, **overrides):
    """One fwd+bwd of a log-prob loss: the logits (fp32) and every flat parameter's gradient."""
    from rlkit.experiments.update_phase import build_fsdp_model

    (compiled_rmsnorm.PATCH.apply if patched else compiled_rmsnorm.PATCH.revert)()
    try:
        module = build_fsdp_model(model, device, seed=0, **overrides)
        generator = torch.Generator().manual_seed(1)
        ids = torch.randint(3, module.config.vocab_size, (2, 40), generator=generator).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = module(input_ids=ids).logits.float()
        logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).mean().backward()
        return logits.detach(), {n: p.grad.detach().clone() for n, p in module.named_parameters()}
    finally:
        compiled_rmsnorm.PATCH.revert()


def _assert_within_tolerance(eager, compiled):
    (logits, grads), (logits_c, grads_c) = eager, compiled
    assert (logits_c - logits).abs().max() <= BF16_STEP * logits.abs().max()
    for name, grad in grads.items():
        assert grad.abs().max() > 0, name  # a bound against zero would hold for anything
        assert (grads_c[name] - grad).abs().max() <= GRAD_BOUND * grad.abs().max(), name


def test_a_tiny_qwen3_wrapped_like_verls_actor_matches_the_eager_norm(single_rank_group):
    compiled_rmsnorm.CALLS.clear()
    eager = _update("tiny", torch.device("cpu"), patched=False)
    assert compiled_rmsnorm.CALLS["compiled"] == 0
    compiled = _update("tiny", torch.device("cpu"), patched=True)
    # 2 layers x 4 norms + the final one, in the forward and again in the checkpoint's recompute (8 + 1 + 8)
    assert compiled_rmsnorm.CALLS["compiled"] == 17
    _assert_within_tolerance(eager, compiled)


@pytest.mark.gpu
def test_qwen3_4b_widths_on_the_gpu_match_the_eager_norm_within_the_stated_tolerance(single_rank_group):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    device = torch.device("cuda", 0)
    eager = _update("qwen3-4b", device, patched=False, num_hidden_layers=2)
    compiled = _update("qwen3-4b", device, patched=True, num_hidden_layers=2)
    logits, logits_c = eager[0], compiled[0]
    print(f"compiled_rmsnorm on {torch.cuda.get_device_name(0)}: logits max |diff| "
          f"{(logits_c - logits).abs().max().item():.3g} (max |logit| {logits.abs().max().item():.3g}); gradients "
          + ", ".join(f"{n.split('.')[-2] if '.' in n else n}: {(compiled[1][n] - g).abs().max().item():.3g} of "
                      f"{g.abs().max().item():.3g}" for n, g in eager[1].items()))
    _assert_within_tolerance(eager, compiled)


@pytest.mark.verl
def test_through_verls_engine_in_fp32_only_the_summation_order_differs():
    """fp32 has no casts to emulate: the compiled norm differs from the eager one only in the order it sums a row's
    squares (and, backward, the gradients), so verl's packed update (rlkit_varlen, chunked log-probs, ppo_loss)
    agrees to fp32 rounding in loss, log-probs, entropy and every gradient."""
    from _verl_engine import assert_update_matches, build_fused, engine_update, restored_verl_model_patches

    from rlkit import models
    from rlkit.patches import chunked_logprobs, varlen_attention

    prompts, responses = [5, 3, 6, 2], [7, 4, 6, 9]
    model = models.build_random_model("tiny")
    compiled_rmsnorm.CALLS.clear()
    try:
        with restored_verl_model_patches(type(model)):
            varlen_attention.PATCH.apply()
            chunked_logprobs.PATCH.apply()
            model.set_attn_implementation(varlen_attention.NAME)
            build_fused(model, use_remove_padding=True)
            ref = engine_update(model, prompts, responses, fused=True, use_remove_padding=True)
            compiled_rmsnorm.PATCH.apply()
            out = engine_update(model, prompts, responses, fused=True, use_remove_padding=True)
    finally:
        for patch in (compiled_rmsnorm.PATCH, chunked_logprobs.PATCH, varlen_attention.PATCH):
            patch.revert()
    assert compiled_rmsnorm.CALLS["compiled"] == 2 * 4 + 1  # 2 layers x 4 norms + the final norm, one forward
    assert_update_matches(ref, out, model, prompts, responses)
