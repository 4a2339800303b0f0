"""compiled_pointwise: Qwen3's rotary embedding and SwiGLU product as torch.compile'd functions of transformers' own
expressions, with eager's roundings kept.

Why. After the RMSNorm (``compiled_rmsnorm``), the next elementwise kernels of every decoder layer in the profiled
update (``outputs/update_profile/h200/``): the rotary embedding, ``q * cos + rotate_half(q) * sin`` for the queries
and the keys (a multiply, two slices, a negation, a concatenation, a multiply and an add each, every one a pass over
[tokens, heads, 128] in bf16), and the MLP's ``act_fn(gate) * up`` (the SiLU and the product, two passes over
[tokens, 9,728] for Qwen3-4B), each again in the checkpoint's recompute and with its own backward kernels.

What it does. transformers' ``apply_rotary_pos_emb`` (the module-level function ``Qwen3Attention.forward`` calls)
becomes :func:`rotary` and ``Qwen3MLP.forward`` becomes ``down_proj(swiglu(gate_proj(x), up_proj(x)))``, both
compiled by :func:`rlkit.patches.kernels._compile.like_eager` (one fused kernel each way on a GPU), except SwiGLU's
backward, which runs eager's own kernels (:class:`_SwiGLU`: Inductor's fused one rounded otherwise on an H100). The
GEMMs stay eager.

Numerics: no reductions, and ``emulate_precision_casts`` keeps every rounding to bf16 that eager does between the
fused ops, so the same elementwise arithmetic runs in the same order. On the CPU with torch 2.13 (Inductor's C++
kernels) the outputs and gradients are bit-identical to eager's (tests/test_compiled_patches.py). torch 2.11's
C++ backend drops those roundings (found on the node's torch: its ``to_dtype`` elides the bf16 round trip whatever
the option says; 2.13 honours it), so results differ there. On a GPU the one open question is SiLU's exponential
(Triton's libdevice against ATen's CUDA ``expf``): the GPU test compares bit for bit. Measured on the GPU: not yet.
Because bit-identity depends on the torch and the device, the first call on each device type and dtype is
checked: eager runs beside the compiled function on the same inputs, and any differing element raises a
:class:`~rlkit.patches.PatchError` naming the field that turns the patch off (``like_eager``'s ``bit_exact``).

Guard: at apply, :func:`rotary` and :func:`swiglu` (not compiled) must equal transformers' own on a probe, bit for
bit, and the MLP's activation must be SiLU (Qwen3's ``hidden_act``); a model built with another activation keeps
the eager MLP (checked per call: ``act_fn`` is an attribute of each MLP).
"""
from __future__ import annotations

import collections

import torch
import torch.nn.functional as F

from rlkit.patches import Patch, import_target, replace_attrs
from rlkit.patches.kernels._compile import QWEN3_MODULE, REQUIRES, expression_changed, like_eager

# Calls of the patched functions, for tests and measurements: what actually ran ("rotary", "swiglu", "eager_mlp").
CALLS: collections.Counter = collections.Counter()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rotary(q, k, cos, sin, unsqueeze_dim: int = 1):
    """transformers' ``apply_rotary_pos_emb`` for Qwen3 (its ``rotate_half`` included)."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (_rotate_half(q) * sin), (k * cos) + (_rotate_half(k) * sin)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``Qwen3MLP``'s ``act_fn(gate_proj(x)) * up_proj(x)`` for ``hidden_act`` silu, given the two projections."""
    return F.silu(gate) * up


compiled_rotary = like_eager(rotary, patch="compiled_pointwise", field="pointwise", bit_exact=True)
compiled_swiglu = like_eager(swiglu, patch="compiled_pointwise", field="pointwise", bit_exact=True)


