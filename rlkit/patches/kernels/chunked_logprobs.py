"""chunked_logprobs: token log-probs (and the entropy) from the final hidden states, never the whole logits.

The seed workload's update forward runs Qwen3-4B on 24,576 tokens per micro-batch. verl 0.9.1's unfused path
(``FSDPEngineWithLMHead.prepare_model_outputs``, ``use_fused_kernels=False``) takes ``output.logits`` from the
model, [tokens, 151,936] in bf16 (7.5 GB), and without flash-attn ``logprobs_from_logits`` falls back to
``logprobs_from_logits_v2``: a row-by-row fp32 ``log_softmax`` whose outputs autograd keeps for backward,
another 24,576 x 151,936 x 4 B = 14.9 GB, before backward allocates the logits' gradient.

Where it hooks in. verl already has a path that never asks the model for logits:
``actor_rollout_ref.model.use_fused_kernels=True``. The engine's ``apply_monkey_patch`` then swaps the
causal LM's ``forward`` for ``verl.models.transformers.dense_common.forward_with_torch_backend`` (Qwen3 and
the other dense text models), which runs the decoder, and hands the final hidden states, ``lm_head.weight``
and the rolled labels to ``verl.utils.experimental.torch_functional.FusedLinearForPPO``; the engine reads
``output.log_probs`` / ``output.entropy`` (remove-padding and padded branches alike). Which implementation
runs is ``fused_kernel_options.impl_backend``: its default is ``torch`` (verl's own pure-torch chunked
``FusedLinearForPPOFunction``, 512 rows), ``triton`` is ``verl.utils.kernel.linear_cross_entropy`` and
``liger`` needs liger-kernel. This patch keeps that plumbing and replaces ``FusedLinearForPPO`` (looked up by
name at every forward) with :class:`ChunkedLinearForPPO`, which calls :func:`chunked_linear_logprobs` below.

Why not verl's torch backend as it is, or the triton kernel:

- Gradient of the (tied, 151,936 x 2,560) output embedding. verl's backend accumulates it chunk by chunk in a
  buffer of the weight's dtype: bf16 under FSDP mixed precision, one bf16 rounding of the running sum per
  512-row chunk (48 per micro-batch here). The unfused path rounds once, at the end of one GEMM. Here the
  per-chunk partial products are summed in fp32 and rounded to the weight's dtype once (an fp32 buffer of
  the weight's size, 1.56 GB for Qwen3-4B, lives during this backward only).
- Precision of the recompute. verl's backend computes the forward under the engine's bf16 autocast but the
  backward recompute outside it (autograd does not carry autocast into backward), so with fp32 parameters
  the recomputed logits are not the ones the forward used (read from the code; verl's FSDP runs keep bf16
  parameters, where both agree). Here the compute dtype is decided once (the autocast dtype if autocast is
  on, else the hidden states' dtype) and used in both passes.
- The entropy it returns is rounded to the model dtype (bf16); verl's unfused path returns it in fp32 (the
  autocast softmax), which this keeps.
- Triton: a CPU test could not run it. The pure-torch version costs one recompute GEMM of the lm_head shape
  (2 x 24,576 x 2,560 x 151,936 = 19 TFLOP per micro-batch) and a few fp32 passes per chunk. Measured on an
  H200 (``python -m rlkit.experiments.kernels``, outputs/kernels/h200/): Qwen3-4B bf16, gradient checkpointing,
  24,576 tokens, fwd+bwd of a log-prob loss took 2.20 s against 2.07 s for the full-logits path (+6 %), and
  the step's peak above the model and its gradients fell from 46.4 to 9.8 GiB; log-probs matched to 1e-6.

What it computes, per chunk of ``CHUNK_ROWS`` rows: ``logits = hidden @ W.T`` in the compute dtype (divided by
the temperature in that dtype, as verl does), cast to fp32, ``log_softmax`` as ``x - logsumexp(x)``, the
labels' entries gathered; the entropy ``-sum(p * log p)`` in fp32. Backward recomputes each chunk's logits and
builds ``d logits = g_lp * (onehot - p) - g_ent * p * (log p + H)`` in place in the fp32 chunk, casts it to the
compute dtype (where autograd would hand the bf16 logits their gradient) and runs the two GEMMs. Nothing of
size [tokens, vocabulary] exists across the micro-batch: at most one chunk's fp32 logits and one temporary.
An entropy that the loss detaches (``metric_entropy``, ``entropy_coeff == 0``) costs backward nothing.

Configuration: ``actor_rollout_ref.model.use_fused_kernels=True`` with ``impl_backend=torch`` (verl's default).
The patch checks it where the engine builds its model and refuses to run otherwise (a patch that silently
does nothing would let a run train on the 15 GB path believing it was fixed).
"""
from __future__ import annotations

