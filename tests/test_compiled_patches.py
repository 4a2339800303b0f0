"""compiled_rmsnorm (Qwen3's RMSNorm) and compiled_pointwise (rotary embedding, SwiGLU product) through torch.compile.

On this CPU (Inductor's C++ kernels): each guard that the compiled function is transformers' own expression (and
the refusal of one that is not), apply/revert, and a tiny Qwen3 wrapped as verl wraps the actor (FSDP1 NO_SHARD,
bf16 compute, gradient checkpointing) against eager: compiled_rmsnorm within its stated tolerance (it sums in
other orders), compiled_pointwise bit for bit (no reductions, eager's roundings kept) or, on a torch whose CPU
backend drops those roundings, refused at its first call; and compiled_rmsnorm in fp32
through verl 0.9.1's own engine and PPO loss (packed, rlkit_varlen, chunked log-probs) to fp32 rounding. On a GPU:
the same at Qwen3-4B's widths, in bf16, with the differences printed."""
from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3 import modeling_qwen3

from rlkit.patches import PatchError, installed_version
from rlkit.patches.kernels import compiled_pointwise, compiled_rmsnorm

CPU_KEEPS_ROUNDINGS = installed_version("torch").release[:2] >= (2, 13)  # Inductor's C++ backend keeps bf16 roundings
GRAD_BOUND = 2.0 ** -6  # of a flat parameter's largest gradient entry (compiled_rmsnorm's docstring says why)
PATCHES = {"rmsnorm": compiled_rmsnorm, "pointwise": compiled_pointwise}


def test_the_compiled_functions_are_transformers_expressions():
    compiled_rmsnorm.check_same_expression(modeling_qwen3.Qwen3RMSNorm)  # each raises if not bit for bit
    compiled_pointwise.check_same_expressions(modeling_qwen3)


def test_a_transformers_norm_that_computes_otherwise_is_refused(monkeypatch):
    def weight_in_fp32(self, hidden_states):  # a plausible rewrite: the weight multiplied before the cast back
        x = hidden_states.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (self.weight.float() * x).to(hidden_states.dtype)

    monkeypatch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", weight_in_fp32)
    with pytest.raises(PatchError, match=r"Qwen3RMSNorm.forward no longer computes rlkit's rms_norm .*Fix: "):
        compiled_rmsnorm.PATCH.apply()
    assert not compiled_rmsnorm.PATCH.active() and modeling_qwen3.Qwen3RMSNorm.forward is weight_in_fp32


def test_a_transformers_rotary_that_computes_otherwise_is_refused(monkeypatch):
    def rotary_in_fp32(q, k, cos, sin, unsqueeze_dim=1):  # a plausible rewrite: one rounding instead of three
        q32, k32 = compiled_pointwise.rotary(q.float(), k.float(), cos.float(), sin.float(), unsqueeze_dim)
        return q32.to(q.dtype), k32.to(k.dtype)

    monkeypatch.setattr(modeling_qwen3, "apply_rotary_pos_emb", rotary_in_fp32)
    with pytest.raises(PatchError, match=r"apply_rotary_pos_emb no longer computes rlkit's .*Fix: "):
        compiled_pointwise.PATCH.apply()
    assert not compiled_pointwise.PATCH.active() and modeling_qwen3.apply_rotary_pos_emb is rotary_in_fp32


@pytest.mark.parametrize("name", list(PATCHES))
def test_apply_is_idempotent_and_revert_restores_what_it_replaced(name):
    module = PATCHES[name]
    before = (modeling_qwen3.Qwen3RMSNorm.forward, modeling_qwen3.apply_rotary_pos_emb, modeling_qwen3.Qwen3MLP.forward)
    module.PATCH.apply()
    module.PATCH.apply()
    after = (modeling_qwen3.Qwen3RMSNorm.forward, modeling_qwen3.apply_rotary_pos_emb, modeling_qwen3.Qwen3MLP.forward)
    assert [a is not b for a, b in zip(before, after)] == ([True, False, False] if name == "rmsnorm" else
                                                          [False, True, True])
    module.PATCH.revert()
    assert all(a is b for a, b in zip(before, (modeling_qwen3.Qwen3RMSNorm.forward, modeling_qwen3.apply_rotary_pos_emb,
                                               modeling_qwen3.Qwen3MLP.forward)))


