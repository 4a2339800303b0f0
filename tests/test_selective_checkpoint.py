"""selective_checkpoint: the first N decoder layers keep their matmul and attention outputs and recompute only the
elementwise ops. On a tiny random-init Qwen3 (CPU, deterministic kernels): the loss and every gradient bit-identical
(0.0) to full checkpointing, backward running fewer GEMMs, apply/revert, and the refusals."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.modeling_utils import PreTrainedModel

from rlkit.models import shape as model_shape
from rlkit.models.qwen import build_random_model
from rlkit.patches import PatchError
from rlkit.patches.kernels import varlen_attention
from rlkit.patches.verl import selective_checkpoint
from rlkit.planning import budget

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


def _kept_storages(storage) -> dict[int, torch.Tensor]:
    """The distinct storages torch's selective-checkpoint cache holds for the backward (keyed by the untyped storage's
    data pointer, so a view and its base count once); entries the policy left to recompute hold none. Per op, torch
    2.13 keeps a dict of entries and the node's torch 2.11 a list (session 29's GPU run failed here): both flatten."""
    kept = {}
    for leaf in torch.utils._pytree.tree_leaves(list(storage.values())):
        tensor = getattr(leaf, "val", None)  # torch's _VersionWrapper around a kept output
        if isinstance(tensor, torch.Tensor):
            kept.setdefault(tensor.untyped_storage().data_ptr(), tensor)
    return kept


def _capturing_context(caches: list):
    """The patch's own context (torch's create_selective_checkpoint_contexts with :func:`policy`), its cache recorded."""
    original = selective_checkpoint.selective_context

    def context():
        caching, cached = original()
        caches.append(caching.storage)
        return caching, cached
    return context


def _packed_qwen(layers: int, tokens: int, device: str):
    """A Qwen3-4B-wide random model in bf16 (``layers`` layers, a 512-token vocabulary) with verl's checkpoint settings
    and rlkit_varlen attention (its patch applied by the caller), and ``tokens`` packed input ids in two sequences."""
    model = build_random_model("qwen3-4b", seed=0, dtype=torch.bfloat16, num_hidden_layers=layers, vocab_size=512)
    model = model.to(device)
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.set_attn_implementation(varlen_attention.NAME)
    model.train()
    ids = torch.randint(3, 512, (1, tokens), generator=torch.Generator().manual_seed(1)).to(device)
    positions = torch.arange(tokens // 2).repeat(2).unsqueeze(0).to(device)
    return model, ids, positions


def _kept_bytes(kept: dict[int, torch.Tensor]) -> dict[torch.dtype, int]:
    """The bytes of a selective cache's kept storages (:func:`_kept_storages`), per dtype."""
    out: dict[torch.dtype, int] = {}
    for t in kept.values():
        out[t.dtype] = out.get(t.dtype, 0) + t.untyped_storage().nbytes()
    return out


# torch's varlen_attn custom op (torch_attn._varlen_attn) returns its output, the fp32 log-sum-exp and an RNG state:
# torch.zeros(2, dtype=uint64), the flash kernel's philox seed and offset, zeros since varlen_attn hardcodes dropout 0
# (torch/nn/attention/varlen.py; its fake kernel gives the same shape). The policy keeps all three outputs, so each
# selective layer's cache holds these 16 bytes too: a constant per layer, not per token, which the planner ignores.
VARLEN_RNG_STATE_BYTES = 16


def test_a_selective_layer_keeps_what_the_planner_counts_per_token(monkeypatch):
    """One Qwen3-4B-wide layer in bf16 on the CPU, 64 packed tokens (two sequences), attention through rlkit_varlen as
    the update profile selects it (on the CPU: per-sequence SDPA, the CPU flash kernel): the cache holds per token the
    planner's bf16 elements plus the attention's fp32 log-sum-exp (one per head, which the planner ignores), none of it
    the layer's input or output (which full checkpointing keeps anyway)."""
    tokens, shape = 64, model_shape.resolve_model("qwen3-4b")
    caches: list = []
    monkeypatch.setenv(selective_checkpoint.ENV, "all")
    monkeypatch.setattr(selective_checkpoint, "selective_context", _capturing_context(caches))
    selective_checkpoint.apply()
    varlen_attention.PATCH.apply()
    try:
        model, ids, positions = _packed_qwen(1, tokens, "cpu")
        seen = {}
        model.model.layers[0].register_forward_hook(
            lambda m, args, kwargs, out: seen.update(io=(kwargs.get("hidden_states", args[0] if args else None), out)),
            with_kwargs=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, position_ids=positions, labels=ids).loss
        assert len(caches) == 1
        kept = _kept_storages(caches[0])
        assert _kept_bytes(kept) == {torch.bfloat16: tokens * budget._selective_elems_per_token_layer(shape) * 2,
                                     torch.float32: tokens * shape.heads * 4}
        layer_io = {t.untyped_storage().data_ptr() for t in seen["io"] if isinstance(t, torch.Tensor)}
        assert len(layer_io) == 2 and not layer_io & kept.keys()
        loss.backward()
    finally:
        varlen_attention.PATCH.revert()
        selective_checkpoint.revert()


