"""What tests/test_chunked_logprobs.py and tests/test_varlen_attention.py share: verl 0.9.1's FSDP engine
(``FSDPEngineWithLMHead``) around a plain CPU module, a GRPO micro-batch in the engine's layout, and one
forward through the engine's own input and output code.

verl's ``FSDPEngine.__init__`` needs a GPU and a process group; the engine's model-facing methods
(``prepare_model_inputs``, ``prepare_model_outputs``) read only the attributes set here. ``engine_forward``
is ``FSDPEngineWithLMHead.forward_step`` without its device move and autocast (``get_device_id()`` fails
without CUDA), so every computation the tests compare runs in verl's code or the model.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from types import SimpleNamespace

import torch

FP32_EPS = torch.finfo(torch.float32).eps


def engine_for(module):
    from verl.utils import torch_functional as verl_F
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    engine = object.__new__(FSDPEngineWithLMHead)
    engine.module = module
    engine.engine_config = SimpleNamespace(entropy_checkpointing=False, entropy_from_logits_with_chunking=False)
    engine.compute_entropy_from_logits = verl_F.entropy_from_logits
    engine.pad_to_length = False
    engine.use_ulysses_sp = False
    return engine


def actor_config(entropy_coeff: float = 0.0):
    from verl.workers.config import ActorConfig

    cfg = ActorConfig(strategy="fsdp", ppo_mini_batch_size=4, rollout_n=1, ppo_micro_batch_size_per_gpu=4,
                      clip_ratio_low=0.2, clip_ratio_high=0.28, entropy_coeff=entropy_coeff)
    cfg.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None)
    return cfg


def grpo_micro_batch(vocab: int, prompt_lens, response_lens, *, use_remove_padding: bool, use_fused_kernels: bool,
                     calculate_entropy: bool = True, temperature: float = 1.0, seed: int = 0):
    """Left-padded prompts + right-padded responses as the rollout hands them over, converted by verl's own
    ``left_right_2_no_padding`` into the engine's nested layout, with the keys ppo_loss reads."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    gen = torch.Generator().manual_seed(seed)
    bsz, prompt, response = len(prompt_lens), max(prompt_lens), max(response_lens)
    prompt_mask = torch.stack([torch.arange(prompt) >= prompt - n for n in prompt_lens]).long()
    response_mask = torch.stack([torch.arange(response) < n for n in response_lens]).long()
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    prompts = torch.randint(3, vocab, (bsz, prompt), generator=gen) * prompt_mask
    responses = torch.randint(3, vocab, (bsz, response), generator=gen) * response_mask
    data = TensorDict({
        "prompts": prompts, "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask, "response_mask": response_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "old_log_probs": -3 - torch.rand(bsz, response, generator=gen),
        "advantages": torch.randn(bsz, 1, generator=gen).expand(bsz, response) * response_mask,
    }, batch_size=[bsz])
    data = left_right_2_no_padding(data)
    tu.assign_non_tensor(data, use_remove_padding=use_remove_padding, use_fused_kernels=use_fused_kernels,
                         calculate_entropy=calculate_entropy, temperature=temperature,
                         dp_size=1, batch_num_tokens=None, global_batch_size=None)
    return data


def engine_forward(engine, micro_batch, loss_function=None):
    """``forward_step``'s body: the engine's inputs, the model, the engine's outputs, the loss."""
    model_inputs, output_args = engine.prepare_model_inputs(micro_batch=micro_batch)
    raw_output = engine.module(**model_inputs, use_cache=False)
    model_output = engine.prepare_model_outputs(output=raw_output, output_args=output_args, micro_batch=micro_batch,
                                                logits_processor_func=loss_function)
    loss = None
    if loss_function is not None:
        loss, _ = loss_function(model_output=model_output, data=micro_batch, dp_group=None)
    return loss, model_output


@contextmanager
def restored_verl_model_patches(model_class):
    """verl's ``apply_monkey_patch`` sets class-level forwards (the fused forward on the causal-LM class, the
    Ulysses flash-attention hook); put them back so later tests see stock transformers."""
    from transformers.integrations import flash_attention

    forward = model_class.__dict__.get("forward")
    flash = flash_attention._flash_attention_forward
    try:
        yield
    finally:
        model_class.forward = forward
        flash_attention._flash_attention_forward = flash