import torch

from rlkit.patches import Patch, PatchError, import_target, replace_attrs, supported

VERL_KERNEL_MODULE = "verl.utils.experimental.torch_functional"
VERL_ENGINE_MODULE = "verl.workers.engine.fsdp.transformer_impl"
# Rows per chunk: 2048 x 151,936 x (4 B fp32 logits + 4 B one temporary) = 2.5 GB at Qwen3's vocabulary. On an
# H200 (Qwen3-4B, 24,576 tokens, outputs/kernels/h200) 2048, 4096 and 8192 rows took the same step time within
# 1 % (2.20, 2.19, 2.19 s) and peaked 9.8, 10.9 and 15.5 GiB above the model and its gradients.
CHUNK_ROWS = 2048


def compute_dtype(hidden: torch.Tensor) -> torch.dtype:
    """The dtype the lm_head GEMM runs in: the autocast dtype when autocast is on (as ``nn.Linear`` would),
    else the hidden states' dtype."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return hidden.dtype


def _chunk_log_softmax(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """fp32 log-softmax over the vocabulary of ``hidden @ weight.T`` (/ temperature in the compute dtype)."""
    logits = hidden @ weight.t()
    if temperature != 1.0:
        logits = logits / temperature
    x = logits.float()  # a fresh fp32 tensor (or ``logits`` itself in fp32): safe to overwrite
    del logits
    return x.sub_(torch.logsumexp(x, dim=-1, keepdim=True))


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise dot products of two [rows, vocab] tensors without a third tensor of their size."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def _entropy(logp: torch.Tensor) -> torch.Tensor:
    return -_row_dot(logp.exp(), logp)


def _logits_grad(logp, labels, grad_lp, grad_ent) -> torch.Tensor:
    """d/dx of ``grad_lp * logp[label] + grad_ent * H``, written over ``logp`` (fp32, [rows, vocab])."""
    if grad_ent is None:
        dx = logp.exp_().mul_(-grad_lp.unsqueeze(-1))  # -p * g
    else:
        p = logp.exp()
        entropy = -_row_dot(p, logp)
        coef = logp.add_(entropy.unsqueeze(-1)).mul_(grad_ent.unsqueeze(-1))  # g_ent * (log p + H)
        if grad_lp is not None:
            coef.add_(grad_lp.unsqueeze(-1))
        dx = p.mul_(coef).neg_()
    if grad_lp is not None:
        dx.scatter_add_(-1, labels.unsqueeze(-1), grad_lp.unsqueeze(-1))  # + g at the label
    return dx


class _ChunkedLinearLogProbs(torch.autograd.Function):
    """Inputs already in the compute dtype, 2-D; runs with autocast off (the wrapper decides the dtype)."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature: float, chunk_rows: int, with_entropy: bool):
        ctx.set_materialize_grads(False)
        rows = hidden.shape[0]
        log_probs = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(rows, dtype=torch.float32, device=hidden.device) if with_entropy else None
        for start in range(0, rows, chunk_rows):
            chunk = slice(start, min(start + chunk_rows, rows))
            logp = _chunk_log_softmax(hidden[chunk], weight, temperature)
            log_probs[chunk] = logp.gather(-1, labels[chunk].unsqueeze(-1)).squeeze(-1)
            if with_entropy:
                entropy[chunk] = _entropy(logp)
            del logp
        ctx.save_for_backward(hidden, weight, labels)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        hidden, weight, labels = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if (grad_lp is None and grad_ent is None) or not (need_hidden or need_weight):
            return None, None, None, None, None, None
        temperature, rows = ctx.temperature, hidden.shape[0]
        with torch.autocast(hidden.device.type, enabled=False):  # backward may run inside the caller's autocast
            d_hidden = torch.empty_like(hidden) if need_hidden else None
            d_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
            for start in range(0, rows, ctx.chunk_rows):
                chunk = slice(start, min(start + ctx.chunk_rows, rows))
                logp = _chunk_log_softmax(hidden[chunk], weight, temperature)
                dx = _logits_grad(logp, labels[chunk], None if grad_lp is None else grad_lp[chunk],
                                  None if grad_ent is None else grad_ent[chunk])
                dx = dx.to(hidden.dtype)
                del logp
                if temperature != 1.0:
                    dx = dx / temperature
                if need_hidden:
                    torch.mm(dx, weight, out=d_hidden[chunk])
                if need_weight:
                    if dx.dtype == torch.float32:
                        d_weight.addmm_(dx.t(), hidden[chunk])
                    else:  # the GEMM accumulates in fp32 and rounds its partial once; the sum stays fp32
                        d_weight.add_(dx.t() @ hidden[chunk])
                del dx
            if need_weight:
                d_weight = d_weight.to(weight.dtype)
        return d_hidden, d_weight, None, None, None, None