def test_the_gpu_varlen_kernel_output_is_kept():
    """On the GPU rlkit_varlen calls torch's varlen_attn, a custom op (torch_attn._varlen_attn) that the policy sees
    whole. Run through torch's own caching mode with the patch's policy on meta tensors (its registered fake kernel,
    Qwen3-4B's heads): the cache keeps its output, tokens x q_dim bf16 elements, instead of recomputing it, with the
    op's other outputs: the log-sum-exp and its RNG state (:data:`VARLEN_RNG_STATE_BYTES`)."""
    from torch.nn.attention.varlen import varlen_attn

    shape, tokens = model_shape.resolve_model("qwen3-4b"), 64
    q = torch.empty(tokens, shape.heads, shape.head_dim, device="meta", dtype=torch.bfloat16)
    kv = torch.empty(tokens, shape.kv_heads, shape.head_dim, device="meta", dtype=torch.bfloat16)
    cu = torch.tensor([0, tokens // 2, tokens], dtype=torch.int32, device="meta")
    caching, _ = selective_checkpoint.selective_context()
    with caching:
        varlen_attn(q, kv, kv, cu, cu, tokens // 2, tokens // 2, window_size=(-1, 0), enable_gqa=True)
    assert [str(op) for op in caching.storage] == ["torch_attn._varlen_attn.default"]
    (entry,) = caching.storage[torch.ops.torch_attn._varlen_attn.default].values()
    out = torch.utils._pytree.tree_leaves(entry)[0]
    assert hasattr(out, "val"), "the policy left the varlen kernel to recompute: its output is not kept"
    assert out.val.dtype == torch.bfloat16 and out.val.numel() == tokens * shape.q_dim
    kept = [leaf.val for leaf in torch.utils._pytree.tree_leaves(entry) if hasattr(leaf, "val")]
    rng = [t for t in kept if t.dtype == torch.uint64]
    assert [(t.numel(), t.element_size()) for t in rng] == [(2, 8)] and 2 * 8 == VARLEN_RNG_STATE_BYTES


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


def _packed_qwen_layers_on_cuda(layers: str | None, caches: list, monkeypatch, tokens: int = 2048):
    """Two Qwen3-4B-wide layers in bf16 on the GPU, ``tokens`` packed tokens (two sequences), attention through
    rlkit_varlen as verl's update selects it, deterministic kernels: the loss, every gradient, and the selective cache
    of each checkpointed layer (``layers`` None: full checkpointing)."""
    if layers is not None:
        monkeypatch.setenv(selective_checkpoint.ENV, layers)
        monkeypatch.setattr(selective_checkpoint, "selective_context", _capturing_context(caches))
        selective_checkpoint.apply()
    varlen_attention.PATCH.apply()
    torch.use_deterministic_algorithms(True)
    try:
        model, ids, positions = _packed_qwen(2, tokens, "cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, position_ids=positions, labels=ids).loss
        kept = [_kept_storages(storage) for storage in caches]  # before backward frees the cache
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}, kept
    finally:
        torch.use_deterministic_algorithms(False)
        varlen_attention.PATCH.revert()
        selective_checkpoint.revert()


@pytest.mark.gpu
def test_on_the_gpu_a_selective_layer_is_bit_identical_and_keeps_the_planners_bytes(monkeypatch):
    """The GPU path the seed's update takes (torch's varlen flash kernel, a custom op the policy keeps whole): loss and
    every gradient bit-identical (0.0) to full checkpointing, and each layer's cache holding per token the planner's
    bf16 elements plus the kernel's fp32 log-sum-exp (one per head), and per layer the op's RNG state, 16 bytes
    (:data:`VARLEN_RNG_STATE_BYTES`; session 30's GPU run failed on it, outputs/_node/session30/selective-gpu-test.log)."""
    full_loss, full_grads, _ = _packed_qwen_layers_on_cuda(None, [], monkeypatch)
    caches: list = []
    loss, grads, kept = _packed_qwen_layers_on_cuda("all", caches, monkeypatch)
    assert torch.equal(loss, full_loss)
    assert grads.keys() == full_grads.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, full_grads[name]), f"{name}: max |diff| {(grad - full_grads[name]).abs().max()}"
    tokens, shape = 2048, model_shape.resolve_model("qwen3-4b")
    assert len(kept) == 2
    for layer in kept:
        assert _kept_bytes(layer) == {torch.bfloat16: tokens * budget._selective_elems_per_token_layer(shape) * 2,
                                      torch.float32: tokens * shape.heads * 4,
                                      torch.uint64: VARLEN_RNG_STATE_BYTES}
