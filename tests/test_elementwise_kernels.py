"""rlkit.experiments.elementwise_kernels on the CPU: every op's eager arm against itself, the compiled SwiGLU (bit-exact
by its patch's claim) against eager, liger's arms saying why they do not run here, and bad parameters refused."""
from __future__ import annotations

import json

import pytest
import torch

from rlkit.core import params as P
from rlkit.experiments import elementwise_kernels as E


def _run(tmp_path, *params):
    argv = ["--tiny", "--out", str(tmp_path), "--tag", "cpu"] + [a for p in params for a in ("-p", p)]
    assert E.main(argv) == 0
    return json.loads((tmp_path / E.NOTEBOOK / "cpu" / "metrics.json").read_text())


def test_tiny_profile_times_each_op_and_says_why_liger_did_not_run(tmp_path):
    metrics = _run(tmp_path)
    assert list(metrics["ops"]) == list(E.OPS)
    for op, rows in metrics["ops"].items():
        eager = rows["eager"]
        assert eager["ran"] and eager["fwd_bwd_ms"] > 0, op
        assert eager["outputs"] == eager["input_grads"] == {"bit_identical": True, "max_rel_diff": 0.0}
        assert rows["liger"] == {"ran": False, "why": "liger-kernel's Triton kernels need a CUDA device"}


def test_the_compiled_swiglu_is_held_against_eager(tmp_path):
    import torch

    from rlkit.patches.kernels import compiled_pointwise

    assert E.arm_function("swiglu", "compiled", torch.device("cpu")) is compiled_pointwise.fused_swiglu
    rows = _run(tmp_path, "ops=[swiglu]", "arms=[compiled]")["ops"]["swiglu"]
    compiled = rows["compiled"]
    assert compiled["ran"] and compiled["outputs"]["bit_identical"] and compiled["input_grads"]["bit_identical"]


def test_the_comparison_finds_a_difference():
    """The column issue 42's exactness rule is read from: a one-ulp change shows, a copy does not."""
    import torch

    a = torch.tensor([1.0, -2.0, 4.0], dtype=torch.bfloat16)
    assert E.against([a], [a.clone()]) == {"bit_identical": True, "max_rel_diff": 0.0}
    b = a.clone()
    b[2] = 4.0 + 2.0 ** -5  # the next bf16 above 4 (8 significand bits)
    assert E.against([a], [b]) == {"bit_identical": False, "max_rel_diff": 2.0 ** -7}


def _liger_rope(q, k, cos, sin):
    """liger-kernel 0.8.5's rope kernel (liger_kernel/ops/rope.py, ``_triton_rope``) in torch: per token it loads only
    the first half of the cos / sin row (the second half of Qwen3's repeats it) and rotates in the cos dtype."""
    half = q.shape[-1] // 2
    c, s = (t[..., :half].unsqueeze(1) for t in (cos, sin))

    def rotate(x):
        x1, x2 = x[..., :half].to(c.dtype), x[..., half:].to(c.dtype)
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype)
    return rotate(q), rotate(k)


def test_the_rotary_inputs_are_qwen3s_and_meet_ligers_premise():
    """Session 30's liger rotary arm differed from eager by 1.94 of the largest output: the experiment drew random
    angles, so cos / sin had unequal halves, and liger's kernel reads the first half only. Now cos / sin are Qwen3's
    (``cat(freqs, freqs)``) and q / k the layout its attention hands over; liger's arithmetic then agrees with eager's
    within a bf16 step, where with random angles it did not come near."""
    from rlkit.patches.kernels import compiled_pointwise

    cfg = E.Config(**E.PROFILES["tiny"])
    (q, k), (cos, sin) = E.make_inputs("rotary", cfg, torch.device("cpu"))
    half = cos.shape[-1] // 2
    assert torch.equal(cos[..., :half], cos[..., half:]) and torch.equal(sin[..., :half], sin[..., half:])
    assert q.shape[1:3] == (E.models.preset_config("tiny").num_attention_heads, cfg.tokens) and q.stride(1) == q.shape[-1]
    eager = list(compiled_pointwise.rotary(q, k, cos, sin))
    assert E.against(eager, list(_liger_rope(q, k, cos, sin)))["max_rel_diff"] <= 2.0 ** -8
    angles = torch.randn(1, cfg.tokens, cos.shape[-1], generator=torch.Generator().manual_seed(0))
    cos_r, sin_r = (f(angles).to(torch.bfloat16) for f in (torch.cos, torch.sin))  # what session 30's run drew
    eager_r = list(compiled_pointwise.rotary(q, k, cos_r, sin_r))
    assert E.against(eager_r, list(_liger_rope(q, k, cos_r, sin_r)))["max_rel_diff"] > 0.5


class _InPlaceSwiGLU(torch.autograd.Function):
    """eager's SwiGLU whose backward writes the gate's gradient into the output gradient's memory and returns it, as
    liger's in-place RMSNorm does with its input gradient (``dX = dY``)."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return torch.nn.functional.silu(gate) * up

    @staticmethod
    def backward(ctx, dy):
        gate, up = (t.detach().requires_grad_(True) for t in ctx.saved_tensors)
        with torch.enable_grad():
            dgate, dup = torch.autograd.grad(torch.nn.functional.silu(gate) * up, (gate, up), dy)
        return dy.copy_(dgate), dup


def test_an_in_place_backward_is_compared_on_its_own_gradient(monkeypatch):
    """Session 30's liger RMSNorm input gradients differed from eager's by 747 times the largest: its backward wrote
    them into the one output-gradient tensor every call shared, so the later timed calls overwrote the gradient being
    compared. With a fresh copy per call, a kernel that does the same is held to its own first result."""
    own = E.arm_function
    monkeypatch.setattr(E, "arm_function", lambda op, arm, device: _InPlaceSwiGLU.apply if arm == "liger"
                        else own(op, arm, device))
    rows = E.run_op("swiglu", E.Config(**{**E.PROFILES["tiny"], "ops": ["swiglu"]}), torch.device("cpu"))
    assert rows["liger"]["outputs"]["bit_identical"] and rows["liger"]["input_grads"]["bit_identical"]


@pytest.mark.parametrize("override, words", [({"ops": ["gelu"]}, "ops=['gelu']"), ({"arms": []}, "arms=[]"),
                                             ({"tokens": 0}, "tokens=0")])
def test_bad_parameters_are_refused(override, words):
    with pytest.raises(P.ParamError, match=words.replace("[", r"\[").replace("]", r"\]")):
        E.Config(**{**E.PROFILES["tiny"], **override})


def test_the_comparison_runs_without_verl_vllm_or_ray(tmp_path):
    """docs/offline-node.md lets a lease without the bundle run kernels-liger: a fresh process where verl, vLLM and Ray
    cannot be imported runs the tiny profile to the end and imports none of them."""
    import subprocess
    import sys

    code = ("import sys\nfor m in ('verl', 'vllm', 'ray'): sys.modules[m] = None\n"
            "from rlkit.experiments import elementwise_kernels as E\n"
            f"assert E.main(['--tiny', '--out', {str(tmp_path)!r}, '--tag', 'cpu']) == 0\n"
            "print(sorted({m.split('.')[0] for m, v in sys.modules.items() if v is not None} & {'verl', 'vllm', 'ray'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / E.NOTEBOOK / "cpu" / "metrics.json").exists()
