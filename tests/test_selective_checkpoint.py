"""selective_checkpoint: the first N decoder layers keep their matmul and attention outputs and recompute only the
elementwise ops. On a tiny random-init Qwen3 (CPU, deterministic kernels): the loss and every gradient bit-identical
(0.0) to full checkpointing, backward running fewer GEMMs, apply/revert, and the refusals."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.modeling_utils import PreTrainedModel

from rlkit.models.qwen import build_random_model
from rlkit.patches import PatchError
from rlkit.patches.verl import selective_checkpoint

GEMMS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}


class _CountGemms(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.gemms = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.gemms += func in GEMMS
        return func(*args, **(kwargs or {}))


def _loss_grads_and_backward_gemms(layers: str | None, monkeypatch):
    """One forward/backward of the tiny Qwen3 (4 layers, fp32) with verl's checkpoint settings; ``layers`` None: full
    checkpointing, else the patch with RLKIT_SELECTIVE_LAYERS=layers."""
    if layers is not None:
        monkeypatch.setenv(selective_checkpoint.ENV, layers)
        selective_checkpoint.apply()
    try:
        model = build_random_model("tiny", seed=0, num_hidden_layers=4)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # as verl 0.9.1
        model.train()
        ids = torch.randint(3, model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
        loss = model(input_ids=ids, labels=ids).loss
        with _CountGemms() as count:
            loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, count.gemms
    finally:
        selective_checkpoint.revert()


@pytest.fixture(scope="module")
def full(request):
    with pytest.MonkeyPatch.context() as mp:
        return _loss_grads_and_backward_gemms(None, mp)


@pytest.mark.parametrize("layers", ["all", "1", "3"])
def test_loss_and_every_gradient_are_bit_identical_to_full_checkpointing(full, layers, monkeypatch):
    loss, grads, gemms = _loss_grads_and_backward_gemms(layers, monkeypatch)
    full_loss, full_grads, full_gemms = full
    assert torch.equal(loss, full_loss)
    assert grads.keys() == full_grads.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, full_grads[name]), f"{name}: max |diff| {(grad - full_grads[name]).abs().max()}"
    # each selective layer skips recomputing 6 projections (q, k, v, o, gate, up); full checkpointing's recompute stops
    # before down_proj (its output feeds only the residual add, which keeps nothing for backward)
    n = 4 if layers == "all" else int(layers)
    assert full_gemms - gemms == 6 * n


def test_the_policy_keeps_the_matmuls_and_recomputes_the_rest(monkeypatch):
    selective_checkpoint.CALLS.clear()
    _loss_grads_and_backward_gemms("1", monkeypatch)
    assert selective_checkpoint.CALLS["saved"] >= 7 and selective_checkpoint.CALLS["recomputed"] > 0


def test_apply_is_idempotent_and_revert_restores_transformers_enable(monkeypatch):
    monkeypatch.setenv(selective_checkpoint.ENV, "all")
    before = PreTrainedModel.gradient_checkpointing_enable
    selective_checkpoint.apply()
    selective_checkpoint.apply()
    patched = PreTrainedModel.gradient_checkpointing_enable
    assert patched is not before and patched.__rlkit_patch__ == "selective_checkpoint"
    selective_checkpoint.revert()
    assert PreTrainedModel.gradient_checkpointing_enable is before


@pytest.mark.parametrize("raw", ["", "0", "-1", "half"])
def test_an_unusable_layer_count_is_refused_before_anything_changes(raw, monkeypatch):
    monkeypatch.setenv(selective_checkpoint.ENV, raw)
    before = PreTrainedModel.gradient_checkpointing_enable
    with pytest.raises(PatchError, match=r"RLKIT_SELECTIVE_LAYERS = a number of layers >= 1 or 'all'.*Fix: "):
        selective_checkpoint.apply()
    assert PreTrainedModel.gradient_checkpointing_enable is before and not selective_checkpoint.active()


def test_the_reentrant_checkpoint_is_refused(monkeypatch):
    monkeypatch.setenv(selective_checkpoint.ENV, "all")
    selective_checkpoint.apply()
    try:
        model = build_random_model("tiny", seed=0, num_hidden_layers=2)
        with pytest.raises(PatchError, match="use_reentrant=False"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    finally:
        selective_checkpoint.revert()