def test_a_compile_that_fails_names_the_patch_and_the_field_that_runs_without_it(monkeypatch):
    """Inductor without what it needs (here: a backend that raises as Inductor does without a C compiler)."""
    from rlkit.patches.kernels._compile import like_eager

    def failing_compile(fn, **options):
        def call(*args):
            raise torch._dynamo.exc.BackendCompilerFailed(failing_compile, RuntimeError("no C compiler"), None)
        return call

    monkeypatch.setattr(torch, "compile", failing_compile)
    square = like_eager(lambda x: x * x, patch="compiled_pointwise", field="pointwise")
    with pytest.raises(PatchError, match=r"patch 'compiled_pointwise': torch.compile could not compile for cpu "
                                         r"\(RuntimeError: no C compiler\)\. Fix: .*recipe field pointwise: eager"):
        square(torch.ones(2))


def test_the_compiled_swiglu_keeps_gate_and_up_for_backward_and_eager_silu_gate_too():
    """What each SwiGLU saves for backward (saved-tensor hooks): eager keeps gate (silu's input), silu(gate) and up
    (the product's inputs); the compiled function keeps gate and up and recomputes silu(gate). The planner's
    ``compiled_pointwise`` option is that one intermediate-wide tensor less (rlkit.planning.budget). On the GPU
    where there is one: the CPU's Inductor of torch < 2.13 drops eager's roundings, and the patch refuses it there
    (test_a_tiny_qwen3_wrapped_like_verls_actor_matches_eager)."""
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cpu" and not CPU_KEEPS_ROUNDINGS:
        pytest.skip("this torch's CPU Inductor is refused by compiled_pointwise, and there is no GPU")

    def saved(fn):
        gate, up = (torch.randn(8, 24, device=device).bfloat16().requires_grad_() for _ in range(2))
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
            out = fn(gate, up)
        out.sum().backward()
        return shapes

    assert saved(compiled_pointwise.swiglu) == [(8, 24)] * 3
    assert saved(compiled_pointwise.fused_swiglu) == [(8, 24)] * 2


def test_the_patched_swiglu_runs_eagers_backward_kernels_on_eagers_operands():
    """Backward, the patched SwiGLU dispatches the ATen kernels eager's autograd does (silu to recompute silu(gate),
    the two products, silu_backward), not a fused kernel of Inductor's, which rounded input gradients otherwise on an
    H100 (session 30); its gradients are eager's bit for bit."""
    from torch.utils._python_dispatch import TorchDispatchMode

    if not CPU_KEEPS_ROUNDINGS:
        pytest.skip("this torch's CPU Inductor is refused by compiled_pointwise (its forward's first-call check)")

    class Dispatched(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    generator = torch.Generator().manual_seed(0)
    gate, up, grad = (torch.randn(16, 40, generator=generator).bfloat16() for _ in range(3))

    def grads(fn, mode=None):
        leaves = [t.clone().requires_grad_() for t in (gate, up)]
        out = fn(*leaves)
        if mode is None:
            return torch.autograd.grad(out, leaves, grad)
        with mode:
            return torch.autograd.grad(out, leaves, grad)

    backward = Dispatched()
    fused = grads(compiled_pointwise.fused_swiglu, backward)
    assert sorted(op for op in backward.ops if op in ("silu", "mul", "silu_backward")) == ["mul", "mul", "silu",
                                                                                             "silu_backward"]
    assert all(torch.equal(a, b) for a, b in zip(grads(compiled_pointwise.swiglu), fused))


def test_an_mlp_of_another_activation_keeps_the_eager_forward():
    config = modeling_qwen3.Qwen3Config(hidden_size=32, intermediate_size=48, hidden_act="gelu")
    mlp, x = modeling_qwen3.Qwen3MLP(config), torch.randn(3, 32)
    expected = mlp(x)
    compiled_pointwise.CALLS.clear()
    compiled_pointwise.PATCH.apply()
    try:
        assert torch.equal(mlp(x), expected) and compiled_pointwise.CALLS == {"eager_mlp": 1}
    finally:
        compiled_pointwise.PATCH.revert()


def _update(model: str, device, patch=None, **overrides):
    """One fwd+bwd of a log-prob loss under ``patch`` (a patch module, or None: eager): the logits (fp32) and every
    flat parameter's gradient."""
    from rlkit.experiments.update_phase import build_fsdp_model

    if patch is not None:
        patch.PATCH.apply()
    try:
        module = build_fsdp_model(model, device, seed=0, **overrides)
        generator = torch.Generator().manual_seed(1)
        ids = torch.randint(3, module.config.vocab_size, (2, 40), generator=generator).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = module(input_ids=ids).logits.float()
        logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).mean().backward()
        return logits.detach(), {n: p.grad.detach().clone() for n, p in module.named_parameters()}
    finally:
        if patch is not None:
            patch.PATCH.revert()


