"""compiled_rmsnorm: Qwen3's RMSNorm as one torch.compile'd function, the expression transformers computes.

Why. In the profiled update of the seed's workload (``outputs/update_profile/h200/``, docs/results.md "Where the
update's time goes") elementwise kernels took 30% of the kernel time, and the 40% MFU target would need most of the
forward and backward's elementwise time gone. transformers' ``Qwen3RMSNorm.forward`` is eight kernels: the cast to
fp32, the square, the mean, + eps, rsqrt, the multiply, the cast back, times the weight; autograd's backward adds
one or more per op, and keeps the fp32 intermediates for it. Every decoder layer runs it four times (before
attention and before the MLP over the 2,560 hidden channels of Qwen3-4B, and per head on the 4,096 query and 1,024
key channels), in the forward, in the checkpoint's recompute and in the backward.

What it does. ``Qwen3RMSNorm.forward`` becomes :func:`rms_norm` (transformers' expression, line by line) compiled
by ``torch.compile`` (:func:`rlkit.patches.kernels._compile.like_eager`: Inductor, dynamic shapes, the whole function one
graph): on a GPU a fused Triton kernel for
the forward and fused kernels for the backward, which keep what the backward needs instead of the fp32
intermediates. Inductor's ``emulate_precision_casts`` keeps eager's rounding to the input dtype before the weight
multiply. Every instance changes at once (the class's forward), so verl's actor uses it in its training forward
and its log-prob passes; vLLM runs its own Qwen3 and is not affected.

Numerics: the same maths, summed in other orders. Inductor sums each row's squares in its own order (ATen's mean
in another), so the variance can differ in its last fp32 bits and an output element, rarely, by one step of the
input dtype; the backward's reductions (through the mean, and the weight's gradient over the tokens) sum in other
orders too. So the patch is not bit-exact, and its tests state tolerances: one norm's output within one bf16 step
of eager's per element; a model's logits within one bf16 step at the largest logit's magnitude (differences pass
through the layers); every flat parameter's gradient within 2^-6 of its largest entry (bf16 compute rounds each op
to 2^-8; a sum in another order moves by a few such roundings); in fp32, where no cast is emulated, to fp32
rounding (tests/test_compiled_patches.py, on the CPU and, with ``-m gpu``, on a GPU; docs/patches.md has their runs).

Guard: at apply, :func:`rms_norm` (not compiled) must equal transformers' own forward bit for bit on a probe in
bf16 and fp32; a transformers whose RMSNorm computes something else is refused instead of being replaced by the
old maths. Cost: one compile per process and graph (grad and no-grad, per dtype) on the first call: seconds on a
GPU, about half a minute on a 2-core CPU. A compile failure (e.g. no C compiler for Inductor's CPU code) raises a
:class:`PatchError` naming the fix.
"""
from __future__ import annotations

import collections

import torch

from rlkit.patches import Patch, import_target, replace_attr
from rlkit.patches.kernels._compile import QWEN3_MODULE, REQUIRES, expression_changed, like_eager

# Calls of the patched forward, for tests and measurements: what actually ran.
CALLS: collections.Counter = collections.Counter()


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' ``Qwen3RMSNorm.forward`` as a function of its input, weight and epsilon."""
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


compiled_rms_norm = like_eager(rms_norm, patch="compiled_rmsnorm", field="rmsnorm")


def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """``Qwen3RMSNorm.forward`` through :func:`compiled_rms_norm`."""
    CALLS["compiled"] += 1
    return compiled_rms_norm(hidden_states, self.weight, self.variance_epsilon)


def check_same_expression(norm_class) -> None:
    """Refuse a transformers whose RMSNorm forward is not :func:`rms_norm` (bit for bit on a probe)."""
    generator = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        norm = norm_class(48, eps=1e-6)
        with torch.no_grad():
            norm.weight.copy_(torch.rand(48, generator=generator) + 0.5)
        norm = norm.to(dtype)
        x = (torch.randn(3, 5, 48, generator=generator) * 3).to(dtype)
        with torch.no_grad():
            theirs, ours = norm(x), rms_norm(x, norm.weight, norm.variance_epsilon)
        if theirs.dtype != ours.dtype or not torch.equal(theirs, ours):
            raise expression_changed("compiled_rmsnorm", "rmsnorm", f"{norm_class.__qualname__}.forward", "rms_norm",
                                     str(dtype))


def _apply():
    qwen3 = import_target("compiled_rmsnorm", QWEN3_MODULE, fix="install rlkit's own dependencies (transformers)")
    check_same_expression(qwen3.Qwen3RMSNorm)
    forward.__rlkit_patch__ = "compiled_rmsnorm"
    return replace_attr(qwen3.Qwen3RMSNorm, "forward", forward)


PATCH = Patch(
    name="compiled_rmsnorm",
    summary="transformers Qwen3RMSNorm.forward: the same expression compiled by torch.compile (fused kernels; "
            "summation order differs, within a stated tolerance)",
    requires=REQUIRES,
    apply_fn=_apply,
    targets=(QWEN3_MODULE,),
)

apply = PATCH.apply
revert = PATCH.revert
active = PATCH.active