def fp32_bound(values: torch.Tensor, terms: int, floor: float = 1.0) -> float:
    """How far two fp32 evaluations of the same sums may differ when only the order of the terms does: a
    pairwise/blocked reduction of ``terms`` terms rounds each value ~log2(terms) times, each by at most eps of the
    running magnitude, bounded here by the largest |value| (log-probs and entropies are sums of O(1) terms,
    hence the floor of 1); a factor 4 for the two reductions each value goes through (log-sum-exp, then the
    gather or the dot)."""
    return 4 * math.ceil(math.log2(terms)) * FP32_EPS * max(values.abs().max().item(), floor)


def engine_update(model, prompts, responses, *, fused: bool, entropy_coeff: float = 0.0,
                  use_remove_padding: bool = False):
    """One GRPO micro-batch through the engine and verl's ppo_loss, then backward: loss, nested log-probs and
    entropy values, per-parameter gradients."""
    from verl.workers.engine_workers import ppo_loss

    model.zero_grad(set_to_none=True)
    batch = grpo_micro_batch(model.config.vocab_size, prompts, responses, use_remove_padding=use_remove_padding,
                             use_fused_kernels=fused)
    config = actor_config(entropy_coeff)
    loss, output = engine_forward(engine_for(model), batch,
                                  lambda model_output, data, dp_group: ppo_loss(config, model_output, data, dp_group))
    loss.backward()
    return (loss.detach(), output["log_probs"].values().detach(), output["entropy"].values().detach(),
            {name: p.grad.clone() for name, p in model.named_parameters()})


def build_fused(model, use_remove_padding: bool = False):
    """The engine's model build step with the fused torch backend: its (possibly patched) apply_monkey_patch,
    called as ``FSDPEngine._build_module`` calls it."""
    from verl.workers.engine.fsdp import transformer_impl

    transformer_impl.apply_monkey_patch(model=model, use_remove_padding=use_remove_padding, ulysses_sp_size=1,
                                        use_fused_kernels=True, fused_kernels_backend="torch")


def assert_update_matches(ref, out, model, prompts, responses) -> dict:
    """Two ``engine_update`` results of the same model and batch, computed by different code paths, agree to
    fp32 rounding. Log-probs and entropy: per-token reductions over the vocabulary in another order (and GEMMs of
    another shape). Gradients: the same few-roundings rule per parameter on its own gradient scale (observed
    <= 4e-7 relative, the bound is ~7e-6). Returns each parameter's max |difference| / max |gradient|."""
    vocab = model.config.vocab_size
    loss0, lp0, ent0, grads0 = ref
    loss1, lp1, ent1, grads1 = out
    assert lp1.shape == lp0.shape and ent1.shape == ent0.shape
    # A sequence's last token predicts past its end: verl's label there is the next sequence's first token on the
    # unfused and packed paths, and a pad on the fused padded one (it rolls the padded batch). No loss reads it.
    ends = torch.tensor([p + r for p, r in zip(prompts, responses)]).cumsum(0) - 1
    read = torch.ones_like(lp0, dtype=torch.bool).index_fill_(0, ends, False)
    assert (lp1 - lp0)[read].abs().max().item() <= fp32_bound(lp0, vocab)
    assert (ent1 - ent0).abs().max().item() <= fp32_bound(ent0, vocab)
    assert abs(loss1.item() - loss0.item()) <= fp32_bound(loss0, vocab)
    assert grads0.keys() == grads1.keys()
    relative = {}
    for name, g0 in grads0.items():
        diff = (grads1[name] - g0).abs().max().item()
        relative[name] = diff / (g0.abs().max().item() + 1e-30)
        assert diff <= fp32_bound(g0, vocab * len(lp0), floor=0.0), name
    print(f"max relative grad diff {max(relative.values()):.2e} ({max(relative, key=relative.get)})")
    return relative