def _assert_within_tolerance(eager, compiled):
    """Logits within one bf16 step at the largest logit's magnitude (a logit of 5.31 steps by 2^-5: differences
    propagate through the layers, so small logits may move by many of their own steps); gradients within
    GRAD_BOUND of each flat parameter's largest entry."""
    (logits, grads), (logits_c, grads_c) = eager, compiled
    assert (logits_c - logits).abs().max() <= bf16_step_at(logits.abs().max())
    for name, grad in grads.items():
        assert grad.abs().max() > 0, name  # a bound against zero would hold for anything
        assert (grads_c[name] - grad).abs().max() <= GRAD_BOUND * grad.abs().max(), name


def _assert_bit_identical(eager, compiled):
    (logits, grads), (logits_c, grads_c) = eager, compiled
    assert torch.equal(logits_c, logits)
    assert all(torch.equal(grads_c[name], grad) for name, grad in grads.items())



def test_a_tiny_qwen3_wrapped_like_verls_actor_matches_eager(single_rank_group):
    """compiled_rmsnorm within its tolerance; compiled_pointwise bit for bit where Inductor's C++ backend keeps
    eager's bf16 roundings (torch >= 2.13), and refused at its first call where it does not (2.11, the node's)."""
    cpu = torch.device("cpu")
    compiled_rmsnorm.CALLS.clear()
    compiled_pointwise.CALLS.clear()
    eager = _update("tiny", cpu)
    assert not compiled_rmsnorm.CALLS and not compiled_pointwise.CALLS
    norm = _update("tiny", cpu, compiled_rmsnorm)
    assert compiled_rmsnorm.CALLS == {"compiled": 17}  # 2 layers x 4 norms + the final one, then the recompute's 8
    _assert_within_tolerance(eager, norm)
    if not CPU_KEEPS_ROUNDINGS:
        with pytest.raises(PatchError, match=r"rotary compiled by torch .* on cpu \(torch.bfloat16\) is not eager's "
                                             r"result bit for bit .*recipe field pointwise: eager"):
            _update("tiny", cpu, compiled_pointwise)
        return
    pointwise = _update("tiny", cpu, compiled_pointwise)
    assert compiled_pointwise.CALLS == {"rotary": 4, "swiglu": 4}  # once per layer each, and again in the recompute
    _assert_bit_identical(eager, pointwise)


def test_a_compiled_function_that_is_not_eagers_bit_for_bit_is_refused_at_its_first_call():
    """A function whose compiled form cannot equal eager (Inductor draws its own random numbers): refused, naming
    the function, the count of differing elements and the field; without the claim the same function runs."""
    from rlkit.patches.kernels._compile import like_eager

    def noisy(x):
        return x + torch.rand_like(x)

    claimed = like_eager(noisy, patch="compiled_pointwise", field="pointwise", bit_exact=True)
    with pytest.raises(PatchError, match=r"patch 'compiled_pointwise': noisy compiled by torch .* on cpu "
                                         r"\(torch.float32\) is not eager's result bit for bit \(\d+ of 64 elements "
                                         r"differ.*recipe field pointwise: eager"):
        claimed(torch.zeros(8, 8))
    assert like_eager(noisy, patch="compiled_pointwise", field="pointwise")(torch.zeros(8, 8)).shape == (8, 8)


def test_one_ulp_at_one_element_is_refused_at_the_first_call():
    """The first-call check is bit identity, not closeness: a compiled form that moves one element by one ulp (its
    nearest float) is refused, counting that one element; a tolerance there would let it through (issue 46)."""
    from rlkit.patches.kernels._compile import like_eager

    def one_ulp_off_when_compiled(x):
        if torch.compiler.is_compiling():  # what Inductor runs; eager takes the other branch
            x = x.clone()
            x[0, 0] = torch.nextafter(x[0, 0], torch.tensor(float("inf")))
        return x * 1.0

    claimed = like_eager(one_ulp_off_when_compiled, patch="compiled_pointwise", field="pointwise", bit_exact=True)
    with pytest.raises(PatchError, match=r"is not eager's result bit for bit \(1 of 64 elements differ, by at most 1.19e-07\)"):
        claimed(torch.ones(8, 8))


