"""Qwen3's elementwise kernels three ways (issue 42): transformers' eager expressions, rlkit's torch.compile patches
(compiled_rmsnorm, compiled_pointwise) and liger-kernel's Triton kernels, each timed and held against eager.

    python -m rlkit.experiments.elementwise_kernels --out DIR [--profile h200|tiny | --tiny] [-p key=value] [--tag TAG]

writes ``DIR/elementwise_kernels/<tag>/`` (``params.yaml``, ``env.json``, ``metrics.json``). For each op of ``ops`` at
the ``model``'s widths and ``tokens`` tokens in bf16 (``rmsnorm``: [tokens, hidden] and its weight; ``rotary``: the
queries and keys of one layer, [1, heads, tokens, head_dim] views of [1, tokens, heads, head_dim] as Qwen3's attention
hands them over, with Qwen3's own cos / sin; ``swiglu``: gate and up, [tokens, intermediate]) and each arm of
``arms``: forward + backward (``torch.autograd.grad`` with a fixed random output gradient, a fresh copy each call),
the median of ``repeats`` timed calls after two warm-ups, and against eager on the same inputs: whether every output
and input gradient is bit-identical, else the largest |difference| over the largest |eager value| per tensor (a
normwise measure: 2^-8 is one bf16 step at the tensor's largest magnitude). The equal-or-better-exactness
rule of issue 42 is read off that column: the compiled rotary and SwiGLU claim bit identity, the compiled RMSNorm a
tolerance (docs/patches.md); liger's kernels claim neither.

liger: ``LigerRMSNormFunction`` with the settings ``apply_liger_kernel_to_qwen3`` gives its ``LigerRMSNorm`` (offset
0, casting mode "llama", in place), ``liger_rotary_pos_emb`` and ``LigerSiLUMulFunction``, the functions liger's
Qwen3 patch puts in place of transformers'. They need Triton on a CUDA device: on a CPU, or where liger-kernel is not
installed (the node gets it from the bundle: ``rlkit bundle build --spec liger-kernel==0.8.5``; a pure-Python wheel
that needs torch >= 2.1.2 and triton >= 2.3.1, which the node's torch 2.11 and triton 3.6 satisfy), each liger arm
records why it did not run.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from rlkit.core import params as P
from rlkit.experiments.kernels import _device, _timed
from rlkit.models import qwen as models

NOTEBOOK = "elementwise_kernels"
OPS = ("rmsnorm", "rotary", "swiglu")
ARMS = ("eager", "compiled", "liger")


@dataclass(frozen=True)
class Config:
    model: str  # rlkit.models.qwen preset whose widths the ops run at: qwen3-4b | tiny
    device: str  # auto (cuda if available) | cuda | cpu
    tokens: int  # tokens of the micro-batch (the seed's: 24,576)
    ops: tuple[str, ...]  # of OPS
    arms: tuple[str, ...]  # of ARMS; eager is the reference and always runs
    repeats: int  # timed forward + backward calls per arm, after two warm-ups
    seed: int  # inputs and output gradients

    def __post_init__(self):
        for key, allowed in (("ops", OPS), ("arms", ARMS)):
            bad = [v for v in getattr(self, key) if v not in allowed]
            if bad or not getattr(self, key):
                raise P.ParamError(f"{key}={list(getattr(self, key))}: list one or more of {list(allowed)}.")
        if self.tokens < 1 or self.repeats < 1:
            raise P.ParamError(f"tokens={self.tokens}, repeats={self.repeats}: both must be >= 1.")
        if self.model not in models.PRESETS:
            raise P.ParamError(f"model={self.model!r}: use an rlkit.models.qwen preset ({sorted(models.PRESETS)}).")


PROFILES: dict[str, dict[str, Any]] = {
    "h200": {"model": "qwen3-4b", "device": "cuda", "tokens": 24576, "ops": list(OPS), "arms": list(ARMS),
             "repeats": 20, "seed": 0},
    "tiny": {"model": "tiny", "device": "cpu", "tokens": 64, "ops": list(OPS), "arms": ["eager", "liger"],
             "repeats": 2, "seed": 0},
}


def make_inputs(op: str, cfg: Config, device) -> tuple[list, list]:
    """(the inputs that take gradients, the others) of ``op`` at the model's widths, bf16, on ``device``."""
    import torch

    c = models.preset_config(cfg.model)
    gen = torch.Generator().manual_seed(cfg.seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(device, torch.bfloat16)
    if op == "rmsnorm":
        return [rand(cfg.tokens, c.hidden_size), 1 + 0.1 * rand(c.hidden_size)], [c.rms_norm_eps]
    if op == "rotary":
        return [rand(1, cfg.tokens, heads, c.head_dim).transpose(1, 2)
                for heads in (c.num_attention_heads, c.num_key_value_heads)], rotary_cos_sin(cfg, device)
    return [rand(cfg.tokens, c.intermediate_size), rand(cfg.tokens, c.intermediate_size)], []


def rotary_cos_sin(cfg: Config, device) -> list:
    """cos and sin as Qwen3's own rotary embedding gives them (transformers' ``Qwen3RotaryEmbedding``, bf16) for one
    sequence of ``tokens`` positions: each is ``cat(freqs, freqs)``, its two halves equal, which liger's rope kernel
    relies on (it reads the first half only). Random angles would break that and liger with it (session 30's run)."""
    import torch
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    c = models.preset_config(cfg.model)
    like = torch.empty(1, cfg.tokens, c.head_dim, dtype=torch.bfloat16)
    cos, sin = Qwen3RotaryEmbedding(c)(like, torch.arange(cfg.tokens)[None])
    return [cos.to(device), sin.to(device)]


def arm_function(op: str, arm: str, device):
    """The function ``arm`` computes ``op`` with (inputs that take gradients first), or a str saying why it cannot
    run here."""
    from rlkit.patches.kernels import compiled_pointwise as cp
    from rlkit.patches.kernels import compiled_rmsnorm as cr

    if arm != "liger":
        own = {"rmsnorm": (cr.rms_norm, cr.compiled_rms_norm), "rotary": (cp.rotary, cp.compiled_rotary),
               "swiglu": (cp.swiglu, cp.fused_swiglu)}[op]
        return own[arm == "compiled"]
    if device.type != "cuda":
        return "liger-kernel's Triton kernels need a CUDA device"
    try:
        from liger_kernel.ops import LigerRMSNormFunction, LigerSiLUMulFunction
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError as err:
        return f"liger-kernel is not installed ({err}); the bundle carries it: rlkit bundle build --spec liger-kernel==0.8.5"
    return {"rmsnorm": lambda x, w, eps: LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", True, None),
            "rotary": liger_rotary_pos_emb,
            "swiglu": lambda gate, up: LigerSiLUMulFunction.apply(gate, up, 1.0, 1.0)}[op]


def forward_backward(fn, grad_inputs: list, others: list, out_grads: list | None, seed: int):
    """Outputs and input gradients of one forward + backward; ``out_grads`` None: drawn once from ``seed``. Each call
    hands autograd its own copy of the output gradients: liger's RMSNorm (in place, as its Qwen3 patch sets it) writes
    its input gradient into the output gradient's memory, which with one shared tensor corrupted the later calls and
    the gradient compared (session 30's run)."""
    import torch

    leaves = [t.detach().clone().requires_grad_(True) for t in grad_inputs]
    outs = fn(*leaves, *others)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    if out_grads is None:
        gen = torch.Generator().manual_seed(seed + 1)
        out_grads = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, leaves, [g.clone() for g in out_grads])
    return [o.detach() for o in outs], list(grads), out_grads