class _SwiGLU(torch.autograd.Function):
    """The SwiGLU product: :func:`compiled_swiglu` forward, eager's own kernels backward.

    Inductor's fused backward of the product gave input gradients up to 2.3e-04 of the largest away from eager's on an
    H100 at 24,576 tokens (session 30, ``outputs/elementwise_kernels/h100.session30/``) while its forward was eager's
    bit for bit. So the backward runs the ATen kernels eager's autograd runs, on the same operands: MulBackward's
    ``grad * up`` and ``grad * silu(gate)``, then ``silu_backward`` of the first. silu(gate) is recomputed by eager's
    kernel (the bits eager's forward kept), so the layer keeps gate and up only, as the planner counts."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return compiled_swiglu(gate, up)

    @staticmethod
    def backward(ctx, grad):
        gate, up = ctx.saved_tensors
        grad_gate = torch.ops.aten.silu_backward(grad * up, gate) if ctx.needs_input_grad[0] else None
        grad_up = grad * F.silu(gate) if ctx.needs_input_grad[1] else None
        return grad_gate, grad_up


def fused_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """What the patched ``Qwen3MLP`` computes between its projections (:class:`_SwiGLU`)."""
    return _SwiGLU.apply(gate, up)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers' ``apply_rotary_pos_emb`` through :func:`compiled_rotary`."""
    CALLS["rotary"] += 1
    return compiled_rotary(q, k, cos, sin, unsqueeze_dim)


def _is_silu(act_fn) -> bool:
    return type(act_fn).__name__ == "SiLUActivation" or isinstance(act_fn, torch.nn.SiLU) or act_fn is F.silu


def make_mlp_forward(original):
    def forward(self, x):
        """``Qwen3MLP.forward`` with the SwiGLU product through :func:`fused_swiglu` (SiLU models only)."""
        if not _is_silu(self.act_fn):
            CALLS["eager_mlp"] += 1
            return original(self, x)
        CALLS["swiglu"] += 1
        return self.down_proj(fused_swiglu(self.gate_proj(x), self.up_proj(x)))

    forward.__rlkit_patch__ = "compiled_pointwise"
    return forward


def check_same_expressions(qwen3) -> None:
    """Refuse a transformers whose rotary embedding or Qwen3 MLP no longer computes what is compiled here."""
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, heads, 7, 16, generator=generator).bfloat16() for heads in (4, 2))
    angles = torch.randn(2, 7, 16, generator=generator)
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    config = qwen3.Qwen3Config(hidden_size=32, intermediate_size=48, hidden_act="silu")
    mlp = qwen3.Qwen3MLP(config).bfloat16()
    x = torch.randn(3, 32, generator=generator).bfloat16()
    with torch.no_grad():
        checks = {("apply_rotary_pos_emb", "rotary"): (qwen3.apply_rotary_pos_emb(q, k, cos, sin), rotary(q, k, cos, sin)),
                  ("Qwen3MLP.forward", "swiglu"): ((mlp(x),), (mlp.down_proj(swiglu(mlp.gate_proj(x), mlp.up_proj(x))),))}
    for (name, ours_name), (theirs, ours) in checks.items():
        if not all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(theirs, ours)):
            raise expression_changed("compiled_pointwise", "pointwise", name, ours_name, "bf16")


def _apply():
    qwen3 = import_target("compiled_pointwise", QWEN3_MODULE, fix="install rlkit's own dependencies (transformers)")
    check_same_expressions(qwen3)
    apply_rotary_pos_emb.__rlkit_patch__ = "compiled_pointwise"
    return replace_attrs((qwen3, "apply_rotary_pos_emb", apply_rotary_pos_emb),
                         (qwen3.Qwen3MLP, "forward", make_mlp_forward(qwen3.Qwen3MLP.forward)))


PATCH = Patch(
    name="compiled_pointwise",
    summary="transformers Qwen3 rotary embedding and SwiGLU product: the same expressions compiled by torch.compile "
            "with eager's bf16 roundings kept (fused kernels)",
    requires=REQUIRES,
    apply_fn=_apply,
    targets=(QWEN3_MODULE,),
)

apply = PATCH.apply
revert = PATCH.revert
active = PATCH.active