@pytest.mark.verl
def test_through_verls_engine_in_fp32_the_norm_differs_only_in_summation_order():
    """fp32 has no casts to emulate: the compiled norm differs from the eager one only in the order it sums a row's
    squares (and, backward, the gradients), so verl's packed update (rlkit_varlen, chunked log-probs, ppo_loss)
    agrees to fp32 rounding in loss, log-probs, entropy and every gradient."""
    from _verl_engine import assert_update_matches, build_fused, engine_update, restored_verl_model_patches

    from rlkit.models import qwen as models
    from rlkit.patches.kernels import chunked_logprobs, varlen_attention

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


def bf16_step_at(magnitude: torch.Tensor) -> torch.Tensor:
    """One step (ulp) of bf16 at ``magnitude``: 2**(e - 8) for magnitude = m * 2**e, m in [0.5, 1)."""
    _, exponent = torch.frexp(magnitude.float().clamp_min(torch.finfo(torch.bfloat16).tiny))
    return torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent - 8)


def bf16_steps(expected: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
    """Each element's difference in steps (ulps) of bf16 at the element's own magnitude, the larger of the two."""
    return (actual.float() - expected.float()).abs() / bf16_step_at(torch.maximum(expected.abs(), actual.abs()))


def test_bf16_steps_counts_the_steps_at_each_elements_own_magnitude():
    expected = torch.tensor([5.3125, 4.0, 1.0, -2.0, 0.0])
    actual = expected + torch.tensor([2.0 ** -5, 0.0, 2.0 ** -6, -2.0 ** -6, 0.0])
    assert bf16_steps(expected, actual).tolist() == [1.0, 0.0, 2.0, 1.0, 0.0]
    assert bf16_step_at(torch.tensor(5.3125)).item() == 2.0 ** -5 and bf16_step_at(torch.tensor(4.0)).item() == 2.0 ** -5


def _one_norm(device: torch.device, compiled: bool) -> torch.Tensor:
    generator = torch.Generator().manual_seed(2)
    hidden = (3 * torch.randn(512, 2560, generator=generator)).bfloat16().to(device)  # Qwen3-4B's hidden width
    weight = (1 + 0.1 * torch.randn(2560, generator=generator)).bfloat16().to(device)
    norm = compiled_rmsnorm.compiled_rms_norm if compiled else compiled_rmsnorm.rms_norm
    return norm(hidden, weight, 1e-6)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_one_norms_output_is_within_one_bf16_step_of_eager_per_element(device):
    """The docstring's claim for one norm: its sum of squares in another order moves an output element, rarely, by
    one step of bf16 at that element, never more."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    eager, compiled = (_one_norm(torch.device(device), flag) for flag in (False, True))
    steps = bf16_steps(eager, compiled)
    print(f"one RMSNorm on {device}: {int((steps > 0).sum())} of {steps.numel()} elements differ, "
          f"by at most {steps.max().item():.3g} bf16 steps")
    assert steps.max() <= 1


def _report(name: str, eager, compiled) -> None:
    (logits, grads), (logits_c, grads_c) = eager, compiled
    steps = bf16_steps(logits, logits_c)
    print(f"{name} on {torch.cuda.get_device_name(0)}: logits max |diff| {(logits_c - logits).abs().max().item():.3g} "
          f"(max |logit| {logits.abs().max().item():.3g}; {int((steps > 0).sum())} of {steps.numel()} differ, by at "
          f"most {steps.max().item():.3g} bf16 steps of their own magnitude); gradients max |diff| / max |grad|: "
          + ", ".join(f"{n}: {(grads_c[n] - g).abs().max().item() / g.abs().max().item():.3g}" for n, g in grads.items()))


@pytest.mark.gpu
def test_qwen3_4b_widths_on_the_gpu(single_rank_group):
    """At Qwen3-4B's widths (two layers), in bf16: the norm within its tolerance; rotary and SwiGLU compared bit for
    bit, the differences printed either way (SiLU's exponential is the one kernel that may round otherwise)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    device = torch.device("cuda", 0)
    eager = _update("qwen3-4b", device, num_hidden_layers=2)
    norm = _update("qwen3-4b", device, compiled_rmsnorm, num_hidden_layers=2)
    _report("compiled_rmsnorm", eager, norm)
    _assert_within_tolerance(eager, norm)
    pointwise = _update("qwen3-4b", device, compiled_pointwise, num_hidden_layers=2)  # its first-call check raises
    _report("compiled_pointwise", eager, pointwise)                                  # with the counts if it differs
    _assert_bit_identical(eager, pointwise)
