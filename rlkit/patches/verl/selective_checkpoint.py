"""selective_checkpoint: the first ``RLKIT_SELECTIVE_LAYERS`` decoder layers keep their matmul and attention outputs
through the update and recompute only the elementwise ops between them in backward.

Why. verl 0.9.1 checkpoints every decoder layer (``module.gradient_checkpointing_enable(gradient_checkpointing_kwargs=
{"use_reentrant": False})`` in its FSDP engine), so backward runs each layer's forward again: in the profiled update of
the seed's workload the recompute is a quarter of the FLOPs the GPU computes, almost all of it GEMMs and attention
(``outputs/update_profile/h200-base/``), while arm 5 leaves about 15 GiB of the 47.4-GiB card unused. Keeping the
outputs of the expensive ops (``SAVED_OPS``: mm, addmm, bmm and the attention kernels) spends that memory on skipping
their recompute; the elementwise ops (norms, rotary, SwiGLU, residual adds) are still recomputed, which costs little.

What it does. ``PreTrainedModel.gradient_checkpointing_enable`` runs as before, then gives the first N layers that
transformers checkpoints (its ``GradientCheckpointingLayer`` modules, in model order) a checkpoint function with a
``context_fn`` from torch's selective checkpoint API (``torch.utils.checkpoint.create_selective_checkpoint_contexts``)
whose policy is :func:`policy`. N comes from ``RLKIT_SELECTIVE_LAYERS`` (a count, or ``all``), which the recipe's
``activation_checkpointing: selective`` and ``selective_layers`` set; pre-flight picks the largest N the planner says
fits (``rlkit.planning.budget``'s ``selective_layers``). Which layers does not matter for the peak: every layer's saved outputs
live from its forward to its backward, so all of them are held at the end of the forward.

What it skips, counted on the tiny Qwen3: six GEMMs of every selective layer's recompute (q, k, v, o, gate, up) and
its attention. On the GPU rlkit_varlen's attention is torch's ``varlen_attn``, a custom op the policy sees whole; until
it was named in ``SAVED_OPS`` its output was not kept and the attention was recomputed (the update profiles of sessions
23 and 26: the recompute's attention time unchanged), so those runs held q_dim x 2 bytes a token a layer less than
the planner counts. It also keeps down_proj's output, which full checkpointing never recomputes (non-reentrant
checkpointing stops its recompute at the last tensor backward needs; down_proj's output feeds only the residual add):
hidden x 2 bytes a token a layer held for nothing, which the planner counts (the policy sees ops, not modules).

Numerics: bit-identical to full checkpointing. A saved output is the tensor the forward computed, and a recomputed
op runs the same kernel on the same inputs as in full checkpointing's recompute (tests/test_selective_checkpoint.py:
the loss and every gradient of a tiny Qwen3, 0.0 difference). Not checked yet: how it combines with the
torch.compile'd kernels (compiled_rmsnorm, compiled_pointwise) under the policy's dispatch mode, on a GPU.
"""
from __future__ import annotations

import collections
import functools
import os

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from rlkit.patches import Patch, PatchError, import_target, replace_attr

TARGET = "transformers.modeling_utils"
ENV = "RLKIT_SELECTIVE_LAYERS"
_ATEN = torch.ops.aten
try:  # registers torch.ops.torch_attn._varlen_attn, the custom op rlkit_varlen's kernel path calls
    import torch.nn.attention.varlen
except ImportError:
    pass


def _varlen_ops() -> tuple:
    """``torch_attn._varlen_attn`` where this torch has it. ``varlen_attn`` (rlkit_varlen's kernel on the GPU) is a
    custom op: the policy sees it, never the ``_flash_attention_forward`` / ``_cudnn_attention_forward`` it calls
    inside, so without it here the attention is recomputed and its output not kept (tests/test_selective_checkpoint.py
    runs it on meta tensors through torch's own caching mode)."""
    namespace = getattr(torch.ops, "torch_attn", None)
    return (namespace._varlen_attn.default,) if namespace is not None and hasattr(namespace, "_varlen_attn") else ()


# The ops whose outputs are kept: the GEMMs (nn.Linear lowers to mm / addmm) and the attention kernels of each backend
# (CUDA flash / efficient / cuDNN, the CPU's flash, the flash / efficient forwards, and torch's varlen_attn custom op
# that rlkit_varlen calls on the GPU).
SAVED_OPS = frozenset(getattr(_ATEN, name).default for name in (
    "mm", "addmm", "bmm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward",
    "_efficient_attention_forward") if hasattr(_ATEN, name)) | frozenset(_varlen_ops())
# What the policy decided, for tests and measurements ("saved", "recomputed": one count per op call in a forward).
CALLS: collections.Counter = collections.Counter()


def selective_layers(environ=os.environ) -> int | None:
    """How many layers checkpoint selectively: ``RLKIT_SELECTIVE_LAYERS`` as a count >= 1, or None for ``all``."""
    raw = environ.get(ENV, "").strip()
    if raw == "all":
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise PatchError(f"patch 'selective_checkpoint' needs {ENV} = a number of layers >= 1 or 'all', got {raw!r}. "
                         f"Fix: set the recipe's activation_checkpointing: selective (and selective_layers), which sets "
                         f"{ENV} with the patch")
    return int(raw)


def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Keep the outputs of :data:`SAVED_OPS`, recompute everything else."""
    if op in SAVED_OPS:
        if not ctx.is_recompute:
            CALLS["saved"] += 1
        return CheckpointPolicy.MUST_SAVE
    if not ctx.is_recompute:
        CALLS["recomputed"] += 1
    return CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    return create_selective_checkpoint_contexts(policy)


def make_enable(original, GradientCheckpointingLayer):
    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        """transformers' own, then the selective checkpoint function for the first RLKIT_SELECTIVE_LAYERS layers."""
        original(self, gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)
        kwargs = dict(gradient_checkpointing_kwargs or {"use_reentrant": False})
        if kwargs.get("use_reentrant", True):  # torch's selective API needs the non-reentrant checkpoint
            raise PatchError("patch 'selective_checkpoint' needs gradient_checkpointing_kwargs use_reentrant=False (as "
                             "verl 0.9.1 passes). Fix: enable checkpointing with use_reentrant=False, or set "
                             "activation_checkpointing: full")
        layers = [m for m in self.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
        func = functools.partial(checkpoint, **kwargs, context_fn=selective_context)
        for layer in layers[:selective_layers()]:
            layer._gradient_checkpointing_func = func

    gradient_checkpointing_enable.__rlkit_patch__ = "selective_checkpoint"
    return gradient_checkpointing_enable


def _apply():
    selective_layers()  # before anything changes: a bad value stops the apply
    modeling = import_target("selective_checkpoint", TARGET, fix="install rlkit's own dependencies (transformers)")
    layer_class = import_target("selective_checkpoint", "transformers.modeling_layers").GradientCheckpointingLayer
    model_class = modeling.PreTrainedModel
    return replace_attr(model_class, "gradient_checkpointing_enable",
                        make_enable(model_class.gradient_checkpointing_enable, layer_class))


PATCH = Patch(
    name="selective_checkpoint",
    summary="transformers gradient checkpointing: the first RLKIT_SELECTIVE_LAYERS decoder layers keep their matmul and "
            "attention outputs and recompute only the elementwise ops (torch's selective checkpoint API)",
    requires={"torch": ">=2.11,<2.15", "transformers": ">=5.5.3,<5.18"},
    apply_fn=_apply,
    targets=(TARGET,),
)

apply = PATCH.apply
revert = PATCH.revert
active = PATCH.active