def against(reference: list, tensors: list) -> dict[str, Any]:
    """Bit identity of ``tensors`` to ``reference``, else the largest |difference| / largest |reference| per tensor."""
    import torch

    identical = all(torch.equal(a, b) for a, b in zip(reference, tensors))
    rel = [((b.float() - a.float()).abs().max() / a.float().abs().max().clamp_min(1e-30)).item()
           for a, b in zip(reference, tensors)]
    return {"bit_identical": identical, "max_rel_diff": max(rel)}


def run_op(op: str, cfg: Config, device) -> dict[str, Any]:
    grad_inputs, others = make_inputs(op, cfg, device)
    ref_out, ref_grads, out_grads = forward_backward(arm_function(op, "eager", device), grad_inputs, others, None, cfg.seed)
    rows = {}
    for arm in dict.fromkeys(["eager", *cfg.arms]):
        fn = arm_function(op, arm, device)
        if isinstance(fn, str):
            rows[arm] = {"ran": False, "why": fn}
            continue
        out, grads, _ = forward_backward(fn, grad_inputs, others, out_grads, cfg.seed)
        seconds = _timed(lambda fn=fn: forward_backward(fn, grad_inputs, others, out_grads, cfg.seed), device,
                         cfg.repeats, warmup=2)
        rows[arm] = {"ran": True, "fwd_bwd_ms": 1000 * statistics.median(seconds), "outputs": against(ref_out, out),
                     "input_grads": against(ref_grads, grads)}
    return rows


def run(cfg: Config) -> dict[str, Any]:
    import torch

    device = _device(cfg.device)
    return {"config": P.as_dict(cfg), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "ops": {op: run_op(op, cfg, device) for op in cfg.ops}}


def main(argv=None) -> int:
    from rlkit.experiments import built_in_parser, run_built_in

    ns = built_in_parser(NOTEBOOK, __doc__.split("\n\n")[0], PROFILES, NOTEBOOK).parse_args(argv)
    return 0 if run_built_in(ns, Config, PROFILES, NOTEBOOK, lambda cfg, _work_dir: run(cfg)) is not None else 2


if __name__ == "__main__":
    raise SystemExit(main())