def chunked_linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                            temperature: float = 1.0, chunk_rows: int = CHUNK_ROWS, with_entropy: bool = True):
    """Per-token ``log softmax(hidden @ weight.T / temperature)[label]`` and entropy, ``chunk_rows`` rows at a time.

    ``hidden``: [..., H]; ``weight``: [V, H] (the lm_head weight); ``labels``: [...] token ids. Returns fp32
    ``(log_probs, entropy)`` of shape ``labels.shape`` (``entropy`` is None when ``with_entropy`` is False).
    Differentiable in ``hidden`` and ``weight``; backward recomputes each chunk's logits.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows={chunk_rows}: must be >= 1")
    if labels.shape != hidden.shape[:-1]:
        raise ValueError(f"labels shape {tuple(labels.shape)} must be hidden's without its last dim "
                         f"{tuple(hidden.shape[:-1])}")
    dtype = compute_dtype(hidden)
    flat_hidden = hidden.reshape(-1, hidden.shape[-1]).to(dtype)
    flat_labels = labels.reshape(-1).to(torch.int64)
    with torch.autocast(hidden.device.type, enabled=False):
        log_probs, entropy = _ChunkedLinearLogProbs.apply(flat_hidden, weight.to(dtype), flat_labels,
                                                          float(temperature), int(chunk_rows), bool(with_entropy))
    return log_probs.view(labels.shape), (entropy.view(labels.shape) if entropy is not None else None)


FIX = ("set actor_rollout_ref.model.use_fused_kernels=True and "
       "actor_rollout_ref.model.fused_kernel_options.impl_backend=torch (verl's default backend), or drop "
       "chunked_logprobs from RLKIT_PATCHES / the recipe's patches")


def check_engine_model(model, use_fused_kernels: bool, fused_kernels_backend) -> None:
    """Refuse a causal LM that verl builds without the hidden-state path this patch replaces."""
    if getattr(model, "lm_head", None) is None:  # a value / reward head: log-probs are not computed there
        return
    if not use_fused_kernels or fused_kernels_backend != "torch":
        raise PatchError(
            f"patch 'chunked_logprobs' replaces verl's fused-kernel log-probs (torch backend), but the engine builds "
            f"{type(model).__name__} with use_fused_kernels={use_fused_kernels}, "
            f"impl_backend={fused_kernels_backend!r}: the model would return full logits. Fix: {FIX}.")


def _apply():
    kernels = import_target("chunked_logprobs", VERL_KERNEL_MODULE)
    engine = import_target("chunked_logprobs", VERL_ENGINE_MODULE)
    verl_class = kernels.FusedLinearForPPO
    verl_monkey_patch = engine.apply_monkey_patch

    class ChunkedLinearForPPO(verl_class):
        """verl's ``FusedLinearForPPO`` with rlkit's chunked log-probs as its torch backend."""

        def forward(self, hidden_states, vocab_weights, input_ids, temperature: float = 1.0):
            if self.impl_backend != "torch":
                raise PatchError(f"patch 'chunked_logprobs' got impl_backend={self.impl_backend!r}. Fix: {FIX}.")
            return chunked_linear_logprobs(hidden_states, vocab_weights, input_ids, temperature, chunk_rows=CHUNK_ROWS)

    def apply_monkey_patch(model, *args, use_fused_kernels: bool = False, fused_kernels_backend=None, **kwargs):
        check_engine_model(model, use_fused_kernels, fused_kernels_backend)
        return verl_monkey_patch(model, *args, use_fused_kernels=use_fused_kernels,
                                 fused_kernels_backend=fused_kernels_backend, **kwargs)

    apply_monkey_patch.__doc__ = verl_monkey_patch.__doc__
    return replace_attrs((kernels, "FusedLinearForPPO", ChunkedLinearForPPO), (engine, "apply_monkey_patch", apply_monkey_patch))


PATCH = Patch(
    name="chunked_logprobs",
    summary="verl: log-probs and entropy from hidden states in row chunks (recomputed in backward), no full logits",
    requires=supported("verl", "torch"),
    apply_fn=_apply,
    # The engine only: verl's forward functions import the kernel class at call time (the apply imports its
    # module), and the engine's apply_monkey_patch must be wrapped before the engine builds a model.
    targets=(VERL_ENGINE_MODULE,),
)
